// The gradients of a parameter list, gathered and checked once for the passes over gradients only
// (clip_grad_norm_, clip_grad_value_, GradScaler::unscale_), which then run as one kernel-table
// entry of the gradients' device.
#pragma once
#include <vector>

#include "fasttrain/tensor.h"

namespace ft::optim::detail {

struct GradList {
  std::vector<Tensor> grads;  // every defined gradient, in parameter order
  Device device;              // of the gradients; of the first parameter when there are none
};

// Collects the gradients of `params` (parameters without one are skipped) and checks that each is
// a dense floating tensor and that all are on one device; `who` names the caller in messages.
inline void collect_grads(const std::vector<Tensor>& params, const char* who, GradList& out) {
  out.grads.clear();
  out.device = params.empty() || !params[0].defined() ? Device::cpu() : params[0].device();
  size_t first = 0;  // the parameter whose gradient set the device
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i];
    FT_CHECK(p.defined(), who, ": parameter ", i, " is undefined");
    Tensor g = p.grad();
    if (!g.defined()) continue;
    if (out.grads.empty()) {
      out.device = g.device();
      first = i;
    }
    FT_CHECK(g.device() == out.device, who, ": the gradient of parameter ", i, " is on ", g.device().str(),
             ", that of parameter ", first, " on ", out.device.str());
    FT_CHECK(is_floating(g.dtype()), who, ": the gradient of parameter ", i, " has dtype ", dtype_name(g.dtype()),
             ", expected f32, f64, bf16 or f16");
    // The passes walk any dense storage as a flat array.
    FT_CHECK(g.is_contiguous() || g.is_channels_last(), who, ": the gradient of parameter ", i, " is not dense (shape ",
             g.shape().str(), ", strides ", g.strides().str(), ")");
    out.grads.push_back(std::move(g));
  }
}

}  // namespace ft::optim::detail
