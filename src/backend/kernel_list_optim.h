// The kernel-table entries of the optimizers, gradient clipping, the loss scaler and random
// fills: X(name, signature), as in kernel_list.h (kept apart so each list reads in one screen).
// The math every backend implements is in random_math.h.
#pragma once
#include "backend/random_math.h"
#include "fasttrain/tensor.h"

// clang-format off
#define FT_KERNELS_OPTIM(X)                                                                                         \
  /* random fills of a contiguous tensor of any dtype */                                                            \
  X(random_fill, void(const Tensor& out, const random_math::RandomFill& fill))
// clang-format on
