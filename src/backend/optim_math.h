// The math of src/optim, written once for every backend: the clipping factor and the loss-scale
// rule. The CPU kernels (cpu/grad_passes.cpp) and, compiled by nvcc, CUDA kernels call these, so
// both produce the same numbers.
#pragma once
#include <cmath>
#include <cstdint>

#include "backend/host_device.h"

namespace ft::optim_math {

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
