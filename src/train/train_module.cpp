// The defaults of TrainModule and the small types of train_module.h.
#include "fasttrain/train_module.h"

namespace ft::train {

const char* item_unit_name(ItemUnit unit) { return unit == ItemUnit::Tokens ? "tokens" : "samples"; }

std::optional<double> EvalResult::metric(std::string_view name) const {
  for (const auto& [n, v] : metrics)
    if (n == name) return v;
  return std::nullopt;
}

std::vector<optim::ParamGroup> TrainModule::param_groups(const optim::GroupOptions& options) {
  return optim::decay_groups(model().named_parameters(), options);
}

}  // namespace ft::train
