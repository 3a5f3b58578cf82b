// CPU kernels of the optimizers, gradient clipping, the loss scaler and random fills (the
// entries of kernel_list_optim.h; the math is in backend/optim_math.h and random_math.h).
// optim.cpp has the multi-tensor steps, grad_passes.cpp the passes over gradients only,
// random_fill.cpp the fills. Every reduction here sums fixed-size blocks and adds the blocks in
// order (multi_tensor_blocks.h), so no result depends on the thread count.
#pragma once
#include <cstdint>
#include <span>

#include "backend/kernel_list_optim.h"

namespace ft::cpu {

using backend::MultiTensorStep;

void sgd_step(const MultiTensorStep& step);
void adam_step(const MultiTensorStep& step, bool decoupled_weight_decay);
void lamb_step(const MultiTensorStep& step);
void lars_step(const MultiTensorStep& step);

void clip_grad_norm(std::span<const Tensor> grads, double max_norm, const Tensor& total_norm);
void clip_grad_value(std::span<const Tensor> grads, double clip_value);
void unscale_grads(std::span<const Tensor> grads, const Tensor& scale, const Tensor& found_inf);
void update_loss_scale(const Tensor& scale, const Tensor& growth_tracker, const Tensor& found_inf, double growth_factor,
                       double backoff_factor, int64_t growth_interval);

void random_fill(const Tensor& out, const random_math::RandomFill& fill);

}  // namespace ft::cpu
