// ZeRO stages 1 and 2 (zero.h): the flattened, padded group layout, the shard optimizer over
// views of this rank's part, gradient reduction (DDP's buckets or one reduce-scatter per group),
// clipping by the global norm and the all-gather of the updated shards; and the optimizer state
// moved between the sharded and the unsharded layout, which is what lets a checkpoint saved at N
// ranks resume at any other number of ranks.
#include "dist/zero.h"

#include <algorithm>
#include <cmath>
#include <unordered_set>

#include "fasttrain/autograd.h"
#include "fasttrain/error.h"

namespace ft::dist {

int zero_stage(const std::string& strategy) {
  if (strategy == "zero1") return 1;
  if (strategy == "zero2") return 2;
  if (strategy == "zero3" || strategy == "fsdp") return 3;
  return 0;
}

namespace {

std::unique_ptr<optim::Optimizer> make_of_kind(optim::OptimizerKind kind, std::vector<optim::ParamGroup> groups) {
  switch (kind) {
    case optim::OptimizerKind::AdamW: return optim::make_adamw(std::move(groups));
    case optim::OptimizerKind::Adam: return optim::make_adam(std::move(groups));
    case optim::OptimizerKind::SGD: return optim::make_sgd(std::move(groups));
    case optim::OptimizerKind::LAMB:
    case optim::OptimizerKind::LARS: break;
  }
  FT_FAIL("ZeRO: expected an element-wise optimizer (adamw, adam or sgd), found ", optim::optimizer_name(kind),
          " (its trust ratio needs the norm of each whole parameter, which a shard does not hold)");
}

// "<group>.<index>.<state>" split into its three parts; false for other names.
bool split_state_name(const std::string& name, int64_t* group, int64_t* index, std::string* state) {
  const size_t a = name.find('.'), b = a == std::string::npos ? a : name.find('.', a + 1);
  if (b == std::string::npos) return false;
  try {
    *group = std::stoll(name.substr(0, a));
    *index = std::stoll(name.substr(a + 1, b - a - 1));
  } catch (const std::exception&) {
    return false;
  }
  *state = name.substr(b + 1);
  return true;
}

std::string state_name(int64_t group, int64_t index, const std::string& state) {
  return std::to_string(group) + "." + std::to_string(index) + "." + state;
}

}  // namespace

ZeroSharding::ZeroSharding(nn::Module& model, const optim::Optimizer& full, std::shared_ptr<Communicator> comm,
                           int stage, DdpOptions ddp)
    : comm_(std::move(comm)), stage_(stage), kind_(full.kind()) {
  FT_CHECK(comm_ != nullptr, "ZeRO: expected a communicator, found none");
  FT_CHECK(stage == 1 || stage == 2, "strategy zero", stage,
           ": not implemented yet (ZeRO stages 1 and 2 are: zero1, zero2; stage 3 / fsdp is not)");
  FT_CHECK(kind_ != optim::OptimizerKind::LAMB && kind_ != optim::OptimizerKind::LARS, "strategy zero", stage,
           ": expected an element-wise optimizer (adamw, adam or sgd), found ", optim::optimizer_name(kind_),
           " (its trust ratio needs the norm of each whole parameter, which a shard does not hold; use --strategy "
           "ddp)");
  const int64_t n = comm_->world_size(), r = comm_->rank();
  autograd::NoGradGuard no_grad;
  for (const optim::ParamGroup& pg : full.param_groups()) {
    Group g;
    g.params = pg.params;
    g.options = pg.options;
    g.name = pg.name;
    for (const Tensor& p : g.params) {
      FT_CHECK(p.dtype() == g.params.front().dtype(), "ZeRO: parameter group '", g.name, "' mixes dtypes (",
               dtype_name(g.params.front().dtype()), " and ", dtype_name(p.dtype()),
               "); expected one dtype per group, as its shards are gathered as one buffer");
      g.offsets.push_back(g.total);
      g.total += p.numel();
    }
    g.shard = (g.total + n - 1) / n;  // P_g = N s_g >= T_g: the last shard is padded with zeros
    g.grad = zeros({std::max<int64_t>(g.shard, 1)}, DType::F32);
    const int64_t lo = r * g.shard, hi = lo + g.shard;
    for (size_t i = 0; i < g.params.size(); ++i) {
      const Tensor& param = g.params[i];
      const int64_t begin = std::max(lo, g.offsets[i]), end = std::min(hi, g.offsets[i] + param.numel());
      if (begin >= end) continue;
      Piece piece{static_cast<int64_t>(i), begin - g.offsets[i], end - begin, begin - lo, Tensor()};
      // The piece is the parameter's own memory: the optimizer updates the model in place and
      // no second copy of the weights exists (a bf16 parameter gets its f32 master in the
      // optimizer's state, as in one process). A parameter in another memory order
      // (channels-last) gets a buffer of its own, refreshed after every all-gather.
      Tensor data = param.detach();
      piece.view = data.is_contiguous() ? data.reshape({-1}).narrow(0, piece.offset, piece.numel)
                                        : empty({piece.numel}, data.dtype());
      g.pieces.push_back(std::move(piece));
    }
    // A rank whose range holds only padding still gives the optimizer one tensor, which never
    // has a gradient (so it is never updated and has no state): optimizers refuse empty lists.
    if (g.pieces.empty()) g.pieces.push_back({-1, 0, 1, 0, zeros({1}, DType::F32)});
    groups_.push_back(std::move(g));
  }
  load_weights_from_model();
  const int64_t cap = ddp.bucket_cap_bytes > 0 ? ddp.bucket_cap_bytes : int64_t{1} << 40;
  gather_chunk_ = std::max<int64_t>(1, cap / static_cast<int64_t>(sizeof(float)) / n);
  if (stage_ == 1) ddp_ = std::make_unique<DataParallel>(model, comm_, ddp);
}

ZeroSharding::~ZeroSharding() {
  for (const WorkPtr& w : works_) try {
      w->wait();
    } catch (const std::exception&) {
    }
}

void ZeroSharding::load_weights_from_model() {
  autograd::NoGradGuard no_grad;
  for (Group& g : groups_)
    for (Piece& p : g.pieces) {
      if (p.param < 0 || g.params[p.param].is_contiguous()) continue;  // a view: nothing to copy
      const Tensor flat = g.params[p.param].detach().contiguous().reshape({-1});
      p.view.copy_(flat.narrow(0, p.offset, p.numel));
    }
}

void ZeroSharding::gather_from_params(const Group& g, int64_t begin, const Tensor& out) {
  // out = elements [begin, begin + numel) of the group's flattened parameters (0 for padding).
  const int64_t end = begin + out.numel();
  if (end > g.total) out.narrow(0, std::max<int64_t>(0, g.total - begin), end - std::max(begin, g.total)).fill_(0);
  for (size_t i = 0; i < g.params.size(); ++i) {
    const int64_t lo = std::max(begin, g.offsets[i]), hi = std::min(end, g.offsets[i] + g.params[i].numel());
    if (lo >= hi) continue;
    const Tensor flat = g.params[i].detach().contiguous().reshape({-1});
    out.narrow(0, lo - begin, hi - lo).copy_(flat.narrow(0, lo - g.offsets[i], hi - lo));
  }
}

std::unique_ptr<optim::Optimizer> ZeroSharding::make_shard_optimizer() const {
  std::vector<optim::ParamGroup> groups;
  for (const Group& g : groups_) {
    optim::ParamGroup pg;
    pg.options = g.options;
    pg.name = g.name;
    for (const Piece& p : g.pieces) pg.params.push_back(p.view);
    groups.push_back(std::move(pg));
  }
  return make_of_kind(kind_, std::move(groups));
}

void ZeroSharding::before_backward(bool last) {
  if (ddp_) ddp_->before_backward(last);
}

void ZeroSharding::after_backward(bool last) {
  if (ddp_) {
    ddp_->after_backward(last);
    return;
  }
  if (!last) return;
  // Stage 2: each group's gradients flattened in the padded layout and reduce-scattered, so that
  // rank r receives the mean of elements [r s_g, (r + 1) s_g) only; one used flag per parameter
  // all-reduced beside them.
  autograd::NoGradGuard no_grad;
  flags_ = zeros({std::max<int64_t>(used_flag_count(), 1)}, DType::F32);
  float* flag = flags_.data<float>();
  flat_grads_.clear();
  for (Group& g : groups_) {
    Tensor flat = zeros({g.shard * comm_->world_size()}, DType::F32);
    for (size_t i = 0; i < g.params.size(); ++i, ++flag) {
      const Tensor grad = g.params[i].grad();
      if (!grad.defined()) continue;
      flat.narrow(0, g.offsets[i], g.params[i].numel()).copy_(grad.contiguous().reshape({-1}));
      *flag = 1;
      g.params[i].set_grad(Tensor());  // the full gradient is not needed past this point
    }
    works_.push_back(comm_->reduce_scatter_async(flat, g.grad.narrow(0, 0, g.shard), ReduceOp::Avg));
    flat_grads_.push_back(std::move(flat));
  }
  works_.push_back(comm_->all_reduce_async(flags_, ReduceOp::Sum));
}

void ZeroSharding::check_views() const {
  // The pieces are views of the parameters' memory: a conversion that gave a parameter new
  // memory after sharding (model.to(...)) would leave the optimizer updating the old one.
  for (const Group& g : groups_)
    for (const Piece& p : g.pieces) {
      if (p.param < 0 || !g.params[p.param].is_contiguous()) continue;
      const Tensor& param = g.params[p.param];
      const char* expected = static_cast<const char*>(param.raw_data()) + p.offset * param.element_size();
      FT_CHECK(p.view.raw_data() == expected && p.view.dtype() == param.dtype(), "ZeRO: parameter ", p.param,
               " of group '", g.name, "' was given new memory (", dtype_name(param.dtype()), ") after sharding (",
               dtype_name(p.view.dtype()),
               " view); convert the model (dtype, device) before the ZeroSharding is built");
    }
}

void ZeroSharding::finish() {
  check_views();
  autograd::NoGradGuard no_grad;
  std::vector<float> used;
  if (ddp_) {
    ddp_->finish();  // every parameter's mean gradient (none where no rank had one)
    for (Group& g : groups_) {
      g.grad.zero_();
      for (const Piece& p : g.pieces) {
        if (p.param < 0) continue;
        const Tensor grad = g.params[p.param].grad();
        if (!grad.defined()) continue;
        g.grad.narrow(0, p.at, p.numel).copy_(grad.contiguous().reshape({-1}).narrow(0, p.offset, p.numel));
      }
    }
    for (const Group& g : groups_)
      for (const Tensor& p : g.params) {
        used.push_back(p.grad().defined() ? 1.0f : 0.0f);
        p.set_grad(Tensor());  // the shard's part was copied: the rest is not this rank's
      }
  } else {
    for (const WorkPtr& w : works_) w->wait();
    works_.clear();
    flat_grads_.clear();
    if (flags_.defined()) {
      used.assign(flags_.data<float>(), flags_.data<float>() + used_flag_count());
    } else {  // no synchronised backward this step: nothing was reduced
      used.assign(static_cast<size_t>(used_flag_count()), 0.0f);
      for (Group& g : groups_) g.grad.zero_();
    }
    flags_ = Tensor();
  }
  round_grads_to_param_dtype();
  copy_shards_to_pieces_grads(used);
}

void ZeroSharding::round_grads_to_param_dtype() {
  // A bf16 / f16 parameter's gradient is held in its own dtype in one process and under DDP
  // (the mean and the clipped gradient are rounded to it): round the shard's f32 copy alike.
  for (Group& g : groups_)
    for (const Piece& p : g.pieces) {
      if (p.param < 0 || g.params[p.param].dtype() == DType::F32) continue;
      Tensor part = g.grad.narrow(0, p.at, p.numel);
      part.copy_(part.to(g.params[p.param].dtype()));
    }
}

void ZeroSharding::copy_shards_to_pieces_grads(const std::vector<float>& used) {
  size_t first = 0;  // the group's first parameter in `used`
  for (Group& g : groups_) {
    for (Piece& p : g.pieces) {
      const bool has = p.param >= 0 && used[first + static_cast<size_t>(p.param)] > 0;
      p.view.set_grad(has ? g.grad.narrow(0, p.at, p.numel) : Tensor());
    }
    first += g.params.size();
  }
}

Tensor ZeroSharding::clip_grad_norm(const std::vector<Tensor>&, double max_norm) {
  // ||g||^2 of the whole gradient = the sum over ranks of their shards' ||g_r||^2 (padding and
  // unused parameters hold zeros), reduced in f64 so the ranks agree on every bit. Summed on the
  // host: the shards are CPU tensors, as the MPI communicator's are (a device communicator
  // would keep this on the device).
  autograd::NoGradGuard no_grad;
  double local = 0;
  for (const Group& g : groups_) {
    const float* v = g.grad.data<float>();
    for (int64_t i = 0; i < g.shard; ++i) local += static_cast<double>(v[i]) * v[i];
  }
  Tensor total = scalar_tensor(local, DType::F64).reshape({1});
  comm_->all_reduce(total, ReduceOp::Sum);
  // As optim::clip_grad_norm_ does it (f32 gradients): the norm rounded to f32, the factor
  // max_norm / (norm + 1e-6) from it, applied in f32; so the clipped gradients are DDP's bits
  // whenever the f64 sums round to the same f32 norm.
  const float norm = static_cast<float>(std::sqrt(total.data<double>()[0]));
  const double coef = max_norm / (static_cast<double>(norm) + 1e-6);
  if (coef < 1.0) {
    const float factor = static_cast<float>(coef);
    for (Group& g : groups_) {
      float* v = g.grad.data<float>();
      for (int64_t i = 0; i < g.shard; ++i) v[i] *= factor;
    }
    round_grads_to_param_dtype();
  }
  return scalar_tensor(norm, DType::F32);
}

void ZeroSharding::clip_grad_value(const std::vector<Tensor>&, double clip_value) {
  std::vector<Tensor> views;
  for (const Group& g : groups_)
    for (const Piece& p : g.pieces)
      if (p.view.grad().defined()) views.push_back(p.view);
  optim::clip_grad_value_(views, clip_value);
  round_grads_to_param_dtype();
}

void ZeroSharding::agree_found_inf(const Tensor& found_inf) {
  // An inf or NaN lands in the shard of whichever rank owns that element: every rank must skip.
  autograd::NoGradGuard no_grad;
  Tensor any = found_inf.to(DType::F32).reshape({1}).clone();
  comm_->all_reduce(any, ReduceOp::Sum);
  Tensor shared = found_inf;  // the scaler's tensor: written in place
  shared.fill_(any.data<float>()[0] > 0 ? 1 : 0);
}

void ZeroSharding::scatter_to_params(Group& g, int64_t begin, const Tensor& values) {
  // values = elements [begin, begin + numel) of the group's flattened (padded) parameters.
  const int64_t end = begin + values.numel();
  for (size_t i = 0; i < g.params.size(); ++i) {
    const int64_t lo = std::max(begin, g.offsets[i]), hi = std::min(end, g.offsets[i] + g.params[i].numel());
    if (lo >= hi) continue;
    Tensor p = g.params[i].detach();
    Tensor part = values.narrow(0, lo - begin, hi - lo);
    if (p.is_contiguous()) {
      p.reshape({-1}).narrow(0, lo - g.offsets[i], hi - lo).copy_(part);
    } else {  // e.g. channels-last: through a contiguous copy (rare: such layers are small)
      Tensor flat = p.contiguous().reshape({-1});
      flat.narrow(0, lo - g.offsets[i], hi - lo).copy_(part);
      p.copy_(flat.view(p.shape()));
    }
    g.params[i].bump_version();
  }
}

void ZeroSharding::after_step() {
  // Every rank's updated shard into every rank's full parameters (the forward needs them whole),
  // in chunks of at most gather_chunk_ elements per rank so the gathered copy never holds more
  // than N x chunk values (not Ψ); the next chunk's all-gather runs while this one is copied out.
  autograd::NoGradGuard no_grad;
  const int64_t n = comm_->world_size();
  struct Chunk {
    size_t group;
    int64_t start, len;
    Tensor send, out;
    WorkPtr work;
  };
  std::vector<Chunk> chunks;
  for (size_t gi = 0; gi < groups_.size(); ++gi)
    for (int64_t start = 0; start < groups_[gi].shard; start += gather_chunk_)
      chunks.push_back({gi, start, std::min(gather_chunk_, groups_[gi].shard - start), Tensor(), Tensor(), nullptr});
  auto launch = [&](Chunk& c) {
    const Group& g = groups_[c.group];
    const DType dtype = g.params.front().dtype();  // a group's parameters share a dtype (checked)
    c.send = empty({c.len}, dtype);
    gather_from_params(g, comm_->rank() * g.shard + c.start, c.send);
    c.out = empty({n * c.len}, dtype);
    c.work = comm_->all_gather_async(c.send, c.out);
  };
  if (!chunks.empty()) launch(chunks[0]);
  for (size_t k = 0; k < chunks.size(); ++k) {
    if (k + 1 < chunks.size()) launch(chunks[k + 1]);
    Chunk& c = chunks[k];
    c.work->wait();
    Group& g = groups_[c.group];
    // Rank q's part holds elements [q s_g + start, q s_g + start + len) of the group.
    for (int64_t q = 0; q < n; ++q) {
      const int64_t begin = q * g.shard + c.start;
      const int64_t len = std::min(c.len, g.total - begin);  // the padding is nobody's
      if (len > 0) scatter_to_params(g, begin, c.out.narrow(0, q * c.len, len));
    }
    c.out = c.send = Tensor();
  }
  load_weights_from_model();  // pieces with buffers of their own (channels-last parameters)
  for (Group& g : groups_)
    for (Piece& p : g.pieces) p.view.set_grad(Tensor());
}

int64_t ZeroSharding::parameter_count() const {
  int64_t n = 0;
  for (const Group& g : groups_) n += g.total;
  return n;
}

int64_t ZeroSharding::padded_count() const {
  int64_t n = 0;
  for (const Group& g : groups_) n += g.shard * comm_->world_size();
  return n;
}

int64_t ZeroSharding::shard_count() const {
  int64_t n = 0;
  for (const Group& g : groups_) n += g.shard;
  return n;
}

int64_t ZeroSharding::used_flag_count() const {
  int64_t n = 0;
  for (const Group& g : groups_) n += static_cast<int64_t>(g.params.size());
  return n;
}

int64_t ZeroSharding::gradient_bytes(const nn::Module& model) const {
  int64_t bytes = 0;
  for (const Group& g : groups_) bytes += g.shard * static_cast<int64_t>(sizeof(float));
  if (ddp_) bytes += ddp_->bytes_per_step();  // stage 1 keeps DDP's buckets: the full gradient
  for (const Tensor& p : model.parameters())
    if (p.grad().defined()) bytes += static_cast<int64_t>(p.grad().nbytes());
  return bytes;
}

std::map<std::string, std::string> ZeroSharding::shard_metadata() const {
  // "zero.<group>.<piece>" = "<param> <offset> <numel>": where each piece of the shard
  // optimizer's state lies in the unsharded parameter.
  std::map<std::string, std::string> m{{"zero.rank", std::to_string(comm_->rank())},
                                       {"zero.world_size", std::to_string(comm_->world_size())}};
  for (size_t gi = 0; gi < groups_.size(); ++gi)
    for (size_t k = 0; k < groups_[gi].pieces.size(); ++k) {
      const Piece& p = groups_[gi].pieces[k];
      m["zero." + std::to_string(gi) + "." + std::to_string(k)] =
          std::to_string(p.param) + " " + std::to_string(p.offset) + " " + std::to_string(p.numel);
    }
  return m;
}

TensorMap ZeroSharding::shard_state_from_full(const TensorMap& full) const {
  TensorMap out;
  for (const auto& [name, t] : full) {
    int64_t gi = 0, i = 0;
    std::string state;
    FT_CHECK(split_state_name(name, &gi, &i, &state) && gi >= 0 && gi < static_cast<int64_t>(groups_.size()),
             "ZeRO resume: expected optimizer state named <group>.<parameter>.<state> of ", groups_.size(),
             " groups, found '", name, "'");
    const Group& g = groups_[static_cast<size_t>(gi)];
    FT_CHECK(i < static_cast<int64_t>(g.params.size()), "ZeRO resume: state '", name, "' names parameter ", i,
             " of group ", gi, ", which has ", g.params.size());
    for (size_t k = 0; k < g.pieces.size(); ++k) {
      const Piece& p = g.pieces[k];
      if (p.param != i) continue;
      const std::string piece_name = state_name(gi, static_cast<int64_t>(k), state);
      if (t.dim() == 0) {  // "step": the parameter's count is every piece's
        out.emplace_back(piece_name, t.clone());
        continue;
      }
      FT_CHECK(t.numel() == g.params[i].numel(), "ZeRO resume: state '", name, "' has ", t.numel(),
               " elements, its parameter ", g.params[i].numel());
      out.emplace_back(piece_name, t.contiguous().reshape({-1}).narrow(0, p.offset, p.numel).clone());
    }
  }
  return out;
}

TensorMap consolidate_zero_state(const std::vector<SafetensorsFile>& shards,
                                 const std::vector<optim::ParamGroup>& groups) {
  FT_CHECK(!shards.empty(), "ZeRO checkpoint: expected the optimizer state of at least one rank, found none");
  // (group, param, state) -> the unsharded tensor, filled piece by piece.
  std::map<std::string, Tensor> full;
  std::map<std::string, int64_t> filled;
  for (const SafetensorsFile& f : shards) {
    for (const auto& [name, t] : f.tensors) {
      int64_t gi = 0, k = 0;
      std::string state;
      FT_CHECK(split_state_name(name, &gi, &k, &state), "ZeRO checkpoint: unexpected state name '", name, "'");
      const auto where = f.metadata.find("zero." + std::to_string(gi) + "." + std::to_string(k));
      FT_CHECK(where != f.metadata.end(), "ZeRO checkpoint: state '", name, "' has no piece in the metadata");
      int64_t param = -1, offset = 0, numel = 0;
      FT_CHECK(std::sscanf(where->second.c_str(), "%ld %ld %ld", &param, &offset, &numel) == 3,
               "ZeRO checkpoint: malformed piece '", where->second, "'");
      FT_CHECK(gi < static_cast<int64_t>(groups.size()) && param >= 0 &&
                   param < static_cast<int64_t>(groups[gi].params.size()),
               "ZeRO checkpoint: state '", name, "' names parameter ", param, " of group ", gi,
               ", which this model does not have");
      const Tensor& p = groups[gi].params[param];
      const std::string key = state_name(gi, param, state);
      if (t.dim() == 0) {
        full.emplace(key, t.clone());
        continue;
      }
      FT_CHECK(t.numel() == numel && offset + numel <= p.numel(), "ZeRO checkpoint: state '", name, "' holds ",
               t.numel(), " elements at ", offset, ", expected ", numel, " of a parameter of ", p.numel());
      auto [it, fresh] = full.try_emplace(key, Tensor());
      if (fresh) it->second = zeros(p.shape(), t.dtype());
      it->second.reshape({-1}).narrow(0, offset, numel).copy_(t);
      filled[key] += numel;
    }
  }
  TensorMap out;
  for (auto& [key, t] : full) {
    if (t.dim() > 0)
      FT_CHECK(filled[key] == t.numel(), "ZeRO checkpoint: state '", key, "' has ", filled[key], " of its ", t.numel(),
               " elements (a rank's file is missing)");
    out.emplace_back(key, t);
  }
  return out;
}

}  // namespace ft::dist
