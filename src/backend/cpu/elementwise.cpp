// CPU loops of the elementwise family: one vectorisable loop per op of the lists in
// backend/elementwise_math.h, plus where, clamp, in-place add and the fused silu_mul
// (out = silu(g) * u = g sigmoid(g) u; backward dg = dy u s (1 + g (1 - s)), du = dy g s with
// s = sigmoid(g): both gradients from one read of dy, g and u).
#include "backend/cpu/elementwise.h"

#include <algorithm>

#include "backend/cpu/copy.h"
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

// --- silu_mul: rows [R, F] with their own row strides, in compute-type tiles ---

// Elements per parallel chunk of rows: below this a row block is not worth another thread.
constexpr int64_t kRowGrainElements = 1 << 15;

// body(r, j0, m) over every tile [j0, j0 + m) of every row r < R, rows split over threads, tiles
// of kHalfTile so that a widened 16-bit operand stays in L1 beside the others.
template <class Body>
void for_row_tiles(int64_t R, int64_t F, Body&& body) {
  parallel_for(0, R, std::max<int64_t>(1, kRowGrainElements / std::max<int64_t>(F, 1)), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) for_half_tiles(F, [&](int64_t j0, int64_t m) { body(r, j0, m); });
  });
}

// Row r of a [R, F] operand with a dense last dim and any row stride.
template <class T>
struct RowsView {
  T* base;
  int64_t ld;
  explicit RowsView(const Tensor& t) : base(static_cast<T*>(t.raw_data())), ld(t.stride(0)) {}
  T* row(int64_t r) const { return base + r * ld; }
};

template <class T>
void silu_mul_typed(const Tensor& gate, const Tensor& up, const Tensor& out) {
  using C = compute_t<T>;
  const RowsView<const T> G(gate), U(up);
  const RowsView<T> O(out);
  for_row_tiles(gate.size(0), gate.size(1), [&](int64_t r, int64_t j0, int64_t m) FT_LOOP_BODY {
    C gb[kHalfTile], ub[kHalfTile];
    const C* g = widened_run(G.row(r) + j0, m, gb);
    const C* u = widened_run(U.row(r) + j0, m, ub);
    store_run(O.row(r) + j0, m, [&](int64_t i) FT_LOOP_BODY { return g[i] * math::sigmoid_(g[i]) * u[i]; });
  });
}

// With s = sigmoid(g): d/dg silu(g) = s (1 + g (1 - s)), so one exp per element serves both
// gradients.
template <class T>
void silu_mul_backward_typed(const Tensor& grad, const Tensor& gate, const Tensor& up, const Tensor& dgate,
                             const Tensor& dup) {
  using C = compute_t<T>;
  const RowsView<const T> D(grad), G(gate), U(up);
  const RowsView<T> DG(dgate), DU(dup);
  for_row_tiles(gate.size(0), gate.size(1), [&](int64_t r, int64_t j0, int64_t m) FT_LOOP_BODY {
    C db[kHalfTile], gb[kHalfTile], ub[kHalfTile], s[kHalfTile];
    const C* d = widened_run(D.row(r) + j0, m, db);
    const C* g = widened_run(G.row(r) + j0, m, gb);
    const C* u = widened_run(U.row(r) + j0, m, ub);
#pragma omp simd
    for (int64_t i = 0; i < m; ++i) s[i] = math::sigmoid_(g[i]);
    store_run(DU.row(r) + j0, m, [&](int64_t i) FT_LOOP_BODY { return d[i] * g[i] * s[i]; });
    store_run(DG.row(r) + j0, m,
              [&](int64_t i) FT_LOOP_BODY { return d[i] * u[i] * s[i] * (C(1) + g[i] * (C(1) - s[i])); });
  });
}

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

void silu_mul(const Tensor& gate, const Tensor& up, const Tensor& out) {
  FT_DISPATCH_FLOATING(gate.dtype(), "silu_mul", [&] { silu_mul_typed<scalar_t>(gate, up, out); });
}

void silu_mul_backward(const Tensor& grad, const Tensor& gate, const Tensor& up, const Tensor& dgate,
                       const Tensor& dup) {
  FT_DISPATCH_FLOATING(gate.dtype(), "silu_mul backward",
                       [&] { silu_mul_backward_typed<scalar_t>(grad, gate, up, dgate, dup); });
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
