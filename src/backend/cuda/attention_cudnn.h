// cuDNN's fused attention (attention_cudnn.cpp) as an alternative to the engine's kernels for
// bf16/f16: the dispatcher (attention.cu) offers each call to these first; they run it on cuDNN
// and return true, or return false and the engine's kernels run. Which one runs is the switch
// FT_CUDA_ATTENTION (core/switches.h): engine (the default until a GPU session has verified
// cuDNN's path), cudnn, or auto (per problem, the faster of the two, timed once and kept).
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include "backend/kernel_params.h"

namespace ft::cuda::attention_cudnn {

// `engine` runs the engine's kernels for the same call (auto times it against cuDNN's). Both
// produce out and lse with the same meaning (lse = max + log(sum) of the scaled scores, f32), so
// a forward on one and a backward on the other agree.
bool forward(const Tensor& q, const Tensor& k, const Tensor& v, const backend::AttentionParams& p, const Tensor& out,
             const Tensor& lse, const Tensor& out_f32, const std::function<void()>& engine);
bool backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
              const Tensor& dout, const backend::AttentionParams& p, const Tensor& dq, const Tensor& dk,
              const Tensor& dv, const std::function<void()>& engine);

// For the tests: how many calls of each pass ran on cuDNN in this process (auto's timing runs
// included), and whether this cuDNN takes a backward over Tk keys (before 9.15.1, multiples of
// 128 only).
struct RunCounts {
  int64_t forward = 0, backward = 0;
};
RunCounts run_counts();

// Without a GPU: builds the plan of one pass for a device described by cuDNN's device-properties
// JSON (device_properties_json() on a machine with that GPU). Built: the plan finalized (a GPU is
// present); Compiled: cuDNN's engine took the graph and compiled its kernel, and only loading the
// kernel failed for want of a GPU (the CUDA driver there is the toolkit's stub; the graph's
// arithmetic is checked only where a GPU runs it); NoDriver: cuDNN's runtime-compiled engines
// found no CUDA driver library at all (not even the stub), so nothing was learnt; Refused: no
// engine took it. `detail` holds cuDNN's reasons, one per configuration tried. Operands dense
// [B, H, T, D], or [B, T, H, D] storage.
struct PlanCheck {
  bool backward = false;
  DType dtype = DType::BF16;
  int64_t B = 1, H = 1, Hkv = 1, Tq = 1, Tk = 1, D = 64;
  bool causal = false;
  bool bthd = false;
  bool deterministic = false;  // the backward's deterministic graph
};
struct PlanVerdict {
  enum Kind { Built, Compiled, NoDriver, Refused } kind = Refused;
  std::string detail;
};
PlanVerdict check_plan_for_device(const std::string& device_json, const PlanCheck& c);
// cuDNN's device-properties JSON of CUDA device `device` (the GPU check records it for the above).
std::string device_properties_json(int device);
bool backward_supported(int64_t Tk);

}  // namespace ft::cuda::attention_cudnn
