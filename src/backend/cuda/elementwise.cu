// CUDA kernels of the elementwise family: the unary and binary ops of the lists in
// backend/elementwise_math.h and the fused unary backward, where, clamp and its backward, and
// in-place add, and SwiGLU's fused silu(gate) * up (kernel-table entries unary, unary_backward,
// binary, where, clamp, clamp_backward, add_inplace, silu_mul, silu_mul_backward). Semantics are the CPU backend's
// (backend/cpu/elementwise.cpp).
//
// Per element: y = op(x); g * op'(x, y) for the unary backward (y the forward's output, for ops
// that save it); c ? a : b; clamp(x, lo, hi) with NaN passed through and its backward g where
// lo <= x <= hi, else 0; a + alpha * b; silu(g) * u = g sigmoid(g) u and its gradients
// du = dy g s, dg = dy u s (1 + g (1 - s)) with s = sigmoid(g), over rows with their own strides. The formulas are the
// ones the CPU backend calls (elementwise_math.h, FT_HD functions), one kernel per op selected on the host, so the op
// switch folds away at compile time. The loop (vector, inner-dense or strided) is
// elementwise.cuh's.
#include <limits>
#include <type_traits>

#include "backend/cuda/common.cuh"
#include "backend/cuda/elementwise.cuh"
#include "backend/cuda/kernels.h"
#include "backend/elementwise_math.h"

namespace ft::cuda {

using math::BinaryOp;
using math::UnaryOp;

namespace {

// --- per-element functors (device code; the op is a template argument so its switch folds) ---

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

// --- silu_mul: [R, F] rows with their own row strides (kernel_list.h), one thread per element ---

template <class T>
struct Rows {
  T* p;
  int64_t ld;  // elements between rows; the last dim is dense
  __device__ __forceinline__ T* at(int64_t r, int64_t j) const { return p + r * ld + j; }
};
template <class T>
Rows<T> rows_of(const Tensor& t) {
  return {reinterpret_cast<T*>(t.raw_data()), t.stride(0)};
}

template <class T>
__global__ void silu_mul_kernel(Rows<const T> gate, Rows<const T> up, Rows<T> out, int64_t F, int64_t n) {
  using A = acc_t<T>;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / F, j = i - r * F;
    const A g = load(gate.at(r, j));
    *out.at(r, j) = convert<T>(g * math::sigmoid_(g) * load(up.at(r, j)));
  }
}

// One exp per element for both gradients: silu'(g) = s (1 + g (1 - s)) with s = sigmoid(g).
template <class T>
__global__ void silu_mul_backward_kernel(Rows<const T> grad, Rows<const T> gate, Rows<const T> up, Rows<T> dgate,
                                         Rows<T> dup, int64_t F, int64_t n) {
  using A = acc_t<T>;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / F, j = i - r * F;
    const A d = load(grad.at(r, j)), g = load(gate.at(r, j)), u = load(up.at(r, j));
    const A s = math::sigmoid_(g);
    *dup.at(r, j) = convert<T>(d * g * s);
    *dgate.at(r, j) = convert<T>(d * u * s * (A(1) + g * (A(1) - s)));
  }
}

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

}  // namespace

// --- kernel-table entries ---

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

void silu_mul(const Tensor& gate, const Tensor& up, const Tensor& out) {
  const int64_t n = gate.numel();
  if (n == 0) return;
  FT_CUDA_DISPATCH_FLOATING(gate.dtype(), "silu_mul", [&] {
    using T = scalar_t;
    silu_mul_kernel<T><<<grid_for(n), 256, 0, stream_for(gate)>>>(rows_of<const T>(gate), rows_of<const T>(up),
                                                                  rows_of<T>(out), gate.size(1), n);
    check_launch("silu_mul");
  });
}

void silu_mul_backward(const Tensor& grad, const Tensor& gate, const Tensor& up, const Tensor& dgate,
                       const Tensor& dup) {
  const int64_t n = gate.numel();
  if (n == 0) return;
  FT_CUDA_DISPATCH_FLOATING(gate.dtype(), "silu_mul_backward", [&] {
    using T = scalar_t;
    silu_mul_backward_kernel<T><<<grid_for(n), 256, 0, stream_for(gate)>>>(
        rows_of<const T>(grad), rows_of<const T>(gate), rows_of<const T>(up), rows_of<T>(dgate), rows_of<T>(dup),
        gate.size(1), n);
    check_launch("silu_mul_backward");
  });
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
}  // namespace ft::cuda
