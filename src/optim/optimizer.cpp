// The optimizer base (groups, zero_grad, set_lr, scalar state) and the state handling shared by
// the multi-tensor optimizers (multi_tensor.h).
#include <cstdio>
#include <set>

#include "fasttrain/autograd.h"
#include "optim/multi_tensor.h"

namespace ft::optim {
namespace {

std::string group_label(const std::vector<ParamGroup>& groups, size_t g) {
  return groups[g].name.empty() ? "group " + std::to_string(g)
                                : "group " + std::to_string(g) + " ('" + groups[g].name + "')";
}

std::string format_double(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);  // round-trips exactly
  return buf;
}

// Hyper-parameters as (key, field) pairs, for state_metadata and load_state_metadata alike.
template <class Options, class F>
void for_each_option(Options& o, F&& f) {
  f("lr", o.lr);
  f("weight_decay", o.weight_decay);
  f("momentum", o.momentum);
  f("dampening", o.dampening);
  f("beta1", o.beta1);
  f("beta2", o.beta2);
  f("eps", o.eps);
  f("trust_coefficient", o.trust_coefficient);
}

// The boolean hyper-parameters, likewise.
template <class Options, class F>
void for_each_flag(Options& o, F&& f) {
  f("nesterov", o.nesterov);
  f("exclude_from_adaptation", o.exclude_from_adaptation);
}

// The fused pass walks a parameter, its gradient and its state as flat arrays of numel elements,
// so all of them must be dense in the same memory order (contiguous, or channels-last for conv
// weights after Module::to_channels_last()).
bool same_dense_layout(const Tensor& t, const Tensor& p) {
  if (p.is_contiguous()) return t.is_contiguous();
  return t.is_channels_last() && !t.is_contiguous();
}

Tensor empty_in_layout_of(const Tensor& p, DType dtype) {
  return p.is_contiguous() ? empty(p.shape(), TensorOptions(dtype, p.device()))
                           : empty_strided(p.shape(), p.strides(), TensorOptions(dtype, p.device()));
}

// t copied into p's memory order (t itself when it already has it).
Tensor in_layout_of(const Tensor& p, const Tensor& t) {
  if (same_dense_layout(t, p)) return t;
  Tensor out = empty_in_layout_of(p, t.dtype());
  autograd::NoGradGuard no_grad;
  out.copy_(t);
  return out;
}

}  // namespace

Optimizer::Optimizer(std::vector<ParamGroup> groups) : groups_(std::move(groups)) {
  size_t total = 0;
  std::set<const TensorImpl*> seen;
  for (size_t g = 0; g < groups_.size(); ++g) {
    for (size_t i = 0; i < groups_[g].params.size(); ++i) {
      const Tensor& p = groups_[g].params[i];
      const std::string where = "parameter " + std::to_string(i) + " of " + group_label(groups_, g);
      FT_CHECK(p.defined(), "optimizer: ", where, " is undefined");
      FT_CHECK(is_floating(p.dtype()), "optimizer: ", where, " has dtype ", dtype_name(p.dtype()),
               ", expected a floating dtype (f32, f64, bf16, f16)");
      if (total == 0) device_ = p.device();  // the first parameter's: the kernel table the steps use
      FT_CHECK(p.device() == device_, "optimizer: ", where, " is on ", p.device().str(), ", the first parameter on ",
               device_.str(), " (a step runs on one device)");
      FT_CHECK(p.is_contiguous() || p.is_channels_last(), "optimizer: ", where,
               " is not dense (expected contiguous or channels-last memory; shape ", p.shape().str(), ", strides ",
               p.strides().str(), ")");
      FT_CHECK(seen.insert(p.impl()).second, "optimizer: some parameters appear in more than one parameter group (",
               where, ")");
      ++total;
    }
  }
  FT_CHECK(total > 0, "optimizer: got an empty parameter list");
}

void Optimizer::zero_grad(bool set_to_none) {
  autograd::NoGradGuard no_grad;
  for (auto& group : groups_)
    for (auto& p : group.params) {
      if (set_to_none) {
        p.set_grad(Tensor());
      } else if (Tensor g = p.grad(); g.defined()) {
        g.zero_();
      }
    }
}

void Optimizer::set_lr(double lr) {
  FT_CHECK(lr >= 0, name(), ": Invalid learning rate: ", lr, " (expected >= 0)");
  for (auto& group : groups_) group.options.lr = lr;
}

void Optimizer::set_momentum(double momentum) {
  // The Adam family keeps its momentum as beta1 (what torch's schedules cycle too).
  const bool adam_style = optimizer_family(kind()) == OptimizerFamily::Adam;
  if (adam_style)
    FT_CHECK(momentum >= 0 && momentum < 1, name(), ": Invalid beta parameter at index 0: ", momentum,
             " (set_momentum expects a value in [0, 1))");
  else
    FT_CHECK(momentum >= 0, name(), ": Invalid momentum value: ", momentum, " (expected >= 0)");
  for (auto& group : groups_) (adam_style ? group.options.beta1 : group.options.momentum) = momentum;
}

std::map<std::string, std::string> Optimizer::state_metadata() const {
  std::map<std::string, std::string> m{
      {"optimizer", name()}, {"step_count", std::to_string(step_count_)}, {"groups", std::to_string(groups_.size())}};
  for (size_t g = 0; g < groups_.size(); ++g) {
    const std::string prefix = std::to_string(g) + ".";
    for_each_option(groups_[g].options, [&](const char* key, double v) { m[prefix + key] = format_double(v); });
    for_each_flag(groups_[g].options, [&](const char* key, bool v) { m[prefix + key] = v ? "true" : "false"; });
    m[prefix + "name"] = groups_[g].name;
  }
  return m;
}

void Optimizer::load_state_metadata(const std::map<std::string, std::string>& metadata) {
  auto get = [&](const std::string& key) -> const std::string& {
    auto it = metadata.find(key);
    FT_CHECK(it != metadata.end(), name(), " state: metadata has no '", key, "'");
    return it->second;
  };
  auto parse_number = [&](const std::string& key, auto& out) {
    const std::string& s = get(key);
    size_t used = 0;
    try {
      if constexpr (std::is_same_v<std::decay_t<decltype(out)>, double>)
        out = std::stod(s, &used);
      else
        out = std::stoll(s, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    FT_CHECK(used == s.size() && !s.empty(), name(), " state: metadata '", key, "' is not a number: '", s, "'");
  };
  FT_CHECK(get("optimizer") == name(), name(), " state: saved by optimizer '", get("optimizer"), "', expected '",
           name(), "'");
  int64_t groups = 0, steps = 0;
  parse_number("groups", groups);
  FT_CHECK(groups == static_cast<int64_t>(groups_.size()), name(), " state: saved with ", groups,
           " parameter groups, this optimizer has ", groups_.size());
  parse_number("step_count", steps);
  std::vector<GroupOptions> options(groups_.size());
  for (size_t g = 0; g < groups_.size(); ++g) {
    const std::string prefix = std::to_string(g) + ".";
    for_each_option(options[g], [&](const char* key, double& v) { parse_number(prefix + key, v); });
    for_each_flag(options[g], [&](const char* key, bool& v) {
      const std::string& text = get(prefix + key);
      FT_CHECK(text == "true" || text == "false", name(), " state: metadata '", prefix, key,
               "' must be true or false, found '", text, "'");
      v = text == "true";
    });
  }
  for (size_t g = 0; g < groups_.size(); ++g) groups_[g].options = options[g];
  step_count_ = steps;
}

namespace detail {

MultiTensorOptimizer::MultiTensorOptimizer(std::vector<ParamGroup> groups) : Optimizer(std::move(groups)) {
  state_.resize(groups_.size());
  for (size_t g = 0; g < groups_.size(); ++g) state_[g].resize(groups_[g].params.size());
}

void MultiTensorOptimizer::check_all_options() const {
  for (size_t g = 0; g < groups_.size(); ++g) check_options(groups_[g].options, g);
}

std::string MultiTensorOptimizer::group_label(size_t g) const { return optim::group_label(groups_, g); }

void MultiTensorOptimizer::check_adam_family_options(const GroupOptions& o, size_t g) const {
  FT_CHECK(o.lr >= 0, name(), ": Invalid learning rate: ", o.lr, " (", group_label(g), ")");
  FT_CHECK(o.eps > 0, name(), ": Invalid epsilon value: ", o.eps, " (expected > 0; ", group_label(g), ")");
  FT_CHECK(o.beta1 >= 0 && o.beta1 < 1, name(), ": Invalid beta parameter at index 0: ", o.beta1, " (", group_label(g),
           ")");
  FT_CHECK(o.beta2 >= 0 && o.beta2 < 1, name(), ": Invalid beta parameter at index 1: ", o.beta2, " (", group_label(g),
           ")");
  FT_CHECK(o.weight_decay >= 0, name(), ": Invalid weight_decay value: ", o.weight_decay, " (", group_label(g), ")");
}

void MultiTensorOptimizer::check_momentum_family_options(const GroupOptions& o, size_t g) const {
  FT_CHECK(o.lr >= 0, name(), ": Invalid learning rate: ", o.lr, " (", group_label(g), ")");
  FT_CHECK(o.momentum >= 0, name(), ": Invalid momentum value: ", o.momentum, " (", group_label(g), ")");
  FT_CHECK(o.weight_decay >= 0, name(), ": Invalid weight_decay value: ", o.weight_decay, " (", group_label(g), ")");
}

int64_t MultiTensorOptimizer::prepare_step(const Tensor* found_inf) {
  // Groups and parameters may have been edited through param_groups(): check before any change.
  check_all_options();
  for (size_t g = 0; g < groups_.size(); ++g)
    FT_CHECK(groups_[g].params.size() == state_[g].size(), name(), ": ", group_label(g), " had ", state_[g].size(),
             " parameters when the optimizer was made, now ", groups_[g].params.size());
  if (found_inf != nullptr) {
    FT_CHECK(
        found_inf->defined() && found_inf->numel() == 1 && found_inf->dim() == 0 && found_inf->dtype() == DType::F32,
        name(), ": found_inf must be a 0-d f32 tensor, found ",
        found_inf->defined() ? std::string(dtype_name(found_inf->dtype())) + " " + found_inf->shape().str()
                             : "undefined");
    FT_CHECK(found_inf->device() == device_, name(), ": found_inf is on ", found_inf->device().str(),
             ", the parameters on ", device_.str());
  }
  contiguous_grads_.clear();
  for (size_t g = 0; g < groups_.size(); ++g) {
    for (size_t i = 0; i < groups_[g].params.size(); ++i) {
      const Tensor& p = groups_[g].params[i];
      const Tensor grad = p.grad();
      if (!grad.defined()) continue;
      // Built only when a check fails (FT_CHECK evaluates its message lazily): no per-step strings.
      auto where = [&] { return "parameter " + std::to_string(i) + " of " + group_label(g); };
      // Parameters may have been replaced through param_groups() since the constructor checked them.
      FT_CHECK(p.device() == device_, name(), ": ", where(), " is on ", p.device().str(), ", the optimizer on ",
               device_.str());
      FT_CHECK(grad.shape() == p.shape(), name(), ": gradient of ", where(), " has shape ", grad.shape().str(),
               ", expected ", p.shape().str());
      FT_CHECK(grad.device() == p.device(), name(), ": gradient of ", where(), " is on ", grad.device().str(),
               ", the parameter on ", p.device().str());
      const bool ok = p.dtype() == DType::F64
                          ? grad.dtype() == DType::F64
                          : grad.dtype() == DType::F32 || grad.dtype() == DType::BF16 || grad.dtype() == DType::F16;
      FT_CHECK(ok, name(), ": gradient of ", where(), " has dtype ", dtype_name(grad.dtype()), " for a ",
               dtype_name(p.dtype()), " parameter (expected ", p.dtype() == DType::F64 ? "f64" : "f32, bf16 or f16",
               ")");
    }
  }

  segments_.clear();
  int64_t total = 0;
  for (size_t g = 0; g < groups_.size(); ++g) {
    const GroupOptions& options = groups_[g].options;
    const int nbuf = num_buffers(options);
    for (size_t i = 0; i < groups_[g].params.size(); ++i) {
      const Tensor& p = groups_[g].params[i];
      Tensor grad = p.grad();
      if (!grad.defined()) continue;
      if (!same_dense_layout(grad, p)) {
        grad = in_layout_of(p, grad);
        contiguous_grads_.push_back(grad);
      }
      ParamState& st = state_[g][i];
      backend::Segment s;
      const bool new_state = !st.step.defined();
      if (new_state) st.step = scalar_tensor(int64_t{0}, TensorOptions(DType::I64, device_));
      const DType state_dtype = p.dtype() == DType::F64 ? DType::F64 : DType::F32;
      if (static_cast<int>(st.buffers.size()) != nbuf) {  // first step, or momentum switched on
        st.buffers.resize(nbuf);
        for (auto& b : st.buffers) b = empty_in_layout_of(p, state_dtype).zero_();
        // The one read of a step count by the host, when buffers are made (rare, and it allocates anyway).
        st.buffers_first_step = (new_state ? 0 : st.step.item<int64_t>()) + 1;
      }
      if ((p.dtype() == DType::BF16 || p.dtype() == DType::F16) && !st.master.defined())
        st.master = in_layout_of(p, p.to(DType::F32));
      s.begin = total;
      s.numel = p.numel();
      s.param = p.raw_data();
      s.param_dtype = p.dtype();
      s.grad = grad.raw_data();
      s.grad_dtype = grad.dtype();
      s.master = st.master.defined() ? st.master.data<float>() : nullptr;
      for (int k = 0; k < nbuf; ++k) s.buffers[k] = st.buffers[k].raw_data();
      s.step = st.step.data<int64_t>();
      s.buffers_first_step = st.buffers_first_step;
      s.options = &options;
      segments_.push_back(s);  // an empty parameter too: its step count advances
      total += s.numel;
    }
  }
  return total;
}

void MultiTensorOptimizer::run_step(const Tensor* found_inf) {
  autograd::NoGradGuard no_grad;
  backend::MultiTensorStep step;
  step.total = prepare_step(found_inf);
  step.segments = segments_;
  step.found_inf = found_inf != nullptr ? found_inf->data<float>() : nullptr;
  update(backend::kernels(device_), step);
  finish_step();
}

void MultiTensorOptimizer::finish_step() {
  for (auto& group : groups_)
    for (auto& p : group.params)
      if (p.impl()->grad) p.bump_version();
  contiguous_grads_.clear();
  ++step_count_;
}

TensorMap MultiTensorOptimizer::state_tensors() const {
  TensorMap out;
  for (size_t g = 0; g < groups_.size(); ++g) {
    const int nbuf = num_buffers(groups_[g].options);
    for (size_t i = 0; i < state_[g].size(); ++i) {
      const ParamState& st = state_[g][i];
      // Never updated (no gradient yet, or every step skipped): no state, as in PyTorch.
      if (!st.step.defined() || st.step.item<int64_t>() == 0) continue;
      const std::string prefix = std::to_string(g) + "." + std::to_string(i) + ".";
      out.emplace_back(prefix + "step", st.step);
      for (int k = 0; k < nbuf && k < static_cast<int>(st.buffers.size()); ++k)
        out.emplace_back(prefix + buffer_name(k), st.buffers[k]);
      if (st.master.defined()) out.emplace_back(prefix + "master", st.master);
    }
  }
  return out;
}

void MultiTensorOptimizer::load_state_tensors(const TensorMap& state) {
  const std::string who = name() + " state";
  // Parse and check everything into a new state table; swap it in only when all is well.
  std::vector<std::vector<ParamState>> loaded(groups_.size());
  std::vector<std::vector<std::set<std::string>>> present(groups_.size());
  for (size_t g = 0; g < groups_.size(); ++g) {
    loaded[g].resize(groups_[g].params.size());
    present[g].resize(groups_[g].params.size());
  }
  for (const auto& [key, t] : state) {
    const size_t dot1 = key.find('.'), dot2 = dot1 == std::string::npos ? dot1 : key.find('.', dot1 + 1);
    FT_CHECK(dot2 != std::string::npos, who, ": entry '", key, "' is not named <group>.<index>.<state>");
    int64_t g = -1, i = -1;
    try {
      size_t used1 = 0, used2 = 0;
      g = std::stoll(key.substr(0, dot1), &used1);
      i = std::stoll(key.substr(dot1 + 1, dot2 - dot1 - 1), &used2);
      if (used1 != dot1 || used2 != dot2 - dot1 - 1) g = -1;
    } catch (const std::exception&) {
      g = -1;
    }
    FT_CHECK(g >= 0 && i >= 0, who, ": entry '", key, "' is not named <group>.<index>.<state>");
    FT_CHECK(g < static_cast<int64_t>(groups_.size()), who, ": entry '", key, "' is for group ", g,
             " but the optimizer has ", groups_.size(), " groups");
    FT_CHECK(i < static_cast<int64_t>(groups_[g].params.size()), who, ": entry '", key, "' is for parameter ", i,
             " but group ", g, " has ", groups_[g].params.size(), " parameters");
    const std::string kind = key.substr(dot2 + 1);
    const Tensor& p = groups_[g].params[i];
    ParamState& st = loaded[g][i];
    FT_CHECK(t.defined(), who, ": entry '", key, "' is undefined");
    if (kind == "step") {
      FT_CHECK(t.numel() == 1 && is_integral(t.dtype()) && t.dtype() != DType::Bool, who, ": entry '", key,
               "' must be one integer, found ", dtype_name(t.dtype()), " ", t.shape().str());
      const int64_t step = t.item<int64_t>();
      FT_CHECK(step >= 1, who, ": entry '", key, "' holds step ", step, ", expected >= 1");
      st.step = scalar_tensor(step, TensorOptions(DType::I64, device_));
    } else {
      const bool is_master = kind == "master";
      const int nbuf = num_buffers(groups_[g].options);
      int k = -1;
      for (int b = 0; b < nbuf; ++b)
        if (kind == buffer_name(b)) k = b;
      const bool low = p.dtype() == DType::BF16 || p.dtype() == DType::F16;
      FT_CHECK(k >= 0 || (is_master && low), who, ": entry '", key, "': '", kind, "' is not a state of ",
               dtype_name(p.dtype()), " parameters of this ", name(), " group");
      const DType want = p.dtype() == DType::F64 ? DType::F64 : DType::F32;
      FT_CHECK(t.shape() == p.shape(), who, ": entry '", key, "' has shape ", t.shape().str(), ", the parameter ",
               p.shape().str());
      FT_CHECK(t.dtype() == want, who, ": entry '", key, "' has dtype ", dtype_name(t.dtype()), ", expected ",
               dtype_name(want));
      Tensor copy = empty_in_layout_of(p, want);
      copy.copy_(t);
      if (is_master) {
        st.master = copy;
      } else {
        if (static_cast<int>(st.buffers.size()) < nbuf) st.buffers.resize(nbuf);
        st.buffers[k] = copy;
      }
    }
    FT_CHECK(present[g][i].insert(kind).second, who, ": entry '", key, "' appears twice");
  }
  // A parameter has either no state or all of it.
  for (size_t g = 0; g < groups_.size(); ++g) {
    for (size_t i = 0; i < groups_[g].params.size(); ++i) {
      if (present[g][i].empty()) continue;
      const std::string prefix = std::to_string(g) + "." + std::to_string(i) + ".";
      std::vector<std::string> needed{"step"};
      for (int b = 0; b < num_buffers(groups_[g].options); ++b) needed.push_back(buffer_name(b));
      const DType pd = groups_[g].params[i].dtype();
      if (pd == DType::BF16 || pd == DType::F16) needed.push_back("master");
      for (const auto& n : needed) FT_CHECK(present[g][i].count(n), who, ": entry '", prefix, n, "' is missing");
    }
  }
  state_ = std::move(loaded);
}

}  // namespace detail
}  // namespace ft::optim
