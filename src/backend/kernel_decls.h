// Declares a backend's kernels from the lists: inside a backend's namespace,
//
//   FT_DECLARE_BACKEND_KERNELS()
//
// names the parameter blocks there and declares one function per entry with the entry's own name and signature (name_fn
// is the signature's type), and the table's assignment (`k.name = &backend::name`) takes that one. A definition with
// other parameters leaves it undefined, so the program fails to link: nobody keeps a second copy of a signature by
// hand.
#pragma once
#include "backend/kernels.h"

#define FT_DECLARE_KERNEL(name, sig) \
  using name##_fn = sig;             \
  name##_fn name;

#define FT_DECLARE_BACKEND_KERNELS()  \
  using backend::AttentionParams;     \
  using backend::BatchNormLayout;     \
  using backend::ConvParams;          \
  using backend::Fp8ScaleParams;      \
  using backend::IndexErrorText;      \
  using backend::MultiTensorStep;     \
  using backend::PoolParams;          \
  FT_KERNELS(FT_DECLARE_KERNEL)       \
  FT_KERNELS_OPTIM(FT_DECLARE_KERNEL) \
  FT_KERNELS_FUSED(FT_DECLARE_KERNEL)
