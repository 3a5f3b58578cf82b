// The shape of an elementwise loop over up to four operands (operand 0 is the output), shared by
// the CPU loops (cpu/loops.h) and the CUDA kernels: inputs broadcast to the output's shape by zero
// strides, size-1 dimensions dropped, and neighbours that are contiguous in every operand merged,
// so most loops end up one- or two-dimensional whatever views the op was given.
#pragma once
#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "fasttrain/shape.h"

namespace ft {
class Tensor;
}

namespace ft::backend {

struct StridedLoop {
  static constexpr int kMaxArgs = 4;
  int ndim = 0;
  int nargs = 0;
  int64_t numel = 0;
  int64_t shape[kMaxDims] = {};
  int64_t strides[kMaxArgs][kMaxDims] = {};  // bytes
  char* base[kMaxArgs] = {};
  size_t elem_size[kMaxArgs] = {};
};

// out must already have the broadcast shape; inputs must broadcast to it (cpu/loops.cpp).
StridedLoop make_loop(const Tensor& out, std::initializer_list<const Tensor*> inputs);

}  // namespace ft::backend
