// Optimizer, step options and block checkpointing from a TrainerConfig (run_setup.h).
#include "train/run_setup.h"

namespace ft::train {

std::unique_ptr<optim::Optimizer> make_optimizer(const TrainerConfig& c, nn::Module& model) {
  optim::GroupOptions o;
  o.lr = c.lr;
  o.weight_decay = c.weight_decay;
  o.momentum = c.momentum;
  o.beta1 = c.beta1;
  o.beta2 = c.beta2;
  o.trust_coefficient = c.trust_coefficient;
  auto groups = optim::decay_groups(model.named_parameters(), o);
  if (c.optimizer == "sgd") return optim::make_sgd(std::move(groups));
  if (c.optimizer == "adam") return optim::make_adam(std::move(groups));
  if (c.optimizer == "lamb") return optim::make_lamb(std::move(groups));
  if (c.optimizer == "lars") {
    // LARS's layer-wise rate is for weight matrices; biases and norms take plain momentum SGD.
    for (auto& g : groups) g.options.exclude_from_adaptation = g.name == "no_decay";
    return optim::make_lars(std::move(groups));
  }
  return optim::make_adamw(std::move(groups));
}

StepOptions step_options(const TrainerConfig& c) {
  StepOptions so;
  so.precision = precision_from_name(c.precision);
  so.accumulate = c.accumulate;
  so.clip = c.grad_clip;
  so.clip_algorithm = c.gradient_clip_algorithm;
  return so;
}

void set_block_checkpointing(nn::UnaryModule& model, bool enabled) {
  nn::set_activation_checkpointing(model, enabled);
}

}  // namespace ft::train
