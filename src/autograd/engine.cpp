// The tape and the backward pass. Nodes are processed in one pass: a node runs once all the
// nodes that feed gradient into it have run (dependency counts), ties broken by creation order
// (latest first), which is a reverse topological order of the forward computation.
#include <algorithm>
#include <atomic>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "core/profiler_context.h"
#include "fasttrain/autograd.h"
#include "fasttrain/ops/elementwise.h"

namespace ft {
namespace autograd {

namespace {
std::atomic<uint64_t> g_next_sequence{0};

// Whether g's memory is seen by nobody but `holders` references to g itself, and lies dense
// (no element aliases another, as in an expanded gradient): only then may a sum overwrite it.
bool exclusively_held(const Tensor& g, long holders) {
  return g.impl_ptr().use_count() <= holders && g.storage().use_count() == 1 &&
         (g.is_contiguous() || g.is_channels_last());
}

// slot += g for gradients meeting at one input. In place where the buffer is exclusively the
// pass's (PyTorch's engine does the same): no second buffer of the gradient's size is live at
// once, and the sum writes memory it has just read instead of a fresh allocation.
void sum_gradient(Tensor& slot, const Tensor& g) {
  if (!slot.defined())
    slot = g;
  else if (slot.dtype() == g.dtype() && slot.device() == g.device() && exclusively_held(slot, 1))
    add_(slot, g);
  else
    slot = add(slot, g);
}

// Accumulates into a leaf's .grad; runs the leaf's hooks first and its post-accumulate hooks after.
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(std::shared_ptr<TensorImpl> leaf) : leaf_(std::move(leaf)) {}
  std::vector<Tensor> apply(std::vector<Tensor>& grads) override {
    Tensor g = grads[0];
    for (auto& hook : leaf_->hooks) {
      Tensor r = hook(g);
      if (r.defined()) g = r;
    }
    if (!leaf_->grad) {
      // Take ownership of the incoming buffer only if nobody else can see it; otherwise copy,
      // so a later in-place accumulation cannot change another tensor. Either way the gradient
      // keeps a dense layout (channels-last stays channels-last, like the leaf, as in PyTorch).
      if (exclusively_held(g, 2) && g.dtype() == leaf_->dtype) {
        leaf_->grad = g.detach().impl_ptr();
      } else {
        Tensor leaf(leaf_);
        bool leaf_dense = leaf.is_contiguous() || leaf.is_channels_last();
        Tensor copy = leaf_dense
                          ? empty_strided(leaf.shape(), leaf.strides(), TensorOptions(leaf_->dtype, leaf.device()))
                          : empty(leaf.shape(), TensorOptions(leaf_->dtype, leaf.device()));
        copy.copy_(g);
        leaf_->grad = copy.impl_ptr();
      }
    } else {
      Tensor acc(leaf_->grad);
      add_(acc, g);
    }
    Tensor leaf(leaf_);
    for (auto& hook : leaf_->post_accumulate_hooks) hook(leaf);
    return {};
  }
  std::string name() const override { return "AccumulateGrad"; }

 private:
  std::shared_ptr<TensorImpl> leaf_;
};

std::shared_ptr<Node> grad_accumulator(const Tensor& leaf) {
  TensorImpl* impl = leaf.impl();
  if (auto acc = impl->grad_accumulator.lock()) return acc;
  auto acc = std::make_shared<AccumulateGrad>(leaf.impl_ptr());
  acc->outputs.push_back({leaf.shape(), leaf.dtype(), leaf.device()});
  acc->output_hooks.resize(1);
  impl->grad_accumulator = acc;
  return acc;
}

Edge edge_of(const Tensor& t) {
  if (!t.defined() || !t.requires_grad()) return {};
  if (t.grad_fn()) return {t.grad_fn(), t.impl()->output_nr};
  return {grad_accumulator(t), 0};
}

}  // namespace

Node::Node() : sequence_nr(g_next_sequence.fetch_add(1, std::memory_order_relaxed)) {}

std::vector<Tensor> FunctionNode::apply(std::vector<Tensor>& grad_outputs) {
  FT_CHECK(fn_ != nullptr, name_, ": trying to backward through the graph a second time (or after its saved ",
           "tensors were freed); pass retain_graph=true to the first backward()");
  return fn_(grad_outputs);
}

SavedTensor::SavedTensor(const Tensor& t) {
  if (!t.defined()) return;
  t_ = t.detach();
  version_ = t.version();
}

Tensor SavedTensor::get(const char* node_name) const {
  if (t_.defined()) {
    FT_CHECK(t_.version() == version_, node_name, ": a tensor saved for backward (shape ", t_.shape().str(),
             ") was modified in place after it was saved: version ", t_.version(), ", expected ", version_);
  }
  return t_;
}

bool any_requires_grad(std::initializer_list<const Tensor*> inputs) {
  if (!grad_enabled()) return false;
  for (const Tensor* t : inputs)
    if (t && t->defined() && t->requires_grad()) return true;
  return false;
}

bool any_requires_grad(const std::vector<Tensor>& inputs) {
  if (!grad_enabled()) return false;
  for (const Tensor& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

void record(const std::shared_ptr<Node>& node, const std::vector<const Tensor*>& inputs,
            const std::vector<Tensor*>& outputs) {
  if (profiler::active()) [[unlikely]]
    node->module = profiler::detail::current_module();
  node->next_edges.clear();
  for (const Tensor* t : inputs) node->next_edges.push_back(t ? edge_of(*t) : Edge{});
  node->outputs.clear();
  node->output_hooks.assign(outputs.size(), {});
  for (size_t i = 0; i < outputs.size(); ++i) {
    Tensor* out = outputs[i];
    if (!out || !out->defined()) {
      node->outputs.push_back({});
      continue;
    }
    node->outputs.push_back({out->shape(), out->dtype(), out->device()});
    if (!is_floating(out->dtype())) continue;  // integer outputs (indices) carry no gradient
    TensorImpl* impl = out->impl();
    impl->grad_fn = node;
    impl->output_nr = static_cast<uint32_t>(i);
    impl->requires_grad = true;
  }
}

void record_function(const char* name, const std::vector<const Tensor*>& inputs, const std::vector<Tensor*>& outputs,
                     FunctionNode::Fn fn) {
  record(std::make_shared<FunctionNode>(name, std::move(fn)), inputs, outputs);
}

namespace {

// What a backward pass does with gradients besides running nodes. grad() stops at leaves and
// stores the gradients reaching its inputs' edges in `slots`; backward() accumulates into
// leaves. A nested pass (nested_backward) adds its own captured edges to those of the pass it
// runs inside, so gradients for the enclosing grad()'s inputs still land in its results.
struct RunContext {
  bool stop_at_leaves = false;
  std::vector<Edge> capture;
  std::vector<Tensor*> slots;  // one per capture edge
};

// The pass this thread is running, if any (nodes may start nested passes).
thread_local RunContext* tls_current_run = nullptr;

bool captures(const RunContext& ctx, const Node* fn) {
  for (const Edge& e : ctx.capture)
    if (e.fn.get() == fn) return true;
  return false;
}

// Runs the graph above `roots` under `ctx`'s rules.
void run_backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grad_roots, bool retain_graph,
                  RunContext& ctx) {
  FT_CHECK(grad_roots.empty() || grad_roots.size() == roots.size(), "backward: ", roots.size(), " outputs but ",
           grad_roots.size(), " gradients");
  std::vector<Edge> root_edges;
  std::vector<Tensor> root_grads;
  for (size_t i = 0; i < roots.size(); ++i) {
    const Tensor& r = roots[i];
    FT_CHECK(r.requires_grad(), "backward: output ", i, " does not require grad and has no grad_fn (was it computed ",
             "under NoGradGuard, or from tensors that do not require grad?)");
    Tensor g = i < grad_roots.size() ? grad_roots[i] : Tensor();
    if (!g.defined()) {
      FT_CHECK(r.numel() == 1, "backward: a gradient must be given for output ", i, " of shape ", r.shape().str(),
               " (implicit ones only for one-element outputs)");
      g = ones_like(r);
    }
    FT_CHECK(g.shape() == r.shape(), "backward: gradient shape ", g.shape().str(), " does not match output shape ",
             r.shape().str());
    root_edges.push_back(edge_of(r));
    root_grads.push_back(g);
  }

  // Dependency counts over the reachable graph.
  std::unordered_map<Node*, int> deps;
  std::unordered_set<Node*> seen;
  std::vector<Node*> stack;
  for (auto& e : root_edges)
    if (seen.insert(e.fn.get()).second) stack.push_back(e.fn.get());
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (auto& e : n->next_edges) {
      if (!e.fn) continue;
      ++deps[e.fn.get()];
      if (seen.insert(e.fn.get()).second) stack.push_back(e.fn.get());
    }
  }

  std::unordered_map<Node*, std::vector<Tensor>> buffers;
  auto accumulate = [&](const Edge& e, Tensor g) {
    for (size_t c = 0; c < ctx.capture.size(); ++c) {
      if (ctx.capture[c].fn == e.fn && ctx.capture[c].input_nr == e.input_nr) {
        Tensor& slot = *ctx.slots[c];
        slot = slot.defined() ? add(slot, g) : g;
      }
    }
    auto& buf = buffers[e.fn.get()];
    if (buf.size() < e.fn->outputs.size()) buf.resize(e.fn->outputs.size());
    sum_gradient(buf[e.input_nr], g);
  };
  for (size_t i = 0; i < root_edges.size(); ++i) accumulate(root_edges[i], root_grads[i]);

  auto later_first = [](const std::shared_ptr<Node>& a, const std::shared_ptr<Node>& b) {
    return a->sequence_nr < b->sequence_nr;
  };
  std::priority_queue<std::shared_ptr<Node>, std::vector<std::shared_ptr<Node>>, decltype(later_first)> ready(
      later_first);
  std::unordered_set<Node*> queued;
  for (auto& e : root_edges)
    if (deps[e.fn.get()] == 0 && queued.insert(e.fn.get()).second) ready.push(e.fn);

  NoGradGuard no_grad;  // backward formulas are not themselves recorded (no double backward)
  struct CurrentRun {   // restores the enclosing pass's context, also when a node throws
    RunContext* prev;
    explicit CurrentRun(RunContext* c) : prev(tls_current_run) { tls_current_run = c; }
    ~CurrentRun() { tls_current_run = prev; }
  } current_run(&ctx);
  while (!ready.empty()) {
    std::shared_ptr<Node> node = ready.top();
    ready.pop();
    std::vector<Tensor> grads = std::move(buffers[node.get()]);
    buffers.erase(node.get());
    grads.resize(node->outputs.size());
    for (size_t i = 0; i < grads.size(); ++i) {
      if (!grads[i].defined()) {
        const auto& m = node->outputs[i];
        grads[i] = zeros(m.shape, TensorOptions(m.dtype, m.device));
      }
      for (auto& hook : node->output_hooks[i]) {
        Tensor r = hook(grads[i]);
        if (r.defined()) grads[i] = r;
      }
    }
    // grad() must not touch leaves' .grad, nor a pass their captured gradients: stop there.
    const bool is_accumulator = dynamic_cast<const AccumulateGrad*>(node.get()) != nullptr;
    std::vector<Tensor> input_grads;
    if (!(is_accumulator && (ctx.stop_at_leaves || captures(ctx, node.get())))) {
      if (profiler::active()) [[unlikely]] {  // a span per node; the kernels it runs nest inside
        profiler::detail::NodeScope scope(node->name(), node->module);
        input_grads = node->apply(grads);
      } else {
        input_grads = node->apply(grads);
      }
    }
    if (!retain_graph) node->release_saved();
    FT_CHECK(input_grads.size() <= node->next_edges.size(), node->name(), ": returned ", input_grads.size(),
             " gradients for ", node->next_edges.size(), " inputs");
    for (size_t i = 0; i < node->next_edges.size(); ++i) {
      const Edge& e = node->next_edges[i];
      if (!e.fn) continue;
      if (i < input_grads.size() && input_grads[i].defined()) {
        const auto& meta = e.fn->outputs[e.input_nr];
        FT_CHECK(input_grads[i].shape() == meta.shape, node->name(), ": gradient for input ", i, " has shape ",
                 input_grads[i].shape().str(), ", expected ", meta.shape.str());
        Tensor g = input_grads[i].dtype() == meta.dtype ? input_grads[i] : input_grads[i].to(meta.dtype);
        accumulate(e, g);
      }
      if (--deps[e.fn.get()] == 0 && queued.insert(e.fn.get()).second) ready.push(e.fn);
    }
  }
}

}  // namespace

void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grad_roots, bool retain_graph) {
  RunContext ctx;
  run_backward(roots, grad_roots, retain_graph, ctx);
}

std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs, bool retain_graph) {
  std::vector<Tensor> captured(inputs.size());
  RunContext ctx;
  ctx.stop_at_leaves = true;
  for (size_t i = 0; i < inputs.size(); ++i) {
    FT_CHECK(inputs[i].requires_grad(), "grad: input ", i, " does not require grad");
    ctx.capture.push_back(edge_of(inputs[i]));
    ctx.slots.push_back(&captured[i]);
  }
  run_backward(outputs, grad_outputs, retain_graph, ctx);
  return captured;
}

std::vector<Tensor> nested_backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grad_roots,
                                    const std::vector<Tensor>& inputs) {
  std::vector<Tensor> captured(inputs.size());
  RunContext ctx;
  for (size_t i = 0; i < inputs.size(); ++i) {
    FT_CHECK(inputs[i].requires_grad(), "nested_backward: input ", i, " does not require grad");
    ctx.capture.push_back(edge_of(inputs[i]));
    ctx.slots.push_back(&captured[i]);
  }
  if (RunContext* outer = tls_current_run) {
    ctx.stop_at_leaves = outer->stop_at_leaves;
    ctx.capture.insert(ctx.capture.end(), outer->capture.begin(), outer->capture.end());
    ctx.slots.insert(ctx.slots.end(), outer->slots.begin(), outer->slots.end());
  }
  run_backward(roots, grad_roots, /*retain_graph=*/false, ctx);
  return captured;
}

}  // namespace autograd

// --- Tensor's autograd methods ---

Tensor Tensor::grad() const { return impl()->grad ? Tensor(impl()->grad) : Tensor(); }

void Tensor::set_grad(const Tensor& g) const {
  if (g.defined())
    FT_CHECK(g.shape() == shape(), "set_grad: gradient shape ", g.shape().str(), " does not match tensor shape ",
             shape().str());
  impl()->grad = g.defined() ? g.impl_ptr() : nullptr;
}

void Tensor::backward(const Tensor& grad, bool retain_graph) const {
  autograd::backward({*this}, {grad}, retain_graph);
}

void Tensor::register_hook(GradHook hook) const {
  FT_CHECK(requires_grad(), "register_hook: the tensor does not require grad");
  if (is_leaf()) {
    impl()->hooks.push_back(std::move(hook));
  } else {
    grad_fn()->output_hooks[impl()->output_nr].push_back(std::move(hook));
  }
}

void Tensor::register_post_accumulate_grad_hook(PostAccumulateHook hook) const {
  FT_CHECK(requires_grad() && is_leaf(), "register_post_accumulate_grad_hook: expected a leaf that requires grad");
  impl()->post_accumulate_hooks.push_back(std::move(hook));
}

void Tensor::retain_grad() const {
  FT_CHECK(requires_grad(), "retain_grad: the tensor does not require grad");
  if (is_leaf() || impl()->retains_grad) return;
  impl()->retains_grad = true;
  std::weak_ptr<TensorImpl> weak = impl_ptr();
  register_hook([weak](const Tensor& g) {
    if (auto self = weak.lock()) {
      if (self->grad) {
        self->grad = add(Tensor(self->grad), g).impl_ptr();
      } else {
        self->grad = g.clone().impl_ptr();
      }
    }
    return Tensor();
  });
}

void zero_grad(const std::vector<Tensor>& params, bool set_to_none) {
  for (const Tensor& p : params) {
    if (!p.defined() || !p.impl()->grad) continue;
    if (set_to_none) {
      p.impl()->grad.reset();
    } else {
      autograd::NoGradGuard ng;
      Tensor(p.impl()->grad).zero_();
    }
  }
}

}  // namespace ft
