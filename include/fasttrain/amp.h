// Dynamic loss scaling for fp16 mixed precision: torch.cuda.amp.GradScaler with its defaults
// (initial scale 2^16, x2 after 2000 consecutive clean steps, x0.5 on overflow, the optimizer
// step skipped when any gradient is inf/NaN). The scale, the growth counter and the found-inf
// flag are 0-d tensors on the parameters' device; unscaling, the inf/NaN check, the step skip and
// the scale update all happen in kernels reading those tensors, so a step never waits for the
// host. Only get_scale() (for logging) reads the device. Implemented in src/optim/grad_scaler.cpp.
#pragma once
#include <cstdint>

#include "fasttrain/optim.h"
#include "fasttrain/safetensors.h"
#include "fasttrain/tensor.h"

namespace ft::amp {

struct GradScalerOptions {
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  bool enabled = true;  // disabled: scale() returns the loss, step() is optimizer.step()
};

class GradScaler {
 public:
  explicit GradScaler(GradScalerOptions options = {}, Device device = Device::cpu());
  // loss * scale (in the loss's dtype; the scale tensor is f32).
  Tensor scale(const Tensor& loss);
  // Divides every gradient of the optimizer's parameters by the scale in one fused pass and sets
  // found_inf when any gradient element is inf or NaN. At most once per step (a second call
  // before update() is an error, as in PyTorch); call it before clipping gradients.
  void unscale_(optim::Optimizer& optimizer);
  // unscale_ (if not done yet), then optimizer.step(found_inf): skipped on overflow.
  void step(optim::Optimizer& optimizer);
  // Updates the scale from found_inf (backoff, or growth after growth_interval clean steps) and
  // clears the per-step state.
  void update();

  double get_scale() const;  // reads the device: for logging only
  const Tensor& scale_tensor() const { return scale_; }
  const Tensor& found_inf() const { return found_inf_; }  // of the last unscale_
  bool enabled() const { return options_.enabled; }
  const GradScalerOptions& options() const { return options_; }

  // "scale" (0-d f32) and "growth_tracker" (0-d i64), the live tensors, for checkpoints; loading
  // checks names, shapes and dtypes before changing anything.
  TensorMap state_tensors() const;
  void load_state_tensors(const TensorMap& state);

 private:
  GradScalerOptions options_;
  Tensor scale_, growth_tracker_, found_inf_;
  bool unscaled_ = false;
};

}  // namespace ft::amp
