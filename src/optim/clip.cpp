// Gradient clipping (torch.nn.utils.clip_grad_norm_ / clip_grad_value_), each one kernel-table
// entry of the gradients' device. The squared global norm is one pass over every gradient (summed
// in f64 per fixed block, blocks added in order: the same result for any thread count); the clip
// factor min(1, max_norm/(norm + 1e-6)) is computed by the scaling pass itself from the norm
// tensor, so the host never reads it.
#include <algorithm>
#include <cmath>

#include "backend/kernels.h"
#include "fasttrain/autograd.h"
#include "fasttrain/ops.h"
#include "fasttrain/optim.h"
#include "optim/grad_list.h"

namespace ft::optim {

Tensor clip_grad_norm_(const std::vector<Tensor>& params, double max_norm) {
  FT_CHECK(max_norm > 0, "clip_grad_norm_: expected a positive max_norm, found ", max_norm);
  thread_local detail::GradList gl;  // kept for its capacity
  detail::collect_grads(params, "clip_grad_norm_", gl);
  // f64 when every gradient is f64 (as PyTorch's norm), else f32.
  const bool all_f64 = !gl.grads.empty() && std::all_of(gl.grads.begin(), gl.grads.end(),
                                                        [](const Tensor& g) { return g.dtype() == DType::F64; });
  Tensor norm = empty({}, TensorOptions(all_f64 ? DType::F64 : DType::F32, gl.device));
  backend::kernels(gl.device).clip_grad_norm(gl.grads, max_norm, norm);
  for (const Tensor& g : gl.grads) g.bump_version();
  gl.grads.clear();  // do not keep the gradients alive
  return norm;
}

void clip_grad_value_(const std::vector<Tensor>& params, double clip_value) {
  FT_CHECK(clip_value >= 0, "clip_grad_value_: expected a non-negative clip_value, found ", clip_value);
  thread_local detail::GradList gl;
  detail::collect_grads(params, "clip_grad_value_", gl);
  backend::kernels(gl.device).clip_grad_value(gl.grads, clip_value);
  for (const Tensor& g : gl.grads) g.bump_version();
  gl.grads.clear();
}

NormClip norm_clip(double total_squares, double max_norm) {
  NormClip c;
  c.norm = static_cast<float>(std::sqrt(total_squares));
  c.factor = max_norm / (static_cast<double>(c.norm) + 1e-6);
  return c;
}

double grad_squares(const Tensor& g) {
  const Tensor v = g.to(Device::cpu()).to(DType::F64).contiguous();
  const double* d = v.data<double>();
  double s = 0;
  for (int64_t i = 0, n = v.numel(); i < n; ++i) s += d[i] * d[i];
  return s;
}

void scale_grads_(const std::vector<Tensor>& params, float factor) {
  autograd::NoGradGuard no_grad;
  for (const Tensor& p : params) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    mul_(g, factor);
    g.bump_version();
  }
}

}  // namespace ft::optim
