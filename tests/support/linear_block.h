// A Linear layer as an nn::CheckpointableBlock, for the data-parallel test programs: the unit
// ZeRO stage 3 gathers before the block's forward and backward (and activation checkpointing
// recomputes). Its parameters are nn::Linear's, initialised alike and named "weight" and "bias",
// so a model's names and initial values are those of the same model built from Linear.
#pragma once
#include <string>

#include "fasttrain/nn.h"

namespace ft::test {

class LinearBlock : public nn::CheckpointableBlock {
 public:
  LinearBlock(int64_t in, int64_t out, Generator* gen) {
    nn::Linear init(in, out, true, gen);
    weight = register_parameter("weight", init.weight);
    bias = register_parameter("bias", init.bias);
  }
  std::string type_name() const override { return "LinearBlock"; }
  Tensor weight, bias;

 protected:
  Tensor block_forward(const Tensor& x) override { return linear(x, weight, bias); }
};

}  // namespace ft::test
