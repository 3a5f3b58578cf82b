// The CUDA backend's kernels: one function per kernel-table entry it provides, with the entry's
// own name and signature, declared from the lists (kernel_decls.h: a definition with another
// signature leaves the declared one undefined, which fails to link). kernels.cpp puts them in the
// table; an entry without one stays empty and the op says "no cuda kernel for <name>".
#pragma once
#include "backend/kernel_decls.h"

namespace ft::cuda {

FT_DECLARE_BACKEND_KERNELS()  // the fused entries it leaves out stay undefined

// The table, built once (runtime.cu's backend record hands it to the core).
const backend::Kernels& cuda_kernels();

}  // namespace ft::cuda
