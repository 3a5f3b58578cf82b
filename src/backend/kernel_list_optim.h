// The kernel-table entries of the optimizers, gradient clipping, the loss scaler and random
// fills: X(name, signature), as in kernel_list.h (kept apart so each list reads in one screen).
#pragma once

#define FT_KERNELS_OPTIM(X)
