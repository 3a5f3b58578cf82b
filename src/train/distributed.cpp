// The Trainer in a job of several ranks (docs/ARCHITECTURE.md "Distributed"): the process-wide
// settings (timeout, threads per rank), DDP's start (rank 0's weights everywhere, the gradient
// hooks), each rank's share of the training data, and the few values the ranks must agree on
// (the run folder, the logged losses, a stop request). With one rank every function here is a
// no-op, so a single process pays nothing.
#include <algorithm>
#include <filesystem>
#include <thread>

#include "fasttrain/parallel.h"
#include "fasttrain/safetensors.h"
#include "fasttrain/zero.h"
#include "train/run_setup.h"
#include "train/trainer_impl.h"

namespace ft::train {

namespace {

// Rank r of W takes positions r, r + W, r + 2W, ... of the inner sampler's epoch (its size cut
// to a multiple of W, as the Trainer drops the last partial batch anyway). With a per-rank batch
// of B/W, rank r's batch k is positions kB + r, kB + r + W, ...: the W batches of step k are
// together exactly batch k of one process with batch B, which is what makes N ranks train like
// one process with the global batch.
class RankSampler : public data::Sampler {
 public:
  RankSampler(data::SamplerPtr inner, int rank, int world) : inner_(std::move(inner)), rank_(rank), world_(world) {}
  int64_t size() const override { return inner_->size() / world_; }
  void indices(uint64_t epoch, std::vector<int64_t>& out) const override {
    inner_->indices(epoch, out);
    const int64_t n = size();
    for (int64_t j = 0; j < n; ++j) out[j] = out[rank_ + j * world_];  // r + jW >= j: in place
    out.resize(static_cast<size_t>(n));
  }

 private:
  data::SamplerPtr inner_;
  int rank_, world_;
};

// The same split of a stream: rank r's sample i is sample r + iW of the whole stream.
class RankStream : public data::SampleStream {
 public:
  RankStream(std::unique_ptr<data::SampleStream> inner, int world) : inner_(std::move(inner)), world_(world) {}
  bool next(const std::vector<Tensor>& fields) override {
    if (!inner_->next(fields)) return false;
    inner_->skip(world_ - 1);
    return true;
  }
  int64_t skip(int64_t n) override {
    int64_t passed = 0;
    for (; passed < n; ++passed) {
      const int64_t moved = inner_->skip(world_);
      if (moved == 0) break;
    }
    return passed;
  }

 private:
  std::unique_ptr<data::SampleStream> inner_;
  int world_;
};

class RankStreamDataset : public data::IterableDataset {
 public:
  RankStreamDataset(data::IterableDatasetPtr inner, int rank, int world)
      : inner_(std::move(inner)), rank_(rank), world_(world) {}
  data::SampleSpec spec() const override { return inner_->spec(); }
  std::unique_ptr<data::SampleStream> open(uint64_t epoch, int64_t start) const override {
    return std::make_unique<RankStream>(inner_->open(epoch, start * world_ + rank_), world_);
  }

 private:
  data::IterableDatasetPtr inner_;
  int rank_, world_;
};

}  // namespace

void apply_distributed_settings(const TrainerConfig& c, dist::Communicator& comm) {
  comm.set_timeout(c.dist.timeout);
  comm.set_debug(c.dist.debug);
  // Ranks on one machine share its cores: by default each takes its part (mpirun may have bound
  // the rank to fewer cores already, which OpenMP's default count reflects).
  if (c.threads == 0 && comm.local_size() > 1) {
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    set_num_threads(std::max(1, std::min(get_num_threads(), cores / comm.local_size())));
  }
}

void Trainer::Impl::start_data_parallel(const TrainerConfig& c) {
  FT_CHECK(!c.dist.sequence_parallel || tensor,
           "option sequence_parallel: splits the activations over a tensor group; "
           "it needs --tp 2 or more, found tp = ",
           c.dist.tp);
  if (tensor) {
    nn::Module& model = module->model();
    FT_CHECK(dist::tensor_group_of(model) != nullptr, "option tp: ", c.dist.tp,
             " tensor-parallel ranks, but the model (", model.type_name(),
             ") has no tensor-parallel layers (built for GPT and Llama)");
    // DDP over this rank's data group: the replicas of the same parts of the model. ZeRO
    // instead shards each tensor rank's parts over its data group: sharded() sets it up around
    // the optimizer, and it (not tp_sync, kept for its counts) synchronises the gradients.
    std::unique_ptr<GradSync> replicas;
    if (world() > 1) dist::broadcast_module(model, *comm);
    if (world() > 1 && dist::zero_stage(c.dist.strategy) == 0) {
      dist::DdpOptions o;
      o.bucket_cap_bytes = static_cast<int64_t>(c.dist.bucket_cap_mb * 1024 * 1024);
      replicas = std::make_unique<dist::DataParallel>(model, comm, o);
    }
    tp_sync = std::make_unique<dist::TensorParallelSync>(model, tensor, std::move(replicas));
    return;
  }
  if (world() == 1) return;
  // Replicas start equal whatever seed initialised them, before the optimizer takes copies.
  dist::broadcast_module(module->model(), *comm);
  if (dist::zero_stage(c.dist.strategy) > 0) return;  // sharded() sets ZeRO up around the optimizer
  dist::DdpOptions o;
  o.bucket_cap_bytes = static_cast<int64_t>(c.dist.bucket_cap_mb * 1024 * 1024);
  ddp = std::make_unique<dist::DataParallel>(module->model(), comm, o);
}

std::unique_ptr<optim::Optimizer> Trainer::Impl::sharded(std::unique_ptr<optim::Optimizer> full,
                                                         const TrainerConfig& c) {
  const int stage = dist::zero_stage(c.dist.strategy);
  if (world() == 1 || stage == 0) return full;
  if (zero) zero->gather_all();  // stage 3: the new sharding starts from the whole model
  zero.reset();                  // its hooks go before the new one registers its own
  // The shards are views of the parameters: bf16-true's conversion (which StepRunner would do
  // later) must come first.
  if (c.precision.mode == Precision::BF16True) module->model().to(DType::BF16);
  dist::DdpOptions o;
  o.bucket_cap_bytes = static_cast<int64_t>(c.dist.bucket_cap_mb * 1024 * 1024);
  // Under --pp the tied embedding's two copies (first and last stage) shard alike (pipeline.h).
  const dist::PipelineStageModel* stage_model = pipeline ? dist::pipeline_stage_of(module->model()) : nullptr;
  const Tensor tied = stage_model ? stage_model->tied_weight() : Tensor();
  zero = std::make_unique<dist::ZeroSharding>(module->model(), *full, comm, stage, o, tied);
  if (tensor)
    zero->set_tensor_parallel(tensor, split_parameters(),
                              dist::sequence_parallel(module->model()) ? dist::ReduceOp::Sum : dist::ReduceOp::Avg);
  // The stage's synchronisation wraps ZeRO (over this stage's data group) instead of DDP.
  if (pipeline) pp_sync = std::make_unique<dist::PipelineSync>(module->model(), zero.get());
  return zero->make_shard_optimizer();
}

void Trainer::Impl::save_model(const std::string& path) const {
  const nn::Module& model = module->model();
  if (!tensor && !pipeline) {
    if (rank0()) model.save(path);
    return;
  }
  const TensorMap whole = whole_model_state();                     // with the tensor and pipeline groups
  if (rank0()) save_safetensors(path, whole, {{"format", "pt"}});  // as Module::save
}

namespace {

// The parameter an optimizer state tensor "<group>.<index>.<state>" belongs to, with its split.
struct StateOwner {
  Tensor param;
  dist::TensorShard shard;
};

std::vector<std::pair<std::string, StateOwner>> state_owners(const optim::Optimizer& optimizer, const nn::Module& model,
                                                             const TensorMap& state) {
  const std::map<std::string, dist::TensorShard> shards = dist::tensor_shards(model);
  std::map<const TensorImpl*, dist::TensorShard> by_tensor;
  for (const auto& [name, p] : model.named_parameters()) {
    const auto it = shards.find(name);
    if (it != shards.end()) by_tensor[p.impl()] = it->second;
  }
  std::vector<std::pair<std::string, StateOwner>> out;
  for (const auto& [key, t] : state) {
    StateOwner owner;
    const size_t a = key.find('.'), b = a == std::string::npos ? a : key.find('.', a + 1);
    if (b != std::string::npos) {
      const size_t g = std::stoul(key.substr(0, a)), i = std::stoul(key.substr(a + 1, b - a - 1));
      const auto& groups = optimizer.param_groups();
      if (g < groups.size() && i < groups[g].params.size()) {
        owner.param = groups[g].params[i];
        const auto it = by_tensor.find(owner.param.impl());
        if (it != by_tensor.end()) owner.shard = it->second;
      }
    }
    out.emplace_back(key, owner);
  }
  return out;
}

}  // namespace

std::vector<Tensor> Trainer::Impl::split_parameters() const {
  const std::map<std::string, dist::TensorShard> shards = dist::tensor_shards(module->model());
  std::vector<Tensor> out;
  for (const auto& [name, p] : module->model().named_parameters())
    if (shards.count(name) != 0) out.push_back(p);
  return out;
}

TensorMap Trainer::Impl::whole_optimizer_state(const TrainerConfig& c) const {
  if (!tensor && zero) {
    // --pp with ZeRO: the stage's shards consolidated over its data group, then the stages'.
    const std::unique_ptr<optim::Optimizer> full = make_optimizer(c, *module);
    return whole_over_stages(zero->full_state(optimizer->state_tensors(), full->param_groups()));
  }
  if (!tensor) return whole_over_stages(optimizer->state_tensors());  // the stages' entries (--pp)
  if (!zero) return whole_optimizer_state(*optimizer, optimizer->state_tensors());
  // ZeRO over the data group: this tensor rank's state consolidated first (a collective of the
  // data group), in the layout of the optimizer one process of this tensor rank would have.
  const std::unique_ptr<optim::Optimizer> full = make_optimizer(c, *module);
  return whole_optimizer_state(*full, zero->full_state(optimizer->state_tensors(), full->param_groups()));
}

TensorMap Trainer::Impl::whole_optimizer_state(const optim::Optimizer& owner, TensorMap state) const {
  // Per-element state (Adam's moments) has its parameter's shape and is split as it is; scalars
  // (step counts) are the same on every rank. Every rank of the group holds the same keys.
  const auto owners = state_owners(owner, module->model(), state);
  for (size_t k = 0; k < state.size(); ++k) {
    const StateOwner& o = owners[k].second;
    Tensor& t = state[k].second;
    if (o.shard.sharded() && o.param.defined() && t.shape() == o.param.shape())
      t = dist::unshard_tensor(t, o.shard, *tensor);
  }
  return whole_over_stages(state);  // the stages' entries renumbered and gathered (--pp)
}

TensorMap Trainer::Impl::split_optimizer_state(const optim::Optimizer& owner, const TensorMap& whole) const {
  if (!tensor) return whole;
  TensorMap state = whole;
  const auto owners = state_owners(owner, module->model(), state);
  for (size_t k = 0; k < state.size(); ++k) {
    const StateOwner& o = owners[k].second;
    Tensor& t = state[k].second;
    if (o.shard.sharded() && o.param.defined() && t.shape() != o.param.shape() && t.dim() == o.param.dim())
      t = dist::shard_tensor(t, o.shard, tensor->rank(), tensor->world_size());
  }
  return state;
}

namespace {

std::string shard_file(const std::string& dir, int rank, int world) {
  return dir + "/optimizer-rank-" + std::to_string(rank) + "-of-" + std::to_string(world) + ".safetensors";
}

}  // namespace

void Trainer::Impl::save_optimizer_shard(const std::string& tmp) const {
  comm->barrier();  // rank 0 has made the folder
  // The optimizer's metadata in the unsharded form (its groups, not stage 3's per-block ones).
  std::map<std::string, std::string> metadata = zero->full_metadata(optimizer->state_metadata());
  for (auto& [key, value] : zero->shard_metadata()) metadata[key] = value;
  save_safetensors(shard_file(tmp, comm->rank(), world()), optimizer->state_tensors(), metadata);
  comm->barrier();  // every shard is written: rank 0 may commit
}

SafetensorsFile Trainer::Impl::load_optimizer_state(const std::string& dir, const TrainerConfig& c) const {
  SafetensorsFile state;
  if (std::filesystem::exists(dir + "/optimizer.safetensors")) {
    state = load_safetensors(dir + "/optimizer.safetensors");
  } else {
    // A ZeRO checkpoint: rank 0's shard says how many ranks wrote it; every one must be there.
    int shards = 0;
    for (int n = 1; n <= 1 << 16 && shards == 0; ++n)
      if (std::filesystem::exists(shard_file(dir, 0, n))) shards = n;
    FT_CHECK(shards > 0, "resume: ", dir,
             " has no optimizer state (expected optimizer.safetensors or optimizer-rank-0-of-N.safetensors)");
    std::vector<SafetensorsFile> files;
    for (int r = 0; r < shards; ++r) {
      const std::string path = shard_file(dir, r, shards);
      FT_CHECK(std::filesystem::exists(path), "resume: ", dir, " holds the optimizer shards of a job of ", shards,
               " ranks, but not ", path);
      files.push_back(load_safetensors(path));
    }
    // The unsharded groups of this model (the same split whatever the number of ranks).
    const std::unique_ptr<optim::Optimizer> full = make_optimizer(c, *module);
    state.tensors = dist::consolidate_zero_state(files, full->param_groups());
    for (const auto& [key, value] : files.front().metadata)
      if (key.rfind("zero.", 0) != 0) state.metadata[key] = value;
  }
  state.tensors = stage_part_of_optimizer_state(state.tensors);  // this stage's entries (--pp)
  if (tensor && zero) {
    // The whole model's state cut to this tensor rank's parts (the layout of its unsharded
    // optimizer), then to its ZeRO shard.
    const std::unique_ptr<optim::Optimizer> full = make_optimizer(c, *module);
    state.tensors = split_optimizer_state(*full, state.tensors);
  }
  if (zero) {
    state.tensors = zero->shard_state_from_full(state.tensors);
    state.metadata = zero->shard_metadata_from_full(state.metadata);
  } else if (tensor) {
    state.tensors = split_optimizer_state(*optimizer, state.tensors);
  }
  return state;
}

data::SamplerPtr Trainer::Impl::rank_sampler(data::SamplerPtr sampler) const {
  if (world() == 1) return sampler;
  return std::make_shared<RankSampler>(std::move(sampler), comm->rank(), world());
}

data::IterableDatasetPtr Trainer::Impl::rank_stream(data::IterableDatasetPtr stream) const {
  if (world() == 1) return stream;
  return std::make_shared<RankStreamDataset>(std::move(stream), comm->rank(), world());
}

std::string Trainer::Impl::agreed(const std::string& rank0_value) const {
  return job->world_size() == 1 ? rank0_value : dist::broadcast_string(*job, rank0_value);
}

void Trainer::Impl::reduce_log_sums() {
  if (world() == 1) return;
  // Sums of means over equal per-rank batches: their mean over the ranks is the global batch's.
  std::vector<Tensor> sums;
  if (loss_sum.defined()) sums.push_back(loss_sum);
  for (const auto& m : metric_sums) sums.push_back(m.second);
  if (sums.empty()) return;
  std::vector<Tensor> flat;
  for (const Tensor& s : sums) flat.push_back(s.detach().to(DType::F64).reshape({1}));
  Tensor packed = cat(flat, 0);
  comm->all_reduce(packed, dist::ReduceOp::Avg);
  size_t i = 0;
  if (loss_sum.defined()) loss_sum = packed.narrow(0, i++, 1).reshape({}).to(DType::F32);
  for (auto& m : metric_sums) m.second = packed.narrow(0, i++, 1).reshape({}).to(DType::F32);
}

bool Trainer::Impl::stop_requested_anywhere() {
  const bool here = stop_requested.load();
  if (job->world_size() == 1) return here;
  // Every rank of the job must leave the loop after the same step, wherever the signal arrived.
  Tensor flag = scalar_tensor(here ? 1 : 0, DType::I32);
  job->all_reduce(flag, dist::ReduceOp::Sum);
  return flag.item<int64_t>() > 0;
}

}  // namespace ft::train
