// One optimisation step (train_step.h): the precision policy, accumulation, clipping, the
// optimizer step and loss scaling, in the order Lightning applies them.
#include "fasttrain/train_step.h"

#include <cstdio>
#include <iterator>

#include "core/fault_injection.h"
#include "core/name_table.h"
#include "fasttrain/allocator.h"
#include "fasttrain/autocast.h"
#include "fasttrain/autograd.h"
#include "fasttrain/cuda_graph.h"
#include "fasttrain/ops.h"
#include "fasttrain/profiler.h"

namespace ft::train {

namespace {

// Lightning's names first, in enum order (precision_name indexes them), then the aliases BENCH.md
// uses.
constexpr NamedValue<Precision> kPrecisionNames[] = {{Precision::FP32, "32"},
                                                     {Precision::TF32, "tf32"},
                                                     {Precision::BF16Mixed, "bf16-mixed"},
                                                     {Precision::FP16Mixed, "fp16-mixed"},
                                                     {Precision::BF16True, "bf16-true"},
                                                     {Precision::FP8Mixed, "fp8-mixed"},
                                                     {Precision::FP32, "fp32"},
                                                     {Precision::FP32, "32-true"},
                                                     {Precision::BF16Mixed, "bf16"},
                                                     {Precision::FP16Mixed, "fp16"},
                                                     {Precision::FP16Mixed, "16-mixed"},
                                                     {Precision::FP8Mixed, "fp8"}};
static_assert(ft::detail::rows_start_in_enum_order(kPrecisionNames, kPrecisionCount),
              "one Lightning name per Precision first, in enum order");

constexpr NamedValue<ClipAlgorithm> kClipAlgorithmNames[] = {{ClipAlgorithm::Norm, "norm"},
                                                             {ClipAlgorithm::Value, "value"}};
static_assert(std::size(kClipAlgorithmNames) == kClipAlgorithmCount &&
                  ft::detail::rows_start_in_enum_order(kClipAlgorithmNames, kClipAlgorithmCount),
              "one row per ClipAlgorithm, in enum order");

}  // namespace

std::span<const NamedValue<Precision>> option_names(Precision) { return kPrecisionNames; }
std::span<const NamedValue<ClipAlgorithm>> option_names(ClipAlgorithm) { return kClipAlgorithmNames; }

Precision precision_from_name(const std::string& name) { return parse_name<Precision>("precision", name); }

const char* precision_name(Precision p) { return name_of(p); }

bool precision_is_mixed(Precision p) {
  return p == Precision::BF16Mixed || p == Precision::FP16Mixed || p == Precision::FP8Mixed;
}

bool precision_is_bf16(Precision p) {
  return p == Precision::BF16Mixed || p == Precision::BF16True || p == Precision::FP8Mixed;
}

ClipAlgorithm clip_algorithm_from_name(const std::string& name) {
  return parse_name<ClipAlgorithm>("gradient_clip_algorithm", name);
}

const char* clip_algorithm_name(ClipAlgorithm a) { return name_of(a); }

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
    case Precision::BF16Mixed:
    case Precision::FP8Mixed: return DType::BF16;
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
    Fp8Autocast fp8(options_.fp8, options_.precision == Precision::FP8Mixed);
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

void StepRunner::run_micro_batches(const std::function<void()>& schedule) {
  FT_CHECK(micro_ == 0, "StepRunner: ", micro_,
           " micro-batches already run for this step; call optimizer_step() first");
  optimizer_.zero_grad(/*set_to_none=*/true);
  const AllowTf32Guard tf32(options_.precision == Precision::TF32);
  schedule();
  micro_ = options_.accumulate;
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
  // FP8's delayed scales: this step's amaxes enter the histories, the next step's scales follow.
  if (options_.precision == Precision::FP8Mixed) {
    const auto states = fp8_states(model_);  // one walk of the module tree per step
    if (sync_ != nullptr) {
      std::vector<Tensor> amaxes;
      for (const auto& [name, state] : states) amaxes.push_back(state->amax);
      sync_->agree_fp8_amax(amaxes);
    }
    for (const auto& [name, state] : states) state->update_scales(options_.fp8);
  }
}

StepResult StepRunner::eager_step(const std::vector<Tensor>& batch, const BatchLoss& loss_of) {
  const int64_t n = options_.accumulate;
  FT_CHECK(!batch.empty() && batch[0].dim() >= 1, "StepRunner::step: expected a batch of tensors with rows first");
  const int64_t rows = batch[0].size(0);
  for (const Tensor& t : batch)
    FT_CHECK(t.dim() >= 1 && t.size(0) == rows && rows % n == 0,
             "StepRunner::step: expected a batch whose tensors share a first dim that divides into accumulate = ", n,
             " micro-batches (found ", batch[0].shape().str(), " and ", t.shape().str(), ")");
  const int64_t micro = rows / n;
  StepResult r;
  std::vector<Tensor> slices(batch.size());
  for (int64_t i = 0; i < n; ++i) {
    for (size_t k = 0; k < batch.size(); ++k) slices[k] = n > 1 ? batch[k].narrow(0, i * micro, micro) : batch[k];
    Tensor l = forward_backward([&] { return loss_of(slices, r.outputs); });
    r.loss = r.loss.defined() ? add(r.loss, l) : l;
  }
  optimizer_step();
  if (n > 1) r.loss = div(r.loss, static_cast<double>(n));
  for (Tensor& t : r.outputs) t = t.detach();
  return r;
}

StepResult StepRunner::step(const std::vector<Tensor>& batch, const BatchLoss& loss_of) {
  if (!wants_graph(batch)) return eager_step(batch, loss_of);
  return graphed_step(batch, loss_of);
}

Tensor StepRunner::step(const Tensor& input, const Tensor& target) {
  FT_CHECK(unary_ != nullptr && loss_,
           "StepRunner: step(input, target) needs the runner built with a one-input model and a loss; give the "
           "forward as a closure instead");
  return step({input, target}, [this](const std::vector<Tensor>& b,
                                      std::vector<Tensor>&) { return loss_((*unary_)(model_input(b[0])), b[1]); })
      .loss;
}

// --- CUDA graphs ------------------------------------------------------------------------------------

namespace {

struct TensorLayout {
  Shape shape;
  Strides strides;
  DType dtype;
};

}  // namespace

// A captured step and what its replays read and write: each batch is copied into `batch` before a
// replay; `result`, `grad_norm` and the gradients are the tensors the capture made, which every
// replay overwrites.
struct StepRunner::GraphedStep {
  explicit GraphedStep(Device device) : graph(device) {}
  CudaGraph graph;
  std::vector<Tensor> batch;          // in the layout of the batch captured (empty_like)
  std::vector<TensorLayout> layouts;  // that batch's tensors': later batches must match them
  StepResult result;
  Tensor grad_norm;
  std::vector<Tensor> grads;  // params_[i]'s gradient as captured
};

StepRunner::~StepRunner() = default;

bool StepRunner::graph_captured() const { return graphed_ != nullptr; }

bool StepRunner::wants_graph(const std::vector<Tensor>& batch) const {
  if (!options_.cuda_graphs || !graph_refused_.empty() || sync_ != nullptr || micro_ != 0 || batch.empty())
    return false;
  for (const Tensor& t : batch)
    if (!t.defined() || !t.device().is_cuda() || t.device() != batch[0].device()) return false;
  return true;
}

namespace {

bool same_layouts(const std::vector<Tensor>& batch, const std::vector<TensorLayout>& captured) {
  if (batch.size() != captured.size()) return false;
  for (size_t i = 0; i < batch.size(); ++i) {
    const TensorLayout& c = captured[i];
    if (batch[i].shape() != c.shape || batch[i].dtype() != c.dtype || batch[i].strides() != c.strides) return false;
  }
  return true;
}

}  // namespace

StepResult StepRunner::graphed_step(const std::vector<Tensor>& batch, const BatchLoss& loss_of) {
  if (graphed_) {
    if (same_layouts(batch, graphed_->layouts)) return replay(batch);
    return eager_step(batch, loss_of);  // another batch shape (a last, shorter batch)
  }
  if (eager_graph_steps_ < kGraphWarmupSteps) {
    ++eager_graph_steps_;
    return eager_step(batch, loss_of);
  }
  auto g = std::make_unique<GraphedStep>(batch[0].device());
  for (const Tensor& t : batch) {
    Tensor copy = empty_like(t);
    copy.copy_(t);
    g->batch.push_back(copy);
    g->layouts.push_back({t.shape(), t.strides(), t.dtype()});
  }
  const int64_t optimizer_steps = optimizer_.step_count();
  try {
    g->graph.capture([&] { g->result = eager_step(g->batch, loss_of); });
  } catch (const GraphCaptureError& e) {
    // Nothing of the capture ran on the device; the host's step bookkeeping goes back.
    micro_ = 0;
    optimizer_.undo_captured_step(optimizer_steps);
    graph_refused_ = e.what();
    std::fprintf(stderr, "cuda graphs: the training step cannot be captured, so it runs eagerly: %s\n",
                 graph_refused_.c_str());
    return eager_step(batch, loss_of);
  }
  g->grad_norm = grad_norm_;
  for (const Tensor& p : params_) g->grads.push_back(p.grad());
  graphed_ = std::move(g);
  std::fprintf(stderr, "cuda graphs: the training step is captured; batches of its shapes replay it\n");
  // The eager steps before the capture left their blocks in the allocator's shared cache, and the
  // replays use the graph's own pool: give those blocks back (one wait for the device, once).
  allocator_for(batch[0].device()).empty_cache();
  // The capture ran nothing but counted the optimizer's step: the first replay is that step.
  optimizer_.undo_captured_step(optimizer_steps);
  return replay(batch);
}

StepResult StepRunner::replay(const std::vector<Tensor>& batch) {
  GraphedStep& g = *graphed_;
  for (size_t i = 0; i < batch.size(); ++i)
    if (batch[i].impl() != g.batch[i].impl()) g.batch[i].copy_(batch[i]);
  g.graph.replay();
  optimizer_.replayed_step();
  // An eager step in between (another batch shape) left its own gradients: show the graph's.
  for (size_t i = 0; i < params_.size(); ++i)
    if (g.grads[i].defined() && params_[i].grad().impl() != g.grads[i].impl()) params_[i].set_grad(g.grads[i]);
  grad_norm_ = g.grad_norm;
  // The next replay overwrites what this one wrote: the caller gets copies.
  StepResult r{g.result.loss.clone(), {}};
  for (const Tensor& t : g.result.outputs) r.outputs.push_back(t.clone());
  return r;
}

}  // namespace ft::train
