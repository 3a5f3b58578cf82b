// CPU kernels of the optimizers, gradient clipping, the loss scaler and random fills (the
// entries of kernel_list_optim.h; the math is in backend/optim_math.h and random_math.h).
// optim.cpp has the multi-tensor steps, grad_passes.cpp the passes over gradients only,
// random_fill.cpp the fills. Every reduction here sums fixed-size blocks and adds the blocks in
// order (multi_tensor_blocks.h), so no result depends on the thread count.
#pragma once
#include <cstdint>
#include <span>

#include "backend/cpu/kernel_decls.h"
#include "backend/kernel_list_optim.h"

namespace ft::cpu {

// The entries (sgd_step, adam_step, lamb_step, lars_step, clip_grad_norm, clip_grad_value,
// unscale_grads, update_loss_scale, random_fill) are declared from the list (kernel_decls.h); their
// contracts are the list's comments.

}  // namespace ft::cpu
