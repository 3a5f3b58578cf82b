// Optimizers. Each step is one multi-tensor pass over all parameters (a single parallel loop
// over every element of every parameter, not one op per tensor), with the same math as
// PyTorch's torch.optim (foreach/fused implementations). Implemented in src/optim/.
//
// Parameters: dense tensors (contiguous or channels-last) all on one device, whose kernel table
// runs the update (src/backend/kernel_list_optim.h); f32 or f64 (updated in place, state in the
// same dtype), or bf16/f16: the optimizer then keeps an fp32 master copy in its state ("master"),
// updates that and writes the rounded value back to the parameter, so small updates are not lost
// to rounding.
// Gradients may be f32, bf16 or f16 for an f32/bf16/f16 parameter (read as f32), f64 for f64.
//
// State, per parameter that has had a gradient: "step" (0-d i64, counted per parameter as in
// PyTorch; kept in memory the update kernels read and advance, so skipped steps do not count) and
// the optimizer's buffers (SGD, LARS: "momentum_buffer" when momentum != 0; Adam/AdamW, LAMB:
// "exp_avg", "exp_avg_sq"), f32 (f64 for f64 parameters), plus "master" for bf16/f16 parameters.
// A parameter whose every step so far was skipped has no entries.
// state_tensors() names them "<group index>.<parameter index>.<state>", e.g. "0.3.exp_avg", and
// returns the live buffers without copying (clone them to keep a snapshot across steps);
// load_state_tensors() copies. Parameters that never had a gradient have no entries.
#pragma once
#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "fasttrain/names.h"
#include "fasttrain/safetensors.h"
#include "fasttrain/tensor.h"

namespace ft::optim {

// Hyper-parameters of one parameter group; fields unused by an optimizer are ignored.
struct GroupOptions {
  double lr = 1e-3;
  double weight_decay = 0.0;
  // SGD
  double momentum = 0.0;
  double dampening = 0.0;
  bool nesterov = false;
  // Adam / AdamW
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  // LAMB (uses beta1, beta2, eps, weight_decay) / LARS (uses momentum, weight_decay)
  double trust_coefficient = 0.001;      // LARS eta
  bool exclude_from_adaptation = false;  // LARS: plain SGD+momentum for this group (biases, norms)
};

struct ParamGroup {
  std::vector<Tensor> params;
  GroupOptions options;
  std::string name;  // e.g. "decay", "no_decay"
};

// The optimizers by kind, for code that must tell them apart. Their names (optimizer_name:
// "adamw", "adam", "sgd", "lamb", "lars") are the values of the Trainer's `optimizer` option and
// what an optimizer's saved state records, so they never change; code compares kinds.
enum class OptimizerKind { AdamW, Adam, SGD, LAMB, LARS };
inline constexpr size_t kOptimizerKindCount = 5;  // the enumerators above (tables indexed by kind check it)

// Where an optimizer keeps what schedules cycle as "momentum" (set_momentum): the Adam family
// (Adam, AdamW, LAMB) in beta1, the decay of its gradient average; the momentum family (SGD,
// LARS) in momentum, the decay of its momentum buffer.
enum class OptimizerFamily { Adam, Momentum };

const char* optimizer_name(OptimizerKind kind);
OptimizerFamily optimizer_family(OptimizerKind kind);
// The kind named `name`; anything else is an ft::Error "optimizer: expected adamw, adam, sgd,
// lamb or lars, found '<name>'".
OptimizerKind optimizer_kind_from_name(const std::string& name);
std::span<const NamedValue<OptimizerKind>> option_names(OptimizerKind);  // names.h

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // Applies one update to every parameter that has a gradient (parameters without .grad are
  // skipped, as in PyTorch). Runs under NoGrad.
  virtual void step() = 0;
  // The same update, skipped for every parameter when the 0-d f32 tensor `found_inf` (on the
  // parameters' device) is non-zero — GradScaler's skip decision. The flag is read by the update
  // kernel itself, never by the host, so the step stays asynchronous on a GPU; skipped steps do
  // not advance the per-parameter step counts (bias correction stays exact).
  virtual void step(const Tensor& found_inf) = 0;
  void zero_grad(bool set_to_none = true);
  std::vector<ParamGroup>& param_groups() { return groups_; }
  const std::vector<ParamGroup>& param_groups() const { return groups_; }
  // Sets the learning rate of every group (schedules call this each step).
  void set_lr(double lr);
  // Sets the momentum of every group: `momentum` for SGD/LARS, `beta1` for Adam/AdamW/LAMB
  // (what 1cycle and cyclic schedules cycle).
  void set_momentum(double momentum);
  // Optimizer state (step counts, moments) as named tensors "<group>.<index>.<state>" plus
  // scalar hyper-parameters in metadata, so it can be saved with save_safetensors.
  virtual TensorMap state_tensors() const = 0;
  // Restores state saved by state_tensors(); throws ft::Error naming the first mismatch
  // (missing entry, wrong shape/dtype, different number of parameters) and changes nothing then.
  virtual void load_state_tensors(const TensorMap& state) = 0;
  // The scalar part of the state, for the same file's "__metadata__": "optimizer" (name()),
  // "step_count", "groups" and every group's hyper-parameters ("<group>.lr", "<group>.beta1", ...).
  std::map<std::string, std::string> state_metadata() const;
  // Restores what state_metadata() wrote (step count and hyper-parameters); checks the optimizer
  // name and group count and parses every value before changing anything.
  void load_state_metadata(const std::map<std::string, std::string>& metadata);
  virtual OptimizerKind kind() const = 0;
  // optimizer_name(kind()): what messages and the saved state call this optimizer.
  std::string name() const { return optimizer_name(kind()); }
  // Calls of step(), skipped ones included (the per-parameter "step" state counts real updates).
  int64_t step_count() const { return step_count_; }
  // CUDA graphs (StepRunner): a replay ran this optimizer's captured step, so the host's part of
  // a step follows (the step count, the parameters' version counters) ...
  virtual void replayed_step() { ++step_count_; }
  // ... and a capture that failed after the step was recorded ran nothing: the count goes back.
  void undo_captured_step(int64_t step_count_before) { step_count_ = step_count_before; }

 protected:
  explicit Optimizer(std::vector<ParamGroup> groups);
  std::vector<ParamGroup> groups_;
  Device device_;  // of every parameter (checked by the constructor)
  int64_t step_count_ = 0;
};

// SGD with momentum, dampening, Nesterov and (L2, coupled) weight decay: torch.optim.SGD.
std::unique_ptr<Optimizer> make_sgd(std::vector<ParamGroup> groups);
// Adam with L2 weight decay added to the gradient: torch.optim.Adam.
std::unique_ptr<Optimizer> make_adam(std::vector<ParamGroup> groups);
// AdamW with decoupled weight decay (p -= lr * wd * p): torch.optim.AdamW.
std::unique_ptr<Optimizer> make_adamw(std::vector<ParamGroup> groups);

// LAMB (You et al. 2019, as in NVIDIA apex FusedLAMB / timm Lamb without grad averaging): the
// Adam direction with bias correction plus decoupled weight decay, scaled per tensor by the trust
// ratio ||w|| / ||update|| (1 when either norm is zero; every tensor is adapted, the NVLAMB form).
// Two multi-tensor passes: moments and norms, then update. Names: "lamb"; state as Adam's.
std::unique_ptr<Optimizer> make_lamb(std::vector<ParamGroup> groups);
// LARS (You et al. 2017): SGD with momentum where each tensor's learning rate is scaled by
// trust_coefficient * ||w|| / (||g|| + weight_decay * ||w||) (1 when either norm is zero);
// groups with exclude_from_adaptation (biases, norm weights) take plain momentum SGD. The ratio
// scales the weight-decayed gradient before momentum (torchlars/timm form); dampening and
// Nesterov as in SGD. Name "lars"; state as SGD's.
std::unique_ptr<Optimizer> make_lars(std::vector<ParamGroup> groups);

// Gradient clipping, torch.nn.utils.clip_grad_norm_ / clip_grad_value_. The global L2 norm over
// every gradient is one fused pass; the scale min(1, max_norm / (norm + 1e-6)) is computed and
// applied by the kernels from the norm tensor, so nothing is read by the host. Returns the norm
// before clipping as a 0-d f32 tensor, f64 when every gradient is f64 (read it only when logging). Parameters without a
// gradient are skipped. A non-finite norm scales by a non-finite factor, as in PyTorch (GradScaler skips such steps
// anyway).
Tensor clip_grad_norm_(const std::vector<Tensor>& params, double max_norm);
// Clamps every gradient element to [-clip_value, clip_value] in one pass.
void clip_grad_value_(const std::vector<Tensor>& params, double clip_value);

// Clipping by a global norm summed elsewhere: a model split over ranks (tensor, pipeline, ZeRO)
// adds its parts' squared norms across them. norm_clip gives the norm rounded to f32 and the
// factor max_norm / (norm + 1e-6) computed from that, as clip_grad_norm_ does, so a split model
// clips by one process's bits whenever its f64 sum rounds to the same f32 norm.
struct NormClip {
  float norm = 0;
  double factor = 1;
  bool clips() const { return factor < 1.0; }
};
NormClip norm_clip(double total_squares, double max_norm);
// The sum of the squares of `g`'s elements, in f64 on the host (every rank gets the same bits).
double grad_squares(const Tensor& g);
// Every defined gradient of `params` times `factor`, in place.
void scale_grads_(const std::vector<Tensor>& params, float factor);

// Splits named parameters into a "decay" group and a "no_decay" group: biases (1-d tensors)
// and norm weights get no weight decay (the Trainer's default, as in GPT-2/nanoGPT practice).
std::vector<ParamGroup> decay_groups(const std::vector<std::pair<std::string, Tensor>>& named_params,
                                     const GroupOptions& options);

}  // namespace ft::optim
