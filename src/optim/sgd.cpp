// SGD (torch.optim.SGD, maximize off). Per element, in f32 (f64 for f64 parameters):
//   d = g + wd*p
//   momentum != 0:  b = d on the buffer's first step, else b = momentum*b + (1-dampening)*d
//                   d = nesterov ? d + momentum*b : b
//   p -= lr*d
// One pass reading p, g, b and writing p, b.
#include "fasttrain/autograd.h"
#include "optim/multi_tensor.h"

namespace ft::optim {
namespace {

using detail::Segment;

template <class P, class G>
void sgd_update(const Segment& s, int64_t first, int64_t n) {
  using C = detail::update_t<P>;
  const GroupOptions& o = *s.options;
  const C lr = static_cast<C>(o.lr), wd = static_cast<C>(o.weight_decay);
  const C momentum = static_cast<C>(o.momentum), keep = static_cast<C>(1 - o.dampening);
  const bool use_momentum = o.momentum != 0, nesterov = o.nesterov;
  // PyTorch starts the buffer as a copy of the first gradient (no dampening on that step).
  const bool first_step = s.fresh_buffers;

  P* __restrict p = static_cast<P*>(s.param) + first;
  const G* __restrict g = static_cast<const G*>(s.grad) + first;
  C* __restrict b = use_momentum ? static_cast<C*>(s.buffers[0]) + first : nullptr;
  C* __restrict w = nullptr;
  if constexpr (detail::has_master_v<P>) w = s.master + first;
  else w = p;
  if (!use_momentum) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) {
      C pi = w[i];
      const C d = static_cast<C>(static_cast<compute_t<G>>(g[i])) + wd * pi;
      pi -= lr * d;
      w[i] = pi;
      if constexpr (detail::has_master_v<P>) p[i] = P(pi);
    }
    return;
  }
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    C pi = w[i];
    C d = static_cast<C>(static_cast<compute_t<G>>(g[i])) + wd * pi;
    const C bi = first_step ? d : momentum * b[i] + keep * d;
    b[i] = bi;
    d = nesterov ? d + momentum * bi : bi;
    pi -= lr * d;
    w[i] = pi;
    if constexpr (detail::has_master_v<P>) p[i] = P(pi);
  }
}

class Sgd final : public detail::MultiTensorOptimizer {
 public:
  explicit Sgd(std::vector<ParamGroup> groups) : MultiTensorOptimizer(std::move(groups)) { check_all_options(); }
  std::string name() const override { return "sgd"; }

  void step() override {
    autograd::NoGradGuard no_grad;
    const int64_t total = prepare_step();
    run_pass(total, &kernel);
    finish_step();
  }

 protected:
  int num_buffers(const GroupOptions& o) const override { return o.momentum != 0 ? 1 : 0; }
  const char* buffer_name(int) const override { return "momentum_buffer"; }
  void check_options(const GroupOptions& o, size_t g) const override {
    FT_CHECK(o.lr >= 0, name(), ": Invalid learning rate: ", o.lr, " (", group_label(g), ")");
    FT_CHECK(o.momentum >= 0, name(), ": Invalid momentum value: ", o.momentum, " (", group_label(g), ")");
    FT_CHECK(o.weight_decay >= 0, name(), ": Invalid weight_decay value: ", o.weight_decay, " (", group_label(g), ")");
    FT_CHECK(!o.nesterov || (o.momentum > 0 && o.dampening == 0), name(),
             ": Nesterov momentum requires a momentum and zero dampening (found momentum ", o.momentum,
             ", dampening ", o.dampening, "; ", group_label(g), ")");
  }

 private:
  static void kernel(const Segment& s, int64_t first, int64_t n) {
    detail::dispatch_param_grad(s.param_dtype, s.grad_dtype,
                                [&](auto p, auto g) { sgd_update<decltype(p), decltype(g)>(s, first, n); });
  }
};

}  // namespace

std::unique_ptr<Optimizer> make_sgd(std::vector<ParamGroup> groups) {
  return std::make_unique<Sgd>(std::move(groups));
}

}  // namespace ft::optim
