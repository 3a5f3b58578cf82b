// Dynamic loss scaling (torch.cuda.amp.GradScaler). unscale_ is one fused pass over every
// gradient (the device's unscale_grads): each element is multiplied by 1/scale (computed from the
// scale tensor by the pass) and checked for inf/NaN into found_inf. update() is torch's
// _amp_update_scale_ on the 0-d tensors (update_loss_scale). Nothing here reads the scale or the
// flag on the host except get_scale().
#include "fasttrain/amp.h"

#include <cmath>

#include "backend/kernels.h"
#include "fasttrain/autograd.h"
#include "fasttrain/ops.h"
#include "optim/grad_list.h"

namespace ft::amp {

GradScaler::GradScaler(GradScalerOptions options, Device device) : options_(options) {
  FT_CHECK(std::isfinite(options_.init_scale) && options_.init_scale > 0,
           "GradScaler: init_scale must be a positive finite number, found ", options_.init_scale);
  FT_CHECK(options_.growth_factor > 1, "GradScaler: The growth factor must be > 1.0 (found ", options_.growth_factor,
           ")");
  FT_CHECK(options_.backoff_factor > 0 && options_.backoff_factor < 1,
           "GradScaler: The backoff factor must be < 1.0 and > 0 (found ", options_.backoff_factor, ")");
  FT_CHECK(options_.growth_interval > 0, "GradScaler: growth_interval must be a positive integer, found ",
           options_.growth_interval);
  scale_ = scalar_tensor(static_cast<float>(options_.init_scale), TensorOptions(DType::F32, device));
  growth_tracker_ = scalar_tensor(int64_t{0}, TensorOptions(DType::I64, device));
  found_inf_ = scalar_tensor(0.0f, TensorOptions(DType::F32, device));
}

Tensor GradScaler::scale(const Tensor& loss) {
  FT_CHECK(loss.defined(), "GradScaler.scale: the loss is undefined");
  if (!options_.enabled) return loss;
  FT_CHECK(is_floating(loss.dtype()), "GradScaler.scale: expected a floating-point loss, found dtype ",
           dtype_name(loss.dtype()));
  FT_CHECK(loss.device() == scale_.device(), "GradScaler.scale: the loss is on ", loss.device().str(),
           ", the scale on ", scale_.device().str());
  return mul(loss, loss.dtype() == DType::F32 ? scale_ : scale_.to(loss.dtype()));
}

void GradScaler::unscale_(optim::Optimizer& optimizer) {
  if (!options_.enabled) return;
  FT_CHECK(!unscaled_,
           "GradScaler.unscale_: unscale_() has already been called on this optimizer since the last "
           "update()");
  thread_local optim::detail::GradList gl;  // kept for its capacity
  thread_local std::vector<Tensor> params;
  params.clear();
  for (const auto& group : optimizer.param_groups())
    params.insert(params.end(), group.params.begin(), group.params.end());
  optim::detail::collect_grads(params, "GradScaler.unscale_", gl);
  FT_CHECK(gl.grads.empty() || gl.device == scale_.device(), "GradScaler.unscale_: the gradients are on ",
           gl.device.str(), ", the scale on ", scale_.device().str());
  backend::kernels(scale_).unscale_grads(gl.grads, scale_, found_inf_);
  for (const Tensor& g : gl.grads) g.bump_version();
  gl.grads.clear();  // do not keep the gradients and parameters alive
  params.clear();
  unscaled_ = true;
}

void GradScaler::step(optim::Optimizer& optimizer) {
  if (!options_.enabled) {
    optimizer.step();
    return;
  }
  if (!unscaled_) unscale_(optimizer);
  optimizer.step(found_inf_);
}

void GradScaler::update() {
  if (!options_.enabled) return;
  FT_CHECK(unscaled_,
           "GradScaler.update: No inf checks were recorded prior to update (call step() or unscale_() "
           "first)");
  backend::kernels(scale_).update_loss_scale(scale_, growth_tracker_, found_inf_, options_.growth_factor,
                                             options_.backoff_factor, options_.growth_interval);
  unscaled_ = false;
}

double GradScaler::get_scale() const { return options_.enabled ? scale_.item<double>() : 1.0; }

TensorMap GradScaler::state_tensors() const { return {{"scale", scale_}, {"growth_tracker", growth_tracker_}}; }

void GradScaler::load_state_tensors(const TensorMap& state) {
  const Tensor* found[2] = {nullptr, nullptr};
  const char* names[2] = {"scale", "growth_tracker"};
  const DType dtypes[2] = {DType::F32, DType::I64};
  for (const auto& [key, t] : state) {
    int k = key == names[0] ? 0 : key == names[1] ? 1 : -1;
    FT_CHECK(k >= 0, "GradScaler state: unexpected entry '", key, "' (expected 'scale' and 'growth_tracker')");
    FT_CHECK(found[k] == nullptr, "GradScaler state: entry '", key, "' appears twice");
    FT_CHECK(t.defined() && t.dim() == 0 && t.dtype() == dtypes[k], "GradScaler state: entry '", key,
             "' must be a 0-d ", dtype_name(dtypes[k]), " tensor, found ",
             t.defined() ? std::string(dtype_name(t.dtype())) + " " + t.shape().str() : std::string("undefined"));
    found[k] = &t;
  }
  for (int k = 0; k < 2; ++k) FT_CHECK(found[k] != nullptr, "GradScaler state: entry '", names[k], "' is missing");
  const double scale = found[0]->item<double>();
  const int64_t tracker = found[1]->item<int64_t>();
  FT_CHECK(std::isfinite(scale) && scale > 0, "GradScaler state: 'scale' must be positive and finite, found ", scale);
  FT_CHECK(tracker >= 0, "GradScaler state: 'growth_tracker' must be >= 0, found ", tracker);
  scale_.copy_(*found[0]);
  growth_tracker_.copy_(*found[1]);
}

}  // namespace ft::amp
