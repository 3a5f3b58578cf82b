// Pipeline parallelism's pure parts and its gradient synchronisation (pipeline.h): the GPipe and
// 1F1B schedules, a stage's program of computation and point-to-point messages, the split of the
// blocks into stages balanced by parameters, the whole model's state and optimizer numbering
// across stages, and PipelineSync (tied embedding, global-norm clipping, found-inf).
#include "fasttrain/pipeline.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <unordered_set>

#include "core/name_table.h"
#include "fasttrain/autograd.h"
#include "fasttrain/ops.h"
#include "fasttrain/optim.h"
#include "fasttrain/tensor_parallel.h"
#include "fasttrain/zero.h"

namespace ft::dist {

namespace {

constexpr NamedValue<PipelineSchedule> kScheduleNames[] = {{PipelineSchedule::GPipe, "gpipe"},
                                                           {PipelineSchedule::OneFOneB, "1f1b"}};
static_assert(std::size(kScheduleNames) == kPipelineScheduleCount &&
                  ft::detail::rows_start_in_enum_order(kScheduleNames, kPipelineScheduleCount),
              "one row per PipelineSchedule, in enum order");

}  // namespace

std::span<const NamedValue<PipelineSchedule>> option_names(PipelineSchedule) { return kScheduleNames; }

std::vector<PipelineAction> pipeline_schedule(PipelineSchedule schedule, int stage, int stages, int64_t m) {
  FT_CHECK(stages >= 1 && stage >= 0 && stage < stages, "pipeline schedule: expected a stage in [0, ", stages,
           "), found ", stage);
  FT_CHECK(m >= 1, "pipeline schedule: expected at least 1 micro-batch, found ", m);
  std::vector<PipelineAction> out;
  out.reserve(static_cast<size_t>(2 * m));
  const auto F = [&](int64_t j) { out.push_back({PipelineAction::Forward, j}); };
  const auto B = [&](int64_t j) { out.push_back({PipelineAction::Backward, j}); };
  if (schedule == PipelineSchedule::GPipe) {
    for (int64_t j = 0; j < m; ++j) F(j);
    for (int64_t j = 0; j < m; ++j) B(j);
    return out;
  }
  // With m < p the last stage would wait for micro-batches the warm-up never sends: 1F1B's bound
  // on activations in flight (p - s) needs the pipeline full before the first backward.
  FT_CHECK(m >= stages, "pipeline schedule 1f1b: ", m, " micro-batches (accumulate) are fewer than the ", stages,
           " pipeline stages (pp); use accumulate >= ", stages, " or --pp-schedule gpipe");
  // Warm-up: enough forwards that the first backward's gradient arrives as this stage needs it.
  const int64_t warmup = std::min<int64_t>(stages - stage - 1, m);
  for (int64_t j = 0; j < warmup; ++j) F(j);
  for (int64_t j = 0; j < m - warmup; ++j) F(warmup + j), B(j);
  for (int64_t j = m - warmup; j < m; ++j) B(j);
  return out;
}

std::vector<PipelineOp> pipeline_program(const std::vector<PipelineAction>& actions, int stage, int stages) {
  std::vector<PipelineOp> out;
  const PipelineMessage none;
  PipelineMessage pending = none;  // the send held back until the next receive
  auto communicate = [&](const PipelineMessage& recv) {
    if (pending.peer >= 0 && recv.peer == pending.peer) {
      out.push_back({false, {}, pending, recv});  // the neighbour may be sending to us now: one send_recv
    } else {
      if (pending.peer >= 0) out.push_back({false, {}, pending, none});
      if (recv.peer >= 0) out.push_back({false, {}, none, recv});
    }
    pending = none;
  };
  for (const PipelineAction& a : actions) {
    PipelineMessage recv = none;
    if (a.kind == PipelineAction::Forward && stage > 0) recv = {PipelineMessage::Activation, a.micro, stage - 1};
    if (a.kind == PipelineAction::Backward && stage + 1 < stages)
      recv = {PipelineMessage::Gradient, a.micro, stage + 1};
    communicate(recv);
    out.push_back({true, a, none, none});
    if (a.kind == PipelineAction::Forward && stage + 1 < stages)
      pending = {PipelineMessage::Activation, a.micro, stage + 1};
    if (a.kind == PipelineAction::Backward && stage > 0) pending = {PipelineMessage::Gradient, a.micro, stage - 1};
  }
  communicate(none);
  return out;
}

std::vector<int64_t> stage_layers(const std::vector<int64_t>& block_params, int64_t first_extra, int64_t last_extra,
                                  int stages, const std::vector<int64_t>& given, const std::string& model) {
  const auto n = static_cast<int64_t>(block_params.size());
  FT_CHECK(stages >= 1, "pipeline parallelism: expected pp >= 1, found ", stages);
  FT_CHECK(stages <= n, "pipeline parallelism: pp = ", stages, " stages for ", model, "'s ", n,
           " blocks; every stage needs at least one block, so use pp <= ", n);
  if (!given.empty()) {
    int64_t sum = 0;
    bool positive = true;
    for (int64_t k : given) sum += k, positive = positive && k >= 1;
    FT_CHECK(static_cast<int64_t>(given.size()) == stages && positive && sum == n, "option pp_layers: expected ",
             stages, " positive block counts (one per stage, pp = ", stages, ") summing to ", model, "'s ", n,
             " blocks, found ", given.size(), " counts summing to ", sum);
    return given;
  }
  // The consecutive split minimising the largest stage (dynamic programming over (stages, blocks):
  // best[k][j] is the smallest largest-stage of blocks [0, j) over stages 0..k-1).
  std::vector<int64_t> prefix(static_cast<size_t>(n + 1), 0);
  for (int64_t i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + block_params[i];
  const auto cost = [&](int k, int64_t i, int64_t j) {
    return prefix[j] - prefix[i] + (k == 0 ? first_extra : 0) + (k == stages - 1 ? last_extra : 0);
  };
  constexpr int64_t kInf = std::numeric_limits<int64_t>::max();
  std::vector<std::vector<int64_t>> best(static_cast<size_t>(stages + 1), std::vector<int64_t>(n + 1, kInf));
  std::vector<std::vector<int64_t>> cut(static_cast<size_t>(stages + 1), std::vector<int64_t>(n + 1, -1));
  best[0][0] = 0;
  for (int k = 1; k <= stages; ++k)
    for (int64_t j = k; j <= n; ++j)
      for (int64_t i = k - 1; i < j; ++i) {
        if (best[k - 1][i] == kInf) continue;
        const int64_t v = std::max(best[k - 1][i], cost(k - 1, i, j));
        if (v < best[k][j]) best[k][j] = v, cut[k][j] = i;  // the first (earliest) cut on ties
      }
  std::vector<int64_t> layers(static_cast<size_t>(stages));
  for (int64_t k = stages, j = n; k >= 1; --k) {
    const int64_t i = cut[k][j];
    layers[k - 1] = j - i;
    j = i;
  }
  return layers;
}

std::string PipelineStage::describe() const {
  return detail::concat("stage ", index, " of ", count, ": blocks ", first_block, "-", end_block - 1);
}

PipelineStageModel* pipeline_stage_of(nn::Module& model) {
  auto* s = dynamic_cast<PipelineStageModel*>(&model);
  return s != nullptr && s->pipeline_stage().split() ? s : nullptr;
}

// ---------------------------------------------------------------- whole state across stages

TensorMap gather_pipeline_state(const TensorMap& stage_state, Communicator& pipeline) {
  if (pipeline.world_size() == 1) return stage_state;
  autograd::NoGradGuard no_grad;
  if (pipeline.rank() != 0) {
    // To stage 0, point to point: the names, dtypes and shapes (one line each, its length first),
    // then the tensors. Stage 0 receives the stages in order, so no two sends wait on each other.
    std::ostringstream desc;
    for (const auto& [name, t] : stage_state) {
      desc << name << '\t' << static_cast<int>(t.dtype()) << '\t';
      for (int64_t d = 0; d < t.dim(); ++d) desc << (d ? "," : "") << t.size(d);
      desc << '\n';
    }
    const std::string text = desc.str();
    pipeline.send(scalar_tensor(static_cast<int64_t>(text.size()), DType::I64).reshape({1}), 0);
    Tensor bytes = empty({std::max<int64_t>(static_cast<int64_t>(text.size()), 1)}, DType::U8);
    std::copy(text.begin(), text.end(), bytes.data<uint8_t>());
    pipeline.send(bytes, 0);
    for (const auto& [name, t] : stage_state) pipeline.send(t.to(Device::cpu()).contiguous(), 0);
    return {};
  }
  TensorMap whole = stage_state;
  for (int s = 1; s < pipeline.world_size(); ++s) {
    Tensor length = empty({1}, DType::I64);
    pipeline.recv(length, s);
    const int64_t n = length.data<int64_t>()[0];
    Tensor bytes = empty({std::max<int64_t>(n, 1)}, DType::U8);
    pipeline.recv(bytes, s);
    const char* p = reinterpret_cast<const char*>(bytes.data<uint8_t>());
    std::istringstream lines(std::string(p, p + n));
    for (std::string line; std::getline(lines, line);) {
      const size_t a = line.find('\t'), b = line.find('\t', a + 1);
      const auto dtype = static_cast<DType>(std::stoi(line.substr(a + 1, b - a - 1)));
      std::vector<int64_t> dims;
      std::istringstream shape(line.substr(b + 1));
      for (std::string d; std::getline(shape, d, ',');) dims.push_back(std::stoll(d));
      Tensor t = empty(Shape(dims), dtype);
      pipeline.recv(t, s);
      whole.emplace_back(line.substr(0, a), t);
    }
  }
  return whole;
}

TensorMap stage_part_of_state(const TensorMap& whole, const nn::Module& model) {
  std::unordered_set<std::string> mine;
  for (const auto& [name, t] : model.state_dict()) mine.insert(name);
  TensorMap out;
  for (const auto& [name, t] : whole)
    if (mine.count(name) != 0) out.emplace_back(name, t);
  return out;
}

namespace {

// "g.i.rest" -> (g, i, rest); g = -1 when the key is not of that form.
std::tuple<int64_t, int64_t, std::string> split_state_key(const std::string& key) {
  const size_t a = key.find('.'), b = a == std::string::npos ? a : key.find('.', a + 1);
  if (b == std::string::npos) return {-1, -1, ""};
  try {
    return {std::stoll(key.substr(0, a)), std::stoll(key.substr(a + 1, b - a - 1)), key.substr(b + 1)};
  } catch (const std::exception&) {
    return {-1, -1, ""};
  }
}

}  // namespace

PipelineStateIndex::PipelineStateIndex(const std::vector<optim::ParamGroup>& groups, const Tensor& tied_copy,
                                       const PipelineStage& stage) {
  const auto G = static_cast<int64_t>(groups.size());
  whole_.resize(static_cast<size_t>(G));
  offset_.assign(static_cast<size_t>(G), 0);
  count_.assign(static_cast<size_t>(G), 0);
  // Per stage: its own entries per group, and (stage 0) where the tied embedding sits.
  Tensor mine = zeros({G + 2}, DType::I64);
  int64_t* m = mine.data<int64_t>();
  m[G] = m[G + 1] = -1;
  for (int64_t g = 0; g < G; ++g)
    for (size_t i = 0; i < groups[g].params.size(); ++i) {
      const bool is_tied = tied_copy.defined() && groups[g].params[i].impl() == tied_copy.impl();
      if (is_tied && stage.first()) m[G] = g, m[G + 1] = m[g];  // the embedding: its whole index
      if (is_tied && stage.last() && stage.split()) {
        tied_group_ = g, tied_local_ = static_cast<int64_t>(i);
        continue;  // the head copy: no entry of its own in the whole state
      }
      ++m[g];
    }
  Tensor all = mine;
  if (stage.split()) {
    all = empty({stage.count * (G + 2)}, DType::I64);
    stage.group->all_gather(mine, all);
  }
  const int64_t* a = all.data<int64_t>();
  for (int s = 0; s < stage.index; ++s)
    for (int64_t g = 0; g < G; ++g) offset_[g] += a[s * (G + 2) + g];
  for (int64_t g = 0; g < G; ++g) count_[g] = m[g];
  if (tied_local_ >= 0) {
    FT_CHECK(a[G] == tied_group_, "pipeline: the head's copy of the embedding is in optimizer group ", tied_group_,
             ", the embedding in group ", a[G]);
    tied_whole_ = a[G + 1];
  }
  for (int64_t g = 0; g < G; ++g) {
    int64_t next = offset_[g];
    for (size_t i = 0; i < groups[g].params.size(); ++i)
      whole_[g].push_back(g == tied_group_ && static_cast<int64_t>(i) == tied_local_ ? -1 : next++);
  }
}

std::string PipelineStateIndex::to_whole(const std::string& key) const {
  const auto [g, i, rest] = split_state_key(key);
  if (g < 0 || g >= static_cast<int64_t>(whole_.size()) || i >= static_cast<int64_t>(whole_[g].size())) return key;
  const int64_t w = whole_[g][i];
  return w < 0 ? std::string() : detail::concat(g, ".", w, ".", rest);
}

std::string PipelineStateIndex::to_stage(const std::string& key) const {
  const auto [g, w, rest] = split_state_key(key);
  if (g < 0 || g >= static_cast<int64_t>(whole_.size())) return key;
  if (g == tied_group_ && w == tied_whole_) return detail::concat(g, ".", tied_local_, ".", rest);
  if (w < offset_[g] || w >= offset_[g] + count_[g]) return "";
  for (size_t i = 0; i < whole_[g].size(); ++i)
    if (whole_[g][i] == w) return detail::concat(g, ".", i, ".", rest);
  return "";
}

// ---------------------------------------------------------------- gradient synchronisation

PipelineSync::PipelineSync(nn::Module& model, train::GradSync* inner)
    : model_(model),
      stage_model_([&]() -> PipelineStageModel& {
        PipelineStageModel* s = pipeline_stage_of(model);
        FT_CHECK(s != nullptr, "PipelineSync: the model (", model.type_name(), ") is not a pipeline stage");
        return *s;
      }()),
      inner_(inner),
      zero_(dynamic_cast<ZeroSharding*>(inner)),
      tensor_(tensor_group_of(model)) {
  const PipelineStage& st = stage_model_.pipeline_stage();
  if (zero_ == nullptr || !stage_model_.tied_weight().defined() || !(st.first() || st.last())) return;
  // The two copies' shards of the mean gradient summed in one order (first + last) on both
  // stages, inside ZeRO's finish (see the class comment).
  zero_->set_tied_exchange([&st](const Tensor& shard) {
    autograd::NoGradGuard no_grad;
    const Tensor mine = shard.contiguous().clone();
    Tensor theirs = empty_like(mine);
    const int peer = st.first() ? st.count - 1 : 0;
    st.group->send_recv(mine, peer, theirs, peer);
    Tensor out = shard;  // the shard's gradient buffer, written in place
    out.copy_(st.first() ? add(mine, theirs) : add(theirs, mine));
  });
}

void PipelineSync::before_forward() {
  if (inner_) inner_->before_forward();
}

void PipelineSync::before_backward(bool last) {
  if (inner_) inner_->before_backward(last);
}

void PipelineSync::after_backward(bool last) {
  if (inner_) inner_->after_backward(last);
}

void PipelineSync::finish() {
  if (inner_) inner_->finish();
  if (zero_) return;  // the tied copies were added inside ZeRO's finish, on their shards
  const PipelineStage& st = stage_model_.pipeline_stage();
  const Tensor tied = stage_model_.tied_weight();
  if (!tied.defined() || !(st.first() || st.last())) return;
  // The embedding's gradient (first stage) and the head copy's (last stage) are two halves of
  // the single-process embedding's gradient: both stages take their sum, formed in the same
  // order (first + last) on both, so the two copies get the same update in every bit.
  autograd::NoGradGuard no_grad;
  Tensor g = tied.grad();
  FT_CHECK(g.defined(), "pipeline: the tied embedding has no gradient on ", st.describe());
  const Tensor mine = g.to(Device::cpu()).contiguous();
  Tensor theirs = empty_like(mine);
  const int peer = st.first() ? st.count - 1 : 0;
  st.group->send_recv(mine, peer, theirs, peer);
  const Tensor sum = st.first() ? add(mine, theirs) : add(theirs, mine);
  g.copy_(sum.to(g.device()));
  g.bump_version();
}

Tensor PipelineSync::clip_grad_norm(const std::vector<Tensor>& params, double max_norm) {
  FT_CHECK(max_norm > 0, "clip_grad_norm_: expected a positive max_norm, found ", max_norm);
  autograd::NoGradGuard no_grad;
  const PipelineStage& st = stage_model_.pipeline_stage();
  if (zero_) {
    // The stage's ||g||^2 over its data and tensor groups from ZeRO's shards (the last stage's
    // tied copy left out: the first stage counts it), then the stages' in stage order.
    const bool skip = stage_model_.tied_weight().defined() && st.last();
    const Tensor stage_total = scalar_tensor(zero_->grad_squares(skip), DType::F64).reshape({1});
    Tensor stages = empty({st.count}, DType::F64);
    st.group->all_gather(stage_total, stages);
    double total = 0;
    for (int s = 0; s < st.count; ++s) total += stages.data<double>()[s];
    const optim::NormClip c = optim::norm_clip(total, max_norm);
    if (c.clips()) zero_->scale_grads(static_cast<float>(c.factor));
    return scalar_tensor(c.norm, DType::F32);
  }
  std::unordered_set<const TensorImpl*> is_split;
  if (tensor_) {
    const std::map<std::string, TensorShard> shards = tensor_shards(model_);
    for (const auto& [name, p] : model_.named_parameters())
      if (shards.count(name) != 0) is_split.insert(p.impl());
  }
  // The head copy's gradient equals the embedding's (finish()): counted once, on the first stage.
  const Tensor tied = stage_model_.tied_weight();
  const TensorImpl* skip = tied.defined() && st.last() ? tied.impl() : nullptr;
  double parts = 0, replicated = 0;
  for (const Tensor& p : params) {
    const Tensor g = p.grad();
    if (!g.defined() || p.impl() == skip) continue;
    (is_split.count(p.impl()) != 0 ? parts : replicated) += optim::grad_squares(g);
  }
  // ||g||^2 of the stage: split parameters' parts summed over the tensor group, replicated ones
  // once (TensorParallelSync's rule); then the stages' sums, gathered and added in stage order so
  // every rank of the job gets the same bits.
  Tensor split_total = scalar_tensor(parts, DType::F64).reshape({1});
  if (tensor_) tensor_->all_reduce(split_total, ReduceOp::Sum);
  const Tensor stage_total = scalar_tensor(split_total.data<double>()[0] + replicated, DType::F64).reshape({1});
  Tensor stages = empty({st.count}, DType::F64);
  st.group->all_gather(stage_total, stages);
  double total = 0;
  for (int s = 0; s < st.count; ++s) total += stages.data<double>()[s];
  const optim::NormClip c = optim::norm_clip(total, max_norm);
  if (c.clips()) optim::scale_grads_(params, static_cast<float>(c.factor));
  return scalar_tensor(c.norm, DType::F32);
}

void PipelineSync::clip_grad_value(const std::vector<Tensor>& params, double clip_value) {
  if (zero_) return zero_->clip_grad_value(params, clip_value);  // its shards, rounded to their dtype
  optim::clip_grad_value_(params, clip_value);                   // element-wise: each stage clips its own
}

void PipelineSync::agree_found_inf(const Tensor& found_inf) {
  if (inner_) inner_->agree_found_inf(found_inf);
  // An overflow in one stage's gradients must skip the step on every stage.
  autograd::NoGradGuard no_grad;
  Tensor flag = found_inf.detach().to(Device::cpu()).to(DType::F32).contiguous().reshape({1}).clone();
  stage_model_.pipeline_stage().group->all_reduce(flag, ReduceOp::Max);
  found_inf.detach().copy_(flag.reshape(found_inf.shape()).to(found_inf.device()).to(found_inf.dtype()));
}

void PipelineSync::after_step() {
  if (inner_) inner_->after_step();
}

}  // namespace ft::dist
