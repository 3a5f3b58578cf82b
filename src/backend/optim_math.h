// The math of src/optim, written once for every backend: the per-element updates of SGD, Adam /
// AdamW, LAMB and LARS with their per-tensor coefficients, the clipping factor and the loss-scale
// rule. The CPU kernels (cpu/optim.cpp, cpu/grad_passes.cpp) and, compiled by nvcc, CUDA kernels
// call these, so both produce the same numbers.
//
// C is the arithmetic type of an update: f32, or f64 for f64 parameters. Coefficients are computed
// in f64 from the group's options (any struct with GroupOptions' fields) and the parameter's step
// count, then rounded to C once, so every element of a tensor uses the same constants. The step
// count is an argument because it lives in device memory: a kernel reads it, the host never does.
#pragma once
#include <cmath>
#include <cstdint>

#include "backend/host_device.h"

namespace ft::optim_math {

// --- SGD and LARS -----------------------------------------------------------------------------
// LARS is SGD whose weight-decayed gradient is first scaled by the tensor's trust ratio (SGD: 1):
//   d = trust * (g + wd*p)
//   momentum != 0:  b = d on the buffer's first step, else b = momentum*b + (1-dampening)*d
//                   d = nesterov ? d + momentum*b : b
//   p -= lr*d
template <class C>
struct MomentumCoefficients {
  C lr, wd, momentum, keep, trust;
  bool use_momentum, nesterov;
  bool first_step;  // PyTorch starts the buffer as a copy of the first gradient (no dampening then)

  template <class Options>
  FT_HD MomentumCoefficients(const Options& o, C trust_ratio, bool buffer_first_step)
      : lr(static_cast<C>(o.lr)),
        wd(static_cast<C>(o.weight_decay)),
        momentum(static_cast<C>(o.momentum)),
        keep(static_cast<C>(1 - o.dampening)),
        trust(trust_ratio),
        use_momentum(o.momentum != 0),
        nesterov(o.nesterov),
        first_step(buffer_first_step) {}
};

// Without momentum: the new weight.
template <class C>
FT_HD C sgd_update(const MomentumCoefficients<C>& k, C w, C g) {
  const C d = k.trust * (g + k.wd * w);
  return w - k.lr * d;
}

// With momentum: updates the buffer b and returns the new weight.
template <class C>
FT_HD C momentum_update(const MomentumCoefficients<C>& k, C w, C g, C& b) {
  C d = k.trust * (g + k.wd * w);
  const C bi = k.first_step ? d : k.momentum * b + k.keep * d;
  b = bi;
  d = k.nesterov ? d + k.momentum * bi : bi;
  return w - k.lr * d;
}

// LARS (You et al. 2017, torchlars / timm form): trust_coefficient * ||p|| / (||g|| + wd*||p||),
// 1 when either norm is zero and for groups with exclude_from_adaptation.
template <class Options>
FT_HD double lars_trust_ratio(const Options& o, double w_norm, double g_norm) {
  if (o.exclude_from_adaptation || w_norm == 0 || g_norm == 0) return 1.0;
  return o.trust_coefficient * w_norm / (g_norm + o.weight_decay * w_norm);
}

// --- Adam and AdamW (amsgrad off, maximize off) -------------------------------------------------
//   AdamW: p *= 1 - lr*wd              Adam: g += wd*p   (L2, coupled)
//   m = beta1*m + (1-beta1)*g          v = beta2*v + (1-beta2)*g*g
//   p -= lr/(1-beta1^t) * m / (sqrt(v)/sqrt(1-beta2^t) + eps)
template <class C>
struct AdamCoefficients {
  C decay, l2, beta1, one_minus_beta1, beta2, one_minus_beta2, step_size, bias2_sqrt, eps;

  template <class Options>
  FT_HD AdamCoefficients(const Options& o, int64_t step) {
    using std::pow, std::sqrt;
    const double bias1 = 1 - pow(o.beta1, static_cast<double>(step));
    const double bias2 = 1 - pow(o.beta2, static_cast<double>(step));
    decay = static_cast<C>(1 - o.lr * o.weight_decay);
    l2 = static_cast<C>(o.weight_decay);
    beta1 = static_cast<C>(o.beta1);
    one_minus_beta1 = static_cast<C>(1 - o.beta1);
    beta2 = static_cast<C>(o.beta2);
    one_minus_beta2 = static_cast<C>(1 - o.beta2);
    step_size = static_cast<C>(o.lr / bias1);
    bias2_sqrt = static_cast<C>(sqrt(bias2));
    eps = static_cast<C>(o.eps);
  }
};

// Updates m and v and returns the new weight.
template <bool kDecoupled, class C>
FT_HD C adam_update(const AdamCoefficients<C>& k, C w, C g, C& m, C& v) {
  using std::sqrt;
  if constexpr (kDecoupled)
    w *= k.decay;
  else
    g += k.l2 * w;
  const C mi = k.beta1 * m + k.one_minus_beta1 * g;
  const C vi = k.beta2 * v + k.one_minus_beta2 * g * g;
  m = mi;
  v = vi;
  return w - k.step_size * (mi / (sqrt(vi) / k.bias2_sqrt + k.eps));
}

// --- LAMB (You et al. 2019; the NVLAMB form of apex FusedLAMB, which adapts every tensor) -------
//   m = beta1*m + (1-beta1)*g          v = beta2*v + (1-beta2)*g*g
//   u = (m/(1-beta1^t)) / (sqrt(v)/sqrt(1-beta2^t) + eps) + wd*p      (decoupled weight decay)
//   p -= lr * r * u,   r = ||p|| / ||u|| per tensor (1 when either norm is zero)
// The norms need the whole tensor, so a step is two passes: moments and norms, then the update,
// which recomputes u from the stored moments instead of keeping it.
template <class C>
struct LambCoefficients {
  C beta1, one_minus_beta1, beta2, one_minus_beta2, inv_bias1, inv_bias2_sqrt, eps, wd;

  template <class Options>
  FT_HD LambCoefficients(const Options& o, int64_t step) {
    using std::pow, std::sqrt;
    const double t = static_cast<double>(step);
    beta1 = static_cast<C>(o.beta1);
    one_minus_beta1 = static_cast<C>(1 - o.beta1);
    beta2 = static_cast<C>(o.beta2);
    one_minus_beta2 = static_cast<C>(1 - o.beta2);
    inv_bias1 = static_cast<C>(1 / (1 - pow(o.beta1, t)));
    inv_bias2_sqrt = static_cast<C>(1 / sqrt(1 - pow(o.beta2, t)));
    eps = static_cast<C>(o.eps);
    wd = static_cast<C>(o.weight_decay);
  }
  FT_HD C direction(C m, C v, C w) const {
    using std::sqrt;
    return m * inv_bias1 / (sqrt(v) * inv_bias2_sqrt + eps) + wd * w;
  }
};

// Pass 1: updates m and v and returns u (whose squares the caller sums with those of p).
template <class C>
FT_HD C lamb_moments(const LambCoefficients<C>& k, C w, C g, C& m, C& v) {
  const C mi = k.beta1 * m + k.one_minus_beta1 * g;
  const C vi = k.beta2 * v + k.one_minus_beta2 * g * g;
  m = mi;
  v = vi;
  return k.direction(mi, vi, w);
}

FT_HD double lamb_trust_ratio(double w_norm, double u_norm) { return w_norm > 0 && u_norm > 0 ? w_norm / u_norm : 1.0; }

// Pass 2: the new weight; step = lr * trust ratio, rounded to C.
template <class C>
FT_HD C lamb_update(const LambCoefficients<C>& k, C step, C w, C m, C v) {
  return w - step * k.direction(m, v, w);
}

// --- gradient clipping and loss scaling -------------------------------------------------------

// torch.nn.utils.clip_grad_norm_: gradients are multiplied by this when it is below 1 (a NaN norm
// gives NaN, which is not >= 1, so NaN propagates as in PyTorch).
FT_HD double clip_coefficient(double max_norm, double total_norm) { return max_norm / (total_norm + 1e-6); }

// GradScaler.unscale_ multiplies by 1/scale computed as torch does: scale.double().reciprocal().float().
FT_HD float inverse_scale(float scale) { return static_cast<float>(1.0 / static_cast<double>(scale)); }

// torch's _amp_update_scale_: back off on overflow; grow after growth_interval clean steps, unless
// growing would overflow f32.
FT_HD void update_loss_scale(float& scale, int64_t& growth_tracker, bool found_inf, double growth_factor,
                             double backoff_factor, int64_t growth_interval) {
  using std::isfinite;
  if (found_inf) {
    scale = static_cast<float>(scale * backoff_factor);
    growth_tracker = 0;
  } else if (growth_tracker + 1 == growth_interval) {
    const float grown = static_cast<float>(scale * growth_factor);
    if (isfinite(grown)) scale = grown;
    growth_tracker = 0;
  } else {
    ++growth_tracker;
  }
}

}  // namespace ft::optim_math
