// Dynamic loss scaling (torch.cuda.amp.GradScaler). unscale_ is one fused pass over every
// gradient: each element is multiplied by 1/scale (computed from the scale tensor by the pass)
// and checked for inf/NaN, with one flag per fixed block ORed in order into found_inf. update()
// is torch's _amp_update_scale_ on the 0-d tensors. Nothing here reads the scale or the flag on
// the host except get_scale().
#include "fasttrain/amp.h"

#include <cmath>

#include "backend/cpu/dispatch.h"
#include "fasttrain/autograd.h"
#include "fasttrain/ops.h"
#include "optim/grad_blocks.h"

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
  FT_CHECK(device.is_cpu(), "GradScaler: the scale lives on the parameters' device; only cpu is supported so far, "
           "found ", device.str());
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
  FT_CHECK(!unscaled_, "GradScaler.unscale_: unscale_() has already been called on this optimizer since the last "
           "update()");
  // Scratch kept for its capacity, named through references: inside the parallel lambda a
  // thread-local's own name would denote the worker thread's (empty) copy.
  thread_local optim::detail::GradBlocks gb_scratch;
  thread_local std::vector<uint8_t> found_scratch;
  thread_local std::vector<Tensor> params_scratch;
  optim::detail::GradBlocks& gb = gb_scratch;
  std::vector<uint8_t>& block_found = found_scratch;
  std::vector<Tensor>& params = params_scratch;
  params.clear();
  for (const auto& group : optimizer.param_groups()) params.insert(params.end(), group.params.begin(), group.params.end());
  optim::detail::collect_grads(params, "GradScaler.unscale_", gb);
  block_found.assign(gb.blocks.size(), 0);
  const float* scale = scale_.data<float>();
  optim::detail::for_each_grad_block(gb, [&](int64_t b, const Tensor& g, int64_t first, int64_t n) {
    // torch: inv_scale = scale.double().reciprocal().float()
    const float inv = static_cast<float>(1.0 / static_cast<double>(*scale));
    FT_DISPATCH_FLOATING(g.dtype(), "GradScaler.unscale_", [&] {
      using C = compute_t<scalar_t>;
      scalar_t* x = static_cast<scalar_t*>(g.raw_data()) + first;
      const C c = static_cast<C>(inv);
      bool bad = false;
      for (int64_t i = 0; i < n; ++i) {
        const C v = static_cast<C>(x[i]);
        bad |= !std::isfinite(v);
        x[i] = static_cast<scalar_t>(v * c);
      }
      block_found[b] = bad;
    });
  });
  uint8_t found = 0;
  for (uint8_t f : block_found) found |= f;
  *found_inf_.data<float>() = found ? 1.0f : 0.0f;
  for (const Tensor& g : gb.grads) g.bump_version();
  gb.grads.clear();  // do not keep the gradients and parameters alive
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
  FT_CHECK(unscaled_, "GradScaler.update: No inf checks were recorded prior to update (call step() or unscale_() "
           "first)");
  // torch's _amp_update_scale_: back off on overflow; grow after growth_interval clean steps,
  // unless growing would overflow f32.
  float& scale = *scale_.data<float>();
  int64_t& tracker = *growth_tracker_.data<int64_t>();
  if (*found_inf_.data<float>() != 0) {
    scale = static_cast<float>(scale * options_.backoff_factor);
    tracker = 0;
  } else if (tracker + 1 == options_.growth_interval) {
    const float grown = static_cast<float>(scale * options_.growth_factor);
    if (std::isfinite(grown)) scale = grown;
    tracker = 0;
  } else {
    ++tracker;
  }
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
  *scale_.data<float>() = static_cast<float>(scale);
  *growth_tracker_.data<int64_t>() = tracker;
}

}  // namespace ft::amp
