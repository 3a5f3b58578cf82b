// The block sizes the caching allocators hand out: four classes per power of two, so a block is at
// most 25% larger than asked for and freed blocks of similar sizes are interchangeable.
#pragma once
#include <cstddef>

namespace ft {

inline size_t allocation_size_class(size_t n) {
  if (n <= 64) return 64;
  size_t p = 64;
  while (p < n) p <<= 1;   // smallest power of two >= n
  size_t quarter = p / 8;  // classes: p/2 + k*p/8, k = 1..4
  size_t r = p / 2;
  while (r < n) r += quarter;
  return r;
}

}  // namespace ft
