// What the Trainer and the finders build the same way from a TrainerConfig: the optimizer, the
// step options and activation checkpointing of the model's blocks.
#pragma once
#include <memory>

#include "fasttrain/nn.h"
#include "fasttrain/optim.h"
#include "fasttrain/train.h"
#include "fasttrain/train_module.h"
#include "fasttrain/train_step.h"

namespace ft::train {

// The config's optimizer over the module's parameter groups (by default a weight-decay group and
// a no-decay group of biases and norm weights; the group named "no_decay" is excluded from
// LARS's layer-wise adaptation, as is any group the module marks so).
std::unique_ptr<optim::Optimizer> make_optimizer(const TrainerConfig& c, TrainModule& module);
StepOptions step_options(const TrainerConfig& c);
// Turns activation checkpointing of every transformer block (GPT) or residual block (ResNet) on
// or off; ft::Error for a model without such blocks.
void set_block_checkpointing(nn::Module& model, bool enabled);

}  // namespace ft::train
