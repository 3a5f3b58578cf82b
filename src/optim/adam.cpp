// Adam and AdamW (torch.optim.Adam / AdamW, amsgrad off, maximize off). Per element, in f32
// (f64 for f64 parameters), with t the parameter's own step count:
//   AdamW: p *= 1 - lr*wd              Adam: g += wd*p   (L2, coupled)
//   m = beta1*m + (1-beta1)*g          v = beta2*v + (1-beta2)*g*g
//   p -= lr/(1-beta1^t) * m / (sqrt(v)/sqrt(1-beta2^t) + eps)
// Memory traffic per element: read p, g, m, v; write p, m, v (28 bytes in f32) in one pass, where
// PyTorch's foreach path makes about six passes over the parameters.
#include <cmath>

#include "optim/multi_tensor.h"

namespace ft::optim {
namespace {

using detail::Segment;

template <bool kDecoupled, class P, class G>
void adam_update(const Segment& s, int64_t first, int64_t n) {
  using C = detail::update_t<P>;
  const GroupOptions& o = *s.options;
  const double bias1 = 1 - std::pow(o.beta1, static_cast<double>(*s.step));
  const double bias2 = 1 - std::pow(o.beta2, static_cast<double>(*s.step));
  const C decay = static_cast<C>(1 - o.lr * o.weight_decay), l2 = static_cast<C>(o.weight_decay);
  const C beta1 = static_cast<C>(o.beta1), one_minus_beta1 = static_cast<C>(1 - o.beta1);
  const C beta2 = static_cast<C>(o.beta2), one_minus_beta2 = static_cast<C>(1 - o.beta2);
  const C step_size = static_cast<C>(o.lr / bias1), bias2_sqrt = static_cast<C>(std::sqrt(bias2));
  const C eps = static_cast<C>(o.eps);

  P* __restrict p = static_cast<P*>(s.param) + first;
  const G* __restrict g = static_cast<const G*>(s.grad) + first;
  C* __restrict m = static_cast<C*>(s.buffers[0]) + first;
  C* __restrict v = static_cast<C*>(s.buffers[1]) + first;
  // bf16/f16 parameters: the f32 master copy is the value being updated.
  C* __restrict w = nullptr;
  if constexpr (detail::has_master_v<P>) w = s.master + first;
  else w = p;
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    C pi = w[i];
    C gi = static_cast<C>(static_cast<compute_t<G>>(g[i]));
    if constexpr (kDecoupled) pi *= decay;
    else gi += l2 * pi;
    const C mi = beta1 * m[i] + one_minus_beta1 * gi;
    const C vi = beta2 * v[i] + one_minus_beta2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    pi -= step_size * (mi / (std::sqrt(vi) / bias2_sqrt + eps));
    w[i] = pi;
    if constexpr (detail::has_master_v<P>) p[i] = P(pi);
  }
}

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
  void check_options(const GroupOptions& o, size_t g) const override {
    check_adam_family_options(o, g);
  }

 private:
  void update(int64_t total) override {
    if (decoupled_) run_pass(total, &kernel<true>);
    else run_pass(total, &kernel<false>);
  }
  template <bool kDecoupled>
  static void kernel(const Segment& s, int64_t first, int64_t n) {
    detail::dispatch_param_grad(s.param_dtype, s.grad_dtype, [&](auto p, auto g) {
      adam_update<kDecoupled, decltype(p), decltype(g)>(s, first, n);
    });
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
