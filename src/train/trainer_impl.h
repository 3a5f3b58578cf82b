// The Trainer's state once a module is attached (trainer.cpp builds it, fit.cpp runs the loop):
// the optimizer, schedule and step runner, the training and validation loaders, the callbacks,
// and the sums kept on the device between log intervals.
#pragma once
#include <atomic>
#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "fasttrain/callbacks.h"
#include "fasttrain/ddp.h"
#include "fasttrain/device_prefetcher.h"
#include "fasttrain/dist.h"
#include "fasttrain/loader.h"
#include "fasttrain/optim.h"
#include "fasttrain/pipeline.h"
#include "fasttrain/process_groups.h"
#include "fasttrain/tensor_parallel.h"
#include "fasttrain/train.h"
#include "fasttrain/train_step.h"
#include "fasttrain/zero.h"

namespace ft::train {

struct Trainer::Impl {
  // Where this rank computes: the device option, with "cuda" resolved to the local rank's GPU
  // under a launcher (dist::local_device).
  Device device = Device::cpu();
  TrainModule* module = nullptr;
  const DataModule* data = nullptr;
  std::unique_ptr<optim::Optimizer> optimizer;
  std::unique_ptr<optim::Schedule> schedule;
  std::unique_ptr<StepRunner> runner;
  std::unique_ptr<data::DataLoader> loader;  // training batches
  // The loader's batches on the training device; its state is the data position.
  std::unique_ptr<data::DevicePrefetcher> batches;
  std::unique_ptr<data::DataLoader> val_loader;
  std::unique_ptr<data::DevicePrefetcher> val_batches;
  std::unique_ptr<EarlyStopping> early_stopping;
  std::unique_ptr<CheckpointKeeper> keeper;
  // Training loss and metrics summed since the last log over loss_count micro-batches, on the
  // device; items (the module's unit) counted on the host.
  Tensor loss_sum;
  std::vector<std::pair<std::string, Tensor>> metric_sums;
  std::vector<std::string> metric_names;  // of the last training_step run (a graph replay runs none)
  int64_t loss_count = 0;
  int64_t items = 0;
  std::atomic<bool> stop_requested{false};
  std::string resumed_from;                 // the checkpoint folder applied ("" if none)
  double checkpoint_metric = std::nan("");  // the monitored value saved with the next checkpoint
  // The evaluation done at the step of the next checkpoint (saved with it) or of the resumed one,
  // so a run resumed at its last step does not evaluate and log that step a second time.
  int64_t checkpoint_eval_step = -1;
  EvalResult checkpoint_eval;
  // Data parallelism (distributed.cpp): the data-parallel group's communicator (the whole job
  // without model parallelism; a world of one without a launcher) and, with several ranks, DDP's
  // gradient synchronisation.
  std::shared_ptr<dist::Communicator> comm;
  std::unique_ptr<dist::DataParallel> ddp;
  std::unique_ptr<dist::ZeroSharding> zero;  // strategy zero1 / zero2 / zero3 (then ddp is null)
  // Model parallelism (--tp): the whole job (comm is one of its data groups), the tensor group
  // (null without tensor parallelism) and its gradient synchronisation, which holds DDP's.
  std::shared_ptr<dist::Communicator> job;
  std::shared_ptr<dist::Communicator> tensor;
  std::unique_ptr<dist::TensorParallelSync> tp_sync;
  // Pipeline parallelism (--pp, pipeline_trainer.cpp): the pipeline group (null without), the
  // stage's gradient synchronisation (around tp_sync or ddp), the executor of the schedule, the
  // optimizer state's numbering across stages, and the bubble measured over the run.
  std::shared_ptr<dist::Communicator> pipeline;
  std::unique_ptr<dist::PipelineSync> pp_sync;
  std::unique_ptr<PipelineExecutor> pp_executor;
  std::unique_ptr<dist::PipelineStateIndex> pp_state_index;
  PipelineStats pp_total;  // summed over the steps run (the first left out once there are others)
  int64_t pp_steps = 0;
  bool pp_first_only = false;  // pp_total holds the first step alone

  bool channels_last = false;  // the model's 4-d weights are NHWC: so are the image batches

  // The batch as the module reads it: floating fields in bf16 for bf16-true runs, images in
  // NHWC memory with channels_last.
  data::Batch model_batch(const data::Batch& b) const;
  // The next training batch, crossing into the next epoch when this one is exhausted.
  const data::Batch& next_batch();
  // The StepRunner for the current optimizer (rebuilt when lr_find replaces the optimizer).
  void make_runner(const TrainerConfig& c);
  // One optimisation step over `accumulate` loader batches; returns the micro-batch losses summed
  // on the device, adds the metrics to metric_sums, the items to `items` and the time spent
  // waiting for batches to *data_wait.
  Tensor train_step(int64_t accumulate, double* data_wait);
  // Loss and metrics over the validation data (the first eval_batches batches, 0: all).
  EvalResult evaluate(const TrainerConfig& c);
  double momentum_in_use() const;
  // Passes over the training data at `step` (steps x accumulate / batches per epoch); for a
  // stream, whose epoch length is unknown, the epochs begun.
  double epoch_at(int64_t step, int64_t accumulate) const;

  // --- data parallelism (distributed.cpp); each a no-op with one rank ---
  // Data-parallel replicas (ranks / (tp x pp)): the global batch is batch_size x world().
  int world() const { return comm->world_size(); }
  bool rank0() const { return job->rank() == 0; }  // the rank that prints and writes files
  // Whether this rank takes part in writing the model: rank 0, and under tensor parallelism the
  // other ranks of its tensor group (the first data-parallel replica), which gather with it.
  bool writes_model() const { return rank0() || ((tensor || pipeline) && comm->rank() == 0); }
  // The whole model to `path` (a safetensors file, as one process saves it): call on every rank
  // where writes_model(); under tensor parallelism they gather the parts, and rank 0 writes.
  void save_model(const std::string& path) const;
  // The optimizer's state_tensors() in the single-process layout (tensor parallelism: split
  // parameters' state gathered over the tensor group, a collective of it), and the inverse.
  // Under ZeRO (over the data group) the shards are consolidated first: a collective of the
  // data group too.
  TensorMap whole_optimizer_state(const TrainerConfig& c) const;
  // `state` of `owner` (an optimizer of this rank's parts, unsharded) gathered, and the inverse.
  TensorMap whole_optimizer_state(const optim::Optimizer& owner, TensorMap state) const;
  TensorMap split_optimizer_state(const optim::Optimizer& owner, const TensorMap& whole) const;
  // The model's parameters that are parts over the tensor group (tensor_shards).
  std::vector<Tensor> split_parameters() const;
  // Every replica takes rank 0's weights and buffers, then DDP's gradient hooks are set.
  void start_data_parallel(const TrainerConfig& c);
  // `full` itself, or under ZeRO this rank's shard optimizer (the sharding rebuilt around it).
  std::unique_ptr<optim::Optimizer> sharded(std::unique_ptr<optim::Optimizer> full, const TrainerConfig& c);
  // ZeRO checkpoints: this rank's optimizer shard as <tmp>/optimizer-rank-R-of-N.safetensors,
  // between two barriers (rank 0 has made tmp before the first; every shard is written after
  // the second, so rank 0 may commit the folder).
  void save_optimizer_shard(const std::string& tmp) const;
  // The optimizer state of checkpoint `dir` for this rank's optimizer: optimizer.safetensors or
  // the shards of a ZeRO run of any number of ranks, consolidated, then cut to this rank's shard
  // under ZeRO.
  SafetensorsFile load_optimizer_state(const std::string& dir, const TrainerConfig& c) const;
  // --- pipeline parallelism (pipeline_trainer.cpp); each a no-op without --pp ---
  // The stage's PipelineSync around the tensor/data-parallel sync; refuses what is not built.
  void start_pipeline(const TrainerConfig& c);
  // The executor and the optimizer-state numbering for the current runner and optimizer.
  void make_pipeline_executor(const TrainerConfig& c);
  // One step of `micro` micro-batches through the schedule (the optimizer step included).
  Tensor pipeline_step(const std::vector<data::Batch>& micro);
  EvalResult evaluate_pipeline(const TrainerConfig& c);
  // The single-process model state: tensor parts and stages gathered (collectives of the groups).
  TensorMap whole_model_state() const;
  // The weights of a whole state that this rank holds (its stage, its tensor parts).
  TensorMap model_part_of(const TensorMap& whole) const;
  // Optimizer state across stages: this stage's entries renumbered as the single-process
  // optimizer's and gathered (a collective of the pipeline group), and the inverse.
  TensorMap whole_over_stages(const TensorMap& stage_state) const;
  TensorMap stage_part_of_optimizer_state(const TensorMap& whole) const;
  // "pipeline bubble: ..." (a collective of the pipeline group), or "" without --pp.
  std::string pipeline_report(const TrainerConfig& c) const;
  // The gradient synchronisation of the strategy (null with one rank).
  GradSync* grad_sync() const {
    if (pp_sync) return pp_sync.get();  // wraps the tensor- or data-parallel one, or ZeRO
    if (zero) return zero.get();        // under tensor parallelism too: it spans both groups
    if (tp_sync) return tp_sync.get();
    return ddp.get();
  }
  // This rank's share of every epoch of the training data (disjoint across ranks).
  data::SamplerPtr rank_sampler(data::SamplerPtr sampler) const;
  data::IterableDatasetPtr rank_stream(data::IterableDatasetPtr stream) const;
  // Rank 0's value on every rank (the run folder).
  std::string agreed(const std::string& rank0_value) const;
  // The log interval's loss and metric sums averaged over the ranks: the global batch's.
  void reduce_log_sums();
  // Whether a stop was requested on any rank (all ranks then stop after the same step).
  bool stop_requested_anywhere();
};

// The distributed options' process-wide effects: the collective timeout, threads per rank.
void apply_distributed_settings(const TrainerConfig& c, dist::Communicator& comm);

// The module's description_json() checked to be a JSON object, as task.json's text.
std::string task_description(const TrainModule& module);

// The value `monitor` names, from an evaluation (NaN when the module does not measure it).
double monitored(const TrainerConfig& c, const EvalResult& r);

}  // namespace ft::train
