#include "backend/cpu/elementwise.h"

#include "backend/cpu/dispatch.h"
#include "backend/cpu/loops.h"

namespace ft::cpu {

using math::BinaryOp;
using math::UnaryOp;

namespace {

// One loop per op, selected outside the loop, so each body is a single formula the compiler
// can vectorise.
#define FT_UNARY_CASE(OP) \
  case UnaryOp::OP: unary_loop<T, T>(out, x, [](C v) { return math::unary<C>(UnaryOp::OP, v); }); return;

template <class T>
void unary_typed(UnaryOp op, const Tensor& x, const Tensor& out) {
  using C = compute_t<T>;
  switch (op) {
    FT_UNARY_CASE(Neg)
    FT_UNARY_CASE(Abs)
    FT_UNARY_CASE(Square)
    FT_UNARY_CASE(Relu)
    default: break;
  }
  if constexpr (std::is_integral_v<T>) {
    FT_FAIL("elementwise op: expected a floating-point tensor, found ", dtype_name(x.dtype()));
  } else {
    switch (op) {
      FT_UNARY_CASE(Exp)
      FT_UNARY_CASE(Log)
      FT_UNARY_CASE(Sqrt)
      FT_UNARY_CASE(Rsqrt)
      FT_UNARY_CASE(Tanh)
      FT_UNARY_CASE(Sigmoid)
      FT_UNARY_CASE(GeluErf)
      FT_UNARY_CASE(GeluTanh)
      FT_UNARY_CASE(Silu)
      default: break;
    }
  }
}
#undef FT_UNARY_CASE

#define FT_BINARY_CASE(OUT, OP) \
  case BinaryOp::OP: binary_loop<OUT, T>(out, a, b, [](C x, C y) { return math::binary<C>(BinaryOp::OP, x, y); }); return;

template <class T>
void binary_typed(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  using C = compute_t<T>;
  switch (op) {
    FT_BINARY_CASE(bool, Eq)
    FT_BINARY_CASE(bool, Ne)
    FT_BINARY_CASE(bool, Lt)
    FT_BINARY_CASE(bool, Le)
    FT_BINARY_CASE(bool, Gt)
    FT_BINARY_CASE(bool, Ge)
    default: break;
  }
  if constexpr (std::is_same_v<T, bool>) {
    FT_FAIL("arithmetic on bool tensors is not supported; convert to an integer or floating dtype first");
  } else {
    switch (op) {
      FT_BINARY_CASE(T, Add)
      FT_BINARY_CASE(T, Sub)
      FT_BINARY_CASE(T, Mul)
      FT_BINARY_CASE(T, Div)
      FT_BINARY_CASE(T, Max)
      FT_BINARY_CASE(T, Min)
      FT_BINARY_CASE(T, Pow)
      default: break;
    }
  }
}
#undef FT_BINARY_CASE

}  // namespace

void unary(UnaryOp op, const Tensor& x, const Tensor& out) {
  FT_DISPATCH_ALL(x.dtype(), "unary", [&] {
    if constexpr (std::is_same_v<scalar_t, bool>) {
      FT_FAIL("elementwise op on a bool tensor is not supported");
    } else {
      unary_typed<scalar_t>(op, x, out);
    }
  });
}

// grad * f'(x, y), one loop per op (selected outside the loop, as in the forward) so each body
// vectorises; a switch inside the loop made tanh-GELU's backward many times slower (docs/PERF.md).
#define FT_UNARY_BACKWARD_CASE(OP)                                                                    \
  case UnaryOp::OP:                                                                                 \
    ternary_loop<T, T, T>(out, grad, x, y, [](C g, C xv, C yv) {                                    \
      return g * math::unary_derivative<C>(UnaryOp::OP, xv, yv);                                    \
    });                                                                                             \
    return;

template <class T>
void unary_backward_typed(UnaryOp op, const Tensor& grad, const Tensor& x, const Tensor& y, const Tensor& out) {
  using C = compute_t<T>;
  switch (op) {
    FT_UNARY_BACKWARD_CASE(Neg)
    FT_UNARY_BACKWARD_CASE(Abs)
    FT_UNARY_BACKWARD_CASE(Exp)
    FT_UNARY_BACKWARD_CASE(Log)
    FT_UNARY_BACKWARD_CASE(Sqrt)
    FT_UNARY_BACKWARD_CASE(Rsqrt)
    FT_UNARY_BACKWARD_CASE(Square)
    FT_UNARY_BACKWARD_CASE(Tanh)
    FT_UNARY_BACKWARD_CASE(Sigmoid)
    FT_UNARY_BACKWARD_CASE(Relu)
    FT_UNARY_BACKWARD_CASE(GeluErf)
    FT_UNARY_BACKWARD_CASE(GeluTanh)
    FT_UNARY_BACKWARD_CASE(Silu)
  }
}
#undef FT_UNARY_BACKWARD_CASE

void unary_backward(UnaryOp op, const Tensor& grad, const Tensor& x, const Tensor& y, const Tensor& out) {
  FT_DISPATCH_FLOATING(x.dtype(), "unary backward",
                       [&] { unary_backward_typed<scalar_t>(op, grad, x, y.defined() ? y : x, out); });
}

void binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  FT_DISPATCH_ALL(a.dtype(), "binary", [&] { binary_typed<scalar_t>(op, a, b, out); });
}

void where(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) {
  FT_DISPATCH_ALL(a.dtype(), "where", [&] {
    using C = compute_t<scalar_t>;
    ternary_loop<scalar_t, bool, scalar_t>(out, cond, a, b, [](bool c, C x, C y) { return c ? x : y; });
  });
}

void clamp(const Tensor& x, std::optional<double> lo, std::optional<double> hi, const Tensor& out) {
  FT_DISPATCH_ALL(x.dtype(), "clamp", [&] {
    using C = compute_t<scalar_t>;
    if constexpr (std::is_same_v<scalar_t, bool>) {
      FT_FAIL("clamp: bool tensors are not supported");
    } else {
      C l = lo ? static_cast<C>(*lo) : std::numeric_limits<C>::lowest();
      C h = hi ? static_cast<C>(*hi) : std::numeric_limits<C>::max();
      unary_loop<scalar_t, scalar_t>(out, x, [l, h](C v) { return v != v ? v : (v < l ? l : (v > h ? h : v)); });
    }
  });
}

void clamp_backward(const Tensor& grad, const Tensor& x, std::optional<double> lo, std::optional<double> hi,
                    const Tensor& out) {
  FT_DISPATCH_FLOATING(x.dtype(), "clamp backward", [&] {
    using C = compute_t<scalar_t>;
    C l = lo ? static_cast<C>(*lo) : std::numeric_limits<C>::lowest();
    C h = hi ? static_cast<C>(*hi) : std::numeric_limits<C>::max();
    binary_loop<scalar_t, scalar_t>(out, grad, x, [l, h](C g, C v) { return (v >= l && v <= h) ? g : C(0); });
  });
}

void add_inplace(const Tensor& a, const Tensor& b, double alpha) {
  FT_DISPATCH_ALL(a.dtype(), "add_", [&] {
    using C = compute_t<scalar_t>;
    if constexpr (std::is_same_v<scalar_t, bool>) {
      FT_FAIL("add_: bool tensors are not supported");
    } else {
      C al = static_cast<C>(alpha);
      binary_loop<scalar_t, scalar_t>(a, a, b, [al](C x, C y) { return x + al * y; });
    }
  });
}

}  // namespace ft::cpu
