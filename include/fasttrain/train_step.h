// One optimisation step as PyTorch Lightning runs it, usable without the Trainer (the bench and
// the finders use it too): precision policy (autocast, loss scaling, low-precision weights),
// gradient accumulation over micro-batches, gradient clipping after unscaling, the optimizer
// step (skipped on fp16 overflow without a host read) and the loss-scale update.
// Implemented in src/train/train_step.cpp.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "fasttrain/amp.h"
#include "fasttrain/fp8.h"
#include "fasttrain/names.h"
#include "fasttrain/nn.h"
#include "fasttrain/optim.h"
#include "fasttrain/tensor.h"

namespace ft::train {

// Lightning's `precision` vocabulary.
//  FP32       "32"          everything in f32
//  TF32       "tf32"        f32 tensors, TF32 tensor-core matmuls on CUDA (no effect on the CPU)
//  BF16Mixed  "bf16-mixed"  autocast to bf16 (matmul/linear/conv/attention), f32 master weights
//  FP16Mixed  "fp16-mixed"  autocast to f16 plus dynamic loss scaling (GradScaler)
//  BF16True   "bf16-true"   weights and activations in bf16; the optimizer keeps f32 masters
//  FP8Mixed   "fp8-mixed"   bf16-mixed, and linear layers' products in FP8 with delayed scaling
//                           (fp8.h; Transformer Engine's recipe; emulated on the CPU)
enum class Precision { FP32, TF32, BF16Mixed, FP16Mixed, BF16True, FP8Mixed };
inline constexpr size_t kPrecisionCount = 6;  // the enumerators above (the name table checks it)
// Accepts the names above (and "fp32"/"32-true", "bf16"/"fp16" for the mixed modes, as BENCH.md
// writes them); anything else is an ft::Error listing the accepted names.
Precision precision_from_name(const std::string& name);
const char* precision_name(Precision p);                         // the Lightning name ("32", "bf16-mixed", ...)
std::span<const NamedValue<Precision>> option_names(Precision);  // names.h
// True for BF16Mixed, FP16Mixed and FP8Mixed (the modes that run forward under autocast).
bool precision_is_mixed(Precision p);
// True for bf16-mixed, bf16-true and fp8-mixed: the precisions whose matrix products take bf16
// operands (fp8-mixed's other than its FP8 linear layers).
bool precision_is_bf16(Precision p);

// Lightning's `gradient_clip_algorithm`:
//  Norm   "norm"   scale every gradient by one factor so their global L2 norm is at most `clip`
//  Value  "value"  clamp each gradient element to [-clip, clip]
enum class ClipAlgorithm { Norm, Value };
inline constexpr size_t kClipAlgorithmCount = 2;  // the enumerators above (the name table checks it)
// Accepts the names above; anything else is an ft::Error "gradient_clip_algorithm: expected norm
// or value, found '<name>'".
ClipAlgorithm clip_algorithm_from_name(const std::string& name);
const char* clip_algorithm_name(ClipAlgorithm a);
std::span<const NamedValue<ClipAlgorithm>> option_names(ClipAlgorithm);  // names.h

struct StepOptions {
  Precision precision = Precision::FP32;
  int64_t accumulate = 1;  // micro-batches per optimizer step
  ClipAlgorithm clip_algorithm = ClipAlgorithm::Norm;
  double clip = 0;                // 0: no clipping
  amp::GradScalerOptions scaler;  // used in FP16Mixed only
  Fp8Recipe fp8;                  // used in FP8Mixed only: the scales are updated after each optimizer step
  // CUDA graphs (--cuda-graphs): after kGraphWarmupSteps eager steps, step() captures the whole
  // step (zero_grad, forward, backward, unscale, clip, optimizer step, scaler update) once and
  // replays it for every batch of the same shapes and dtypes (dropout draws new masks in every
  // replay); a batch of other shapes runs eagerly. A step that cannot be captured (a host read
  // such as item()) is reported once on stderr with what refused it, and steps run eagerly from
  // then on. No effect on the
  // CPU, with gradient synchronisation (DDP), or through forward_backward()/optimizer_step().
  bool cuda_graphs = false;
};

// Eager steps before the capture: cuDNN's algorithm search, the optimizer's state and the scalar
// constants are made during them (none of these can be captured).
inline constexpr int64_t kGraphWarmupSteps = 3;

// Gradient synchronisation between data-parallel replicas, called by StepRunner around each
// micro-batch's backward and before clipping and the optimizer step (fasttrain/ddp.h is DDP's).
class GradSync {
 public:
  virtual ~GradSync() = default;
  // Before a micro-batch's forward (ZeRO stage 3 gathers the parameters no block holds).
  virtual void before_forward() {}
  // Before a micro-batch's backward; `last`: the step's final micro-batch, the only one whose
  // gradients are communicated (the others only accumulate, as under PyTorch's no_sync()).
  virtual void before_backward(bool last) = 0;
  // After that backward: gradients not sent yet (parameters the pass did not reach) are sent.
  virtual void after_backward(bool last) = 0;
  // Before clipping: waits until every gradient is the mean over the replicas.
  virtual void finish() = 0;
  // Clipping of the gradients finish() left: over `params` by default; a sharded strategy
  // (ZeRO) clips its shards by the norm of the whole gradient instead.
  virtual Tensor clip_grad_norm(const std::vector<Tensor>& params, double max_norm) {
    return optim::clip_grad_norm_(params, max_norm);
  }
  virtual void clip_grad_value(const std::vector<Tensor>& params, double clip_value) {
    optim::clip_grad_value_(params, clip_value);
  }
  // After GradScaler's unscale_: `found_inf` (0-d f32, shared with the scaler) made the same on
  // every rank when each rank checked only its part of the gradients (ZeRO), so all skip alike.
  virtual void agree_found_inf(const Tensor& found_inf) { (void)found_inf; }
  // fp8-mixed, before the scales' update: each FP8 layer's step amaxes (f32 [3] tensors, written
  // in place) made the maximum over the replicas, as Transformer Engine reduces them over the
  // data-parallel group: every rank then quantizes with the same scales, and a checkpoint (rank
  // 0's scales) resumes every rank exactly.
  virtual void agree_fp8_amax(const std::vector<Tensor>& amaxes) { (void)amaxes; }
  // After the optimizer step (ZeRO: the updated shards are gathered into every replica).
  virtual void after_step() {}
};

// (output, target) -> scalar loss.
using LossFn = std::function<Tensor(const Tensor& output, const Tensor& target)>;
// A micro-batch's forward to its scalar loss (a TrainModule's training_step).
using LossOf = std::function<Tensor()>;
// A micro-batch's forward from its tensors to its scalar loss; it may append tensors it wants back
// (metrics) to `outputs`.
using BatchLoss = std::function<Tensor(const std::vector<Tensor>& batch, std::vector<Tensor>& outputs)>;

// What StepRunner::step returns: the mean micro-batch loss and every micro-batch's `outputs`, in
// order, detached (with CUDA graphs, copies of what the replay wrote).
struct StepResult {
  Tensor loss;
  std::vector<Tensor> outputs;
};

class StepRunner {
 public:
  // Validates the options. For BF16True the model's parameters are converted to bf16 here.
  // Micro-batches are given as closures (forward_backward(LossOf)).
  StepRunner(nn::Module& model, optim::Optimizer& optimizer, StepOptions options);
  // For a one-input model and a loss of (output, target): forward_backward(input, target) too.
  StepRunner(nn::UnaryModule& model, optim::Optimizer& optimizer, LossFn loss, StepOptions options);
  ~StepRunner();
  StepRunner(const StepRunner&) = delete;
  StepRunner& operator=(const StepRunner&) = delete;

  // Forward and backward of one micro-batch: the loss is divided by `accumulate` (and scaled in
  // FP16Mixed) before backward. The first micro-batch of a step clears the gradients (to none).
  // Returns the micro-batch's loss as computed (undivided, unscaled), detached, on the device.
  Tensor forward_backward(const Tensor& input, const Tensor& target);
  // The same with the forward given as a closure, run under the precision's autocast.
  Tensor forward_backward(const LossOf& loss_of);
  // Pipeline parallelism (pipeline.h): all `accumulate` micro-batches of a step run by `schedule`,
  // which interleaves their forwards and backwards itself (applying autocast and the loss
  // division and scaling as forward_backward does); the gradients are cleared first and TF32 is
  // on as the precision says. optimizer_step() follows as after forward_backward.
  void run_micro_batches(const std::function<void()>& schedule);
  // After `accumulate` micro-batches: unscale (fp16), clip, optimizer step (skipped on overflow),
  // scaler update. Throws ft::Error when called after a different number of micro-batches.
  void optimizer_step();
  // Runs a whole step on one batch split into `accumulate` equal micro-batches (the batch's
  // first dim must divide evenly); returns the mean micro-batch loss (detached).
  Tensor step(const Tensor& input, const Tensor& target);
  // The same for any model: `batch`'s tensors (rows first, all with the same rows) are split into
  // micro-batches, each handed to `loss_of`. With cuda_graphs, this is the step captured and
  // replayed (`loss_of` then runs only in the eager and captured steps).
  StepResult step(const std::vector<Tensor>& batch, const BatchLoss& loss_of);

  // The global gradient norm before clipping of the last step (0-d tensor; undefined when
  // clipping by norm is off). Reading it syncs with the device: log intervals only.
  const Tensor& last_grad_norm() const { return grad_norm_; }
  // The loss-scaling state (FP16Mixed; disabled otherwise).
  amp::GradScaler& scaler() { return *scaler_; }
  const StepOptions& options() const { return options_; }
  // The input as the model expects it (floating inputs in bf16 for BF16True; else unchanged).
  Tensor model_input(const Tensor& input) const;
  // The dtype autocast regions use in mixed modes (BF16 or F16); F32 when not mixed.
  DType autocast_dtype() const;
  // Synchronise gradients through `sync` (not owned; null: none), e.g. across DDP replicas.
  void set_grad_sync(GradSync* sync) { sync_ = sync; }
  // With cuda_graphs: whether step() replays a captured graph now, and why it does not when a
  // capture was refused ("" otherwise).
  bool graph_captured() const;
  const std::string& graph_refused() const { return graph_refused_; }

 private:
  nn::Module& model_;
  nn::UnaryModule* unary_ = nullptr;  // set by the (model, loss) constructor
  optim::Optimizer& optimizer_;
  LossFn loss_;
  StepOptions options_;
  std::unique_ptr<amp::GradScaler> scaler_;
  std::vector<Tensor> params_;
  int64_t micro_ = 0;  // micro-batches run in the current step
  Tensor grad_norm_;
  GradSync* sync_ = nullptr;

  struct GraphedStep;  // train_step.cpp
  std::unique_ptr<GraphedStep> graphed_;
  int64_t eager_graph_steps_ = 0;  // eager steps towards kGraphWarmupSteps
  std::string graph_refused_;
  StepResult eager_step(const std::vector<Tensor>& batch, const BatchLoss& loss_of);
  bool wants_graph(const std::vector<Tensor>& batch) const;
  StepResult graphed_step(const std::vector<Tensor>& batch, const BatchLoss& loss_of);
  StepResult replay(const std::vector<Tensor>& batch);
};

}  // namespace ft::train
