// Mixed precision (torch.autocast): a thread-local policy applied where ops are dispatched.
// Inside an AutocastGuard, ops of the low-precision class — matmul, bmm, linear, conv2d,
// scaled_dot_product_attention — cast their f32 inputs to the guard's dtype (bf16 or f16) and
// run there; ops of the f32 class — softmax, log_softmax, cross_entropy — cast 16-bit inputs to
// f32. Every other op runs in its inputs' promoted dtype; norms compute their statistics in f32
// whatever the input. Parameters stay f32 (the master weights): their casts are differentiable,
// so gradients arrive in f32, and each parameter is cast once per autocast region (cached until
// the outermost guard exits), not once per use.
#pragma once
#include <initializer_list>

#include "fasttrain/tensor.h"

namespace ft::autocast {

class AutocastGuard {
 public:
  // dtype: BF16 or F16. enabled = false makes a region that turns autocast off.
  explicit AutocastGuard(DType dtype = DType::BF16, bool enabled = true);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  bool prev_enabled_;
  DType prev_dtype_;
};

bool enabled();
DType lowp_dtype();

// --- for op implementations ---
// True when autocast is on and any input is f32: the op should re-dispatch on lowp() inputs.
bool needs_lowp(std::initializer_list<const Tensor*> inputs);
// t cast to the low-precision dtype when it is f32 (cached for parameters); otherwise t.
Tensor lowp(const Tensor& t);
// True when autocast is on and any input is bf16/f16: the op should re-dispatch on fp32() inputs.
bool needs_fp32(std::initializer_list<const Tensor*> inputs);
// t cast to f32 when it is bf16/f16; otherwise t.
Tensor fp32(const Tensor& t);
// Number of casts served from the cache since the process started (tests read it).
int64_t cache_hits();

}  // namespace ft::autocast
