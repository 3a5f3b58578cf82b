// ZeRO stages 1, 2 and 3 (zero.h): the flattened, padded group layout, the shard optimizer over
// this rank's part, gradient reduction (DDP's buckets, or reduce-scatters per group: at the end
// of backward in stage 2, block by block during it in stage 3), clipping by the global norm, the
// all-gather of the updated shards (stages 1, 2) or stage 3's gathering and releasing of each
// block's parameters around its forward and backward; and the optimizer state moved between the
// sharded and the unsharded layout, which is what lets a checkpoint saved at N ranks resume at
// any other number of ranks.
#include "fasttrain/zero.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "core/name_table.h"
#include "fasttrain/autograd.h"
#include "fasttrain/error.h"

namespace ft::dist {

namespace {

constexpr NamedValue<Strategy> kStrategies[] = {{Strategy::Ddp, "ddp"},
                                                {Strategy::Zero1, "zero1"},
                                                {Strategy::Zero2, "zero2"},
                                                {Strategy::Zero3, "zero3"},
                                                {Strategy::Fsdp, "fsdp"}};
static_assert(ft::detail::rows_start_in_enum_order(kStrategies, std::size(kStrategies)), "in enum order");

}  // namespace

std::span<const NamedValue<Strategy>> option_names(Strategy) { return kStrategies; }

int zero_stage(Strategy strategy) {
  switch (strategy) {
    case Strategy::Ddp: return 0;
    case Strategy::Zero1: return 1;
    case Strategy::Zero2: return 2;
    case Strategy::Zero3:
    case Strategy::Fsdp: return 3;
  }
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

namespace {

// Stage 3 releases a parameter's memory between its uses: the Storage (shared by the parameter,
// its views and the tensors autograd saved) stays, so restoring its memory makes all of them
// valid again.
void release_memory(const Tensor& p) { p.storage()->data.reset(); }
bool released(const Tensor& p) { return !p.storage()->data && p.storage()->nbytes > 0; }

void restore_memory(const Tensor& p) {
  Storage& s = *p.storage();
  if (s.data || s.nbytes == 0) return;
  Tensor fresh = empty({static_cast<int64_t>(s.nbytes)}, TensorOptions(DType::U8, p.device()));
  s.data = std::move(fresh.storage()->data);
}

}  // namespace

ZeroSharding::ZeroSharding(nn::Module& model, const optim::Optimizer& full, std::shared_ptr<Communicator> comm,
                           int stage, DdpOptions ddp, const Tensor& tied)
    : comm_(std::move(comm)), tied_(tied.defined() ? tied.impl() : nullptr), stage_(stage), kind_(full.kind()) {
  FT_CHECK(comm_ != nullptr, "ZeRO: expected a communicator, found none");
  FT_CHECK(stage >= 1 && stage <= 3, "ZeRO: expected stage 1, 2 or 3, found ", stage);
  FT_CHECK(kind_ != optim::OptimizerKind::LAMB && kind_ != optim::OptimizerKind::LARS, "strategy zero", stage,
           ": expected an element-wise optimizer (adamw, adam or sgd), found ", optim::optimizer_name(kind_),
           " (its trust ratio needs the norm of each whole parameter, which a shard does not hold; use --strategy "
           "ddp)");
  build_groups(model, full);
  for (Unit& u : units_) u.gathered = true;  // the model is whole until stage 3 releases it below
  load_weights_from_model();
  const int64_t cap = ddp.bucket_cap_bytes > 0 ? ddp.bucket_cap_bytes : int64_t{1} << 40;
  gather_chunk_ = std::max<int64_t>(1, cap / static_cast<int64_t>(sizeof(float)) / comm_->world_size());
  if (stage_ == 1) ddp_ = std::make_unique<DataParallel>(model, comm_, ddp);
  if (stage_ == 3) {
    add_stage3_hooks();
    release_all();
  }
}

void ZeroSharding::assign_units(nn::Module& model, std::vector<size_t>* unit_of_param,
                                const std::vector<const TensorImpl*>& params) {
  // Unit 0 is the root; each outermost block is a unit (a block inside one is part of it). A
  // parameter two blocks share stays in the root, which is gathered through the whole step.
  units_.assign(1, Unit{});
  unit_of_param->assign(params.size(), 0);
  if (stage_ != 3) return;
  std::unordered_map<const TensorImpl*, size_t> index;
  for (size_t i = 0; i < params.size(); ++i) index.emplace(params[i], i);
  std::vector<char> shared(params.size(), 0);
  for (auto& [name, m] : model.named_modules()) {
    auto* block = dynamic_cast<nn::CheckpointableBlock*>(m.get());
    // The model itself (a non-owning handle) is the root even when it is a block.
    if (block == nullptr || name.empty()) continue;
    std::vector<size_t> mine;
    for (const auto& [pname, p] : block->named_parameters())
      if (const auto found = index.find(p.impl()); found != index.end()) mine.push_back(found->second);
    const bool nested = !mine.empty() && std::all_of(mine.begin(), mine.end(), [&](size_t i) {
      return (*unit_of_param)[i] != 0 && (*unit_of_param)[i] == (*unit_of_param)[mine.front()];
    });
    if (mine.empty() || nested) continue;
    FT_CHECK(block->hooks() == nullptr, "ZeRO stage 3: block '", name,
             "' already has hooks (another sharding of this model is alive)");
    units_.push_back(Unit{});
    units_.back().block = block;
    units_.back().owner = m;
    for (size_t i : mine) {
      if ((*unit_of_param)[i] != 0) shared[i] = 1;
      (*unit_of_param)[i] = units_.size() - 1;
    }
  }
  for (size_t i = 0; i < params.size(); ++i)
    if (shared[i]) (*unit_of_param)[i] = 0;
}

void ZeroSharding::build_groups(nn::Module& model, const optim::Optimizer& full) {
  const int64_t n = comm_->world_size(), r = comm_->rank();
  const auto& full_groups = full.param_groups();
  full_groups_ = static_cast<int64_t>(full_groups.size());
  std::vector<const TensorImpl*> all;  // every optimizer parameter, group by group
  for (const optim::ParamGroup& pg : full_groups)
    for (const Tensor& p : pg.params) all.push_back(p.impl());
  std::vector<size_t> unit_of_param;
  assign_units(model, &unit_of_param, all);
  autograd::NoGradGuard no_grad;
  int64_t flag = 0;
  // Stages 1 and 2: one group per optimizer group (empty ones too: the indices are the
  // optimizer's). Stage 3: one per unit and optimizer group, empty ones left out. Either way the
  // tied parameter (if any) gets a group of its own after its optimizer group's (the metadata's
  // "zero.group.<g>" maps every group to its optimizer group).
  for (size_t u = 0; u < units_.size(); ++u) {
    size_t first_k = 0;  // the optimizer group's first position in `all`
    for (size_t fg = 0; fg < full_groups.size(); first_k += full_groups[fg].params.size(), ++fg)
      // Pass 1: the tied parameter alone (when it is in this unit and optimizer group), so that its
      // elements are split over the ranks alike whatever else a stage holds.
      for (int pass = 0; pass < 2; ++pass) {
        const optim::ParamGroup& pg = full_groups[fg];
        Group g;
        g.options = pg.options;
        g.name = pg.name;
        g.full_group = static_cast<int64_t>(fg);
        g.unit = u;
        size_t k = first_k;
        for (size_t i = 0; i < pg.params.size(); ++i, ++k) {
          if (unit_of_param[k] != u) continue;
          const Tensor& p = pg.params[i];
          if ((p.impl() == tied_) != (pass == 1)) continue;
          FT_CHECK(g.params.empty() || p.dtype() == g.params.front().dtype(), "ZeRO: parameter group '", g.name,
                   "' mixes dtypes (", dtype_name(g.params.front().dtype()), " and ", dtype_name(p.dtype()),
                   "); expected one dtype per group, as its shards are gathered as one buffer");
          g.params.push_back(p);
          g.full_index.push_back(static_cast<int64_t>(i));
          g.offsets.push_back(g.total);
          g.total += p.numel();
        }
        if ((stage_ == 3 || pass == 1) && g.params.empty()) continue;
        if (pass == 1) tied_group_ = static_cast<int64_t>(groups_.size());
        g.shard = (g.total + n - 1) / n;  // P_g = N s_g >= T_g: the last shard is padded with zeros
        g.grad = zeros({std::max<int64_t>(g.shard, 1)}, DType::F32);
        g.first_flag = flag;
        flag += static_cast<int64_t>(g.params.size());
        if (stage_ == 3) g.data = zeros({std::max<int64_t>(g.shard, 1)}, g.params.front().dtype());
        const int64_t lo = r * g.shard, hi = lo + g.shard;
        for (size_t i = 0; i < g.params.size(); ++i) {
          const Tensor& param = g.params[i];
          const int64_t begin = std::max(lo, g.offsets[i]), end = std::min(hi, g.offsets[i] + param.numel());
          if (begin >= end) continue;
          Piece piece{static_cast<int64_t>(i), begin - g.offsets[i], end - begin, begin - lo, Tensor()};
          // Stages 1 and 2: the piece is the parameter's own memory, so the optimizer updates the
          // model in place and no second copy of the weights exists (a bf16 parameter gets its f32
          // master in the optimizer's state, as in one process). A parameter in another memory
          // order (channels-last) gets a buffer of its own, refreshed after every all-gather.
          // Stage 3: the shard's buffer, the only copy kept between uses.
          Tensor data = param.detach();
          if (stage_ == 3)
            piece.view = g.data.narrow(0, piece.at, piece.numel);
          else
            piece.view = data.is_contiguous() ? data.reshape({-1}).narrow(0, piece.offset, piece.numel)
                                              : empty({piece.numel}, data.dtype());
          g.pieces.push_back(std::move(piece));
        }
        // A rank whose range holds only padding still gives the optimizer one tensor, which never
        // has a gradient (so it is never updated and has no state): optimizers refuse empty lists.
        if (g.pieces.empty()) g.pieces.push_back({-1, 0, 1, 0, zeros({1}, DType::F32)});
        units_[u].groups.push_back(groups_.size());
        groups_.push_back(std::move(g));
      }
  }
}

void ZeroSharding::add_stage3_hooks() {
  // One gradient hook per parameter: the unit's backward is over when all of them ran.
  for (size_t u = 0; u < units_.size(); ++u) {
    Unit& unit = units_[u];
    if (unit.block) unit.block->set_hooks(this);
    for (size_t gi : unit.groups)
      for (const Tensor& p : groups_[gi].params) {
        if (!p.requires_grad()) continue;
        const size_t slot = static_cast<size_t>(unit.slots++);
        std::weak_ptr<bool> alive = alive_;
        p.register_post_accumulate_grad_hook([this, alive, u, slot](Tensor&) {
          const std::shared_ptr<bool> a = alive.lock();
          if (a && *a) on_grad_ready(u, slot);
        });
      }
    unit.slot_ready.assign(static_cast<size_t>(unit.slots), 0);
  }
}

ZeroSharding::~ZeroSharding() {
  *alive_ = false;
  for (Unit& u : units_) {
    if (u.block && u.block->hooks() == this) u.block->set_hooks(nullptr);
    for (Gather& g : u.gathers) try {
        g.work->wait();
      } catch (const std::exception&) {
      }
  }
  for (const WorkPtr& w : works_) try {
      w->wait();
    } catch (const std::exception&) {
    }
}

void ZeroSharding::load_weights_from_model() {
  autograd::NoGradGuard no_grad;
  if (stage_ == 3) {
    FT_CHECK(std::all_of(units_.begin(), units_.end(), [](const Unit& u) { return u.gathered; }),
             "ZeRO stage 3: the shards can take the model's weights only while they are gathered (gather_all)");
    for (Group& g : groups_) gather_from_params(g, comm_->rank() * g.shard, g.data.narrow(0, 0, g.shard));
    return;
  }
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

void ZeroSharding::before_forward() {
  if (stage_ == 3 && !all_gathered_) wait_gather(units_[0]);  // the root: embeddings, head, norms
}

void ZeroSharding::before_backward(bool last) {
  if (ddp_) ddp_->before_backward(last);
  if (stage_ == 1) return;
  syncing_ = last;
  // Stage 3 counts every micro-batch's gradients (a finished block is released either way).
  for (Unit& u : units_) {
    u.ready = 0;
    u.done = false;
    std::fill(u.slot_ready.begin(), u.slot_ready.end(), 0);
  }
  if (!last) return;
  autograd::NoGradGuard no_grad;
  flags_ = zeros({std::max<int64_t>(used_flag_count(), 1)}, DType::F32);
  flat_grads_.clear();
  if (stage_ != 3) return;
  // Reduce-scatters go out in one order on every rank (MPI matches collectives by order):
  // blocks in reverse forward order (roughly when backward finishes them), then blocks the
  // forward did not run, then the root, whose gradients (tied embeddings) come last.
  reduce_order_.assign(forward_order_.rbegin(), forward_order_.rend());
  for (size_t u = 1; u < units_.size(); ++u)
    if (std::find(forward_order_.begin(), forward_order_.end(), u) == forward_order_.end()) reduce_order_.push_back(u);
  reduce_order_.push_back(0);
  next_reduce_ = 0;
}

void ZeroSharding::reduce_group(Group& g) {
  // The group's gradients flattened in the padded layout and reduce-scattered, so that rank r
  // receives the mean of elements [r s_g, (r + 1) s_g) only; its used flags set for the one
  // all-reduce at the end of backward.
  autograd::NoGradGuard no_grad;
  Tensor flat = zeros({g.shard * comm_->world_size()}, DType::F32);
  float* flag = flags_.data<float>() + g.first_flag;
  for (size_t i = 0; i < g.params.size(); ++i) {
    const Tensor grad = g.params[i].grad();
    if (!grad.defined()) continue;
    flat.narrow(0, g.offsets[i], g.params[i].numel()).copy_(grad.contiguous().reshape({-1}));
    flag[i] = 1;
    g.params[i].set_grad(Tensor());  // the full gradient is not needed past this point
  }
  works_.push_back(comm_->reduce_scatter_async(flat, g.grad.narrow(0, 0, g.shard), ReduceOp::Avg));
  flat_grads_.push_back(std::move(flat));
}

void ZeroSharding::after_backward(bool last) {
  if (ddp_) {
    ddp_->after_backward(last);
    return;
  }
  if (stage_ == 3) {
    // Units whose gradients did not all arrive (parameters this pass did not use) go now, in
    // the agreed order; every block is released, the root after the step's last backward.
    if (last) {
      for (Unit& u : units_) u.done = true;
      launch_reductions();
      syncing_ = false;
    }
    for (size_t u = 1; u < units_.size(); ++u) release(units_[u]);
    if (last) release(units_[0]);
  } else if (last) {
    for (Group& g : groups_) reduce_group(g);  // stage 2: once backward is over
  }
  if (last) works_.push_back(comm_->all_reduce_async(flags_, ReduceOp::Sum));
}

// --- stage 3: gathering, releasing and the blocks' hooks ---

void ZeroSharding::launch_gather(Unit& u) {
  if (u.gathered || !u.gathers.empty()) return;
  for (size_t gi : u.groups) {
    Group& g = groups_[gi];
    for (const Tensor& p : g.params) restore_memory(p);
    Tensor out = empty({g.shard * comm_->world_size()}, g.data.dtype());
    WorkPtr work = comm_->all_gather_async(g.data.narrow(0, 0, g.shard), out);
    u.gathers.push_back({gi, std::move(out), std::move(work)});
  }
}

void ZeroSharding::wait_gather(Unit& u) {
  launch_gather(u);
  if (u.gathered) return;
  // The values are the ones autograd saved these parameters with (a gather before backward):
  // written without bumping the version counters, so the saved tensors stay usable.
  autograd::InferenceMode quiet;
  for (Gather& g : u.gathers) {
    g.work->wait();
    Group& group = groups_[g.group];
    scatter_to_params(group, 0, g.out.narrow(0, 0, group.total));
  }
  u.gathers.clear();
  u.gathered = true;
}

void ZeroSharding::release(Unit& u) {
  if (all_gathered_) return;
  for (Gather& g : u.gathers) g.work->wait();  // nothing may write into released memory
  u.gathers.clear();
  for (size_t gi : u.groups)
    for (const Tensor& p : groups_[gi].params) release_memory(p);
  u.gathered = false;
}

size_t ZeroSharding::unit_of(const nn::CheckpointableBlock& block) const {
  for (size_t u = 1; u < units_.size(); ++u)
    if (units_[u].block == &block) return u;
  FT_FAIL("ZeRO stage 3: a block this sharding does not know called its hooks");
}

void ZeroSharding::before_forward(nn::CheckpointableBlock& block) {
  if (all_gathered_) return;
  const size_t u = unit_of(block);
  auto at = std::find(forward_order_.begin(), forward_order_.end(), u);
  if (at == forward_order_.end()) at = forward_order_.insert(forward_order_.end(), u);
  wait_gather(units_[u]);
  // The next block's parameters travel while this one computes.
  if (at + 1 != forward_order_.end()) launch_gather(units_[*(at + 1)]);
}

Tensor ZeroSharding::after_forward(nn::CheckpointableBlock& block, const Tensor& output) {
  if (all_gathered_) return output;
  const size_t u = unit_of(block);
  release(units_[u]);  // autograd's saved tensors keep the Storage: gathered again before backward
  if (!autograd::grad_enabled() || !output.requires_grad()) return output;
  Tensor y = output.detach();
  std::weak_ptr<bool> alive = alive_;
  autograd::record_function("ZeroGatherBeforeBackward", {&output}, {&y}, [this, alive, u](std::vector<Tensor>& grads) {
    const std::shared_ptr<bool> a = alive.lock();
    if (a && *a) before_block_backward(u);
    return std::vector<Tensor>{grads[0]};
  });
  return y;
}

void ZeroSharding::before_block_backward(size_t unit) {
  wait_gather(units_[unit]);
  // The block whose backward runs next is the one before it in forward order.
  const auto at = std::find(forward_order_.begin(), forward_order_.end(), unit);
  if (at != forward_order_.end() && at != forward_order_.begin() && !units_[*(at - 1)].done)
    launch_gather(units_[*(at - 1)]);
}

void ZeroSharding::on_grad_ready(size_t unit, size_t slot) {
  Unit& u = units_[unit];
  if (u.slot_ready[slot]) return;  // a second backward through the same leaf in one pass
  u.slot_ready[slot] = 1;
  if (++u.ready < u.slots) return;
  u.done = true;
  if (unit == 0) return;  // the root is gathered until the step's last backward ends
  release(u);
  if (syncing_) launch_reductions();
}

void ZeroSharding::launch_reductions() {
  while (next_reduce_ < reduce_order_.size() && units_[reduce_order_[next_reduce_]].done) {
    for (size_t gi : units_[reduce_order_[next_reduce_]].groups) reduce_group(groups_[gi]);
    ++next_reduce_;
  }
}

void ZeroSharding::gather_all() {
  if (stage_ != 3) return;
  for (Unit& u : units_) launch_gather(u);
  for (Unit& u : units_) wait_gather(u);
  all_gathered_ = true;
}

void ZeroSharding::release_all() {
  if (stage_ != 3) return;
  all_gathered_ = false;
  for (Unit& u : units_) release(u);
}

GatheredParameters::GatheredParameters(ZeroSharding* zero) : zero_(zero) {
  if (!zero_) return;
  was_gathered_ = zero_->all_gathered();
  zero_->gather_all();
}

GatheredParameters::~GatheredParameters() {
  if (zero_ && !was_gathered_) zero_->release_all();
}

void ZeroSharding::check_views() const {
  // The pieces are views of the parameters' memory: a conversion that gave a parameter new
  // memory after sharding (model.to(...)) would leave the optimizer updating the old one.
  // (Stage 3's pieces are the shard's own buffer.)
  if (stage_ == 3) return;
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
  if (tied_group_ >= 0 && tied_exchange_) {
    // The other stage's copy's mean gradient added (pipeline.h): before clipping and rounding, as
    // one process adds both uses of the parameter into one gradient. A tied embedding is a split
    // parameter under tensor parallelism, so the tensor group's averaging below does not touch it.
    Group& g = groups_[static_cast<size_t>(tied_group_)];
    tied_exchange_(g.grad.narrow(0, 0, g.shard));
  }
  average_replicated_over_tensor_group();
  round_grads_to_param_dtype();
  copy_shards_to_pieces_grads(used);
}

void ZeroSharding::set_tied_exchange(std::function<void(const Tensor&)> exchange) {
  tied_exchange_ = std::move(exchange);
}

void ZeroSharding::set_tensor_parallel(std::shared_ptr<Communicator> tensor, const std::vector<Tensor>& split,
                                       ReduceOp replicated) {
  tensor_ = tensor && tensor->world_size() > 1 ? std::move(tensor) : nullptr;
  replicated_op_ = replicated;
  split_params_.clear();
  for (const Tensor& p : split) split_params_.push_back(p.impl());
  std::sort(split_params_.begin(), split_params_.end());
}

bool ZeroSharding::is_split(const Tensor& param) const {
  return std::binary_search(split_params_.begin(), split_params_.end(), param.impl());
}

void ZeroSharding::average_replicated_over_tensor_group() {
  if (!tensor_) return;
  // The ranks of a tensor group flattened parameters of equal shapes in one order: their
  // shards hold the same elements, so the replicated pieces line up in one f32 buffer.
  std::vector<Tensor> parts;
  int64_t total = 0;
  for (Group& g : groups_)
    for (const Piece& p : g.pieces) {
      if (p.param < 0 || is_split(g.params[p.param])) continue;
      parts.push_back(g.grad.narrow(0, p.at, p.numel));
      total += p.numel;
    }
  if (total == 0) return;
  Tensor flat = empty({total}, DType::F32);
  int64_t at = 0;
  for (const Tensor& t : parts) {
    flat.narrow(0, at, t.numel()).copy_(t);
    at += t.numel();
  }
  tensor_->all_reduce(flat, replicated_op_);
  at = 0;
  for (Tensor t : parts) {
    t.copy_(flat.narrow(0, at, t.numel()));
    at += t.numel();
  }
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
  // As optim::clip_grad_norm_ does it, applied in f32 to the shards: the clipped gradients are
  // DDP's bits whenever the f64 sums round to the same f32 norm.
  const optim::NormClip c = optim::norm_clip(grad_squares(false), max_norm);
  if (c.clips()) scale_grads(static_cast<float>(c.factor));
  return scalar_tensor(c.norm, DType::F32);
}

double ZeroSharding::grad_squares(bool skip_tied) const {
  // ||g||^2 of the whole gradient = the sum over ranks of their shards' ||g_r||^2 (padding and
  // unused parameters hold zeros), reduced in f64 so the ranks agree on every bit. Summed on the
  // host: the shards are CPU tensors, as the MPI communicator's are (a device communicator
  // would keep this on the device). Under tensor parallelism the split parameters' squares are
  // first summed over the tensor group (each holds other parts), the replicated ones' counted
  // once (every tensor rank holds the same values), so every rank adds the same numbers.
  autograd::NoGradGuard no_grad;
  double local = 0, split = 0;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const Group& g = groups_[gi];
    if (skip_tied && static_cast<int64_t>(gi) == tied_group_) continue;
    const float* v = g.grad.data<float>();
    if (!tensor_) {
      for (int64_t i = 0; i < g.shard; ++i) local += static_cast<double>(v[i]) * v[i];
      continue;
    }
    for (const Piece& p : g.pieces) {
      if (p.param < 0) continue;
      double& sum = is_split(g.params[p.param]) ? split : local;
      for (int64_t i = p.at; i < p.at + p.numel; ++i) sum += static_cast<double>(v[i]) * v[i];
    }
  }
  if (tensor_) {
    Tensor parts = scalar_tensor(split, DType::F64).reshape({1});
    tensor_->all_reduce(parts, ReduceOp::Sum);
    local += parts.data<double>()[0];
  }
  Tensor total = scalar_tensor(local, DType::F64).reshape({1});
  comm_->all_reduce(total, ReduceOp::Sum);
  return total.data<double>()[0];
}

void ZeroSharding::scale_grads(float factor) {
  for (Group& g : groups_) {
    float* v = g.grad.data<float>();
    for (int64_t i = 0; i < g.shard; ++i) v[i] *= factor;
  }
  round_grads_to_param_dtype();
}

void ZeroSharding::clip_grad_value(const std::vector<Tensor>&, double clip_value) {
  std::vector<Tensor> views;
  for (const Group& g : groups_)
    for (const Piece& p : g.pieces)
      if (p.view.grad().defined()) views.push_back(p.view);
  optim::clip_grad_value_(views, clip_value);
  round_grads_to_param_dtype();
}

void ZeroSharding::agree_fp8_amax(const std::vector<Tensor>& amaxes) {
  all_reduce_together(*comm_, amaxes, ReduceOp::Max);
}

void ZeroSharding::agree_found_inf(const Tensor& found_inf) {
  // An inf or NaN lands in the shard of whichever rank owns that element: every rank must skip.
  autograd::NoGradGuard no_grad;
  Tensor any = found_inf.to(DType::F32).reshape({1}).clone();
  comm_->all_reduce(any, ReduceOp::Sum);
  if (tensor_) tensor_->all_reduce(any, ReduceOp::Sum);  // a split parameter's inf: its owner's alone
  Tensor shared = found_inf;                             // the scaler's tensor: written in place
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
  if (stage_ == 3) {
    // The updated shards are gathered unit by unit by the next forward. The parameters' values
    // changed: anything keyed by their version (autocast's cached casts) must not be reused.
    for (Group& g : groups_) {
      for (const Tensor& p : g.params) p.bump_version();
      for (Piece& p : g.pieces) p.view.set_grad(Tensor());
    }
    if (all_gathered_) {                          // a caller holding the whole model sees the new values
      for (Unit& u : units_) u.gathered = false;  // the memory is there: gathered into again
      gather_all();
    }
    return;
  }
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

int64_t ZeroSharding::parameter_bytes(const nn::Module& model) const {
  int64_t bytes = 0;
  for (const Group& g : groups_)
    if (g.data.defined()) bytes += static_cast<int64_t>(g.data.nbytes());
  for (const Tensor& p : model.parameters())
    if (!released(p)) bytes += static_cast<int64_t>(p.nbytes());
  return bytes;
}

std::map<std::string, std::string> ZeroSharding::shard_metadata() const {
  // "zero.<group>.<piece>" = "<param> <offset> <numel>": where each piece of the shard
  // optimizer's state lies in the unsharded parameter, <param> counted in the optimizer's group
  // "zero.group.<group>" (stage 3 cuts an optimizer group into one group per unit).
  std::map<std::string, std::string> m{{"zero.rank", std::to_string(comm_->rank())},
                                       {"zero.world_size", std::to_string(comm_->world_size())}};
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const Group& g = groups_[gi];
    m["zero.group." + std::to_string(gi)] = std::to_string(g.full_group);
    for (size_t k = 0; k < g.pieces.size(); ++k) {
      const Piece& p = g.pieces[k];
      const int64_t param = p.param < 0 ? -1 : g.full_index[static_cast<size_t>(p.param)];
      m["zero." + std::to_string(gi) + "." + std::to_string(k)] =
          std::to_string(param) + " " + std::to_string(p.offset) + " " + std::to_string(p.numel);
    }
  }
  return m;
}

TensorMap ZeroSharding::shard_state_from_full(const TensorMap& full) const {
  // "<optimizer group>.<index there>" -> (group, parameter) of this sharding.
  std::map<std::pair<int64_t, int64_t>, std::pair<size_t, int64_t>> where;
  for (size_t gi = 0; gi < groups_.size(); ++gi)
    for (size_t i = 0; i < groups_[gi].params.size(); ++i)
      where[{groups_[gi].full_group, groups_[gi].full_index[i]}] = {gi, static_cast<int64_t>(i)};
  TensorMap out;
  for (const auto& [name, t] : full) {
    int64_t fg = 0, fi = 0;
    std::string state;
    FT_CHECK(split_state_name(name, &fg, &fi, &state),
             "ZeRO resume: expected optimizer state named "
             "<group>.<parameter>.<state>, found '",
             name, "'");
    const auto found = where.find({fg, fi});
    FT_CHECK(found != where.end(), "ZeRO resume: state '", name, "' names parameter ", fi, " of group ", fg,
             ", which this model's optimizer does not have");
    const auto [gi, i] = found->second;
    const Group& g = groups_[gi];
    for (size_t k = 0; k < g.pieces.size(); ++k) {
      const Piece& p = g.pieces[k];
      if (p.param != i) continue;
      const std::string piece_name = state_name(static_cast<int64_t>(gi), static_cast<int64_t>(k), state);
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

namespace {

// "<group>.<rest>" -> group, rest; false for keys that belong to no group ("groups", "optimizer").
bool split_group_key(const std::string& key, int64_t* group, std::string* rest) {
  const size_t dot = key.find('.');
  if (dot == std::string::npos || dot == 0 || key.find_first_not_of("0123456789") != dot) return false;
  *group = std::stoll(key.substr(0, dot));
  *rest = key.substr(dot + 1);
  return true;
}

}  // namespace

std::map<std::string, std::string> ZeroSharding::full_metadata(const std::map<std::string, std::string>& shard) const {
  std::map<std::string, std::string> out;
  for (const auto& [key, value] : shard) {
    int64_t g = 0;
    std::string rest;
    if (!split_group_key(key, &g, &rest)) {
      out[key] = value;
    } else if (g >= 0 && g < static_cast<int64_t>(groups_.size())) {
      // The groups of one optimizer group have its options (the schedule sets them alike).
      out[std::to_string(groups_[static_cast<size_t>(g)].full_group) + "." + rest] = value;
    }
  }
  out["groups"] = std::to_string(full_groups_);
  return out;
}

std::map<std::string, std::string> ZeroSharding::shard_metadata_from_full(
    const std::map<std::string, std::string>& full) const {
  std::map<std::string, std::string> out;
  std::map<int64_t, std::vector<std::pair<std::string, std::string>>> per_group;
  for (const auto& [key, value] : full) {
    int64_t g = 0;
    std::string rest;
    if (split_group_key(key, &g, &rest))
      per_group[g].emplace_back(rest, value);
    else
      out[key] = value;
  }
  if (const auto n = full.find("groups"); n != full.end())
    FT_CHECK(n->second == std::to_string(full_groups_), "ZeRO resume: the optimizer state has ", n->second,
             " parameter groups, this optimizer ", full_groups_);
  for (size_t gi = 0; gi < groups_.size(); ++gi)
    for (const auto& [rest, value] : per_group[groups_[gi].full_group]) out[std::to_string(gi) + "." + rest] = value;
  out["groups"] = std::to_string(groups_.size());
  return out;
}

TensorMap ZeroSharding::full_state(const TensorMap& shard_state, const std::vector<optim::ParamGroup>& groups) const {
  // Each rank in turn broadcasts a text header (one line per tensor: name, dtype, shape; then
  // the metadata) and its tensors; every rank ends up with every shard, as the files of a ZeRO
  // checkpoint would hold them.
  std::map<std::string, std::string> metadata = shard_metadata();
  std::vector<SafetensorsFile> shards(static_cast<size_t>(comm_->world_size()));
  for (int root = 0; root < comm_->world_size(); ++root) {
    std::string header;
    if (root == comm_->rank()) {
      for (const auto& [name, t] : shard_state) {
        header += "t\t" + name + "\t" + std::to_string(static_cast<int>(t.dtype()));
        // Appended piece by piece: GCC 12 warns falsely (-Wrestrict) about "\t" + to_string(d).
        for (int64_t d : t.shape()) header.append("\t").append(std::to_string(d));
        header += "\n";
      }
      for (const auto& [key, value] : metadata) header += "m\t" + key + "\t" + value + "\n";
    }
    header = broadcast_string(*comm_, header, root);
    SafetensorsFile& f = shards[static_cast<size_t>(root)];
    size_t k = 0;  // the root's tensors in order
    for (size_t begin = 0; begin < header.size();) {
      const size_t end = header.find('\n', begin);
      std::vector<std::string> fields;
      for (size_t a = begin; a <= end;) {
        const size_t b = std::min(header.find('\t', a), end);
        fields.push_back(header.substr(a, b - a));
        a = b + 1;
      }
      begin = end + 1;
      if (fields[0] == "m") {
        f.metadata[fields[1]] = fields.size() > 2 ? fields[2] : "";
        continue;
      }
      Shape shape;
      for (size_t i = 3; i < fields.size(); ++i) shape.push_back(std::stoll(fields[i]));
      Tensor t = root == comm_->rank() ? shard_state[k].second.contiguous().clone()
                                       : empty(shape, TensorOptions(static_cast<DType>(std::stoi(fields[2]))));
      comm_->broadcast(t, root);
      f.tensors.emplace_back(fields[1], t);
      ++k;
    }
  }
  return consolidate_zero_state(shards, groups);
}

TensorMap consolidate_zero_state(const std::vector<SafetensorsFile>& shards,
                                 const std::vector<optim::ParamGroup>& groups) {
  FT_CHECK(!shards.empty(), "ZeRO checkpoint: expected the optimizer state of at least one rank, found none");
  // (group, param, state) -> the unsharded tensor, filled piece by piece.
  std::map<std::string, Tensor> full;
  std::map<std::string, int64_t> filled;
  for (const SafetensorsFile& f : shards) {
    for (const auto& [name, t] : f.tensors) {
      int64_t sg = 0, k = 0;  // the shard's group and piece
      std::string state;
      FT_CHECK(split_state_name(name, &sg, &k, &state), "ZeRO checkpoint: unexpected state name '", name, "'");
      // The optimizer group the shard's group belongs to (the same index before stage 3).
      int64_t gi = sg;
      if (const auto g = f.metadata.find("zero.group." + std::to_string(sg)); g != f.metadata.end())
        FT_CHECK(std::sscanf(g->second.c_str(), "%ld", &gi) == 1, "ZeRO checkpoint: malformed group '", g->second, "'");
      const auto where = f.metadata.find("zero." + std::to_string(sg) + "." + std::to_string(k));
      FT_CHECK(where != f.metadata.end(), "ZeRO checkpoint: state '", name, "' has no piece in the metadata");
      int64_t param = -1, offset = 0, numel = 0;
      FT_CHECK(std::sscanf(where->second.c_str(), "%ld %ld %ld", &param, &offset, &numel) == 3,
               "ZeRO checkpoint: malformed piece '", where->second, "'");
      FT_CHECK(gi >= 0 && gi < static_cast<int64_t>(groups.size()) && param >= 0 &&
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
