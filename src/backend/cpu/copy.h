// Copies with dtype conversion between arbitrarily strided CPU tensors, and fills.
#pragma once
#include <type_traits>

#include "backend/cpu/half_tiles.h"
#include "backend/cpu/kernel_decls.h"
#include "fasttrain/tensor.h"

namespace ft::cpu {

// One element converted as copy() converts it (through the source's compute type).
template <class To, class From>
inline To convert_value(From v) {
  if constexpr (std::is_same_v<To, bool>) {
    return static_cast<compute_t<From>>(v) != 0;
  } else if constexpr (std::is_same_v<To, bf16> || std::is_same_v<To, f16>) {
    return To(static_cast<float>(static_cast<compute_t<From>>(v)));
  } else {
    return static_cast<To>(static_cast<compute_t<From>>(v));
  }
}

// dst[i] = src[i] converted, for a dense run; f16 <-> f32 and f32 -> bf16 through the
// conversion instructions of half_tiles.h.
template <class To, class From>
inline void convert_run(const From* src, To* dst, int64_t n) {
  if constexpr (std::is_same_v<To, float> && std::is_same_v<From, f16>) {
    widen_halves(src, dst, n);
  } else if constexpr (std::is_same_v<From, float> && (std::is_same_v<To, f16> || std::is_same_v<To, bf16>)) {
    narrow_to_halves(src, dst, n);
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = convert_value<To>(src[i]);
  }
}

// A dense run of n elements in the compute type C: in place when T is C, else converted into buf
// (convert_run's instructions), for kernels that read 16-bit operands as f32 tiles.
template <class C, class T>
inline const C* widened_run(const T* src, int64_t n, C* buf) {
  if constexpr (std::is_same_v<T, C>) {
    return src;
  } else {
    convert_run(src, buf, n);
    return buf;
  }
}

// copy: dst = src converted to dst's dtype; src broadcasts to dst's shape. fill: dst = value.

}  // namespace ft::cpu
