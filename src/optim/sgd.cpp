// SGD (torch.optim.SGD, maximize off): momentum, dampening, Nesterov and coupled weight decay, as
// one multi-tensor pass (the device's sgd_step; the math is backend/optim_math.h's momentum update
// with a trust ratio of 1).
#include "optim/multi_tensor.h"

namespace ft::optim {
namespace {

class Sgd final : public detail::MultiTensorOptimizer {
 public:
  explicit Sgd(std::vector<ParamGroup> groups) : MultiTensorOptimizer(std::move(groups)) { check_all_options(); }
  OptimizerKind kind() const override { return OptimizerKind::SGD; }

 protected:
  int num_buffers(const GroupOptions& o) const override { return o.momentum != 0 ? 1 : 0; }
  const char* buffer_name(int) const override { return "momentum_buffer"; }
  void check_options(const GroupOptions& o, size_t g) const override {
    check_momentum_family_options(o, g);
    FT_CHECK(!o.nesterov || (o.momentum > 0 && o.dampening == 0), name(),
             ": Nesterov momentum requires a momentum and zero dampening (found momentum ", o.momentum, ", dampening ",
             o.dampening, "; ", group_label(g), ")");
  }

 private:
  void update(const backend::Kernels& kernels, const backend::MultiTensorStep& step) override {
    kernels.sgd_step(step);
  }
};

}  // namespace

std::unique_ptr<Optimizer> make_sgd(std::vector<ParamGroup> groups) { return std::make_unique<Sgd>(std::move(groups)); }

}  // namespace ft::optim
