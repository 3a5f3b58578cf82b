// What the memory-bound CUDA kernels (rows, elementwise, BatchNorm, pooling) share: typed data
// pointers, vectors of V elements moved as one 16-, 8- or 4-byte access (and the choice of V at
// run time), and an integer division by a run-time divisor done as a multiply-high and a shift,
// for the index decodes those kernels do per vector.
#pragma once
#include <cstdint>
#include <type_traits>

#include "backend/cuda/common.cuh"

namespace ft::cuda {

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

template <class T>
const T* cptr(const Tensor& t) {
  return static_cast<const T*>(t.raw_data());
}
template <class T>
T* mptr(const Tensor& t) {
  return static_cast<T*>(t.raw_data());
}

template <class T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

template <class T, int V>
__device__ __forceinline__ Pack<T, V> load_pack(const T* p) {
  return *reinterpret_cast<const Pack<T, V>*>(p);
}
template <class T, int V>
__device__ __forceinline__ void store_pack(T* p, const Pack<T, V>& v) {
  *reinterpret_cast<Pack<T, V>*>(p) = v;
}

// Runs f with std::integral_constant<int, v>, v one of the widths a 16-byte vector of T allows:
// 16 / sizeof(T), half that for 16-bit types (8 bytes), or 1.
template <class T, class F>
void with_width(int v, F&& f) {
  constexpr int full = 16 / static_cast<int>(sizeof(T));
  if (v == full) return f(std::integral_constant<int, full>{});
  if constexpr (full >= 8) {
    if (v == full / 2) return f(std::integral_constant<int, full / 2>{});
  }
  f(std::integral_constant<int, 1>{});
}

// n / d for 0 <= n < 2^63 by a multiply-high and a shift (Granlund-Montgomery): a 64-bit division
// is a long software sequence on the GPU, too slow for an index decode per vector.
// mul = ceil(2^(63 + l) / d) with l = ceil(log2 d); the error term stays below 1 / d.
struct FastDiv {
  int64_t d = 1;
  uint64_t mul = 0;
  int shr = 0;
  FastDiv() = default;
  explicit FastDiv(int64_t divisor) : d(divisor > 1 ? divisor : 1) {
    if (d == 1) return;
    int l = 0;
    while ((uint64_t(1) << l) < static_cast<uint64_t>(d)) ++l;
    const unsigned __int128 one = 1;
    mul = static_cast<uint64_t>(((one << (63 + l)) + static_cast<uint64_t>(d) - 1) / static_cast<uint64_t>(d));
    shr = l - 1;
  }
  __device__ __forceinline__ int64_t div(int64_t n) const {
    return d == 1 ? n : static_cast<int64_t>(__umul64hi(static_cast<uint64_t>(n), mul) >> shr);
  }
};

}  // namespace ft::cuda
