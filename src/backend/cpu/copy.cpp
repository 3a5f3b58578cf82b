#include "backend/cpu/copy.h"

#include <cstring>

#include "backend/cpu/dispatch.h"
#include "backend/cpu/loops.h"

namespace ft::cpu {

void copy(const Tensor& dst, const Tensor& src) {
  if (dst.numel() == 0) return;
  // Same dtype, both dense in the same layout: one memcpy.
  if (dst.dtype() == src.dtype() && dst.shape() == src.shape() && dst.is_contiguous() && src.is_contiguous()) {
    const size_t n = dst.nbytes();
    char* d = static_cast<char*>(dst.raw_data());
    const char* s = static_cast<const char*>(src.raw_data());
    parallel_for(0, static_cast<int64_t>(n), 1 << 20, [&](int64_t b, int64_t e) { std::memcpy(d + b, s + b, e - b); });
    return;
  }
  FT_DISPATCH_ALL(dst.dtype(), "copy", [&] {
    using To = scalar_t;
    FT_DISPATCH_ALL(src.dtype(), "copy", [&] {
      using From = scalar_t;
      StridedLoop L = make_loop(dst, {&src});
      run_loop(L, [&](char** p, const int64_t* s, int64_t n) {
        if (s[0] == sizeof(To) && s[1] == sizeof(From)) {
          if constexpr (std::is_same_v<To, From>)
            std::memcpy(p[0], p[1], n * sizeof(To));  // bytes, not a round trip through the compute type
          else
            convert_run(reinterpret_cast<const From*>(p[1]), reinterpret_cast<To*>(p[0]), n);
        } else {
          for (int64_t i = 0; i < n; ++i) {
            const From& x = *reinterpret_cast<const From*>(p[1] + i * s[1]);
            *reinterpret_cast<To*>(p[0] + i * s[0]) = convert_value<To>(x);
          }
        }
      });
    });
  });
}

void fill(const Tensor& dst, Scalar value) {
  FT_DISPATCH_ALL(dst.dtype(), "fill", [&] {
    scalar_t v;
    if constexpr (std::is_same_v<scalar_t, bool>) {
      v = value.to_double() != 0;
    } else if constexpr (std::is_integral_v<scalar_t>) {
      v = static_cast<scalar_t>(value.to_int());
    } else {
      v = scalar_t(static_cast<compute_t<scalar_t>>(value.to_double()));
    }
    StridedLoop L = make_loop(dst, {});
    run_loop(L, [&](char** p, const int64_t* s, int64_t n) {
      if (s[0] == sizeof(scalar_t)) {
        // A dense run, written from a local copy: stores through a bf16/f16 pointer may alias a
        // captured `v`, so GCC reloaded it per element and wrote one element at a time (half an
        // fp16/bf16 backward went to the ones of its seed gradient; docs/PERF.md).
        const scalar_t val = v;
        scalar_t* o = reinterpret_cast<scalar_t*>(p[0]);
        for (int64_t i = 0; i < n; ++i) o[i] = val;
        return;
      }
      for (int64_t i = 0; i < n; ++i) *reinterpret_cast<scalar_t*>(p[0] + i * s[0]) = v;
    });
  });
}

}  // namespace ft::cpu
