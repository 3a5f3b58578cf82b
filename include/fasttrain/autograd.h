// Reverse-mode automatic differentiation. Ops that run while grad mode is on and see an input
// that requires grad record a Node on the tape; backward() walks the tape once in reverse
// topological order, accumulating gradients into leaves' .grad.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "fasttrain/tensor.h"

namespace ft {
namespace autograd {

struct Edge {
  std::shared_ptr<Node> fn;  // null: this input needs no gradient
  uint32_t input_nr = 0;     // which output slot of fn the gradient flows into
};

// Shape, dtype and device of one output, kept so the engine can materialise a zero gradient for
// an output that received none (e.g. an unused piece of split()).
struct OutputMeta {
  Shape shape;
  DType dtype = DType::F32;
  Device device;
};

struct Node : std::enable_shared_from_this<Node> {
  Node();
  virtual ~Node() = default;
  // Given the gradient of each output (always defined, correct shape), returns the gradient of
  // each input, in the order of next_edges (undefined where that input needs none).
  virtual std::vector<Tensor> apply(std::vector<Tensor>& grad_outputs) = 0;
  virtual std::string name() const = 0;
  // Frees tensors saved for backward (called after use unless retain_graph).
  virtual void release_saved() {}

  std::vector<Edge> next_edges;
  std::vector<OutputMeta> outputs;
  std::vector<std::vector<GradHook>> output_hooks;  // per output: hooks of non-leaf tensors
  uint64_t sequence_nr;                             // creation order; later nodes run first among ready ones
  bool released = false;
  // The module whose forward recorded this node, set only while profiling (profiler.h), so the
  // memory its backward allocates is attributed to that module.
  std::string module;
};

// Backward of a function given as a lambda; the lambda's captures are the saved state and are
// destroyed by release_saved().
class FunctionNode : public Node {
 public:
  using Fn = std::function<std::vector<Tensor>(std::vector<Tensor>& grad_outputs)>;
  FunctionNode(std::string name, Fn fn) : name_(std::move(name)), fn_(std::move(fn)) {}
  std::vector<Tensor> apply(std::vector<Tensor>& grad_outputs) override;
  std::string name() const override { return name_; }
  void release_saved() override { fn_ = nullptr; }

 private:
  std::string name_;
  Fn fn_;
};

// A tensor kept for backward. Records the version counter at save time and refuses to hand the
// tensor back if it was modified in place since (PyTorch's "modified by an inplace operation").
// Holds no autograd history, so saving an op's own output creates no reference cycle.
class SavedTensor {
 public:
  SavedTensor() = default;
  SavedTensor(const Tensor& t);
  Tensor get(const char* node_name) const;
  bool defined() const { return t_.defined(); }

 private:
  Tensor t_;
  uint32_t version_ = 0;
};

// --- grad modes (thread-local) ---
bool grad_enabled();
void set_grad_enabled(bool on);
bool inference_mode_enabled();

class NoGradGuard {
 public:
  NoGradGuard() : prev_(grad_enabled()) { set_grad_enabled(false); }
  ~NoGradGuard() { set_grad_enabled(prev_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

class EnableGradGuard {
 public:
  EnableGradGuard() : prev_(grad_enabled()) { set_grad_enabled(true); }
  ~EnableGradGuard() { set_grad_enabled(prev_); }

 private:
  bool prev_;
};

// No autograd recording and no version-counter bumps: the cheapest mode for evaluation.
class InferenceMode {
 public:
  InferenceMode();
  ~InferenceMode();
  InferenceMode(const InferenceMode&) = delete;
  InferenceMode& operator=(const InferenceMode&) = delete;

 private:
  bool prev_grad_;
  bool prev_inference_;
};

// --- the engine ---
// Runs backward from `roots`, seeded with `grad_roots` (one per root; an undefined entry means
// ones for a one-element root). Leaves' .grad accumulate (added to an existing .grad).
void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grad_roots = {}, bool retain_graph = false);

// Gradients of `outputs` w.r.t. `inputs` without touching .grad (used by gradient checks).
std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs = {}, bool retain_graph = false);

// For a node that runs a backward pass of its own while the engine runs it (activation
// checkpointing backpropagates through its recomputation): backpropagates `grad_roots` from
// `roots` and returns the gradients reaching `inputs` (leaves requiring grad; their .grad is left
// alone). Other leaves are treated as the enclosing pass treats them: under backward() their .grad
// accumulates; under grad() it is left alone and gradients for grad()'s inputs join its results.
std::vector<Tensor> nested_backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grad_roots,
                                    const std::vector<Tensor>& inputs);

// --- helpers for op authors ---
// True when grad mode is on and any of the tensors requires grad.
bool any_requires_grad(std::initializer_list<const Tensor*> inputs);
bool any_requires_grad(const std::vector<Tensor>& inputs);
// Connects `node` to the gradient functions of `inputs` and makes it the grad_fn of `outputs`
// (which then require grad). Inputs not requiring grad get empty edges.
void record(const std::shared_ptr<Node>& node, const std::vector<const Tensor*>& inputs,
            const std::vector<Tensor*>& outputs);
// Shorthand for the common case: a lambda backward over single or multiple outputs.
void record_function(const char* name, const std::vector<const Tensor*>& inputs, const std::vector<Tensor*>& outputs,
                     FunctionNode::Fn fn);

}  // namespace autograd

// Sets .grad of each tensor to undefined (default, no memset) or to zero in place.
void zero_grad(const std::vector<Tensor>& params, bool set_to_none = true);

}  // namespace ft
