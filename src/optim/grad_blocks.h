// The gradients of a parameter list cut into fixed-size blocks, for the passes over gradients
// only (clip_grad_norm_, clip_grad_value_, GradScaler::unscale_). Reductions keep one partial
// result per block and combine them in block order, so they do not depend on the thread count.
#pragma once
#include <string>
#include <vector>

#include "fasttrain/parallel.h"
#include "fasttrain/tensor.h"
#include "optim/multi_tensor.h"

namespace ft::optim::detail {

struct GradBlocks {
  std::vector<Tensor> grads;  // every defined gradient, in parameter order
  std::vector<Block> blocks;  // Block::segment indexes grads
};

// Collects the gradients of `params` (parameters without one are skipped) and checks that each
// is a dense CPU floating tensor; `who` names the caller in messages.
inline void collect_grads(const std::vector<Tensor>& params, const char* who, GradBlocks& out) {
  out.grads.clear();
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i];
    FT_CHECK(p.defined(), who, ": parameter ", i, " is undefined");
    Tensor g = p.grad();
    if (!g.defined()) continue;
    FT_CHECK(g.device().is_cpu(), who, ": the gradient of parameter ", i, " is on ", g.device().str(),
             "; only CPU gradients are supported so far");
    FT_CHECK(is_floating(g.dtype()), who, ": the gradient of parameter ", i, " has dtype ", dtype_name(g.dtype()),
             ", expected f32, f64, bf16 or f16");
    // Elementwise passes may walk any dense storage as a flat array.
    FT_CHECK(g.is_contiguous() || g.is_channels_last(), who, ": the gradient of parameter ", i,
             " is not dense (shape ", g.shape().str(), ", strides ", g.strides().str(), ")");
    out.grads.push_back(std::move(g));
  }
  split_into_blocks(
      static_cast<int64_t>(out.grads.size()), [&](int64_t i) { return out.grads[i].numel(); }, out.blocks);
}

// Calls f(block_index, gradient, first, count) for every block, in parallel.
template <class F>
void for_each_grad_block(const GradBlocks& gb, const F& f) {
  parallel_for(0, static_cast<int64_t>(gb.blocks.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const Block& blk = gb.blocks[b];
      f(b, gb.grads[blk.segment], blk.first, blk.numel);
    }
  });
}

}  // namespace ft::optim::detail
