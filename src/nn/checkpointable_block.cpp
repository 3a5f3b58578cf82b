// Model blocks that can run under activation checkpointing, and switching it on for a model.
#include "fasttrain/activation_checkpoint.h"
#include "fasttrain/nn.h"

namespace ft::nn {

Tensor CheckpointableBlock::forward(const Tensor& x) {
  if (hooks_) hooks_->before_forward(*this);
  Tensor y = checkpointing_ ? autograd::checkpoint([this](const Tensor& in) { return block_forward(in); }, x)
                            : block_forward(x);
  return hooks_ ? hooks_->after_forward(*this, y) : y;
}

int64_t set_activation_checkpointing(Module& model, bool on) {
  int64_t blocks = 0;
  for (auto& [name, m] : model.named_modules()) {
    if (auto* block = dynamic_cast<CheckpointableBlock*>(m.get())) {
      block->set_activation_checkpointing(on);
      ++blocks;
    }
  }
  FT_CHECK(blocks > 0,
           "set_activation_checkpointing: expected a model with checkpointable blocks (GPT, a ResNet), "
           "found none in a ",
           model.type_name());
  return blocks;
}

}  // namespace ft::nn
