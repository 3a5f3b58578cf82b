// One optimisation step (train_step.h): the precision policy, accumulation, clipping, the
// optimizer step and loss scaling, in the order Lightning applies them.
#include "fasttrain/train_step.h"

#include <iterator>

#include "core/fault_injection.h"
#include "core/name_table.h"
#include "fasttrain/autocast.h"
#include "fasttrain/autograd.h"
#include "fasttrain/ops.h"
#include "fasttrain/profiler.h"

namespace ft::train {

namespace {

struct PrecisionName {
  Precision value;
  const char* name;
};
// Lightning's names first, in enum order (precision_name indexes them), then the aliases BENCH.md
// uses.
constexpr PrecisionName kPrecisionNames[] = {{Precision::FP32, "32"},
                                             {Precision::TF32, "tf32"},
                                             {Precision::BF16Mixed, "bf16-mixed"},
                                             {Precision::FP16Mixed, "fp16-mixed"},
                                             {Precision::BF16True, "bf16-true"},
                                             {Precision::FP32, "fp32"},
                                             {Precision::FP32, "32-true"},
                                             {Precision::BF16Mixed, "bf16"},
                                             {Precision::FP16Mixed, "fp16"},
                                             {Precision::FP16Mixed, "16-mixed"}};
static_assert(ft::detail::rows_start_in_enum_order(kPrecisionNames, kPrecisionCount),
              "one Lightning name per Precision first, in enum order");

struct ClipAlgorithmName {
  ClipAlgorithm value;
  const char* name;
};
constexpr ClipAlgorithmName kClipAlgorithmNames[] = {{ClipAlgorithm::Norm, "norm"}, {ClipAlgorithm::Value, "value"}};
static_assert(std::size(kClipAlgorithmNames) == kClipAlgorithmCount &&
                  ft::detail::rows_start_in_enum_order(kClipAlgorithmNames, kClipAlgorithmCount),
              "one row per ClipAlgorithm, in enum order");

}  // namespace

Precision precision_from_name(const std::string& name) {
  for (const auto& p : kPrecisionNames)
    if (name == p.name) return p.value;
  FT_FAIL("precision: expected 32, tf32, bf16-mixed, fp16-mixed or bf16-true (or fp32, bf16, fp16), found '", name,
          "'");
}

const char* precision_name(Precision p) { return kPrecisionNames[static_cast<size_t>(p)].name; }

bool precision_is_mixed(Precision p) { return p == Precision::BF16Mixed || p == Precision::FP16Mixed; }

bool precision_is_bf16(Precision p) { return p == Precision::BF16Mixed || p == Precision::BF16True; }

ClipAlgorithm clip_algorithm_from_name(const std::string& name) {
  for (const auto& a : kClipAlgorithmNames)
    if (name == a.name) return a.value;
  FT_FAIL("gradient_clip_algorithm: expected ", ft::detail::names_list(kClipAlgorithmNames), ", found '", name, "'");
}

const char* clip_algorithm_name(ClipAlgorithm a) { return kClipAlgorithmNames[static_cast<size_t>(a)].name; }

StepRunner::StepRunner(nn::UnaryModule& model, optim::Optimizer& optimizer, LossFn loss, StepOptions options)
    : StepRunner(static_cast<nn::Module&>(model), optimizer, std::move(options)) {
  unary_ = &model;
  loss_ = std::move(loss);
}

StepRunner::StepRunner(nn::Module& model, optim::Optimizer& optimizer, StepOptions options)
    : model_(model), optimizer_(optimizer), options_(std::move(options)) {
  FT_CHECK(options_.accumulate >= 1, "accumulate: expected at least 1 micro-batch per step, found ",
           options_.accumulate);
  FT_CHECK(options_.clip >= 0, "gradient clipping: expected 0 (off) or a positive value, found ", options_.clip);
  amp::GradScalerOptions so = options_.scaler;
  so.enabled = options_.precision == Precision::FP16Mixed;
  Device device = Device::cpu();
  params_ = model_.parameters();
  if (!params_.empty()) device = params_.front().device();
  scaler_ = std::make_unique<amp::GradScaler>(so, device);
  if (options_.precision == Precision::BF16True) model_.to(DType::BF16);
}

DType StepRunner::autocast_dtype() const {
  switch (options_.precision) {
    case Precision::BF16Mixed: return DType::BF16;
    case Precision::FP16Mixed: return DType::F16;
    default: return DType::F32;
  }
}

Tensor StepRunner::model_input(const Tensor& input) const {
  if (options_.precision == Precision::BF16True && is_floating(input.dtype()) && input.dtype() != DType::BF16)
    return input.to(DType::BF16);
  return input;
}

Tensor StepRunner::forward_backward(const Tensor& input, const Tensor& target) {
  FT_CHECK(unary_ != nullptr && loss_,
           "StepRunner: forward_backward(input, target) needs the runner built with a "
           "one-input model and a loss; give the forward as a closure instead");
  return forward_backward([&] { return loss_((*unary_)(model_input(input)), target); });
}

Tensor StepRunner::forward_backward(const LossOf& loss_of) {
  FT_CHECK(micro_ < options_.accumulate, "StepRunner: ", micro_, " micro-batches already run for this step of ",
           options_.accumulate, "; call optimizer_step() first");
  if (micro_ == 0) optimizer_.zero_grad(/*set_to_none=*/true);
  fault::point("forward");
  const AllowTf32Guard tf32(options_.precision == Precision::TF32);  // forward and backward products
  Tensor loss;
  {
    // Forward and loss under autocast, backward outside it (torch.autocast's rule).
    const bool mixed = precision_is_mixed(options_.precision);
    autocast::AutocastGuard amp(mixed ? autocast_dtype() : DType::BF16, mixed);
    profiler::PhaseScope phase(profiler::Phase::Forward);
    if (sync_ != nullptr) sync_->before_forward();
    loss = loss_of();
  }
  Tensor to_backprop = loss;
  if (options_.accumulate > 1) to_backprop = div(to_backprop, static_cast<double>(options_.accumulate));
  if (scaler_->enabled()) to_backprop = scaler_->scale(to_backprop);
  fault::point("backward");
  const bool last = micro_ + 1 == options_.accumulate;
  if (sync_ != nullptr) sync_->before_backward(last);
  {
    profiler::PhaseScope phase(profiler::Phase::Backward);
    to_backprop.backward();
  }
  if (sync_ != nullptr) sync_->after_backward(last);
  ++micro_;
  // Summed over log intervals by callers: keep it f32 (bf16-true losses are bf16).
  return loss.dtype() == DType::F32 ? loss.detach() : loss.detach().to(DType::F32);
}

void StepRunner::optimizer_step() {
  FT_CHECK(micro_ == options_.accumulate, "StepRunner: optimizer_step() after ", micro_, " micro-batches, expected ",
           options_.accumulate, " (accumulate)");
  fault::point("optimizer");
  micro_ = 0;
  if (sync_ != nullptr) {  // the replicas' mean gradients: what backward did not hide is waited for here
    profiler::PhaseScope phase(profiler::Phase::Communication);
    sync_->finish();
  }
  profiler::PhaseScope phase(profiler::Phase::Optimizer);
  if (scaler_->enabled()) {
    scaler_->unscale_(optimizer_);  // clip real gradients, not scaled ones
    if (sync_ != nullptr) sync_->agree_found_inf(scaler_->found_inf());
  }
  grad_norm_ = Tensor();
  if (options_.clip > 0) {
    if (options_.clip_algorithm == ClipAlgorithm::Norm)
      grad_norm_ = sync_ != nullptr ? sync_->clip_grad_norm(params_, options_.clip)
                                    : optim::clip_grad_norm_(params_, options_.clip);
    else if (sync_ != nullptr)
      sync_->clip_grad_value(params_, options_.clip);
    else
      optim::clip_grad_value_(params_, options_.clip);
  }
  if (scaler_->enabled()) {
    scaler_->step(optimizer_);
    scaler_->update();
  } else {
    optimizer_.step();
  }
  if (sync_ != nullptr) sync_->after_step();
}

Tensor StepRunner::step(const Tensor& input, const Tensor& target) {
  const int64_t n = options_.accumulate;
  FT_CHECK(input.dim() >= 1 && input.size(0) % n == 0 && target.size(0) == input.size(0),
           "StepRunner::step: expected a batch whose first dim divides into accumulate = ", n, " micro-batches (input ",
           input.shape().str(), ", target ", target.shape().str(), ")");
  const int64_t micro = input.size(0) / n;
  Tensor loss_sum;
  for (int64_t i = 0; i < n; ++i) {
    Tensor l = forward_backward(input.narrow(0, i * micro, micro), target.narrow(0, i * micro, micro));
    loss_sum = loss_sum.defined() ? add(loss_sum, l) : l;
  }
  optimizer_step();
  return n > 1 ? div(loss_sum, static_cast<double>(n)) : loss_sum;
}

}  // namespace ft::train
