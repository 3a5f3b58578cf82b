// CPU kernels of the optimizers, gradient clipping, the loss scaler and random fills (the
// entries of kernel_list_optim.h).
#pragma once
#include "backend/kernel_list_optim.h"

namespace ft::cpu {}  // namespace ft::cpu
