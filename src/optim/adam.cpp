// Adam and AdamW (torch.optim.Adam / AdamW, amsgrad off, maximize off), as one multi-tensor pass
// (the device's adam_step; the math is in backend/optim_math.h). Memory traffic per element: read
// p, g, m, v; write p, m, v (28 bytes in f32), where PyTorch's foreach path makes about six
// passes over the parameters.
#include "optim/multi_tensor.h"

namespace ft::optim {
namespace {

class Adam final : public detail::MultiTensorOptimizer {
 public:
  Adam(std::vector<ParamGroup> groups, bool decoupled)
      : MultiTensorOptimizer(std::move(groups)), decoupled_(decoupled) {
    check_all_options();
  }
  OptimizerKind kind() const override { return decoupled_ ? OptimizerKind::AdamW : OptimizerKind::Adam; }

 protected:
  int num_buffers(const GroupOptions&) const override { return 2; }
  const char* buffer_name(int index) const override { return index == 0 ? "exp_avg" : "exp_avg_sq"; }
  void check_options(const GroupOptions& o, size_t g) const override { check_adam_family_options(o, g); }

 private:
  void update(const backend::Kernels& kernels, const backend::MultiTensorStep& step) override {
    kernels.adam_step(step, decoupled_);
  }
  bool decoupled_;
};

}  // namespace

std::unique_ptr<Optimizer> make_adam(std::vector<ParamGroup> groups) {
  return std::make_unique<Adam>(std::move(groups), false);
}
std::unique_ptr<Optimizer> make_adamw(std::vector<ParamGroup> groups) {
  return std::make_unique<Adam>(std::move(groups), true);
}

}  // namespace ft::optim
