// Model blocks that can run under activation checkpointing, and switching it on for a model.
#include <utility>

#include "fasttrain/activation_checkpoint.h"
#include "fasttrain/nn.h"

namespace ft::nn {

Tensor CheckpointableBlock::forward(const Tensor& x) { return run(x, Tensor()); }

// Called as this module here (operator() does that for forward(x)).
Tensor CheckpointableBlock::forward(const Tensor& x, const Tensor& side) {
  return call_as_this([&] { return run(x, side); });
}

Tensor CheckpointableBlock::run(const Tensor& x, const Tensor& side) {
  if (hooks_) hooks_->before_forward(*this);
  // The side input by value in the closure: checkpointing's recomputation calls it again during
  // backward, after later forwards may have run with other side inputs.
  auto body = [this, side](const Tensor& in) {
    struct Restore {
      Tensor& slot;
      Tensor saved;
      ~Restore() { slot = std::move(saved); }
    } restore{side_, std::exchange(side_, side)};
    return block_forward(in);
  };
  Tensor y = checkpointing_ ? autograd::checkpoint(body, x) : body(x);
  return hooks_ ? hooks_->after_forward(*this, y) : y;
}

Tensor CheckpointableBlock::forward_variant(const std::function<Tensor()>& f) {
  return call_as_this([&] {
    if (hooks_) hooks_->before_forward(*this);
    Tensor y = f();
    return hooks_ ? hooks_->after_forward(*this, y) : y;
  });
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
