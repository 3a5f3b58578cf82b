// Autocast's per-op policy in one table (torch.autocast's op lists): which ops run in the
// low-precision dtype and which widen 16-bit inputs to f32. An op not in the table runs in its
// inputs' promoted dtype. An op consults the table first thing:
//
//   if (auto c = ops::autocast_inputs(AutocastOp::linear, x, weight, bias)) return linear((*c)[0], (*c)[1], (*c)[2]);
//
// and re-dispatches on the cast inputs; the cast ones no longer ask for a cast, so it recurses once.
#pragma once
#include <array>
#include <iterator>
#include <optional>

#include "fasttrain/autocast.h"

namespace ft::ops {

enum class CastClass {
  LowPrecision,  // f32 inputs are cast to the region's bf16/f16 (products: where the speed is)
  Float32,       // bf16/f16 inputs are widened (exp/log/sums over many terms: where range and accuracy are)
  // As Float32, but the kernel widens 16-bit inputs as it reads them (it computes in f32 for
  // every dtype) and the op returns an f32 result: the same computation up to the order of its
  // f32 sums (the vectorised loops differ by input dtype), without the widened copy of the input
  // or the rounding copy of its gradient. For cross-entropy over a language model's vocabulary
  // those copies are each as large as the logits (docs/PERF.md).
  Float32InKernel,
};

#define FT_AUTOCAST_OPS(X)                      \
  X(matmul, LowPrecision)                       \
  X(bmm, LowPrecision)                          \
  X(linear, LowPrecision)                       \
  X(conv2d, LowPrecision)                       \
  X(scaled_dot_product_attention, LowPrecision) \
  X(softmax, Float32)                           \
  X(log_softmax, Float32)                       \
  X(cross_entropy, Float32InKernel)

enum class AutocastOp {
#define FT_AUTOCAST_ENUM(op, cls) op,
  FT_AUTOCAST_OPS(FT_AUTOCAST_ENUM)
#undef FT_AUTOCAST_ENUM
};

inline constexpr CastClass kAutocastPolicy[] = {
#define FT_AUTOCAST_CLASS(op, cls) CastClass::cls,
    FT_AUTOCAST_OPS(FT_AUTOCAST_CLASS)
#undef FT_AUTOCAST_CLASS
};

constexpr CastClass autocast_class(AutocastOp op) { return kAutocastPolicy[static_cast<int>(op)]; }

// The inputs cast as `op`'s class asks when autocast is on and one of them needs it; nullopt
// when the op should run on its inputs as they are.
template <class... T>
std::optional<std::array<Tensor, sizeof...(T)>> autocast_inputs(AutocastOp op, const T&... inputs) {
  if (autocast_class(op) == CastClass::Float32InKernel) return std::nullopt;  // see autocast_result_dtype
  if (autocast_class(op) == CastClass::LowPrecision) {
    if (!autocast::needs_lowp({&inputs...})) return std::nullopt;
    return std::array<Tensor, sizeof...(T)>{autocast::lowp(inputs)...};
  }
  if (!autocast::needs_fp32({&inputs...})) return std::nullopt;
  return std::array<Tensor, sizeof...(T)>{autocast::fp32(inputs)...};
}

// The dtype of a Float32InKernel op's result on input x: f32 where autocast would have widened
// x, x's own dtype otherwise.
inline DType autocast_result_dtype(AutocastOp op, const Tensor& x) {
  return autocast_class(op) == CastClass::Float32InKernel && autocast::needs_fp32({&x}) ? DType::F32 : x.dtype();
}

}  // namespace ft::ops
