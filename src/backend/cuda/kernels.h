// The CUDA backend's kernels: one function per kernel-table entry it provides, with the entry's
// own name and signature (declared from the lists, so a definition with another signature is a
// compile error). kernels.cpp puts them in the table; an entry without one stays empty and the
// op says "no cuda kernel for <name>".
#pragma once
#include "backend/kernels.h"

namespace ft::cuda {

using backend::AttentionParams;
using backend::BatchNormLayout;
using backend::ConvParams;
using backend::IndexErrorText;
using backend::MultiTensorStep;
using backend::PoolParams;

#define FT_CUDA_DECLARE(name, sig) \
  using name##_fn = sig;           \
  name##_fn name;
FT_KERNELS(FT_CUDA_DECLARE)
FT_KERNELS_OPTIM(FT_CUDA_DECLARE)
FT_KERNELS_FUSED(FT_CUDA_DECLARE)  // those kernels.cpp lists are defined; the others stay undefined
#undef FT_CUDA_DECLARE

// The table, built once (runtime.cu registers it with the core).
const backend::Kernels& cuda_kernels();

}  // namespace ft::cuda
