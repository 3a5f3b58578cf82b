// CPU loops of the elementwise family: one vectorisable loop per op of the lists in
// backend/elementwise_math.h, plus where, clamp and in-place add.
#include "backend/cpu/elementwise.h"

#include "backend/cpu/dispatch.h"
#include "backend/cpu/loops.h"

namespace ft::cpu {

using math::BinaryOp;
using math::UnaryOp;

namespace {

// Loop bodies are forced inline, as FT_HD formulas are: GCC inlines a lambda into its loop by
// size heuristics, and once the cases were generated it stopped doing so for tanh-GELU's
// backward, and the loop went scalar (docs/PERF.md, "Figures formerly in code comments").
#define FT_LOOP_BODY __attribute__((always_inline))

// One loop per op, selected outside the loop, so each body is a single formula the compiler
// can vectorise (a switch inside the loop is many times slower). The cases come
// from the op lists in elementwise_math.h; an integer tensor only reaches ops whose domain
// admits it (the op checked), the rest of the integer instantiation is never compiled.
#define FT_UNARY_CASE(Op, ...)                                                                   \
  case UnaryOp::Op:                                                                              \
    if constexpr (!std::is_integral_v<T> || math::accepts_integers(UnaryOp::Op)) {               \
      unary_loop<T, T>(out, x, [](C v) FT_LOOP_BODY { return math::unary<C>(UnaryOp::Op, v); }); \
      return;                                                                                    \
    }                                                                                            \
    break;

template <class T>
void unary_typed(UnaryOp op, const Tensor& x, const Tensor& out) {
  using C = compute_t<T>;
  switch (op) { FT_UNARY_OPS(FT_UNARY_CASE) }
  FT_FAIL("elementwise op: expected a floating-point tensor, found ", dtype_name(x.dtype()));
}
#undef FT_UNARY_CASE

#define FT_UNARY_BACKWARD_CASE(Op, ...)                                       \
  case UnaryOp::Op:                                                           \
    ternary_loop<T, T, T>(out, grad, x, y, [](C g, C xv, C yv) FT_LOOP_BODY { \
      return g * math::unary_derivative<C>(UnaryOp::Op, xv, yv);              \
    });                                                                       \
    return;

// grad * f'(x, y), one loop per op as in the forward.
template <class T>
void unary_backward_typed(UnaryOp op, const Tensor& grad, const Tensor& x, const Tensor& y, const Tensor& out) {
  using C = compute_t<T>;
  switch (op) { FT_UNARY_OPS(FT_UNARY_BACKWARD_CASE) }
}
#undef FT_UNARY_BACKWARD_CASE

// Comparisons write bool for every dtype; arithmetic writes the operands' dtype and refuses bool.
#define FT_BINARY_CASE(Op, name, kind, formula)                                                                   \
  case BinaryOp::Op:                                                                                              \
    if constexpr (math::BinaryKind::kind == math::BinaryKind::Comparison) {                                       \
      binary_loop<bool, T>(out, a, b, [](C x, C y) FT_LOOP_BODY { return math::binary<C>(BinaryOp::Op, x, y); }); \
      return;                                                                                                     \
    } else if constexpr (!std::is_same_v<T, bool>) {                                                              \
      binary_loop<T, T>(out, a, b, [](C x, C y) FT_LOOP_BODY { return math::binary<C>(BinaryOp::Op, x, y); });    \
      return;                                                                                                     \
    }                                                                                                             \
    break;

template <class T>
void binary_typed(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  using C = compute_t<T>;
  switch (op) { FT_BINARY_OPS(FT_BINARY_CASE) }
  FT_FAIL("arithmetic on bool tensors is not supported; convert to an integer or floating dtype first");
}
#undef FT_BINARY_CASE
#undef FT_LOOP_BODY

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
