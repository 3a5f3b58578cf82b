// Small helpers shared by op implementations.
#pragma once
#include "fasttrain/autograd.h"
#include "fasttrain/tensor.h"

namespace ft::ops {

// Throws unless every defined tensor lives on the same device; returns that device.
Device common_device(std::initializer_list<const Tensor*> ts, const char* op);
// Throws "<op>: <what> must be a floating-point tensor, found i64".
void check_floating(const Tensor& t, const char* op, const char* what);
// Throws unless the tensor is on the CPU (until the CUDA backend provides the kernel).
void check_cpu(const Tensor& t, const char* op);
// A 0-d tensor holding `s`, of the dtype an op with tensor `like` computes in.
Tensor scalar_like(Scalar s, const Tensor& like);

}  // namespace ft::ops
