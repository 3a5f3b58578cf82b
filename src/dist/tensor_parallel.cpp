// Tensor parallelism (tensor_parallel.h): the f and g autograd functions, the parallel layers,
// the vocabulary-parallel cross-entropy, cutting and joining split tensors, and the gradient
// synchronisation of a split model.
//
// Cost per GPT block and micro-batch of B x T tokens, width C, t ranks: two all-reduces of
// B T C elements in forward (attention's and the MLP's g) and two in backward (their f), each
// moving 2 (t-1)/t B T C elements per rank in a ring; the embedding's g and the head's f add
// one more each way, and the cross-entropy three all-reduces of B T values (max, sum of exps,
// target logit).
#include "fasttrain/tensor_parallel.h"

#include <cmath>
#include <unordered_map>
#include <unordered_set>

#include "fasttrain/autograd.h"
#include "fasttrain/error.h"
#include "fasttrain/ops.h"
#include "fasttrain/optim.h"
#include "fasttrain/pipeline.h"
#include "ops/mask_parts.h"

namespace ft::dist {

namespace {

// `t` summed over the group, as a new tensor of t's dtype and shape. MPI reduces f32 and f64;
// other floating types (bf16 under autocast) travel as f32.
Tensor all_reduce_sum(const Tensor& t, Communicator& group) {
  autograd::NoGradGuard no_grad;
  const bool native = t.dtype() == DType::F32 || t.dtype() == DType::F64;
  Tensor buffer = native ? t.detach().contiguous().clone() : t.detach().to(DType::F32).contiguous();
  group.all_reduce(buffer, ReduceOp::Sum);
  return native ? buffer : buffer.to(t.dtype());
}

std::string join(const std::string& prefix, const char* name) { return prefix.empty() ? name : prefix + "." + name; }

void check_group(const std::shared_ptr<Communicator>& group, const char* who) {
  FT_CHECK(group != nullptr, who, ": expected a tensor-parallel group, found none");
}

// out / t, refusing a size that does not divide.
int64_t part_of(int64_t n, int64_t blocks, int t, const char* who, const char* what) {
  FT_CHECK(n % (blocks * t) == 0, who, ": ", what, " ", n, (blocks > 1 ? detail::concat(" (", blocks, " blocks)") : ""),
           " is not divisible by the tensor-parallel size ", t);
  return n / t;
}

}  // namespace

// ---------------------------------------------------------------- cutting and joining

Tensor shard_tensor(const Tensor& full, TensorShard s, int rank, int size) {
  if (!s.sharded() || size == 1) return full;
  FT_CHECK(s.dim < full.dim(), "shard_tensor: split dimension ", s.dim, " of a ", full.dim(), "-d tensor");
  const int64_t n = full.size(s.dim);
  FT_CHECK(s.blocks >= 1 && n % (s.blocks * size) == 0, "shard_tensor: dimension ", s.dim, " of shape ",
           full.shape().str(), " does not split into ", s.blocks, " block(s) of ", size, " parts");
  const int64_t block = n / s.blocks, part = block / size;
  std::vector<Tensor> pieces;
  for (int64_t b = 0; b < s.blocks; ++b) pieces.push_back(full.narrow(s.dim, b * block + rank * part, part));
  autograd::NoGradGuard no_grad;
  return (pieces.size() == 1 ? pieces[0] : cat(pieces, s.dim)).contiguous().clone();
}

Tensor unshard_tensor(const Tensor& part, TensorShard s, Communicator& group) {
  const int t = group.world_size();
  if (!s.sharded() || t == 1) return part;
  autograd::NoGradGuard no_grad;
  const Tensor local = part.detach().contiguous();
  Tensor all = empty({t * local.numel()}, TensorOptions(local.dtype()));
  group.all_gather(local.reshape({-1}), all);
  // Rank r's part is [r n, (r+1) n) of `all`; block b of the whole is block b of every part in
  // rank order.
  const int64_t n = local.numel(), per_block = local.size(s.dim) / s.blocks;
  std::vector<Tensor> pieces;
  for (int64_t b = 0; b < s.blocks; ++b)
    for (int r = 0; r < t; ++r)
      pieces.push_back(all.narrow(0, r * n, n).view(local.shape()).narrow(s.dim, b * per_block, per_block));
  return cat(pieces, s.dim).contiguous();
}

// ---------------------------------------------------------------- f and g

Tensor copy_to_tensor_group(const Tensor& x, const std::shared_ptr<Communicator>& group) {
  check_group(group, "copy_to_tensor_group");
  if (group->world_size() == 1 || !autograd::any_requires_grad({&x})) return x;
  Tensor y = x.detach();
  autograd::record_function("CopyToTensorGroup", {&x}, {&y}, [group](std::vector<Tensor>& grads) {
    return std::vector<Tensor>{all_reduce_sum(grads[0], *group)};
  });
  return y;
}

Tensor reduce_from_tensor_group(const Tensor& x, const std::shared_ptr<Communicator>& group) {
  check_group(group, "reduce_from_tensor_group");
  if (group->world_size() == 1) return x;
  Tensor y = all_reduce_sum(x, *group);
  if (autograd::any_requires_grad({&x}))
    autograd::record_function("ReduceFromTensorGroup", {&x}, {&y},
                              [](std::vector<Tensor>& grads) { return std::vector<Tensor>{grads[0]}; });
  return y;
}

// ---------------------------------------------------------------- sequence parallelism

namespace {

// [B, T, ...] -> [T, B, ...] contiguous: rank r's positions are then the r-th of t equal
// contiguous chunks, which is what all-gather and reduce-scatter exchange.
Tensor sequence_major(const Tensor& x) {
  autograd::NoGradGuard no_grad;
  const bool native = x.dtype() == DType::F32 || x.dtype() == DType::F64;  // MPI reduces these
  const Tensor y = x.detach().transpose(0, 1).contiguous();
  return native ? y : y.to(DType::F32);
}

Tensor batch_major(const Tensor& y, DType dtype) {
  autograd::NoGradGuard no_grad;
  const Tensor x = y.transpose(0, 1).contiguous();
  return x.dtype() == dtype ? x : x.to(dtype);
}

void check_sequence(const Tensor& x, int t, const char* who) {
  FT_CHECK(x.dim() >= 2 && x.size(1) % t == 0, who, ": sequence parallelism needs the sequence length (dimension 1 of ",
           x.shape().str(), ") to be a multiple of tp = ", t);
}

Tensor all_gather_sequence(const Tensor& x, Communicator& group) {
  const int t = group.world_size();
  const Tensor part = sequence_major(x);
  Shape whole = part.shape();
  whole[0] *= t;
  Tensor out = empty(whole, TensorOptions(part.dtype()));
  group.all_gather(part.reshape({-1}), out.reshape({-1}));
  return batch_major(out, x.dtype());
}

Tensor reduce_scatter_sequence_sum(const Tensor& x, Communicator& group) {
  const int t = group.world_size();
  check_sequence(x, t, "reduce_scatter_sequence");
  const Tensor whole = sequence_major(x);
  Shape part = whole.shape();
  part[0] /= t;
  Tensor out = empty(part, TensorOptions(whole.dtype()));
  group.reduce_scatter(whole.reshape({-1}), out.reshape({-1}), ReduceOp::Sum);
  return batch_major(out, x.dtype());
}

}  // namespace

Tensor gather_sequence(const Tensor& x, const std::shared_ptr<Communicator>& group) {
  check_group(group, "gather_sequence");
  if (group->world_size() == 1) return x;
  Tensor y = all_gather_sequence(x, *group);
  if (autograd::any_requires_grad({&x}))
    autograd::record_function("GatherSequence", {&x}, {&y}, [group](std::vector<Tensor>& grads) {
      return std::vector<Tensor>{reduce_scatter_sequence_sum(grads[0], *group)};
    });
  return y;
}

Tensor reduce_scatter_sequence(const Tensor& x, const std::shared_ptr<Communicator>& group) {
  check_group(group, "reduce_scatter_sequence");
  if (group->world_size() == 1) return x;
  Tensor y = reduce_scatter_sequence_sum(x, *group);
  if (autograd::any_requires_grad({&x}))
    autograd::record_function("ReduceScatterSequence", {&x}, {&y}, [group](std::vector<Tensor>& grads) {
      return std::vector<Tensor>{all_gather_sequence(grads[0], *group)};
    });
  return y;
}

// ---------------------------------------------------------------- cross-entropy

Tensor vocab_parallel_cross_entropy(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                                    const std::shared_ptr<Communicator>& group) {
  check_group(group, "vocab_parallel_cross_entropy");
  FT_CHECK(logits.defined() && logits.dim() == 2 && logits.size(1) >= 1,
           "vocab_parallel_cross_entropy: expected logits [N, V_r] with V_r >= 1, found ",
           logits.defined() ? logits.shape().str() : "undefined");
  FT_CHECK(targets.defined() && targets.dim() == 1 && targets.size(0) == logits.size(0) &&
               is_integral(targets.dtype()) && targets.dtype() != DType::Bool,
           "vocab_parallel_cross_entropy: expected integer targets [", logits.size(0), "], found ",
           targets.defined() ? dtype_name(targets.dtype()) + std::string(" ") + targets.shape().str() : "undefined");
  const int64_t N = logits.size(0), V = logits.size(1);
  const Tensor z = logits.dtype() == DType::F64 || logits.dtype() == DType::F32 ? logits : logits.to(DType::F32);
  // m: the largest logit of each row over the whole vocabulary. A constant of the loss (which
  // does not depend on it), so no gradient flows through it.
  Tensor m;
  {
    autograd::NoGradGuard no_grad;
    m = max(z.detach(), 1).values.contiguous().clone();
    group->all_reduce(m, ReduceOp::Max);
  }
  const Tensor shifted = sub(z, m.unsqueeze(1));
  const Tensor sum_exp = reduce_from_tensor_group(sum(exp(shifted), {1}), group);
  // The target's shifted logit from the rank whose columns hold it (0 on the others).
  Tensor index = empty({N, 1}, TensorOptions(DType::I64)), owned = empty({N}, TensorOptions(z.dtype()));
  {
    const Tensor t = targets.to(DType::I64).contiguous();
    const int64_t* ids = t.data<int64_t>();
    int64_t* at = index.data<int64_t>();
    for (int64_t i = 0; i < N; ++i) {
      FT_CHECK(ids[i] >= 0, "vocab_parallel_cross_entropy: target ", ids[i], " at row ", i, " is negative");
      const int64_t local = ids[i] - vocab_start;
      const bool mine = local >= 0 && local < V;
      at[i] = mine ? local : 0;
      if (z.dtype() == DType::F64) {
        owned.data<double>()[i] = mine ? 1.0 : 0.0;
      } else {
        owned.data<float>()[i] = mine ? 1.0f : 0.0f;
      }
    }
  }
  const Tensor target_logit = reduce_from_tensor_group(mul(gather(shifted, 1, index).squeeze(1), owned), group);
  return mean(sub(log(sum_exp), target_logit));
}

// ---------------------------------------------------------------- layers

ColumnParallelLinear::ColumnParallelLinear(int64_t in, int64_t out, bool with_bias, std::shared_ptr<Communicator> g,
                                           int64_t blocks_)
    : group(std::move(g)), blocks(blocks_) {
  check_group(group, "ColumnParallelLinear");
  FT_CHECK(in > 0 && out > 0 && blocks >= 1, "ColumnParallelLinear: expected positive sizes, found in ", in, ", out ",
           out, ", blocks ", blocks);
  const int64_t local = part_of(out, blocks, group->world_size(), "ColumnParallelLinear", "out_features");
  weight = register_parameter("weight", zeros({local, in}));
  if (with_bias) bias = register_parameter("bias", zeros({local}));
}

ColumnParallelLinear::ColumnParallelLinear(Tensor w, std::shared_ptr<Communicator> g) : group(std::move(g)), blocks(1) {
  check_group(group, "ColumnParallelLinear");
  FT_CHECK(w.defined() && w.dim() == 2, "ColumnParallelLinear: weight must be a 2-d [out / t, in] tensor");
  weight = register_parameter("weight", w);
}

Tensor ColumnParallelLinear::forward(const Tensor& x) { return linear(enter(x), weight, bias); }

Tensor ColumnParallelLinear::enter(const Tensor& x) const {
  return sequence_parallel ? gather_sequence(x, group) : copy_to_tensor_group(x, group);
}

Tensor RowParallelLinear::leave(const Tensor& partial) const {
  return sequence_parallel ? reduce_scatter_sequence(partial, group) : reduce_from_tensor_group(partial, group);
}

namespace {

// y: this rank's positions of a sequence split over `group` when `split`.
Tensor dropout_in_sequence(const Tensor& y, double p, bool training, bool split, const Communicator& group) {
  if (!split) return ft::dropout(y, p, training);
  const int64_t n = y.size(1);
  return ops::dropout_of_part(y, p, training, group.rank() * n, group.world_size() * n);
}

}  // namespace

Tensor RowParallelLinear::dropout(const Tensor& y, double p, bool training) const {
  return dropout_in_sequence(y, p, training, sequence_parallel, *group);
}

Tensor VocabParallelEmbedding::dropout(const Tensor& y, double p, bool training) const {
  return dropout_in_sequence(y, p, training, sequence_parallel, *group);
}

RowParallelLinear::RowParallelLinear(int64_t in, int64_t out, bool with_bias, std::shared_ptr<Communicator> g)
    : group(std::move(g)) {
  check_group(group, "RowParallelLinear");
  FT_CHECK(in > 0 && out > 0, "RowParallelLinear: expected positive sizes, found in ", in, ", out ", out);
  const int64_t local = part_of(in, 1, group->world_size(), "RowParallelLinear", "in_features");
  weight = register_parameter("weight", zeros({out, local}));
  if (with_bias) bias = register_parameter("bias", zeros({out}));
}

Tensor RowParallelLinear::forward(const Tensor& x) {
  // The bias once, after the sum: added on every rank before it, it would count t times.
  const Tensor y = leave(linear(x, weight));
  return bias.defined() ? add(y, bias) : y;
}

VocabParallelEmbedding::VocabParallelEmbedding(int64_t num, int64_t dim, std::shared_ptr<Communicator> g)
    : group(std::move(g)) {
  check_group(group, "VocabParallelEmbedding");
  FT_CHECK(num > 0 && dim > 0, "VocabParallelEmbedding: expected positive sizes, found ", num, " rows of ", dim);
  const int64_t local = part_of(num, 1, group->world_size(), "VocabParallelEmbedding", "rows");
  start_ = group->rank() * local;
  weight = register_parameter("weight", zeros({local, dim}));
}

Tensor VocabParallelEmbedding::forward(const Tensor& ids) {
  FT_CHECK(ids.defined() && is_integral(ids.dtype()) && ids.dtype() != DType::Bool,
           "VocabParallelEmbedding: expected integer ids, found ",
           ids.defined() ? dtype_name(ids.dtype()) : "undefined");
  FT_CHECK(weight.dtype() == DType::F32 || weight.dtype() == DType::F64,
           "VocabParallelEmbedding: expected f32 or f64 weights, found ", dtype_name(weight.dtype()));
  const int64_t rows = weight.size(0);
  // Ids outside this rank's rows look up row 0 and are zeroed: their rows live on another rank,
  // whose part g adds. Row 0's gradient gets those positions' gradient times 0.
  const Tensor all = ids.to(DType::I64).contiguous();
  Tensor local = empty(all.shape(), TensorOptions(DType::I64));
  Shape mask_shape = all.shape();
  mask_shape.push_back(1);
  Tensor keep = empty(mask_shape, TensorOptions(weight.dtype()));
  const int64_t* in = all.data<int64_t>();
  int64_t* out = local.data<int64_t>();
  for (int64_t i = 0, n = all.numel(); i < n; ++i) {
    const int64_t j = in[i] - start_;
    const bool mine = j >= 0 && j < rows;
    out[i] = mine ? j : 0;
    if (weight.dtype() == DType::F64) {
      keep.data<double>()[i] = mine ? 1.0 : 0.0;
    } else {
      keep.data<float>()[i] = mine ? 1.0f : 0.0f;
    }
  }
  // Under sequence parallelism each rank keeps the sum at its positions only (what follows, up
  // to the next column-parallel layer, runs on them).
  const Tensor part = mul(embedding(local, weight), keep);
  return sequence_parallel ? reduce_scatter_sequence(part, group) : reduce_from_tensor_group(part, group);
}

ParallelCausalSelfAttention::ParallelCausalSelfAttention(int64_t dim, int64_t heads, double dropout_,
                                                         std::shared_ptr<Communicator> group)
    : dropout(dropout_) {
  check_group(group, "ParallelCausalSelfAttention");
  const int t = group->world_size();
  FT_CHECK(dim > 0 && heads > 0 && dim % heads == 0, "ParallelCausalSelfAttention: width ", dim,
           " must be a positive multiple of the number of heads ", heads);
  FT_CHECK(heads % t == 0, "tensor parallelism: the ", heads, " attention heads are not divisible by tp = ", t);
  local_heads = heads / t;
  c_attn = register_module("c_attn", std::make_shared<ColumnParallelLinear>(dim, 3 * dim, true, group, 3));
  c_proj = register_module("c_proj", std::make_shared<RowParallelLinear>(dim, dim, true, group));
}

Tensor ParallelCausalSelfAttention::forward(const Tensor& x) { return attend(x, Tensor()); }

// Called as this module here (operator() does that for forward(x)).
Tensor ParallelCausalSelfAttention::forward(const Tensor& x, const Tensor& doc_ids) {
  return call_as_this([&] { return attend(x, doc_ids); });
}

Tensor ParallelCausalSelfAttention::attend(const Tensor& x, const Tensor& doc_ids) {
  const int64_t C = c_proj->weight.size(0), local = c_proj->weight.size(1);
  FT_CHECK(x.dim() == 3 && x.size(2) == C, "ParallelCausalSelfAttention: expected input [B, T, ", C, "], found shape ",
           x.shape().str());
  // As CausalSelfAttention, over this rank's heads: [B, T, 3 C / t] = its q, k and v heads (all
  // T positions: under sequence parallelism c_attn gathers them).
  const Tensor projected = (*c_attn)(x);
  const int64_t B = x.size(0), T = projected.size(1), D = local / local_heads;
  std::vector<Tensor> qkv = split(projected.view({B, T, 3, local_heads, D}), 1, 2);
  auto head_view = [&](int64_t i) { return qkv[i].squeeze(2).transpose(1, 2); };
  const double p = training_ ? dropout : 0.0;
  // The probabilities' dropout mask of this rank's heads is their part of the whole layer's (the
  // tensor group draws from one generator stream): the numbers one process drops.
  const ops::AttentionHeads heads{c_proj->group->rank() * local_heads, c_proj->group->world_size() * local_heads};
  const DocumentMask mask{doc_ids};
  Tensor y = ops::attention_of_heads(head_view(0), head_view(1), head_view(2), /*causal=*/true,
                                     doc_ids.defined() ? &mask : nullptr, p, heads);
  y = y.transpose(1, 2).reshape({B, T, local});
  return c_proj->dropout((*c_proj)(y), dropout, training_);
}

// ---------------------------------------------------------------- models

std::map<std::string, TensorShard> tensor_shards(const nn::Module& model) {
  std::map<std::string, TensorShard> out;
  for (const auto& [prefix, m] : const_cast<nn::Module&>(model).named_modules()) {
    if (const auto* c = dynamic_cast<const ColumnParallelLinear*>(m.get())) {
      out[join(prefix, "weight")] = c->shard();
      if (c->bias.defined()) out[join(prefix, "bias")] = c->shard();
    } else if (dynamic_cast<const RowParallelLinear*>(m.get()) != nullptr) {
      out[join(prefix, "weight")] = {1, 1};
    } else if (dynamic_cast<const VocabParallelEmbedding*>(m.get()) != nullptr) {
      out[join(prefix, "weight")] = {0, 1};
    }
  }
  return out;
}

std::shared_ptr<Communicator> tensor_group_of(const nn::Module& model) {
  for (const auto& [prefix, m] : const_cast<nn::Module&>(model).named_modules()) {
    std::shared_ptr<Communicator> g;
    if (const auto* c = dynamic_cast<const ColumnParallelLinear*>(m.get())) g = c->group;
    if (const auto* r = dynamic_cast<const RowParallelLinear*>(m.get())) g = r->group;
    if (const auto* e = dynamic_cast<const VocabParallelEmbedding*>(m.get())) g = e->group;
    if (g && g->world_size() > 1) return g;
  }
  return nullptr;
}

void set_sequence_parallel(nn::Module& model, bool on) {
  FT_CHECK(!on || tensor_group_of(model) != nullptr, "sequence parallelism: the model (", model.type_name(),
           ") is not split over a tensor group (it needs --tp of 2 or more)");
  for (const auto& [prefix, m] : model.named_modules()) {
    if (auto* c = dynamic_cast<ColumnParallelLinear*>(m.get())) c->sequence_parallel = on;
    if (auto* r = dynamic_cast<RowParallelLinear*>(m.get())) r->sequence_parallel = on;
    if (auto* e = dynamic_cast<VocabParallelEmbedding*>(m.get())) e->sequence_parallel = on;
  }
}

bool sequence_parallel(const nn::Module& model) {
  for (const auto& [prefix, m] : const_cast<nn::Module&>(model).named_modules())
    if (const auto* r = dynamic_cast<const RowParallelLinear*>(m.get()); r && r->sequence_parallel) return true;
  return false;
}

TensorMap gather_tensor_parallel_state(const nn::Module& model) {
  const std::shared_ptr<Communicator> group = tensor_group_of(model);
  TensorMap state = model.state_dict();
  if (!group) return state;
  const std::map<std::string, TensorShard> shards = tensor_shards(model);
  std::unordered_map<const TensorImpl*, Tensor> gathered;  // tied tensors: one all-gather
  for (auto& [name, t] : state) {
    const auto it = shards.find(name);
    if (it == shards.end()) continue;
    auto [at, fresh] = gathered.try_emplace(t.impl());
    if (fresh) at->second = unshard_tensor(t, it->second, *group);
    t = at->second;
  }
  return state;
}

TensorMap shard_tensor_parallel_state(const TensorMap& whole, const nn::Module& model) {
  // A pipeline stage takes its entries of the whole model's first (every loader of whole files,
  // --init-from's included, goes through here).
  const auto* stage = dynamic_cast<const PipelineStageModel*>(&model);
  const TensorMap full =
      stage != nullptr && stage->pipeline_stage().split() ? stage_part_of_state(whole, model) : whole;
  const std::shared_ptr<Communicator> group = tensor_group_of(model);
  if (!group) return full;
  const std::map<std::string, TensorShard> shards = tensor_shards(model);
  TensorMap out;
  for (const auto& [name, t] : full) {
    const auto it = shards.find(name);
    out.emplace_back(name, it == shards.end() ? t : shard_tensor(t, it->second, group->rank(), group->world_size()));
  }
  return out;
}

// ---------------------------------------------------------------- gradient synchronisation

TensorParallelSync::TensorParallelSync(nn::Module& model, std::shared_ptr<Communicator> tensor_group,
                                       std::unique_ptr<train::GradSync> data_parallel)
    : group_(std::move(tensor_group)), inner_(std::move(data_parallel)) {
  check_group(group_, "TensorParallelSync");
  const std::map<std::string, TensorShard> shards = tensor_shards(model);
  std::unordered_set<const TensorImpl*> seen;
  for (const auto& [name, p] : model.named_parameters()) {
    if (!p.requires_grad() || !seen.insert(p.impl()).second) continue;
    (shards.count(name) != 0 ? sharded_ : replicated_).push_back(p);
  }
  if (sequence_parallel(model)) replicated_op_ = ReduceOp::Sum;
}

void TensorParallelSync::before_forward() {
  if (inner_) inner_->before_forward();
}

void TensorParallelSync::before_backward(bool last) {
  last_ = last;
  if (inner_) inner_->before_backward(last);
}

void TensorParallelSync::after_backward(bool last) {
  if (inner_) inner_->after_backward(last);
}

void TensorParallelSync::finish() {
  if (inner_) inner_->finish();
  if (group_->world_size() == 1) return;
  // The replicated parameters' gradients, equal on every rank of the group in exact arithmetic,
  // averaged in one f32 buffer so that they are equal in every bit too (and the replicas of a
  // layer norm never drift apart). Every rank has gradients for the same replicated parameters
  // (the same code ran on each).
  autograd::NoGradGuard no_grad;
  std::vector<Tensor> grads;
  int64_t total = 0;
  for (const Tensor& p : replicated_) {
    const Tensor g = p.grad();
    if (!g.defined()) continue;
    grads.push_back(g);
    total += g.numel();
  }
  if (grads.empty()) return;
  Tensor flat = empty({total}, TensorOptions(DType::F32));
  int64_t at = 0;
  for (const Tensor& g : grads) {
    flat.narrow(0, at, g.numel()).view(g.shape()).copy_(g);
    at += g.numel();
  }
  group_->all_reduce(flat, replicated_op_);
  at = 0;
  for (Tensor g : grads) {
    g.copy_(flat.narrow(0, at, g.numel()).view(g.shape()));
    g.bump_version();
    at += g.numel();
  }
}

Tensor TensorParallelSync::clip_grad_norm(const std::vector<Tensor>& params, double max_norm) {
  FT_CHECK(max_norm > 0, "clip_grad_norm_: expected a positive max_norm, found ", max_norm);
  if (group_->world_size() == 1) return optim::clip_grad_norm_(params, max_norm);
  autograd::NoGradGuard no_grad;
  std::unordered_set<const TensorImpl*> is_split;
  for (const Tensor& p : sharded_) is_split.insert(p.impl());
  // ||g||^2 = sum over the group of the split parameters' parts + the replicated ones once; in
  // f64 on the host (MPI's tensors are host tensors), so every rank gets the same bits.
  double parts = 0, replicated = 0;
  for (const Tensor& p : params) {
    const Tensor g = p.grad();
    if (!g.defined()) continue;
    (is_split.count(p.impl()) != 0 ? parts : replicated) += optim::grad_squares(g);
  }
  Tensor total = scalar_tensor(parts, DType::F64).reshape({1});
  group_->all_reduce(total, ReduceOp::Sum);
  const optim::NormClip c = optim::norm_clip(total.data<double>()[0] + replicated, max_norm);
  if (c.clips()) optim::scale_grads_(params, static_cast<float>(c.factor));
  return scalar_tensor(c.norm, DType::F32);
}

void TensorParallelSync::clip_grad_value(const std::vector<Tensor>& params, double clip_value) {
  optim::clip_grad_value_(params, clip_value);  // element-wise: each rank clips its own elements
}

void TensorParallelSync::agree_found_inf(const Tensor& found_inf) {
  if (inner_) inner_->agree_found_inf(found_inf);
  if (group_->world_size() == 1) return;
  // An inf in a split parameter is seen by its owner only: every rank of the group must skip.
  autograd::NoGradGuard no_grad;
  Tensor flag = found_inf.detach().to(DType::F32).contiguous().reshape({1}).clone();
  group_->all_reduce(flag, ReduceOp::Max);
  found_inf.detach().copy_(flag.reshape(found_inf.shape()).to(found_inf.dtype()));
}

void TensorParallelSync::after_step() {
  if (inner_) inner_->after_step();
}

int64_t TensorParallelSync::sharded_elements() const {
  int64_t n = 0;
  for (const Tensor& p : sharded_) n += p.numel();
  return n;
}

int64_t TensorParallelSync::replicated_elements() const {
  int64_t n = 0;
  for (const Tensor& p : replicated_) n += p.numel();
  return n;
}

}  // namespace ft::dist
