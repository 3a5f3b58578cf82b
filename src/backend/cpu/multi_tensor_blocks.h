// Fixed-size blocks over a list of flat arrays, for reductions that must not depend on the thread
// count: each block is summed on its own (one partial result per block) and the partials are
// combined in block order afterwards, so the rounding is the same however the blocks were shared
// between threads. Used by the LAMB / LARS norms and the gradient passes (clipping, unscaling).
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "fasttrain/parallel.h"

namespace ft::cpu {

struct Block {
  int64_t array = 0, first = 0, numel = 0;
};
// 64 KiB of f32: enough work per block to be worth a thread, small enough to balance.
inline constexpr int64_t kBlockSize = 16384;

// Fills `out` with the blocks of `count` arrays of numel(i) elements, in array order (the vector
// keeps its capacity: no allocation once it has grown).
template <class Numel>
void split_into_blocks(int64_t count, const Numel& numel, std::vector<Block>& out) {
  out.clear();
  for (int64_t i = 0; i < count; ++i)
    for (int64_t lo = 0; lo < numel(i); lo += kBlockSize) out.push_back({i, lo, std::min(kBlockSize, numel(i) - lo)});
}

// Calls f(block_index, block) for every block, in parallel.
template <class F>
void for_each_block(const std::vector<Block>& blocks, const F& f) {
  struct Context {
    const std::vector<Block>* blocks;
    const F* f;
  } ctx{&blocks, &f};
  // The lambda captures one pointer, so std::function stores it inline (no allocation).
  parallel_for(0, static_cast<int64_t>(blocks.size()), 1, [c = &ctx](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) (*c->f)(b, (*c->blocks)[b]);
  });
}

}  // namespace ft::cpu
