// Module: registration, PyTorch-style naming, modes, state dicts and moves; Sequential and
// ModuleList. A parameter is a Tensor handle shared by the layer's member field, this registry,
// optimizers and (when tied) other modules, so every move below rewrites the TensorImpl in place
// (PyTorch's `param.data = ...`): all holders see the new data, ties stay ties, and parameters
// stay leaves that require grad.
#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "fasttrain/autograd.h"
#include "fasttrain/nn.h"

namespace ft::nn {
namespace {

// Parameters, buffers and submodules share one namespace: a state-dict key such as "fc.weight"
// must lead to exactly one tensor, so a new name may be taken by none of the three.
template <class Params, class Children>
void check_new_name(const std::string& name, const std::string& type, const char* what, const Params& params,
                    const Params& buffers, const Children& children) {
  FT_CHECK(!name.empty(), type, ": ", what, " name must not be empty");
  FT_CHECK(name.find('.') == std::string::npos, type, ": ", what, " name \"", name,
           "\" must not contain '.' (dots join the names of nested modules)");
  auto taken = [&](const auto& list) {
    return std::any_of(list.begin(), list.end(), [&](const auto& entry) { return entry.first == name; });
  };
  const char* holder = taken(params) ? "parameter" : taken(buffers) ? "buffer" : taken(children) ? "submodule" : "";
  FT_CHECK(*holder == '\0', type, ": \"", name, "\" is already registered (as a ", holder, ")");
}

// Replaces the data behind `t` (all handles to its impl) with `data`; keeps autograd identity.
void replace_data(const Tensor& t, const Tensor& data) {
  TensorImpl* impl = t.impl();
  const TensorImpl* src = data.impl();
  // Counts as a write: anything that recorded the old version (a tensor saved for backward, an
  // autocast cast cache) must not mistake the new data for the old.
  src->storage->version.store(t.version() + 1, std::memory_order_relaxed);
  impl->storage = src->storage;
  impl->shape = src->shape;
  impl->strides = src->strides;
  impl->offset = src->offset;
  impl->dtype = src->dtype;
  // A gradient accumulator records the leaf's old shape and dtype; the next graph makes a new one.
  impl->grad_accumulator.reset();
}

// Applies `convert` once to every distinct parameter and buffer (tied tensors once) and to
// parameters' gradients.
template <class F>
void for_each_unique_tensor(const Module& m, F&& convert) {
  std::unordered_set<const TensorImpl*> seen;
  auto apply = [&](const Tensor& t, bool is_param) {
    if (!seen.insert(t.impl()).second) return;
    autograd::NoGradGuard ng;
    Tensor moved = convert(t.detach());
    if (moved.storage() != t.storage()) replace_data(t, moved);  // unchanged: keep the version
    if (is_param && t.impl()->grad) {
      Tensor g(t.impl()->grad);
      Tensor gm = convert(g);
      if (!gm.same(g)) t.impl()->grad = gm.impl_ptr();
    }
  };
  for (auto& [n, p] : m.named_parameters()) apply(p, true);
  for (auto& [n, b] : m.named_buffers()) apply(b, false);
}

}  // namespace

// ---------------------------------------------------------------- registration

Tensor& Module::register_parameter(const std::string& name, Tensor t, bool requires_grad) {
  check_new_name(name, type_name(), "parameter", params_, buffers_, children_);
  FT_CHECK(t.defined(), type_name(), ": parameter \"", name, "\" is an undefined tensor");
  FT_CHECK(!requires_grad || is_floating(t.dtype()), type_name(), ": parameter \"", name,
           "\" requires grad, so it must be floating point; found ", dtype_name(t.dtype()));
  if (!t.is_leaf()) t = t.detach();
  t.requires_grad_(requires_grad);
  params_.emplace_back(name, t);
  return params_.back().second;
}

Tensor& Module::register_buffer(const std::string& name, Tensor t) {
  check_new_name(name, type_name(), "buffer", params_, buffers_, children_);
  FT_CHECK(t.defined(), type_name(), ": buffer \"", name, "\" is an undefined tensor");
  buffers_.emplace_back(name, t.detach());
  return buffers_.back().second;
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> m) {
  check_new_name(name, type_name(), "submodule", params_, buffers_, children_);
  FT_CHECK(m != nullptr, type_name(), ": submodule \"", name, "\" is null");
  FT_CHECK(m.get() != this, type_name(), ": a module cannot be its own submodule (\"", name, "\")");
  children_.emplace_back(name, std::move(m));
}

// ---------------------------------------------------------------- introspection

namespace {
std::string join(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}
}  // namespace

// Walks modules depth first, each module's own entries before its children's (PyTorch's order).
template <class Visit>
static void walk(const Module& m, const std::string& prefix, Visit&& visit) {
  visit(m, prefix);
  for (auto& [name, child] : m.named_children()) walk(*child, join(prefix, name), visit);
}

std::vector<std::pair<std::string, Tensor>> Module::named_parameters() const {
  std::vector<std::pair<std::string, Tensor>> out;
  std::unordered_set<const TensorImpl*> seen;
  walk(*this, "", [&](const Module& m, const std::string& prefix) {
    for (auto& [n, p] : m.params_)
      if (seen.insert(p.impl()).second) out.emplace_back(join(prefix, n), p);
  });
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [n, p] : named_parameters()) out.push_back(p);
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::named_buffers() const {
  std::vector<std::pair<std::string, Tensor>> out;
  std::unordered_set<const TensorImpl*> seen;
  walk(*this, "", [&](const Module& m, const std::string& prefix) {
    for (auto& [n, b] : m.buffers_)
      if (seen.insert(b.impl()).second) out.emplace_back(join(prefix, n), b);
  });
  return out;
}

std::vector<std::pair<std::string, std::shared_ptr<Module>>> Module::named_children() const { return children_; }

std::vector<std::pair<std::string, std::shared_ptr<Module>>> Module::named_modules() {
  // The entry for this module does not own it: a module may live on the stack.
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> out{
      {"", std::shared_ptr<Module>(std::shared_ptr<Module>(), this)}};
  std::unordered_set<const Module*> seen{this};
  std::function<void(const Module&, const std::string&)> rec = [&](const Module& m, const std::string& prefix) {
    for (auto& [n, c] : m.children_) {
      if (!seen.insert(c.get()).second) continue;
      out.emplace_back(join(prefix, n), c);
      rec(*c, join(prefix, n));
    }
  };
  rec(*this, "");
  return out;
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (auto& [name, p] : named_parameters()) n += p.numel();
  return n;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [n, c] : children_) c->train(on);
}

// ---------------------------------------------------------------- state

TensorMap Module::state_dict() const {
  TensorMap out;
  walk(*this, "", [&](const Module& m, const std::string& prefix) {
    for (auto& [n, p] : m.params_) out.emplace_back(join(prefix, n), p.detach());
    for (auto& [n, b] : m.buffers_) out.emplace_back(join(prefix, n), b.detach());
  });
  return out;
}

void Module::load_state_dict(const TensorMap& state, bool strict) {
  std::vector<std::pair<std::string, Tensor>> targets;
  walk(*this, "", [&](const Module& m, const std::string& prefix) {
    for (auto& [n, p] : m.params_) targets.emplace_back(join(prefix, n), p);
    for (auto& [n, b] : m.buffers_) targets.emplace_back(join(prefix, n), b);
  });
  std::unordered_map<std::string, const Tensor*> given;
  for (auto& [n, t] : state) given[n] = &t;

  // Validate everything first so a bad state leaves the module untouched.
  std::vector<std::string> problems;
  std::unordered_set<std::string> known;
  for (auto& [name, dst] : targets) {
    known.insert(name);
    auto it = given.find(name);
    if (it == given.end()) {
      if (strict) problems.push_back("missing key \"" + name + "\" (expected shape " + dst.shape().str() + ")");
      continue;
    }
    const Tensor& src = *it->second;
    if (!src.defined())
      problems.push_back("key \"" + name + "\" holds an undefined tensor");
    else if (src.shape() != dst.shape())
      problems.push_back("key \"" + name + "\": expected shape " + dst.shape().str() + ", found " + src.shape().str());
  }
  if (strict)
    for (auto& [n, t] : state)
      if (!known.count(n)) problems.push_back("unexpected key \"" + n + "\"");
  if (!problems.empty()) {
    const std::string foreign = explain_foreign_state(state);
    if (!foreign.empty()) FT_FAIL(type_name(), ".load_state_dict: ", foreign);
    std::string msg = type_name() + ".load_state_dict: " + std::to_string(problems.size()) + " problem(s): ";
    for (size_t i = 0; i < problems.size(); ++i) msg += (i ? "; " : "") + problems[i];
    FT_FAIL(msg);
  }
  autograd::NoGradGuard ng;
  for (auto& [name, dst] : targets) {
    auto it = given.find(name);
    if (it == given.end()) continue;
    Tensor d = dst;
    d.copy_(*it->second);  // converts dtype and device
  }
}

std::string Module::explain_foreign_state(const TensorMap&) const { return {}; }

// ---------------------------------------------------------------- moves

void Module::to(Device device) {
  for_each_unique_tensor(*this, [device](const Tensor& t) { return t.to(device); });
}

void Module::to(DType dtype) {
  FT_CHECK(is_floating(dtype), type_name(), ".to(", dtype_name(dtype),
           "): modules convert to floating dtypes only (integer buffers keep theirs)");
  for_each_unique_tensor(*this, [dtype](const Tensor& t) { return is_floating(t.dtype()) ? t.to(dtype) : t; });
}

void Module::to_channels_last() {
  for_each_unique_tensor(*this, [](const Tensor& t) { return t.dim() == 4 ? t.contiguous_channels_last() : t; });
}

void Module::zero_grad(bool set_to_none) { ft::zero_grad(parameters(), set_to_none); }

// ---------------------------------------------------------------- containers

Sequential::Sequential(std::vector<ModulePtr> layers) {
  for (auto& l : layers) push_back(std::move(l));
}

void Sequential::push_back(ModulePtr m) {
  register_module(std::to_string(layers_.size()), m);
  layers_.push_back(std::move(m));
}

Tensor Sequential::forward(const Tensor& x) { return run_layers(x, layers_.size()); }

Tensor Sequential::forward_add_relu(const Tensor& x, const Tensor& residual) {
  return call_as_this([&] {
    FT_CHECK(!layers_.empty(), "Sequential::forward_add_relu: the Sequential has no layers");
    const Tensor y = run_layers(x, layers_.size() - 1);
    if (auto* bn = dynamic_cast<BatchNorm2d*>(layers_.back().get())) return bn->call_with_add_relu(y, residual);
    return relu(add((*layers_.back())(y), residual));
  });
}

Tensor Sequential::run_layers(const Tensor& x, size_t end) {
  Tensor y = x;
  for (size_t i = 0; i < end; ++i) {
    // BatchNorm2d then ReLU: one fused op, each pass over the activations once (the ReLU module
    // is not called; the pair's work shows under the BatchNorm2d's profiler span).
    auto* bn = dynamic_cast<BatchNorm2d*>(layers_[i].get());
    if (bn && i + 1 < end && dynamic_cast<ReLU*>(layers_[i + 1].get())) {
      y = bn->call_with_relu(y);
      ++i;
      continue;
    }
    y = (*layers_[i])(y);
  }
  return y;
}

void ModuleList::push_back(std::shared_ptr<Module> m) {
  register_module(std::to_string(items_.size()), m);
  items_.push_back(std::move(m));
}

}  // namespace ft::nn
