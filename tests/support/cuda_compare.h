// Helpers of the CUDA tests: move tensors to the GPU and compare a CUDA result with the CPU
// backend's by norms, ||got - want|| / ||want|| in f64 (the measure: f32 < 1e-5,
// bf16 < 1e-2). A NaN anywhere, a shape mismatch or a result left on the GPU fails.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "fasttrain/fasttrain.h"

namespace ft::testing {

inline Tensor gpu(const Tensor& t) { return t.to(Device::cuda(0)); }

inline double relative_error(const std::vector<double>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isnan(got[i]) != std::isnan(want[i])) return INFINITY;
    if (std::isnan(got[i])) continue;
    if (std::isinf(want[i]) || std::isinf(got[i])) {
      if (got[i] != want[i]) return INFINITY;
      continue;
    }
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  if (den == 0) return std::sqrt(num);
  return std::sqrt(num / den);
}

inline ::testing::AssertionResult close_to_cpu(const Tensor& got, const Tensor& want, double tol) {
  if (!got.defined() || !want.defined()) return ::testing::AssertionFailure() << "undefined tensor";
  if (!got.device().is_cuda()) return ::testing::AssertionFailure() << "result is on " << got.device().str();
  if (got.shape() != want.shape())
    return ::testing::AssertionFailure() << "shape " << got.shape().str() << ", expected " << want.shape().str();
  if (got.dtype() != want.dtype())
    return ::testing::AssertionFailure() << "dtype " << dtype_name(got.dtype()) << ", expected "
                                         << dtype_name(want.dtype());
  const double err = relative_error(got.to(Device::cpu()).to_vector(), want.to_vector());
  if (err < tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "relative error " << err << " >= " << tol;
}

// The tolerances by norms: f32 1e-5, 16-bit floats 1e-2 (f64 far below both).
inline double tol(DType dt) {
  switch (dt) {
    case DType::F64: return 1e-10;
    case DType::F32: return 1e-5;
    default: return 1e-2;
  }
}

// N(0, 1) * scale + shift drawn in f32 and rounded to dt, so the CPU and GPU see the same values.
inline Tensor rnd(const Shape& shape, DType dt, uint64_t seed, double scale = 1.0, double shift = 0.0) {
  Generator g(seed);
  return add(mul(randn(shape, DType::F32, &g), scale), shift).to(dt).detach();
}

// The same leaf on both devices, both requiring grad unless asked not to.
struct Leaf {
  Tensor cpu, cuda;
};
inline Leaf leaf(const Tensor& v, bool requires_grad = true) {
  Leaf l{v.detach().clone(), gpu(v.detach())};
  if (requires_grad) {
    l.cpu.requires_grad_();
    l.cuda.requires_grad_();
  }
  return l;
}

// Backpropagates the same random upstream gradient into y_cpu and y_cuda.
inline void backward_random(const Tensor& y_cpu, const Tensor& y_cuda, uint64_t seed) {
  Tensor gy = rnd(y_cpu.shape(), y_cpu.dtype(), seed);
  y_cpu.backward(gy);
  y_cuda.backward(gpu(gy));
}

}  // namespace ft::testing

// EXPECT_CLOSE_TO_CPU(cuda_result, cpu_result, tolerance)
#define EXPECT_CLOSE_TO_CPU(got, want, tol) EXPECT_TRUE(::ft::testing::close_to_cpu((got), (want), (tol)))
