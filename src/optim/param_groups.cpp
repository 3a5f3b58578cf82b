// The decay / no_decay split used by GPT-2 and nanoGPT: matrices (Linear and Embedding weights,
// convolution kernels) are decayed; vectors (biases, LayerNorm/BatchNorm weights) are not, since
// shrinking a bias or a norm's gain toward zero only adds a bias of its own.
#include <set>

#include "fasttrain/optim.h"

namespace ft::optim {

std::vector<ParamGroup> decay_groups(const std::vector<std::pair<std::string, Tensor>>& named_params,
                                     const GroupOptions& options) {
  ParamGroup decay{{}, options, "decay"};
  ParamGroup no_decay{{}, options, "no_decay"};
  no_decay.options.weight_decay = 0;
  std::set<const TensorImpl*> seen;
  for (const auto& [name, p] : named_params) {
    FT_CHECK(p.defined(), "decay_groups: parameter '", name, "' is undefined");
    if (!p.requires_grad()) continue;             // frozen: nothing to optimise
    if (!seen.insert(p.impl()).second) continue;  // a tied weight listed under two names
    (p.dim() >= 2 ? decay : no_decay).params.push_back(p);
  }
  return {std::move(decay), std::move(no_decay)};
}

}  // namespace ft::optim
