// Per-element formulas of the elementwise ops and their derivatives, shared by the CPU kernels
// and (compiled by nvcc) the CUDA kernels, so each formula is written once.
#pragma once
#include <cmath>
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

enum class UnaryOp { Neg, Abs, Exp, Log, Sqrt, Rsqrt, Square, Tanh, Sigmoid, Relu, GeluErf, GeluTanh, Silu };
enum class BinaryOp { Add, Sub, Mul, Div, Max, Min, Pow, Eq, Ne, Lt, Le, Gt, Ge };

constexpr double kSqrt2OverPi = 0.7978845608028654;
constexpr double kInvSqrt2 = 0.7071067811865476;
constexpr double kInvSqrt2Pi = 0.3989422804014327;

template <class T>
FT_HD T unary(UnaryOp op, T x) {
  using std::erf, std::log, std::sqrt, std::fabs;
  switch (op) {
    case UnaryOp::Neg: return -x;
    case UnaryOp::Abs: return fabs(x);
    case UnaryOp::Exp: return exp_(x);
    case UnaryOp::Log: return log(x);
    case UnaryOp::Sqrt: return sqrt(x);
    case UnaryOp::Rsqrt: return T(1) / sqrt(x);
    case UnaryOp::Square: return x * x;
    case UnaryOp::Tanh: return tanh_(x);
    case UnaryOp::Sigmoid: return T(1) / (T(1) + exp_(-x));
    case UnaryOp::Relu: return x > T(0) ? x : T(0);
    case UnaryOp::GeluErf: return T(0.5) * x * (T(1) + erf(x * T(kInvSqrt2)));
    case UnaryOp::GeluTanh: return T(0.5) * x * (T(1) + tanh_(T(kSqrt2OverPi) * (x + T(0.044715) * x * x * x)));
    case UnaryOp::Silu: return x / (T(1) + exp_(-x));
  }
  return x;
}

// d unary(x) / dx, given x (and y = unary(x) where that is cheaper).
template <class T>
FT_HD T unary_derivative(UnaryOp op, T x, T y) {
  using std::erf;
  switch (op) {
    case UnaryOp::Neg: return T(-1);
    case UnaryOp::Abs: return x > T(0) ? T(1) : (x < T(0) ? T(-1) : T(0));
    case UnaryOp::Exp: return y;
    case UnaryOp::Log: return T(1) / x;
    case UnaryOp::Sqrt: return T(0.5) / y;
    case UnaryOp::Rsqrt: return T(-0.5) * y * y * y;
    case UnaryOp::Square: return T(2) * x;
    case UnaryOp::Tanh: return T(1) - y * y;
    case UnaryOp::Sigmoid: return y * (T(1) - y);
    case UnaryOp::Relu: return x > T(0) ? T(1) : T(0);
    case UnaryOp::GeluErf:
      return T(0.5) * (T(1) + erf(x * T(kInvSqrt2))) + x * T(kInvSqrt2Pi) * exp_(T(-0.5) * x * x);
    case UnaryOp::GeluTanh: {
      T inner = T(kSqrt2OverPi) * (x + T(0.044715) * x * x * x);
      T t = tanh_(inner);
      T dinner = T(kSqrt2OverPi) * (T(1) + T(3 * 0.044715) * x * x);
      return T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * dinner;
    }
    case UnaryOp::Silu: {
      T s = T(1) / (T(1) + exp_(-x));
      return s * (T(1) + x * (T(1) - s));
    }
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
      case BinaryOp::Add: return a + b;
      case BinaryOp::Sub: return a - b;
      case BinaryOp::Mul: return a * b;
      case BinaryOp::Div: return a / b;
      // NaN propagates, as in torch.maximum/minimum
      case BinaryOp::Max: return (a != a) ? a : (b != b) ? b : (a > b ? a : b);
      case BinaryOp::Min: return (a != a) ? a : (b != b) ? b : (a < b ? a : b);
      case BinaryOp::Pow: {
        if constexpr (std::is_integral_v<T>) {
          T r = 1;
          for (long long i = 0; i < static_cast<long long>(b); ++i) r = static_cast<T>(r * a);
          return r;
        } else {
          using std::pow;
          return pow(a, b);
        }
      }
      case BinaryOp::Eq: return a == b;
      case BinaryOp::Ne: return a != b;
      case BinaryOp::Lt: return a < b;
      case BinaryOp::Le: return a <= b;
      case BinaryOp::Gt: return a > b;
      case BinaryOp::Ge: return a >= b;
    }
  }
  return a;
}

inline bool is_comparison(BinaryOp op) { return op >= BinaryOp::Eq; }

}  // namespace ft::math
