// Optimizer, step options and block checkpointing from a TrainerConfig (run_setup.h).
#include "train/run_setup.h"

namespace ft::train {

std::unique_ptr<optim::Optimizer> make_optimizer(const TrainerConfig& c, TrainModule& module) {
  optim::GroupOptions o;
  o.lr = c.optimizer.lr;
  o.weight_decay = c.optimizer.weight_decay;
  o.momentum = c.optimizer.momentum;
  o.beta1 = c.optimizer.beta1;
  o.beta2 = c.optimizer.beta2;
  o.trust_coefficient = c.optimizer.trust_coefficient;
  auto groups = module.param_groups(o);
  switch (c.optimizer.kind) {
    case optim::OptimizerKind::AdamW: return optim::make_adamw(std::move(groups));
    case optim::OptimizerKind::Adam: return optim::make_adam(std::move(groups));
    case optim::OptimizerKind::SGD: return optim::make_sgd(std::move(groups));
    case optim::OptimizerKind::LAMB: return optim::make_lamb(std::move(groups));
    case optim::OptimizerKind::LARS:
      // LARS's layer-wise rate is for weight matrices; biases and norms take plain momentum SGD.
      for (auto& g : groups) g.options.exclude_from_adaptation |= g.name == "no_decay";
      return optim::make_lars(std::move(groups));
  }
  // Only a kind added to OptimizerKind without a case above gets here (and -Wswitch says so).
  FT_FAIL("make_optimizer: no factory for optimizer '", name_of(c.optimizer.kind), "'");
}

StepOptions step_options(const TrainerConfig& c) {
  StepOptions so;
  so.precision = c.precision.mode;
  so.accumulate = c.accumulate;
  so.clip = c.optimizer.grad_clip;
  so.clip_algorithm = c.optimizer.gradient_clip_algorithm;
  so.cuda_graphs = c.precision.cuda_graphs;
  so.fp8.amax_history_len = static_cast<int>(c.precision.fp8_amax_history);
  so.fp8.amax_algo = c.precision.fp8_amax_algo;
  so.fp8.margin = static_cast<int>(c.precision.fp8_margin);
  return so;
}

void set_block_checkpointing(nn::Module& model, bool enabled) { nn::set_activation_checkpointing(model, enabled); }

}  // namespace ft::train
