// LAMB (You et al. 2019; the NVLAMB form of NVIDIA apex FusedLAMB, which adapts every tensor): the
// Adam direction with bias correction and decoupled weight decay, scaled per tensor by the trust
// ratio ||p|| / ||u||. The device's lamb_step makes two passes: moments and per-tensor norms, then
// the update (the math is in backend/optim_math.h). State per parameter: "step", "exp_avg" (m),
// "exp_avg_sq" (v), and "master" for bf16/f16 parameters.
#include "optim/multi_tensor.h"

namespace ft::optim {
namespace {

class Lamb final : public detail::MultiTensorOptimizer {
 public:
  explicit Lamb(std::vector<ParamGroup> groups) : MultiTensorOptimizer(std::move(groups)) { check_all_options(); }
  OptimizerKind kind() const override { return OptimizerKind::LAMB; }

 protected:
  int num_buffers(const GroupOptions&) const override { return 2; }
  const char* buffer_name(int index) const override { return index == 0 ? "exp_avg" : "exp_avg_sq"; }
  void check_options(const GroupOptions& o, size_t g) const override { check_adam_family_options(o, g); }
  void update(const backend::Kernels& kernels, const backend::MultiTensorStep& step) override {
    kernels.lamb_step(step);
  }
};

}  // namespace

std::unique_ptr<Optimizer> make_lamb(std::vector<ParamGroup> groups) {
  return std::make_unique<Lamb>(std::move(groups));
}

}  // namespace ft::optim
