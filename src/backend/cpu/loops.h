// Strided elementwise loops over up to four operands (operand 0 is the output). Inputs are
// broadcast to the output's shape by zero strides, dimensions that are contiguous in every
// operand are merged, and the flattened index range is split across threads. The innermost loop
// gets a fast path when every operand is dense (or a broadcast scalar), which the compiler
// vectorises; that path is where almost all time goes.
#pragma once
#include <array>
#include <cstring>
#include <type_traits>

#include "backend/cpu/half_tiles.h"
#include "backend/strided_loop.h"

#include "fasttrain/parallel.h"
#include "fasttrain/tensor.h"

namespace ft::cpu {

using backend::make_loop;
using backend::StridedLoop;

// The per-element lambdas handed to store_run are forced inline: GCC inlines them by size, and in
// the bf16 instantiations of the longer derivatives (exact GELU's, mish's) it declined, leaving a
// call per element: those backward passes ran 10x slower in bf16 than in f32 (docs/PERF.md).
#define FT_ELEMENT __attribute__((always_inline))

// Calls inner(ptrs, strides_bytes, n) for contiguous runs of the innermost dimension, in parallel.
template <class Inner>
void run_loop(const StridedLoop& L, Inner&& inner, int64_t grain = 32768) {
  if (L.numel == 0) return;
  parallel_for(0, L.numel, grain, [&](int64_t begin, int64_t end) {
    const int nd = L.ndim;
    int64_t idx[kMaxDims] = {};
    int64_t rem = begin;
    for (int d = nd - 1; d >= 0; --d) {
      idx[d] = rem % L.shape[d];
      rem /= L.shape[d];
    }
    char* ptrs[StridedLoop::kMaxArgs];
    int64_t inner_strides[StridedLoop::kMaxArgs];
    for (int a = 0; a < L.nargs; ++a) {
      ptrs[a] = L.base[a];
      for (int d = 0; d < nd; ++d) ptrs[a] += idx[d] * L.strides[a][d];
      inner_strides[a] = L.strides[a][nd - 1];
    }
    int64_t pos = begin;
    while (pos < end) {
      int64_t run = std::min(L.shape[nd - 1] - idx[nd - 1], end - pos);
      inner(ptrs, inner_strides, run);
      pos += run;
      if (pos >= end) break;
      // advance the multi-index past the run
      for (int a = 0; a < L.nargs; ++a) ptrs[a] += run * inner_strides[a];
      idx[nd - 1] += run;
      for (int d = nd - 1; d > 0 && idx[d] == L.shape[d]; --d) {
        idx[d] = 0;
        ++idx[d - 1];
        for (int a = 0; a < L.nargs; ++a) ptrs[a] += L.strides[a][d - 1] - L.shape[d] * L.strides[a][d];
      }
    }
  });
}

// out[i] = op(in[i]) with in/out of C++ types In/Out; op works on compute types.
template <class Out, class In, class Op>
void unary_loop(const Tensor& out, const Tensor& in, Op op) {
  StridedLoop L = make_loop(out, {&in});
  run_loop(L, [&](char** p, const int64_t* s, int64_t n) {
    Out* o = reinterpret_cast<Out*>(p[0]);
    const In* x = reinterpret_cast<const In*>(p[1]);
    if (s[0] == sizeof(Out) && s[1] == sizeof(In)) {
      if constexpr (std::is_same_v<In, f16> && std::is_same_v<Out, f16>) {
        for_half_tiles(n, [&](int64_t i0, int64_t m) {
          float t[kHalfTile];
          widen_halves(x + i0, t, m);
          for (int64_t i = 0; i < m; ++i) t[i] = static_cast<float>(op(t[i]));
          narrow_to_halves(t, o + i0, m);
        });
        return;
      }
      store_run(o, n, [&](int64_t i) FT_ELEMENT { return op(static_cast<compute_t<In>>(x[i])); });
    } else {
      for (int64_t i = 0; i < n; ++i)
        *reinterpret_cast<Out*>(p[0] + i * s[0]) =
            static_cast<Out>(op(static_cast<compute_t<In>>(*reinterpret_cast<const In*>(p[1] + i * s[1]))));
    }
  });
}

template <class Out, class In, class Op>
void binary_loop(const Tensor& out, const Tensor& a, const Tensor& b, Op op) {
  using C = compute_t<In>;
  StridedLoop L = make_loop(out, {&a, &b});
  run_loop(L, [&](char** p, const int64_t* s, int64_t n) {
    Out* o = reinterpret_cast<Out*>(p[0]);
    const In* x = reinterpret_cast<const In*>(p[1]);
    const In* y = reinterpret_cast<const In*>(p[2]);
    if (s[0] == sizeof(Out) && s[1] == sizeof(In) && s[2] == sizeof(In)) {
      if constexpr (std::is_same_v<In, f16> && std::is_same_v<Out, f16>) {
        for_half_tiles(n, [&](int64_t i0, int64_t m) {
          float tx[kHalfTile], ty[kHalfTile];
          widen_halves(x + i0, tx, m);
          widen_halves(y + i0, ty, m);
          for (int64_t i = 0; i < m; ++i) tx[i] = static_cast<float>(op(tx[i], ty[i]));
          narrow_to_halves(tx, o + i0, m);
        });
        return;
      }
      store_run(o, n, [&](int64_t i) FT_ELEMENT { return op(static_cast<C>(x[i]), static_cast<C>(y[i])); });
    } else if (s[0] == sizeof(Out) && s[1] == sizeof(In) && s[2] == 0) {
      const C yv = static_cast<C>(*y);
      store_run(o, n, [&](int64_t i) FT_ELEMENT { return op(static_cast<C>(x[i]), yv); });
    } else if (s[0] == sizeof(Out) && s[1] == 0 && s[2] == sizeof(In)) {
      const C xv = static_cast<C>(*x);
      store_run(o, n, [&](int64_t i) FT_ELEMENT { return op(xv, static_cast<C>(y[i])); });
    } else {
      for (int64_t i = 0; i < n; ++i)
        *reinterpret_cast<Out*>(p[0] + i * s[0]) =
            static_cast<Out>(op(static_cast<C>(*reinterpret_cast<const In*>(p[1] + i * s[1])),
                                static_cast<C>(*reinterpret_cast<const In*>(p[2] + i * s[2]))));
    }
  });
}

// out[i] = op(a[i], b[i], c[i]) with all inputs of type In (cond-style inputs are converted first).
template <class Out, class In0, class In, class Op>
void ternary_loop(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& c, Op op) {
  using C = compute_t<In>;
  StridedLoop L = make_loop(out, {&a, &b, &c});
  run_loop(L, [&](char** p, const int64_t* s, int64_t n) {
    if (s[0] == sizeof(Out) && s[1] == sizeof(In0) && s[2] == sizeof(In) && s[3] == sizeof(In)) {
      Out* o = reinterpret_cast<Out*>(p[0]);
      const In0* x = reinterpret_cast<const In0*>(p[1]);
      const In* y = reinterpret_cast<const In*>(p[2]);
      const In* z = reinterpret_cast<const In*>(p[3]);
      if constexpr (std::is_same_v<In0, f16> && std::is_same_v<In, f16> && std::is_same_v<Out, f16>) {
        for_half_tiles(n, [&](int64_t i0, int64_t m) {
          float tx[kHalfTile], ty[kHalfTile], tz[kHalfTile];
          widen_halves(x + i0, tx, m);
          widen_halves(y + i0, ty, m);
          widen_halves(z + i0, tz, m);
          for (int64_t i = 0; i < m; ++i) tx[i] = static_cast<float>(op(tx[i], ty[i], tz[i]));
          narrow_to_halves(tx, o + i0, m);
        });
        return;
      }
      store_run(o, n, [&](int64_t i) FT_ELEMENT { return op(x[i], static_cast<C>(y[i]), static_cast<C>(z[i])); });
      return;
    }
    for (int64_t i = 0; i < n; ++i)
      *reinterpret_cast<Out*>(p[0] + i * s[0]) = static_cast<Out>(op(
          *reinterpret_cast<const In0*>(p[1] + i * s[1]), static_cast<C>(*reinterpret_cast<const In*>(p[2] + i * s[2])),
          static_cast<C>(*reinterpret_cast<const In*>(p[3] + i * s[3]))));
  });
}

#undef FT_ELEMENT

}  // namespace ft::cpu
