// cuDNN's fused attention (attention_cudnn.cpp) as an alternative to the engine's kernels for
// bf16/f16: the dispatcher (attention.cu) offers each call to these first; they run it on cuDNN
// and return true, or return false and the engine's kernels run. Which one runs is the switch
// FT_CUDA_ATTENTION (core/switches.h): engine (the default until a GPU session has verified
// cuDNN's path), cudnn, or auto (per problem, the faster of the two, timed once and kept).
#pragma once
#include <cstdint>
#include <functional>

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
bool backward_supported(int64_t Tk);

}  // namespace ft::cuda::attention_cudnn
