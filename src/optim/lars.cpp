// LARS (You et al. 2017, in the form of torchlars / timm's Lars): SGD whose weight-decayed
// gradient is scaled per tensor by the trust ratio before the momentum update; groups with
// exclude_from_adaptation take plain momentum SGD. The device's lars_step makes two passes:
// per-tensor norms of p and g, then SGD's update with the ratio (the math is in
// backend/optim_math.h). State per parameter: "step", "momentum_buffer" when momentum != 0, and
// "master" for bf16/f16 parameters.
#include "optim/multi_tensor.h"

namespace ft::optim {
namespace {

class Lars final : public detail::MultiTensorOptimizer {
 public:
  explicit Lars(std::vector<ParamGroup> groups) : MultiTensorOptimizer(std::move(groups)) { check_all_options(); }
  OptimizerKind kind() const override { return OptimizerKind::LARS; }

 protected:
  int num_buffers(const GroupOptions& o) const override { return o.momentum != 0 ? 1 : 0; }
  const char* buffer_name(int) const override { return "momentum_buffer"; }
  void check_options(const GroupOptions& o, size_t g) const override {
    check_momentum_family_options(o, g);
    FT_CHECK(o.trust_coefficient > 0, name(), ": Invalid trust_coefficient value: ", o.trust_coefficient,
             " (expected > 0; ", group_label(g), ")");
    FT_CHECK(!o.nesterov || (o.momentum > 0 && o.dampening == 0), name(),
             ": Nesterov momentum requires a momentum and zero dampening (found momentum ", o.momentum, ", dampening ",
             o.dampening, "; ", group_label(g), ")");
  }
  void update(const backend::Kernels& kernels, const backend::MultiTensorStep& step) override {
    kernels.lars_step(step);
  }
};

}  // namespace

std::unique_ptr<Optimizer> make_lars(std::vector<ParamGroup> groups) {
  return std::make_unique<Lars>(std::move(groups));
}

}  // namespace ft::optim
