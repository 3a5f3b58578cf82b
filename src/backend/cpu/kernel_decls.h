// The CPU backend's kernels: one function per kernel-table entry, with the entry's own name and
// signature, declared from the lists (kernel_decls.h). The files that define them (elementwise.cpp,
// norm.cpp, ...) document each kernel's contract in their headers; cpu/kernels.cpp puts them in
// the table, where a missing definition or one with other parameters fails to link.
#pragma once
#include "backend/kernel_decls.h"

namespace ft::cpu {

FT_DECLARE_BACKEND_KERNELS()

}  // namespace ft::cpu
