// SGD (torch.optim.SGD, maximize off): the momentum update of momentum_update.h with a trust
// ratio of 1, as one multi-tensor pass.
#include "optim/momentum_update.h"
#include "optim/multi_tensor.h"

namespace ft::optim {
namespace {

using detail::Segment;

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
             ": Nesterov momentum requires a momentum and zero dampening (found momentum ", o.momentum,
             ", dampening ", o.dampening, "; ", group_label(g), ")");
  }

 private:
  void update(int64_t total) override { run_pass(total, &kernel); }
  static void kernel(const Segment& s, int64_t first, int64_t n) {
    detail::dispatch_param_grad(s.param_dtype, s.grad_dtype, [&](auto p, auto g) {
      detail::momentum_update<decltype(p), decltype(g)>(s, first, n, 1);
    });
  }
};

}  // namespace

std::unique_ptr<Optimizer> make_sgd(std::vector<ParamGroup> groups) {
  return std::make_unique<Sgd>(std::move(groups));
}

}  // namespace ft::optim
