// LARS (You et al. 2017, in the form of torchlars / timm's Lars): SGD whose weight-decayed
// gradient is scaled per tensor by the trust ratio before the momentum update. Per element, in
// f32 (f64 for f64 parameters):
//   r = trust_coefficient * ||p|| / (||g|| + wd*||p||)   (1 when either norm is zero, and for
//                                                        groups with exclude_from_adaptation)
//   d = r * (g + wd*p), then momentum, dampening, Nesterov and p -= lr*d as in SGD
// Pass 1 sums ||p||^2 and ||g||^2 per adapted tensor in fixed blocks (see multi_tensor.h);
// pass 2 is SGD's update (momentum_update.h). State per parameter: "step", "momentum_buffer"
// when momentum != 0, and "master" for bf16/f16 parameters.
#include "optim/momentum_update.h"
#include "optim/multi_tensor.h"

namespace ft::optim {
namespace {

using detail::Segment;

template <class P, class G>
void lars_norms(const Segment& s, int64_t first, int64_t n, double* sums) {
  using C = detail::update_t<P>;
  const G* __restrict g = static_cast<const G*>(s.grad) + first;
  const C* __restrict w = detail::weights<P>(s) + first;
  double w_sq = 0, g_sq = 0;
#pragma omp simd reduction(+ : w_sq, g_sq)
  for (int64_t i = 0; i < n; ++i) {
    const double gi = static_cast<C>(static_cast<compute_t<G>>(g[i]));
    w_sq += static_cast<double>(w[i]) * w[i];
    g_sq += gi * gi;
  }
  sums[0] += w_sq;
  sums[1] += g_sq;
}

double trust_ratio(const Segment& s) {
  const GroupOptions& o = *s.options;
  const double w_norm = s.norms[0], g_norm = s.norms[1];
  if (o.exclude_from_adaptation || w_norm == 0 || g_norm == 0) return 1.0;
  return o.trust_coefficient * w_norm / (g_norm + o.weight_decay * w_norm);
}

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
             ": Nesterov momentum requires a momentum and zero dampening (found momentum ", o.momentum,
             ", dampening ", o.dampening, "; ", group_label(g), ")");
  }
  void update(int64_t total) override {
    run_norm_pass(
        [](const Segment& s, int64_t first, int64_t n, double* sums) {
          detail::dispatch_param_grad(s.param_dtype, s.grad_dtype, [&](auto p, auto g) {
            lars_norms<decltype(p), decltype(g)>(s, first, n, sums);
          });
        },
        [](const Segment& s) { return !s.options->exclude_from_adaptation; });
    run_pass(total, [](const Segment& s, int64_t first, int64_t n) {
      detail::dispatch_param_grad(s.param_dtype, s.grad_dtype, [&](auto p, auto g) {
        using C = detail::update_t<decltype(p)>;
        detail::momentum_update<decltype(p), decltype(g)>(s, first, n, static_cast<C>(trust_ratio(s)));
      });
    });
  }
};

}  // namespace

std::unique_ptr<Optimizer> make_lars(std::vector<ParamGroup> groups) {
  return std::make_unique<Lars>(std::move(groups));
}

}  // namespace ft::optim
