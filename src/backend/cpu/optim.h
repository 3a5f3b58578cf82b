// CPU kernels of the optimizers, gradient clipping, the loss scaler and random fills (the
// entries of kernel_list_optim.h; the math is in backend/random_math.h). random_fill.cpp has the
// fills.
#pragma once
#include "backend/kernel_list_optim.h"

namespace ft::cpu {

void random_fill(const Tensor& out, const random_math::RandomFill& fill);

}  // namespace ft::cpu
