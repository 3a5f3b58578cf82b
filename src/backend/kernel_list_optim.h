// The kernel-table entries of the optimizers, gradient clipping, the loss scaler and random
// fills: X(name, signature), as in kernel_list.h (kept apart so each list reads in one screen).
// The math every backend implements is in optim_math.h and random_math.h.
//
// Gradient lists are the defined gradients of a parameter list, each dense (contiguous or
// channels-last, walked as a flat array), all on the table's device.
#pragma once
#include <cstdint>
#include <span>

#include "backend/multi_tensor.h"
#include "backend/random_math.h"
#include "fasttrain/tensor.h"

// clang-format off
#define FT_KERNELS_OPTIM(X)                                                                                         \
  /* multi-tensor optimizer steps: advance the step counts, then update every segment (multi_tensor.h) */          \
  X(sgd_step, void(const MultiTensorStep& step))                                                                    \
  X(adam_step, void(const MultiTensorStep& step, bool decoupled_weight_decay))                                      \
  X(lamb_step, void(const MultiTensorStep& step))                                                                   \
  X(lars_step, void(const MultiTensorStep& step))                                                                   \
  /* clipping: total_norm (0-d f32 or f64) = the global L2 norm; gradients scaled by min(1, clip_coefficient) */   \
  X(clip_grad_norm, void(std::span<const Tensor> grads, double max_norm, const Tensor& total_norm))                \
  X(clip_grad_value, void(std::span<const Tensor> grads, double clip_value))                                        \
  /* loss scaling: grads *= 1/scale and found_inf = any inf/NaN; then torch's _amp_update_scale_ (0-d tensors) */  \
  X(unscale_grads, void(std::span<const Tensor> grads, const Tensor& scale, const Tensor& found_inf))              \
  X(update_loss_scale, void(const Tensor& scale, const Tensor& growth_tracker, const Tensor& found_inf,             \
                            double growth_factor, double backoff_factor, int64_t growth_interval))                  \
  /* random fills of a contiguous tensor of any dtype */                                                            \
  X(random_fill, void(const Tensor& out, const random_math::RandomFill& fill))
// clang-format on
