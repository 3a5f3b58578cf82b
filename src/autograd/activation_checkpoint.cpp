// Activation checkpointing: the forward runs fn without recording it and keeps only the inputs;
// one node stands for the whole of fn, and its backward re-runs fn with grad enabled, under the
// forward's random-number, autocast and FP8 state, and backpropagates through that recomputation with
// a nested engine pass (autograd::nested_backward).
#include "fasttrain/activation_checkpoint.h"

#include <optional>

#include "fasttrain/autocast.h"
#include "fasttrain/autograd.h"
#include "fasttrain/fp8.h"
#include "fasttrain/random.h"

namespace ft::autograd {
namespace {

thread_local bool tls_recomputing = false;

// What the backward needs to run fn again exactly as the forward did.
struct CheckpointState {
  CheckpointFn fn;
  std::vector<SavedTensor> inputs;
  std::vector<bool> input_requires_grad;
  std::vector<OutputMeta> outputs;  // to check the recomputation returns the same
  std::vector<bool> output_defined;
  GeneratorState rng;
  bool autocast_enabled;
  DType autocast_dtype;
  std::optional<Fp8Recipe> fp8;  // the forward's FP8 region, copied (its guard is gone by backward)
};

// Puts the default generator at `s` for the recomputation and back where it was afterwards, so
// dropout draws the forward's masks and the random stream after backward is undisturbed.
class GeneratorStateGuard {
 public:
  explicit GeneratorStateGuard(GeneratorState s) : prev_(default_generator().state()) {
    default_generator().set_state(s);
  }
  ~GeneratorStateGuard() { default_generator().set_state(prev_); }
  GeneratorStateGuard(const GeneratorStateGuard&) = delete;
  GeneratorStateGuard& operator=(const GeneratorStateGuard&) = delete;

 private:
  GeneratorState prev_;
};

class RecomputingGuard {
 public:
  RecomputingGuard() : prev_(tls_recomputing) { tls_recomputing = true; }
  ~RecomputingGuard() { tls_recomputing = prev_; }
  RecomputingGuard(const RecomputingGuard&) = delete;
  RecomputingGuard& operator=(const RecomputingGuard&) = delete;

 private:
  bool prev_;
};

bool same_meta(const OutputMeta& m, bool defined, const Tensor& t) {
  if (!t.defined() || !defined) return t.defined() == defined;
  return m.shape == t.shape() && m.dtype == t.dtype() && m.device == t.device();
}

// Re-runs fn on fresh leaves holding the saved inputs and backpropagates `grads` through it.
std::vector<Tensor> checkpoint_backward(const CheckpointState& st, std::vector<Tensor>& grads) {
  const size_t n = st.inputs.size();
  std::vector<Tensor> leaves(n);
  std::vector<Tensor> wrt;
  for (size_t i = 0; i < n; ++i) {
    leaves[i] = st.inputs[i].get("checkpoint").detach();
    if (st.input_requires_grad[i]) {
      leaves[i].requires_grad_(true);
      wrt.push_back(leaves[i]);
    }
  }

  std::vector<Tensor> outs;
  {
    GeneratorStateGuard rng(st.rng);
    autocast::AutocastGuard ac(st.autocast_dtype, st.autocast_enabled);
    Fp8Autocast fp8(st.fp8.value_or(Fp8Recipe{}), st.fp8.has_value());  // FP8 layers quantize as the forward did
    RecomputingGuard recomputing;
    EnableGradGuard grad_on;  // the engine runs nodes under NoGrad
    outs = st.fn(leaves);
  }
  FT_CHECK(outs.size() == st.outputs.size(), "checkpoint: the recomputation returned ", outs.size(),
           " outputs but the forward returned ", st.outputs.size(),
           "; the checkpointed function must do the same thing when run again");
  std::vector<Tensor> roots, root_grads;
  for (size_t i = 0; i < outs.size(); ++i) {
    FT_CHECK(same_meta(st.outputs[i], st.output_defined[i], outs[i]), "checkpoint: output ", i,
             " of the recomputation (",
             outs[i].defined() ? outs[i].shape().str() + " " + dtype_name(outs[i].dtype()) : std::string("undefined"),
             ") differs from the forward's (", st.outputs[i].shape.str(), " ", dtype_name(st.outputs[i].dtype),
             "); the checkpointed function must do the same thing when run again");
    if (outs[i].requires_grad()) {  // outputs that do not depend on anything requiring grad carry none
      roots.push_back(outs[i]);
      root_grads.push_back(grads[i]);
    }
  }

  std::vector<Tensor> input_grads(n);
  if (roots.empty()) return input_grads;
  std::vector<Tensor> captured = nested_backward(roots, root_grads, wrt);
  for (size_t i = 0, k = 0; i < n; ++i)
    if (st.input_requires_grad[i]) input_grads[i] = captured[k++];
  return input_grads;
}

}  // namespace

bool recomputing() { return tls_recomputing; }

std::vector<Tensor> checkpoint(const CheckpointFn& fn, const std::vector<Tensor>& inputs) {
  FT_CHECK(fn != nullptr, "checkpoint: expected a function, found an empty one");
  for (size_t i = 0; i < inputs.size(); ++i)
    FT_CHECK(inputs[i].defined(), "checkpoint: input ", i, " is undefined; expected a tensor");
  // Nothing to differentiate with respect to through the inputs: fn records its own graph (if it
  // uses parameters), exactly as without checkpointing.
  if (!any_requires_grad(inputs)) return fn(inputs);

  auto st = std::make_shared<CheckpointState>();
  st->fn = fn;
  for (const Tensor& t : inputs) {
    st->inputs.emplace_back(t);
    st->input_requires_grad.push_back(t.requires_grad());
  }
  st->rng = default_generator().state();
  st->autocast_enabled = autocast::enabled();
  st->autocast_dtype = autocast::lowp_dtype();
  if (const Fp8Recipe* r = fp8_autocast_recipe()) st->fp8 = *r;

  std::vector<Tensor> outputs;
  {
    NoGradGuard no_grad;  // nothing of fn is recorded, so none of its activations is kept
    outputs = fn(inputs);
  }
  std::vector<const Tensor*> in_ptrs;
  for (const Tensor& t : inputs) in_ptrs.push_back(&t);
  std::vector<Tensor*> out_ptrs;
  for (Tensor& t : outputs) {
    // Under NoGrad, an output requiring grad is a tensor fn passed through (an input or a
    // parameter): give the node its own alias rather than rewriting that tensor's history.
    if (t.defined() && t.requires_grad()) t = t.detach();
    st->outputs.push_back(t.defined() ? OutputMeta{t.shape(), t.dtype(), t.device()} : OutputMeta{});
    st->output_defined.push_back(t.defined());
    out_ptrs.push_back(&t);
  }
  record_function("CheckpointBackward", in_ptrs, out_ptrs,
                  [st](std::vector<Tensor>& grads) { return checkpoint_backward(*st, grads); });
  return outputs;
}

Tensor checkpoint(const std::function<Tensor(const Tensor&)>& fn, const Tensor& input) {
  FT_CHECK(fn != nullptr, "checkpoint: expected a function, found an empty one");
  auto outs = checkpoint([fn](const std::vector<Tensor>& in) { return std::vector<Tensor>{fn(in[0])}; },
                         std::vector<Tensor>{input});
  return outs[0];
}

}  // namespace ft::autograd
