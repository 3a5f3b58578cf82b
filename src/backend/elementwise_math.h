// Per-element formulas of the elementwise ops and their derivatives, shared by the CPU kernels
// and (compiled by nvcc) the CUDA kernels. Each unary and binary op is one line of the lists
// below (FT_UNARY_OPS, FT_BINARY_OPS); the enums, the formula switches, the op names, the CPU
// kernel cases and the op functions in src/ops/elementwise.cpp are all generated from them.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#ifdef __CUDACC__
#define FT_HD __host__ __device__ __forceinline__
#else
// Always inlined: the op argument must fold to a constant inside each kernel's loop, or the
// switch runs per element and the loop does not vectorise (GCC once declined to inline
// unary_derivative, and the tanh-GELU derivative became many times slower; docs/PERF.md).
#define FT_HD inline __attribute__((always_inline))
#endif

#ifndef __CUDACC__
#include "backend/cpu/fast_exp.h"
#endif

namespace ft::math {

// exp for the formulas below: on the CPU, f32 uses the vectorisable fast_exp (glibc's expf is a
// scalar call that would dominate every activation); f64 and device code use the library exp.
template <class T>
FT_HD T exp_(T x) {
#ifndef __CUDACC__
  if constexpr (std::is_same_v<T, float>) return ft::cpu::fast_exp(x);
#endif
  using std::exp;
  return exp(x);
}

// tanh through exp: tanh(x) = 1 - 2 / (exp(2x) + 1), with its odd Taylor series near 0 where
// that form cancels.
template <class T>
FT_HD T tanh_(T x) {
  if constexpr (std::is_same_v<T, float>) {
    const T big = T(1) - T(2) / (exp_(T(2) * x) + T(1));
    const T x2 = x * x;
    const T small = x * (T(1) + x2 * (T(-1.0 / 3) + x2 * (T(2.0 / 15) + x2 * T(-17.0 / 315))));
    return (x > T(-0.0625) && x < T(0.0625)) ? small : big;
  } else {
    using std::tanh;
    return tanh(x);
  }
}

// log(1 + t) for t in [-0.3, 1]. On the CPU, f32 is computed as 2 atanh(s) with s = t / (2 + t),
// |s| <= 1/3, whose odd series reaches f32 precision in 8 terms (<= 2 ulp): it vectorises, where
// glibc's log1pf is a scalar call (40 ns per element in softplus). f64 and device code use log1p.
template <class T>
FT_HD T log1p_unit_(T t) {
#ifndef __CUDACC__
  if constexpr (std::is_same_v<T, float>) {
    const T s = t / (T(2) + t), s2 = s * s;
    T p = T(1.0 / 15);
    p = p * s2 + T(1.0 / 13);
    p = p * s2 + T(1.0 / 11);
    p = p * s2 + T(1.0 / 9);
    p = p * s2 + T(1.0 / 7);
    p = p * s2 + T(1.0 / 5);
    p = p * s2 + T(1.0 / 3);
    return T(2) * s + T(2) * s * s2 * p;
  }
#endif
  using std::log1p;
  return log1p(t);
}

// log for the formulas below. On the CPU, f32 splits x = 2^e m with m in [sqrt(1/2), sqrt(2)) by
// integer arithmetic on its bits (subnormals scaled by 2^23 first) and takes e ln2 + log1p(m - 1)
// through log1p_unit_ above: it vectorises (given -fno-trapping-math, CMakeLists.txt), where
// glibc's logf is a scalar call (3x slower than PyTorch's log; docs/PERF.md). 0 gives -inf,
// negatives and NaN give NaN, inf gives inf. f64 and device code use the library log.
template <class T>
FT_HD T log_(T x) {
#ifndef __CUDACC__
  if constexpr (std::is_same_v<T, float>) {
    const bool subnormal = x < T(1.17549435e-38f);
    const T xs = subnormal ? x * T(8388608.0f) : x;
    uint32_t u;
    std::memcpy(&u, &xs, sizeof(u));
    // Offsetting by sqrt(1/2)'s bits puts the exponent boundary at sqrt(1/2) instead of 1.
    const uint32_t v = u - 0x3f3504f3u;
    const uint32_t mbits = (v & 0x007fffffu) + 0x3f3504f3u;
    T m;
    std::memcpy(&m, &mbits, sizeof(m));
    const T ef = static_cast<T>(static_cast<int32_t>(v) >> 23) - (subnormal ? T(23) : T(0));
    // ln2 in two parts: e * 0.693359375 is exact, the small remainder carries the rest.
    const T r = ef * T(0.693359375f) + (log1p_unit_(m - T(1)) + ef * T(-2.12194440e-4f));
    constexpr T kInf = std::numeric_limits<T>::infinity();
    // NaN fails both comparisons: NaN.
    return x > T(0) ? (x < kInf ? r : kInf) : (x == T(0) ? -kInf : std::numeric_limits<T>::quiet_NaN());
  }
#endif
  using std::log;
  return log(x);
}

// c[0] x^(N-1) + c[1] x^(N-2) + ... + c[N-1] by Horner's scheme.
template <class T, int N>
FT_HD T horner_(T x, const float (&c)[N]) {
  T r = T(c[0]);
  for (int i = 1; i < N; ++i) r = r * x + T(c[i]);
  return r;
}

constexpr double kSqrt2OverPi = 0.7978845608028654;
constexpr double kInvSqrt2 = 0.7071067811865476;
constexpr double kInvSqrt2Pi = 0.3989422804014327;

// The standard normal CDF Phi(x) = 0.5 erfc(-x/sqrt2), exact GELU's gate. On the CPU, f32 is
// branch-free and vectorises (glibc's erff is a scalar call, and made exact GELU 12x slower than
// PyTorch's; docs/PERF.md). With z = x/sqrt2:
// - |z| <= 0.9: 0.5 + 0.5 z P(z^2);
// - past that, h = 0.5 erfc(|z|) = 0.5 e^{-z^2} Q(|z|), where Q(z) = erfc(z) e^{z^2} is smooth and
//   fitted in |z| - 2.45 on [0.9, 4]; Phi = h for x < 0 and 1 - h for x > 0. Taking h itself for
//   x < 0, rather than 0.5 (1 + erf(z)), keeps Phi's relative accuracy in the negative tail,
//   where 1 + erf(z) cancels;
// - past |z| = 3.92, 0 or 1 (Phi(-5.54) = 1.5e-8).
// P and Q are least-squares fits at Chebyshev nodes against 30-digit erf (mpmath). e^{-z^2} is
// written exp_(T(-0.5) * x * x), the expression of the density in GELU's derivative, so a loop
// computing both evaluates the exp once. f64 and device code use the library erfc.
template <class T>
FT_HD T normal_cdf_(T x) {
#ifndef __CUDACC__
  if constexpr (std::is_same_v<T, float>) {
    // P(z^2) on |z| <= 0.9 and Q(|z| - 2.45) on [0.9, 4], highest power first.
    static constexpr float kP[] = {-6.106989458e-04f, 5.015357397e-03f,  -2.678133920e-02f,
                                   1.128221229e-01f,  -3.761253059e-01f, 1.128379107e+00f};
    static constexpr float kQ[] = {1.298582077e-07f, -5.154042242e-07f, 1.061642820e-06f, -4.144072591e-06f,
                                   1.830378278e-05f, -6.663234672e-05f, 2.325126698e-04f, -7.993957261e-04f,
                                   2.658724319e-03f, -8.514073677e-03f, 2.617615834e-02f, -7.690239698e-02f,
                                   2.145870924e-01f};
    const T z = x * T(kInvSqrt2), az = z < T(0) ? -z : z;
    const T central = T(0.5f) + T(0.5f) * z * horner_(z * z, kP);
    // Past 3.92 Q may overflow and the exp be 0: the select, not the product, gives the tail 0
    // there. A NaN x fails every comparison and gives 1 - NaN.
    const T tail = az > T(3.92f) ? T(0) : T(0.5f) * exp_(T(-0.5) * x * x) * horner_(az - T(2.45f), kQ);
    return az <= T(0.9f) ? central : (x < T(0) ? tail : T(1) - tail);
  }
#endif
  using std::erfc;
  return T(0.5) * erfc(-x * T(kInvSqrt2));
}

// Formulas too long for one line of the lists. Helpers are FT_HD too: one that is not inlined
// turns its caller's loop scalar.
template <class T>
FT_HD T sigmoid_(T x) {
  return T(1) / (T(1) + exp_(-x));
}
// tanh-GELU as x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3): 0.5 (1 + tanh(u)) = sigmoid(2u)
// exactly, and the sigmoid form takes one exp and one division, with no 1 + tanh cancelling for
// negative x. Its derivative, with s = sigmoid(2u): s + 2 x s (1 - s) u'.
template <class T>
FT_HD T gelu_tanh_gate_(T x) {
  return sigmoid_(T(2 * kSqrt2OverPi) * (x + T(0.044715) * x * x * x));
}
template <class T>
FT_HD T gelu_tanh_derivative(T x) {
  const T s = gelu_tanh_gate_(x);
  const T du = T(kSqrt2OverPi) * (T(1) + T(3 * 0.044715) * x * x);
  return s + T(2) * x * s * (T(1) - s) * du;
}
template <class T>
FT_HD T silu_derivative(T x) {
  T s = sigmoid_(x);
  return s * (T(1) + x * (T(1) - s));
}
// tanh(softplus(x)) = n / (n + 2) with n = e^x (e^x + 2): exp alone, so mish vectorises; past 20
// it is 1 in double precision, and n would overflow f32 past 44.
template <class T>
FT_HD T tanh_softplus_(T x) {
  const T e = exp_(x);
  const T n = e * (e + T(2));
  return x > T(20) ? T(1) : n / (n + T(2));
}
template <class T>
FT_HD T mish_derivative(T x) {
  const T w = tanh_softplus_(x);
  return w + x * (T(1) - w * w) * sigmoid_(x);
}
template <class T>
FT_HD T pow_(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    T r = 1;
    for (long long i = 0; i < static_cast<long long>(b); ++i) r = static_cast<T>(r * a);
    return r;
  } else {
    using std::pow;
    return pow(a, b);
  }
}

// The unary ops, one line each: OP(Op, name, domain, saves, api, forward(x), derivative(x, y)).
//   Op          enumerator of UnaryOp; the backward node is named Op "Backward".
//   name        the op's name in messages and parity cases; with api Public also the function
//               `Tensor name(const Tensor&)`, which include/fasttrain/ops/elementwise.h declares.
//   domain      Numeric: every dtype but bool; Floating: floating dtypes; Positive: floating,
//               defined for x > 0 (gradient checks draw positive inputs).
//   saves       what backward keeps: Input (x) or Output (y = forward(x), kept instead of x, so
//               the derivative must be written in y alone, as PyTorch's TanhBackward is).
//   api         Public (generated function) or Internal (reached through a hand-written function,
//               e.g. gelu's `approximate` argument).
//   forward     an expression in x of type T (exp_, tanh_ and the helpers above vectorise;
//               other libm calls keep the CPU loop scalar).
//   derivative  d forward / dx as an expression in x and y.
// Adding an op: one line here, its declaration in the public header, one parity line in
// tests/parity/cases_elementwise.py (docs/ARCHITECTURE.md, "How to add an op").
// clang-format off
#define FT_UNARY_OPS(OP)                                                                                               \
  /* Op        name       domain    saves   api       forward(x)           derivative(x, y) */                         \
  OP(Neg,      neg,       Numeric,  Input,  Public,   -x,                  T(-1))                                      \
  OP(Abs,      abs,       Numeric,  Input,  Public,   fabs(x),             T((x > T(0)) - (x < T(0))))                 \
  OP(Exp,      exp,       Floating, Output, Public,   exp_(x),             y)                                          \
  OP(Log,      log,       Positive, Input,  Public,   log_(x),             T(1) / x)                                   \
  OP(Sqrt,     sqrt,      Positive, Output, Public,   sqrt(x),             T(0.5) / y)                                 \
  OP(Rsqrt,    rsqrt,     Positive, Output, Public,   T(1) / sqrt(x),      T(-0.5) * y * y * y)                        \
  OP(Square,   square,    Numeric,  Input,  Public,   x * x,               T(2) * x)                                   \
  OP(Tanh,     tanh,      Floating, Output, Public,   tanh_(x),            T(1) - y * y)                               \
  OP(Sigmoid,  sigmoid,   Floating, Output, Public,   sigmoid_(x),         y * (T(1) - y))                             \
  OP(Relu,     relu,      Numeric,  Input,  Public,   x > T(0) ? x : T(0), x > T(0) ? T(1) : T(0))                     \
  OP(Gelu,     gelu,      Floating, Input,  Internal,                                                                  \
     x * normal_cdf_(x),                                                                                               \
     normal_cdf_(x) + x * T(kInvSqrt2Pi) * exp_(T(-0.5) * x * x))                                                      \
  OP(GeluTanh, gelu_tanh, Floating, Input,  Internal,                                                                  \
     x * gelu_tanh_gate_(x), gelu_tanh_derivative(x))                                                                  \
  OP(Silu,     silu,      Floating, Input,  Public,                                                                    \
     x / (T(1) + exp_(-x)),                                                                                            \
     silu_derivative(x))                                                                                               \
  OP(Softplus, softplus,  Floating, Input,  Public,                                                                    \
     x > T(20) ? x : (x > T(0) ? x : T(0)) + log1p_unit_(exp_(-fabs(x))),                                              \
     x > T(20) ? T(1) : sigmoid_(x))                                                                                   \
  OP(Mish,     mish,      Floating, Input,  Public,   x * tanh_softplus_(x), mish_derivative(x))                       \
  /* end of the list: every op line ends in a backslash, so appending one changes no other line */
// clang-format on

// The binary ops: OP(Op, name, kind, formula(a, b)). kind Arithmetic: the result has the
// operands' dtype and bool operands are refused; Comparison: a bool result, for every dtype (the
// function `Tensor name(a, b)` is generated). Gradients of the arithmetic ops are compositions
// written in src/ops/elementwise.cpp.
// clang-format off
#define FT_BINARY_OPS(OP)                                                                                              \
  OP(Add, add,     Arithmetic, a + b)                                                                                  \
  OP(Sub, sub,     Arithmetic, a - b)                                                                                  \
  OP(Mul, mul,     Arithmetic, a * b)                                                                                  \
  OP(Div, div,     Arithmetic, a / b)                                                                                  \
  /* NaN propagates, as in torch.maximum/minimum */                                                                    \
  OP(Max, maximum, Arithmetic, (a != a) ? a : (b != b) ? b : (a > b ? a : b))                                          \
  OP(Min, minimum, Arithmetic, (a != a) ? a : (b != b) ? b : (a < b ? a : b))                                          \
  OP(Pow, pow,     Arithmetic, pow_(a, b))                                                                             \
  OP(Eq,  eq,      Comparison, a == b)                                                                                 \
  OP(Ne,  ne,      Comparison, a != b)                                                                                 \
  OP(Lt,  lt,      Comparison, a < b)                                                                                  \
  OP(Le,  le,      Comparison, a <= b)                                                                                 \
  OP(Gt,  gt,      Comparison, a > b)                                                                                  \
  OP(Ge,  ge,      Comparison, a >= b)                                                                                 \
  /* end of the list */
// clang-format on

#define FT_MATH_ENUMERATOR(Op, ...) Op,
enum class UnaryOp { FT_UNARY_OPS(FT_MATH_ENUMERATOR) };
enum class BinaryOp { FT_BINARY_OPS(FT_MATH_ENUMERATOR) };
#undef FT_MATH_ENUMERATOR

enum class UnaryDomain { Numeric, Floating, Positive };
enum class UnarySaves { Input, Output };
enum class UnaryApi { Public, Internal };
enum class BinaryKind { Arithmetic, Comparison };

struct UnaryInfo {
  const char* name;
  const char* node;  // autograd node name
  UnaryDomain domain;
  UnarySaves saves;
  UnaryApi api;
};
struct BinaryInfo {
  const char* name;
  BinaryKind kind;
};

#define FT_UNARY_INFO(Op, name, domain, saves, api, ...) \
  UnaryInfo{#name, #Op "Backward", UnaryDomain::domain, UnarySaves::saves, UnaryApi::api},
inline constexpr UnaryInfo kUnaryInfo[] = {FT_UNARY_OPS(FT_UNARY_INFO)};
#undef FT_UNARY_INFO
#define FT_BINARY_INFO(Op, name, kind, ...) BinaryInfo{#name, BinaryKind::kind},
inline constexpr BinaryInfo kBinaryInfo[] = {FT_BINARY_OPS(FT_BINARY_INFO)};
#undef FT_BINARY_INFO

constexpr const UnaryInfo& unary_info(UnaryOp op) { return kUnaryInfo[static_cast<int>(op)]; }
constexpr const BinaryInfo& binary_info(BinaryOp op) { return kBinaryInfo[static_cast<int>(op)]; }
constexpr bool accepts_integers(UnaryOp op) { return unary_info(op).domain == UnaryDomain::Numeric; }
constexpr bool is_comparison(BinaryOp op) { return binary_info(op).kind == BinaryKind::Comparison; }

template <class T>
FT_HD T unary(UnaryOp op, T x) {
  using std::log1p, std::sqrt, std::fabs;
  switch (op) {
#define FT_UNARY_FORWARD_CASE(Op, name, domain, saves, api, forward, derivative) \
  case UnaryOp::Op: return forward;
    FT_UNARY_OPS(FT_UNARY_FORWARD_CASE)
#undef FT_UNARY_FORWARD_CASE
  }
  return x;
}

// d unary(x) / dx, given x and y = unary(x). For ops that save their output, x is y too.
template <class T>
FT_HD T unary_derivative(UnaryOp op, T x, T y) {
  using std::log1p, std::sqrt, std::fabs;
  switch (op) {
#define FT_UNARY_DERIVATIVE_CASE(Op, name, domain, saves, api, forward, derivative) \
  case UnaryOp::Op: return derivative;
    FT_UNARY_OPS(FT_UNARY_DERIVATIVE_CASE)
#undef FT_UNARY_DERIVATIVE_CASE
  }
  return T(0);
}

template <class T>
FT_HD T binary(BinaryOp op, T a, T b) {
  // bool only reaches here for comparisons (the ops reject bool arithmetic); compute as int.
  if constexpr (std::is_same_v<T, bool>) {
    return static_cast<bool>(binary<int>(op, a, b));
  } else {
    switch (op) {
#define FT_BINARY_CASE(Op, name, kind, formula) \
  case BinaryOp::Op: return formula;
      FT_BINARY_OPS(FT_BINARY_CASE)
#undef FT_BINARY_CASE
    }
  }
  return a;
}

}  // namespace ft::math
