// LAMB (You et al. 2019; the NVLAMB form of NVIDIA apex FusedLAMB, which adapts every tensor).
// Per element, in f32 (f64 for f64 parameters), with t the parameter's own step count:
//   m = beta1*m + (1-beta1)*g          v = beta2*v + (1-beta2)*g*g
//   u = (m/(1-beta1^t)) / (sqrt(v)/sqrt(1-beta2^t) + eps) + wd*p      (decoupled weight decay)
//   p -= lr * r * u,   r = ||p|| / ||u|| per tensor (1 when either norm is zero)
// Pass 1 updates m and v and sums ||p||^2 and ||u||^2 per tensor in fixed blocks (see
// multi_tensor.h); pass 2 recomputes u from the stored moments and applies it. State per
// parameter: "step", "exp_avg" (m), "exp_avg_sq" (v), and "master" for bf16/f16 parameters.
#include <cmath>

#include "optim/multi_tensor.h"

namespace ft::optim {
namespace {

using detail::Segment;

// The per-element constants of one segment's step.
template <class C>
struct LambCoefficients {
  C beta1, one_minus_beta1, beta2, one_minus_beta2, inv_bias1, inv_bias2_sqrt, eps, wd;
  explicit LambCoefficients(const Segment& s) {
    const GroupOptions& o = *s.options;
    const double t = static_cast<double>(*s.step);
    beta1 = static_cast<C>(o.beta1);
    one_minus_beta1 = static_cast<C>(1 - o.beta1);
    beta2 = static_cast<C>(o.beta2);
    one_minus_beta2 = static_cast<C>(1 - o.beta2);
    inv_bias1 = static_cast<C>(1 / (1 - std::pow(o.beta1, t)));
    inv_bias2_sqrt = static_cast<C>(1 / std::sqrt(1 - std::pow(o.beta2, t)));
    eps = static_cast<C>(o.eps);
    wd = static_cast<C>(o.weight_decay);
  }
  C direction(C m, C v, C w) const { return m * inv_bias1 / (std::sqrt(v) * inv_bias2_sqrt + eps) + wd * w; }
};

template <class P, class G>
void lamb_moments_and_norms(const Segment& s, int64_t first, int64_t n, double* sums) {
  using C = detail::update_t<P>;
  const LambCoefficients<C> k(s);
  const G* __restrict g = static_cast<const G*>(s.grad) + first;
  C* __restrict m = static_cast<C*>(s.buffers[0]) + first;
  C* __restrict v = static_cast<C*>(s.buffers[1]) + first;
  const C* __restrict w = detail::weights<P>(s) + first;
  double w_sq = 0, u_sq = 0;
#pragma omp simd reduction(+ : w_sq, u_sq)
  for (int64_t i = 0; i < n; ++i) {
    const C gi = static_cast<C>(static_cast<compute_t<G>>(g[i]));
    const C mi = k.beta1 * m[i] + k.one_minus_beta1 * gi;
    const C vi = k.beta2 * v[i] + k.one_minus_beta2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const C ui = k.direction(mi, vi, w[i]);
    w_sq += static_cast<double>(w[i]) * w[i];
    u_sq += static_cast<double>(ui) * ui;
  }
  sums[0] += w_sq;
  sums[1] += u_sq;
}

template <class P>
void lamb_apply(const Segment& s, int64_t first, int64_t n) {
  using C = detail::update_t<P>;
  const LambCoefficients<C> k(s);
  const double w_norm = s.norms[0], u_norm = s.norms[1];
  const double ratio = w_norm > 0 && u_norm > 0 ? w_norm / u_norm : 1.0;
  const C step = static_cast<C>(s.options->lr * ratio);
  P* __restrict p = static_cast<P*>(s.param) + first;
  const C* __restrict m = static_cast<const C*>(s.buffers[0]) + first;
  const C* __restrict v = static_cast<const C*>(s.buffers[1]) + first;
  C* __restrict w = detail::weights<P>(s) + first;
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const C pi = w[i] - step * k.direction(m[i], v[i], w[i]);
    w[i] = pi;
    if constexpr (detail::has_master_v<P>) p[i] = P(pi);
  }
}

class Lamb final : public detail::MultiTensorOptimizer {
 public:
  explicit Lamb(std::vector<ParamGroup> groups) : MultiTensorOptimizer(std::move(groups)) { check_all_options(); }
  OptimizerKind kind() const override { return OptimizerKind::LAMB; }

 protected:
  int num_buffers(const GroupOptions&) const override { return 2; }
  const char* buffer_name(int index) const override { return index == 0 ? "exp_avg" : "exp_avg_sq"; }
  void check_options(const GroupOptions& o, size_t g) const override {
    check_adam_family_options(o, g);
  }
  void update(int64_t total) override {
    run_norm_pass(
        [](const Segment& s, int64_t first, int64_t n, double* sums) {
          detail::dispatch_param_grad(s.param_dtype, s.grad_dtype, [&](auto p, auto g) {
            lamb_moments_and_norms<decltype(p), decltype(g)>(s, first, n, sums);
          });
        },
        [](const Segment&) { return true; });
    run_pass(total, [](const Segment& s, int64_t first, int64_t n) {
      detail::dispatch_param_grad(s.param_dtype, s.grad_dtype,
                                  [&](auto p, auto) { lamb_apply<decltype(p)>(s, first, n); });
    });
  }
};

}  // namespace

std::unique_ptr<Optimizer> make_lamb(std::vector<ParamGroup> groups) {
  return std::make_unique<Lamb>(std::move(groups));
}

}  // namespace ft::optim
