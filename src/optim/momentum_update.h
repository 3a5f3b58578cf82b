// The per-element SGD-with-momentum update shared by SGD and LARS (LARS is SGD whose weight-
// decayed gradient is first scaled by the tensor's trust ratio; SGD passes 1). In f32 (f64 for
// f64 parameters):
//   d = trust * (g + wd*p)
//   momentum != 0:  b = d on the buffer's first step, else b = momentum*b + (1-dampening)*d
//                   d = nesterov ? d + momentum*b : b
//   p -= lr*d
// One pass reading p, g, b and writing p, b.
#pragma once
#include "optim/multi_tensor.h"

namespace ft::optim::detail {

template <class P, class G>
void momentum_update(const Segment& s, int64_t first, int64_t n, update_t<P> trust) {
  using C = update_t<P>;
  const GroupOptions& o = *s.options;
  const C lr = static_cast<C>(o.lr), wd = static_cast<C>(o.weight_decay);
  const C momentum = static_cast<C>(o.momentum), keep = static_cast<C>(1 - o.dampening);
  const bool use_momentum = o.momentum != 0, nesterov = o.nesterov;
  // PyTorch starts the buffer as a copy of the first gradient (no dampening on that step).
  const bool first_step = *s.step == s.buffers_first_step;

  P* __restrict p = static_cast<P*>(s.param) + first;
  const G* __restrict g = static_cast<const G*>(s.grad) + first;
  C* __restrict b = use_momentum ? static_cast<C*>(s.buffers[0]) + first : nullptr;
  C* __restrict w = nullptr;
  if constexpr (has_master_v<P>) w = s.master + first;
  else w = p;
  if (!use_momentum) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) {
      C pi = w[i];
      const C d = trust * (static_cast<C>(static_cast<compute_t<G>>(g[i])) + wd * pi);
      pi -= lr * d;
      w[i] = pi;
      if constexpr (has_master_v<P>) p[i] = P(pi);
    }
    return;
  }
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    C pi = w[i];
    C d = trust * (static_cast<C>(static_cast<compute_t<G>>(g[i])) + wd * pi);
    const C bi = first_step ? d : momentum * b[i] + keep * d;
    b[i] = bi;
    d = nesterov ? d + momentum * bi : bi;
    pi -= lr * d;
    w[i] = pi;
    if constexpr (has_master_v<P>) p[i] = P(pi);
  }
}

}  // namespace ft::optim::detail
