// CUDA kernels of the elementwise family and the tensor fills: copy (with dtype conversion), fill,
// the unary and binary ops of the lists in backend/elementwise_math.h and the fused unary
// backward, where, clamp and its backward, in-place add, the counter-based random fills and
// dropout.
//
// Every kernel here is bound by memory traffic: each input element is read once and each output
// element written once (in-place add reads and writes its destination; dropout forward writes y
// and a one-byte mask, its backward reads the mask), a few flops apiece, with the Philox rounds
// (ten 32x32->64-bit multiply rounds per four elements) the heaviest arithmetic. So the work is
// in the addressing: when every operand is dense or a broadcast scalar, with suitably aligned
// bases, one thread handles a 16-byte vector of the widest operand per step; any other layout
// walks the byte strides of backend/strided_loop.h (broadcast, merged dimensions) one element per
// step. Both are grid-stride loops.
//
// The per-element formulas are the ones the CPU backend calls (elementwise_math.h and
// random_math.h, FT_HD functions), one kernel per op selected on the host, so the op switch folds
// away at compile time; 16-bit floats compute in f32 and round to nearest even on store, as on
// the CPU. Random fills and dropout map element i to word i%4 of Philox counter base + i/4, as the
// CPU does, so they draw the same values.
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"
#include "backend/elementwise_math.h"
#include "backend/random_math.h"
#include "fasttrain/dtype.h"

namespace ft::cuda {

using math::BinaryOp;
using math::UnaryOp;
using random_math::RandomDistribution;
using random_math::RandomFill;

namespace {

constexpr int kThreads = 256;
constexpr int kMaxArgs = backend::StridedLoop::kMaxArgs;

// kVec elements of T moved as one access; aligned to its size so the compiler emits a single
// vector load or store (at most 16 bytes: kVec is chosen from the widest operand).
template <class T, int kVec>
struct alignas(sizeof(T) * kVec) Pack {
  T v[kVec];
};

// Elements per vector step: 16 bytes of the widest operand (4 for f32, 8 for bf16, 2 for f64).
template <class Out, class... In>
constexpr int vec_width() {
  size_t widest = sizeof(Out);
  ((widest = sizeof(In) > widest ? sizeof(In) : widest), ...);
  return static_cast<int>(16 / widest);
}

// The operands of a one-dimensional loop whose inputs are each dense or a single broadcast element.
struct DenseArgs {
  int64_t n = 0;
  char* ptr[kMaxArgs] = {};
  bool scalar[kMaxArgs] = {};  // input read from one element for every index (stride 0)
};

template <class T, int kVec>
__device__ __forceinline__ Pack<T, kVec> load_pack(const char* p, bool scalar, int64_t pack) {
  if (scalar) {
    const T v = *reinterpret_cast<const T*>(p);
    Pack<T, kVec> r;
#pragma unroll
    for (int j = 0; j < kVec; ++j) r.v[j] = v;
    return r;
  }
  return reinterpret_cast<const Pack<T, kVec>*>(p)[pack];
}

template <int kVec, class Out, class F, class... In>
__device__ __forceinline__ void store_pack(const F& f, Pack<Out, kVec>* out, const Pack<In, kVec>&... in) {
  Pack<Out, kVec> r;
#pragma unroll
  for (int j = 0; j < kVec; ++j) r.v[j] = convert<Out>(f(convert<acc_t<In>>(in.v[j])...));
  *out = r;
}

// One vector step: pack `pack` of every operand (input k is operand k + 1).
template <int kVec, class Out, class... In, class F, size_t... I>
__device__ __forceinline__ void dense_pack(const DenseArgs& a, const F& f, int64_t pack, std::index_sequence<I...>) {
  store_pack<kVec, Out>(f, reinterpret_cast<Pack<Out, kVec>*>(a.ptr[0]) + pack,
                        load_pack<In, kVec>(a.ptr[I + 1], a.scalar[I + 1], pack)...);
}

// One element e of the dense loop (the tail that does not fill a vector).
template <class Out, class... In, class F, size_t... I>
__device__ __forceinline__ void dense_one(const DenseArgs& a, const F& f, int64_t e, std::index_sequence<I...>) {
  reinterpret_cast<Out*>(a.ptr[0])[e] =
      convert<Out>(f(load(reinterpret_cast<const In*>(a.ptr[I + 1]) + (a.scalar[I + 1] ? 0 : e))...));
}

template <int kVec, class Out, class F, class... In>
__global__ void __launch_bounds__(kThreads) dense_kernel(DenseArgs a, F f) {
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t packs = a.n / kVec;
  for (int64_t p = tid; p < packs; p += step) dense_pack<kVec, Out, In...>(a, f, p, std::index_sequence_for<In...>{});
  // The last n % kVec (< 16) elements, one each for the first threads of block 0.
  const int64_t e = packs * kVec + tid;
  if (e < a.n) dense_one<Out, In...>(a, f, e, std::index_sequence_for<In...>{});
}

// Byte offsets of element i in each of the N operands, with the operand count known at compile
// time, so the unrolled loops keep off[] in registers (a runtime count puts it
// in local memory), and without the 64-bit divisions when the loop is one-dimensional.
template <int N>
__device__ __forceinline__ void element_offsets(const backend::StridedLoop& L, int64_t i, int64_t (&off)[N]) {
  if (L.ndim == 1) {
#pragma unroll
    for (int a = 0; a < N; ++a) off[a] = i * L.strides[a][0];
    return;
  }
#pragma unroll
  for (int a = 0; a < N; ++a) off[a] = 0;
  for (int d = L.ndim - 1; d >= 0; --d) {
    const int64_t idx = i % L.shape[d];
    i /= L.shape[d];
#pragma unroll
    for (int a = 0; a < N; ++a) off[a] += idx * L.strides[a][d];
  }
}

// Element i of an arbitrary strided loop.
template <class Out, class... In, class F, size_t... I>
__device__ __forceinline__ void strided_one(const DeviceLoop& loop, const F& f, int64_t i, std::index_sequence<I...>) {
  int64_t off[1 + sizeof...(In)];
  element_offsets(loop.L, i, off);
  *reinterpret_cast<Out*>(loop.L.base[0] + off[0]) =
      convert<Out>(f(load(reinterpret_cast<const In*>(loop.L.base[I + 1] + off[I + 1]))...));
}

template <class Out, class F, class... In>
__global__ void __launch_bounds__(kThreads) strided_kernel(DeviceLoop loop, F f) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < loop.L.numel; i += step)
    strided_one<Out, In...>(loop, f, i, std::index_sequence_for<In...>{});
}

// Vector step p of a loop whose innermost dimension is dense in every operand and a multiple of
// kVec long, with every run starting aligned (inner_dense_operands): the index arithmetic of
// element p * kVec serves kVec elements, and each access is one vector. Permuted copies (the
// attention heads' [B, T, H, D] <-> [B, H, T, D]) take this path.
template <int kVec, class Out, class... In, class F, size_t... I>
__device__ __forceinline__ void inner_pack(const DeviceLoop& loop, const F& f, int64_t p, std::index_sequence<I...>) {
  int64_t off[1 + sizeof...(In)];
  element_offsets(loop.L, p * kVec, off);
  store_pack<kVec, Out>(f, reinterpret_cast<Pack<Out, kVec>*>(loop.L.base[0] + off[0]),
                        load_pack<In, kVec>(loop.L.base[I + 1] + off[I + 1], false, 0)...);
}

template <int kVec, class Out, class F, class... In>
__global__ void __launch_bounds__(kThreads) inner_dense_kernel(DeviceLoop loop, F f) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t packs = loop.L.numel / kVec;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < packs; p += step)
    inner_pack<kVec, Out, In...>(loop, f, p, std::index_sequence_for<In...>{});
}

// True when every operand's innermost dimension is dense, that dimension is a multiple of kVec,
// and every run of it starts on a kVec-element boundary (base and outer strides aligned).
template <int kVec>
bool inner_dense_operands(const backend::StridedLoop& L) {
  const int nd = L.ndim;
  if (nd < 2 || L.shape[nd - 1] % kVec != 0) return false;
  for (int a = 0; a < L.nargs; ++a) {
    const int64_t es = static_cast<int64_t>(L.elem_size[a]), vec = es * kVec;
    if (L.strides[a][nd - 1] != es || reinterpret_cast<uintptr_t>(L.base[a]) % static_cast<uintptr_t>(vec) != 0)
      return false;
    for (int d = 0; d < nd - 1; ++d)
      if (L.strides[a][d] % vec != 0) return false;
  }
  return true;
}

// Fills `d` and returns true when the loop is one-dimensional, the output is dense, every input
// is dense or one broadcast element, and the dense bases are aligned for kVec-element vectors
// (a view starting mid-vector takes the strided kernel instead).
template <int kVec>
bool dense_operands(const backend::StridedLoop& L, DenseArgs& d) {
  if (L.ndim != 1) return false;
  d.n = L.numel;
  for (int a = 0; a < L.nargs; ++a) {
    const int64_t es = static_cast<int64_t>(L.elem_size[a]);
    const int64_t stride = L.strides[a][0];
    const auto addr = reinterpret_cast<uintptr_t>(L.base[a]);
    d.ptr[a] = L.base[a];
    d.scalar[a] = false;
    // An input of stride 0 is one element broadcast to every index. (A one-element loop has
    // stride 0 everywhere: its output passes the test below and is written at index 0.)
    if (a > 0 && stride == 0) {
      d.scalar[a] = true;
      continue;
    }
    // An output of stride 0 (an expanded view) is not dense: every index writes one element.
    if (stride != es && L.numel != 1) return false;
    if (addr % static_cast<uintptr_t>(es * kVec) != 0) return false;
  }
  return true;
}

// out[i] = f(in_0[i], ...) over the broadcast loop of out and the inputs (same count as In...).
// f takes and returns compute types (acc_t); values are converted on load and store.
template <class Out, class... In, class F>
void launch_elementwise(const char* name, const Tensor& out, std::initializer_list<const Tensor*> inputs, const F& f) {
  const DeviceLoop loop{backend::make_loop(out, inputs)};
  FT_CHECK(loop.L.nargs == 1 + static_cast<int>(sizeof...(In)), name, ": operand count mismatch");
  const int64_t n = loop.L.numel;
  if (n == 0) return;
  cudaStream_t stream = stream_for(out);
  constexpr int kVec = vec_width<Out, In...>();
  DenseArgs d;
  if (dense_operands<kVec>(loop.L, d)) {
    dense_kernel<kVec, Out, F, In...><<<grid_for((n + kVec - 1) / kVec, kThreads), kThreads, 0, stream>>>(d, f);
  } else if (inner_dense_operands<kVec>(loop.L)) {
    inner_dense_kernel<kVec, Out, F, In...><<<grid_for(n / kVec, kThreads), kThreads, 0, stream>>>(loop, f);
  } else {
    strided_kernel<Out, F, In...><<<grid_for(n, kThreads), kThreads, 0, stream>>>(loop, f);
  }
  check_launch(name);
}

// --- per-element functors (device code; the op is a template argument so its switch folds) ---

struct IdentityFn {
  template <class C>
  __device__ __forceinline__ C operator()(C v) const {
    return v;
  }
};

// A fill writes the element's bit pattern, an unsigned integer of the element's size.
template <class U>
struct ConstantFn {
  U bits;
  __device__ __forceinline__ U operator()() const { return bits; }
};

template <UnaryOp kOp>
struct UnaryFn {
  template <class C>
  __device__ __forceinline__ C operator()(C x) const {
    return math::unary<C>(kOp, x);
  }
};

template <UnaryOp kOp>
struct UnaryBackwardFn {
  template <class C>
  __device__ __forceinline__ C operator()(C g, C x, C y) const {
    return g * math::unary_derivative<C>(kOp, x, y);
  }
};

// Comparisons return 0/1 in the compute type; the store converts to bool (v != 0), as the CPU's
// static_cast<bool> does.
template <BinaryOp kOp>
struct BinaryFn {
  template <class C>
  __device__ __forceinline__ C operator()(C a, C b) const {
    return math::binary<C>(kOp, a, b);
  }
};

struct WhereFn {
  template <class C>
  __device__ __forceinline__ C operator()(bool c, C a, C b) const {
    return c ? a : b;
  }
};

// NaN passes through (v != v), as on the CPU and in torch.clamp.
template <class C>
struct ClampFn {
  C lo, hi;
  __device__ __forceinline__ C operator()(C v) const { return v != v ? v : (v < lo ? lo : (v > hi ? hi : v)); }
};

template <class C>
struct ClampBackwardFn {
  C lo, hi;
  __device__ __forceinline__ C operator()(C g, C v) const { return (v >= lo && v <= hi) ? g : C(0); }
};

template <class C>
struct AxpyFn {
  C alpha;
  __device__ __forceinline__ C operator()(C x, C y) const { return x + alpha * y; }
};

// dy * (mask * scale): a multiply by 0, not a select, so NaN/inf gradients behave as on the CPU.
template <class C>
struct DropoutBackwardFn {
  C scale;
  __device__ __forceinline__ C operator()(C g, uint8_t m) const { return g * (static_cast<C>(m) * scale); }
};

// --- typed host dispatch, one launch per op of the lists ---

#define FT_CUDA_UNARY_CASE(Op, ...)                                                \
  case UnaryOp::Op:                                                                \
    if constexpr (!std::is_integral_v<T> || math::accepts_integers(UnaryOp::Op)) { \
      return launch_elementwise<T, T>("unary", out, {&x}, UnaryFn<UnaryOp::Op>{}); \
    }                                                                              \
    break;

// Integer tensors only reach the ops whose domain admits them (the op checked); the floating-only
// ops are not instantiated for integers.
template <class T>
void unary_typed(UnaryOp op, const Tensor& x, const Tensor& out) {
  switch (op) { FT_UNARY_OPS(FT_CUDA_UNARY_CASE) }
  FT_FAIL("elementwise op: expected a floating-point tensor, found ", dtype_name(x.dtype()));
}
#undef FT_CUDA_UNARY_CASE

#define FT_CUDA_UNARY_BACKWARD_CASE(Op, ...) \
  case UnaryOp::Op:                          \
    return launch_elementwise<T, T, T, T>("unary_backward", out, {&grad, &x, &y}, UnaryBackwardFn<UnaryOp::Op>{});

template <class T>
void unary_backward_typed(UnaryOp op, const Tensor& grad, const Tensor& x, const Tensor& y, const Tensor& out) {
  switch (op) { FT_UNARY_OPS(FT_CUDA_UNARY_BACKWARD_CASE) }
}
#undef FT_CUDA_UNARY_BACKWARD_CASE

// Comparisons write bool for every dtype; arithmetic writes the operands' dtype and refuses bool.
#define FT_CUDA_BINARY_CASE(Op, name, kind, formula)                                            \
  case BinaryOp::Op:                                                                            \
    if constexpr (math::BinaryKind::kind == math::BinaryKind::Comparison) {                     \
      return launch_elementwise<bool, T, T>("binary", out, {&a, &b}, BinaryFn<BinaryOp::Op>{}); \
    } else if constexpr (!std::is_same_v<T, bool>) {                                            \
      return launch_elementwise<T, T, T>("binary", out, {&a, &b}, BinaryFn<BinaryOp::Op>{});    \
    }                                                                                           \
    break;

template <class T>
void binary_typed(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  switch (op) { FT_BINARY_OPS(FT_CUDA_BINARY_CASE) }
  FT_FAIL("arithmetic on bool tensors is not supported; convert to an integer or floating dtype first");
}
#undef FT_CUDA_BINARY_CASE

// The element bit pattern fill writes, converted on the host exactly as the CPU's fill converts
// the value (integers from the integer value, floats through the compute type, 16-bit floats with
// ft::bf16/ft::f16's round-to-nearest-even).
template <class T>
uint64_t bits_of(T v) {
  static_assert(sizeof(T) <= sizeof(uint64_t));
  uint64_t b = 0;
  std::memcpy(&b, &v, sizeof(T));  // little-endian: the element is the low bytes
  return b;
}

uint64_t fill_bits(DType dt, Scalar value) {
  switch (dt) {
    case DType::F32: return bits_of(static_cast<float>(value.to_double()));
    case DType::F64: return bits_of(value.to_double());
    case DType::BF16: return bits_of(ft::bf16(static_cast<float>(value.to_double())));
    case DType::F16: return bits_of(ft::f16(static_cast<float>(value.to_double())));
    case DType::I32: return bits_of(static_cast<int32_t>(value.to_int()));
    case DType::I64: return bits_of(static_cast<int64_t>(value.to_int()));
    case DType::U8: return bits_of(static_cast<uint8_t>(value.to_int()));
    case DType::Bool: return bits_of(static_cast<bool>(value.to_double() != 0));
  }
  FT_FAIL("fill: invalid dtype code ", static_cast<int>(dt));
}

// --- random fills and dropout: one thread per Philox counter block (four elements) ---

template <class T, RandomDistribution kDist>
__global__ void __launch_bounds__(kThreads) random_fill_kernel(T* out, int64_t n, RandomFill fill) {
  if (fill.device_base != nullptr) fill.base += *fill.device_base;  // a CUDA graph's replay
  const int64_t blocks = (n + 3) / 4;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; b < blocks; b += step) {
    // Element 4b + lane is word `lane` of counter base + b (random_math.h), as on the CPU.
    const random_math::PhiloxBlock w = random_math::philox4x32(fill.key, fill.base + static_cast<uint64_t>(b));
#pragma unroll
    for (int lane = 0; lane < 4; ++lane) {
      const int64_t e = 4 * b + lane;
      // f64 -> T through the compute type, as the CPU's static_cast<T>(static_cast<compute_t<T>>(v)).
      if (e < n) out[e] = convert<T>(random_math::random_value<kDist>(fill, lane, w));
    }
  }
}

template <class T, RandomDistribution kDist>
void launch_random_fill(T* p, int64_t n, const RandomFill& fill, cudaStream_t stream) {
  random_fill_kernel<T, kDist><<<grid_for((n + 3) / 4, kThreads), kThreads, 0, stream>>>(p, n, fill);
  check_launch("random_fill");
}

// Dropout forward over dense x, y and mask. The keep test is the CPU's integer form of
// uniform_from_word(w) < keep: (w >> 8) < threshold. `vec`: x, y and mask are aligned for one
// 4-element access per counter block.
template <class T>
__global__ void __launch_bounds__(kThreads)
    dropout_forward_kernel(const T* x, T* y, uint8_t* mask, int64_t n, uint32_t threshold, acc_t<T> scale, uint64_t key,
                           uint64_t base, const uint64_t* device_base, bool vec) {
  using C = acc_t<T>;
  if (device_base != nullptr) base += *device_base;  // a CUDA graph's replay: the counter it started at
  const int64_t blocks = (n + 3) / 4;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; b < blocks; b += step) {
    const random_math::PhiloxBlock w = random_math::philox4x32(key, base + static_cast<uint64_t>(b));
    if (vec && 4 * b + 4 <= n) {
      const Pack<T, 4> xv = reinterpret_cast<const Pack<T, 4>*>(x)[b];
      Pack<T, 4> yv;
      Pack<uint8_t, 4> mv;
#pragma unroll
      for (int lane = 0; lane < 4; ++lane) {
        const uint32_t keep = (w.v[lane] >> 8) < threshold;
        mv.v[lane] = static_cast<uint8_t>(keep);
        // x * (keep * scale), in this order, as the CPU rounds it.
        yv.v[lane] = convert<T>(convert<C>(xv.v[lane]) * (static_cast<C>(keep) * scale));
      }
      reinterpret_cast<Pack<T, 4>*>(y)[b] = yv;
      reinterpret_cast<Pack<uint8_t, 4>*>(mask)[b] = mv;
    } else {
      for (int lane = 0; lane < 4; ++lane) {
        const int64_t e = 4 * b + lane;
        if (e >= n) break;
        const uint32_t keep = (w.v[lane] >> 8) < threshold;
        mask[e] = static_cast<uint8_t>(keep);
        y[e] = convert<T>(convert<C>(x[e]) * (static_cast<C>(keep) * scale));
      }
    }
  }
}

bool aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

}  // namespace

// --- kernel-table entries ---

void copy(const Tensor& dst, const Tensor& src) {
  if (dst.numel() == 0) return;
  // Same dtype, both dense in the same layout: one device-to-device copy.
  if (dst.dtype() == src.dtype() && dst.shape() == src.shape() && dst.is_contiguous() && src.is_contiguous()) {
    if (dst.raw_data() == src.raw_data()) return;
    cudaStream_t stream = stream_for(dst);
    check(cudaMemcpyAsync(dst.raw_data(), src.raw_data(), dst.nbytes(), cudaMemcpyDeviceToDevice, stream), "copy");
    return;
  }
  FT_CUDA_DISPATCH_ALL(dst.dtype(), "copy", [&] {
    using To = scalar_t;
    FT_CUDA_DISPATCH_ALL(src.dtype(), "copy",
                         [&] { launch_elementwise<To, scalar_t>("copy", dst, {&src}, IdentityFn{}); });
  });
}

void fill(const Tensor& dst, Scalar value) {
  if (dst.numel() == 0) return;
  const uint64_t bits = fill_bits(dst.dtype(), value);
  const size_t es = dst.element_size();
  // A dense fill whose bytes are all equal (zeros above all) is a memset.
  const backend::StridedLoop L = backend::make_loop(dst, {});
  const bool dense = L.ndim == 1 && (L.numel == 1 || L.strides[0][0] == static_cast<int64_t>(es));
  bool uniform_bytes = true;
  for (size_t k = 1; k < es; ++k) uniform_bytes &= ((bits >> (8 * k)) & 0xff) == (bits & 0xff);
  if (dense && uniform_bytes) {
    cudaStream_t stream = stream_for(dst);
    check(cudaMemsetAsync(L.base[0], static_cast<int>(bits & 0xff), L.numel * es, stream), "fill");
    return;
  }
  switch (es) {
    case 1: return launch_elementwise<uint8_t>("fill", dst, {}, ConstantFn<uint8_t>{static_cast<uint8_t>(bits)});
    case 2: return launch_elementwise<uint16_t>("fill", dst, {}, ConstantFn<uint16_t>{static_cast<uint16_t>(bits)});
    case 4: return launch_elementwise<uint32_t>("fill", dst, {}, ConstantFn<uint32_t>{static_cast<uint32_t>(bits)});
    case 8: return launch_elementwise<uint64_t>("fill", dst, {}, ConstantFn<uint64_t>{bits});
  }
  FT_FAIL("fill: unexpected element size ", es);
}

void unary(UnaryOp op, const Tensor& x, const Tensor& out) {
  FT_CUDA_DISPATCH_ALL(x.dtype(), "unary", [&] {
    if constexpr (std::is_same_v<scalar_t, bool>) {
      FT_FAIL("elementwise op on a bool tensor is not supported");
    } else {
      unary_typed<scalar_t>(op, x, out);
    }
  });
}

void unary_backward(UnaryOp op, const Tensor& grad, const Tensor& x, const Tensor& y, const Tensor& out) {
  // Ops that save their output pass it as both x and y; an undefined y means "use x".
  FT_CUDA_DISPATCH_FLOATING(x.dtype(), "unary backward",
                            [&] { unary_backward_typed<scalar_t>(op, grad, x, y.defined() ? y : x, out); });
}

void binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  FT_CUDA_DISPATCH_ALL(a.dtype(), "binary", [&] { binary_typed<scalar_t>(op, a, b, out); });
}

void where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) {
  FT_CUDA_DISPATCH_ALL(a.dtype(), "where", [&] {
    launch_elementwise<scalar_t, bool, scalar_t, scalar_t>("where", out, {&cond, &a, &b}, WhereFn{});
  });
}

void clamp(const Tensor& x, std::optional<double> lo, std::optional<double> hi, const Tensor& out) {
  FT_CUDA_DISPATCH_ALL(x.dtype(), "clamp", [&] {
    using C = acc_t<scalar_t>;
    if constexpr (std::is_same_v<scalar_t, bool>) {
      FT_FAIL("clamp: bool tensors are not supported");
    } else {
      const C l = lo ? static_cast<C>(*lo) : std::numeric_limits<C>::lowest();
      const C h = hi ? static_cast<C>(*hi) : std::numeric_limits<C>::max();
      launch_elementwise<scalar_t, scalar_t>("clamp", out, {&x}, ClampFn<C>{l, h});
    }
  });
}

void clamp_backward(const Tensor& grad, const Tensor& x, std::optional<double> lo, std::optional<double> hi,
                    const Tensor& out) {
  FT_CUDA_DISPATCH_FLOATING(x.dtype(), "clamp backward", [&] {
    using C = acc_t<scalar_t>;
    const C l = lo ? static_cast<C>(*lo) : std::numeric_limits<C>::lowest();
    const C h = hi ? static_cast<C>(*hi) : std::numeric_limits<C>::max();
    launch_elementwise<scalar_t, scalar_t, scalar_t>("clamp_backward", out, {&grad, &x}, ClampBackwardFn<C>{l, h});
  });
}

void add_inplace(const Tensor& a, const Tensor& b, double alpha) {
  FT_CUDA_DISPATCH_ALL(a.dtype(), "add_", [&] {
    using C = acc_t<scalar_t>;
    if constexpr (std::is_same_v<scalar_t, bool>) {
      FT_FAIL("add_: bool tensors are not supported");
    } else {
      // a is operand 0 and 1: each element is read and written by the same thread.
      launch_elementwise<scalar_t, scalar_t, scalar_t>("add_inplace", a, {&a, &b}, AxpyFn<C>{static_cast<C>(alpha)});
    }
  });
}

void random_fill(const Tensor& out, const RandomFill& fill) {
  const int64_t n = out.numel();
  if (n == 0) return;
  cudaStream_t stream = stream_for(out);
  FT_CUDA_DISPATCH_ALL(out.dtype(), "random", [&] {
    // Contiguous (the caller checked): element i is at p[i].
    scalar_t* p = static_cast<scalar_t*>(out.raw_data());
    switch (fill.distribution) {
      case RandomDistribution::Uniform01:
        return launch_random_fill<scalar_t, RandomDistribution::Uniform01>(p, n, fill, stream);
      case RandomDistribution::Uniform:
        return launch_random_fill<scalar_t, RandomDistribution::Uniform>(p, n, fill, stream);
      case RandomDistribution::StandardNormal:
        return launch_random_fill<scalar_t, RandomDistribution::StandardNormal>(p, n, fill, stream);
      case RandomDistribution::Normal:
        return launch_random_fill<scalar_t, RandomDistribution::Normal>(p, n, fill, stream);
      case RandomDistribution::RandInt:
        return launch_random_fill<scalar_t, RandomDistribution::RandInt>(p, n, fill, stream);
      case RandomDistribution::Bernoulli:
        return launch_random_fill<scalar_t, RandomDistribution::Bernoulli>(p, n, fill, stream);
    }
    FT_FAIL("random fill: invalid distribution ", static_cast<int>(fill.distribution));
  });
}

void dropout_forward(const Tensor& x, float keep, double scale, const PhiloxDraw& draw, const Tensor& y,
                     const Tensor& mask) {
  const int64_t n = x.numel();
  if (n == 0) return;
  // (w >> 8) < ceil(keep * 2^24) <=> uniform_from_word(w) < keep; computed as the CPU computes it.
  const uint32_t threshold = static_cast<uint32_t>(std::ceil(keep * 16777216.0f));
  cudaStream_t stream = stream_for(x);
  FT_CUDA_DISPATCH_FLOATING(x.dtype(), "dropout", [&] {
    using T = scalar_t;
    const T* xp = static_cast<const T*>(x.raw_data());
    T* yp = static_cast<T*>(y.raw_data());
    uint8_t* mp = static_cast<uint8_t*>(mask.raw_data());
    const bool vec = aligned(xp, sizeof(Pack<T, 4>)) && aligned(yp, sizeof(Pack<T, 4>)) && aligned(mp, 4);
    dropout_forward_kernel<T><<<grid_for((n + 3) / 4, kThreads), kThreads, 0, stream>>>(
        xp, yp, mp, n, threshold, static_cast<acc_t<T>>(scale), draw.key, draw.base, draw.device_base, vec);
    check_launch("dropout_forward");
  });
}

void dropout_backward(const Tensor& dy, const Tensor& mask, double scale, const Tensor& dx) {
  FT_CUDA_DISPATCH_FLOATING(dy.dtype(), "dropout", [&] {
    using C = acc_t<scalar_t>;
    launch_elementwise<scalar_t, scalar_t, uint8_t>("dropout_backward", dx, {&dy, &mask},
                                                    DropoutBackwardFn<C>{static_cast<C>(scale)});
  });
}

}  // namespace ft::cuda
