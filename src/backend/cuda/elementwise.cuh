// The elementwise loop the CUDA kernels of elementwise.cu, copy.cu (copy, fill) and dropout.cu
// (its backward) share: launch_elementwise computes out[i] = f(in_0[i], ...) over the broadcast
// loop of backend/strided_loop.h for a device functor f, plus the block size those files and
// random_fill.cu launch with.
//
// Every kernel of these files is bound by memory traffic: each input element is read once and
// each output element written once (in-place add reads and writes its destination; dropout
// forward writes y and a one-byte mask, its backward reads the mask), a few flops apiece, with the
// Philox rounds (ten 32x32->64-bit multiply rounds per four elements) the heaviest arithmetic. So
// the work is in the addressing: when every operand is dense or a broadcast scalar, with suitably
// aligned bases, one thread handles a 16-byte vector of the widest operand per step; when each
// operand's innermost dimension is dense and aligned, one thread handles a vector of that
// dimension per step; any other layout walks the byte strides (broadcast, merged dimensions) one
// element per step. All are grid-stride loops. Values are converted to the compute type (acc_t)
// on load and back on store: 16-bit floats compute in f32 and round to nearest even, as on the
// CPU.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <utility>

#include "backend/cuda/common.cuh"
#include "backend/cuda/vectors.cuh"

namespace ft::cuda {

// Threads per block of every kernel of these files.
constexpr int kThreads = 256;
constexpr int kMaxArgs = backend::StridedLoop::kMaxArgs;

// kVec elements of T move as one access: vectors.cuh's Pack<T, kVec>, aligned to its size so the
// compiler emits a single vector load or store (at most 16 bytes: kVec is chosen from the widest
// operand).

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

}  // namespace ft::cuda
