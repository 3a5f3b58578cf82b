// The batch-size finder (train.h: find_batch_size). Each trial is a real optimisation step —
// forward, backward and the optimizer's update with its state — at the config's precision, so
// the peak it reaches is the peak training will reach at that batch size. Batches come from the
// module's own data at each trial size, read by a loader in the calling thread.
//
// In a job of several ranks every rank searches on its own (the trials do not communicate: DDP's
// hooks are not registered yet), under a budget that is the user's per-process limit or its share
// of the machine's memory (the ranks on one machine share it), and then the ranks agree on the
// smallest batch any of them found, so the per-rank batch is the same everywhere.
//
// A tensor-parallel model's trials communicate within its tensor group (the parallel layers' f
// and g, the vocabulary-parallel loss): the ranks of a group must run the same trials and leave
// a failed one together, or one would wait in a collective for a rank that gave up. They hold
// parts of equal shapes and allocate in the same order, so under the same limit they run out of
// memory at the same allocation; the limit is therefore agreed over the job (the smallest
// rank's budget) and every trial's outcome agreed over the tensor group (failed if it failed
// on any rank), which also keeps the searches in step.
//
// Under pipeline parallelism a trial is the stage's part of a whole step (accumulate
// micro-batches in the schedule's order: GPipe holds all of their activations), run without
// communicating between stages (pipeline_trial_step), since stages hold different parts and run
// out of memory at different sizes: a stage's receive would wait for a peer that gave up. The
// outcome is agreed over the whole job after each trial, keeping every rank's search in step.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "fasttrain/allocator.h"
#include "fasttrain/dist.h"
#include "fasttrain/loader.h"
#include "fasttrain/pipeline.h"
#include "fasttrain/tasks.h"
#include "fasttrain/tensor_parallel.h"
#include "fasttrain/train.h"
#include "fasttrain/train_step.h"
#include "train/run_setup.h"

namespace ft::train {

namespace {

// 80% of MemAvailable, shared by the job's ranks on this machine: what a CPU run may use when the
// user set no budget.
int64_t default_cpu_budget(int local_ranks) {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024 / 10 * 8 / local_ranks;
  FT_FAIL("batch-size finder: cannot read MemAvailable from /proc/meminfo; set --memory-limit");
}

std::string bytes_text(int64_t b) {
  char buf[32];
  const double mib = static_cast<double>(b) / (1024.0 * 1024);
  if (mib < 1024)
    std::snprintf(buf, sizeof buf, "%.1f MiB", mib);
  else
    std::snprintf(buf, sizeof buf, "%.2f GiB", mib / 1024);
  return buf;
}

}  // namespace

BatchSizeSearch find_batch_size(const TrainerConfig& config, TrainModule& module, const DataModule& data) {
  TrainerConfig c = config;
  c.batch_size = 1;  // any valid value: the trials set their own
  c.validate();
  Allocator& alloc = allocator_for(Device::cpu());
  BatchSizeSearch out;
  const std::shared_ptr<dist::Communicator> comm = dist::world();
  const int64_t user_limit = config.memory_limit.bytes;
  out.memory_limit = user_limit > 0 ? user_limit : default_cpu_budget(comm->local_size());
  const std::shared_ptr<dist::Communicator> tensor = dist::tensor_group_of(module.model());
  const bool pipeline = dist::pipeline_stage_of(module.model()) != nullptr;
  if (tensor || pipeline) {
    Tensor budget = scalar_tensor(-out.memory_limit, DType::I64).reshape({1});  // the smallest: max of -b
    comm->all_reduce(budget, dist::ReduceOp::Max);
    out.memory_limit = -budget.data<int64_t>()[0];
  }
  alloc.set_memory_limit(static_cast<size_t>(out.memory_limit));

  // The trials train: the module's weights are put back afterwards (clones, since state_dict
  // holds live views), and the trial optimizer is dropped.
  nn::Module& model = module.model();
  TensorMap weights;
  for (const auto& [name, t] : model.state_dict()) weights.emplace_back(name, t.clone());
  model.train();
  const bool checkpointing = c.precision.checkpoint_blocks;
  if (checkpointing) set_block_checkpointing(model, true);
  std::unique_ptr<optim::Optimizer> optimizer = make_optimizer(c, module);
  StepOptions so = step_options(c);
  // Memory is set by the micro-batch; under a pipeline by the schedule's micro-batches in flight.
  so.accumulate = pipeline ? config.accumulate : 1;
  StepRunner runner(model, *optimizer, so);
  int64_t cap = config.max_batch_size;
  if (const TrainData one = data.train_data(1); one.dataset) {
    cap = std::min(cap, one.dataset->size() / config.accumulate);
    FT_CHECK(cap >= 1, "batch-size finder: the training data holds ", one.dataset->size(),
             " samples, fewer than accumulate = ", config.accumulate);
  }

  auto fits = [&](int64_t b) {
    bool ok = true;
    try {
      data::LoaderOptions lo;
      lo.batch_size = b;
      const TrainData train = data.train_data(b);
      std::unique_ptr<data::DataLoader> loader =
          train.dataset ? std::make_unique<data::DataLoader>(train.dataset, lo, train.sampler)
                        : std::make_unique<data::DataLoader>(train.stream, lo);
      const data::Batch* next = loader->next();
      FT_CHECK(next != nullptr && next->rows == b, "batch-size finder: the training data holds fewer than ", b,
               " samples; set --max-batch-size below that");
      data::Batch batch = *next;
      for (Tensor& f : batch.fields) f = runner.model_input(f);  // bf16 inputs for bf16-true
      if (pipeline) {
        auto* decoder = dynamic_cast<nn::UnaryModule*>(&model);
        FT_CHECK(decoder != nullptr, "batch-size finder: the pipeline stage is not a decoder");
        pipeline_trial_step(model, runner, c.dist.pp_schedule, so.accumulate, batch,
                            [decoder](const Tensor& logits, const data::Batch& mb) {
                              return next_token_cross_entropy(*decoder, logits, mb.fields[1]);
                            });
      } else {
        runner.forward_backward([&] { return module.training_step(batch).loss; });
      }
      runner.optimizer_step();
    } catch (const OutOfMemoryError&) {
      ok = false;  // everything the trial allocated has been released by the unwinding
    }
    if (tensor || pipeline) {
      Tensor failed = scalar_tensor(ok ? 0 : 1, DType::I32).reshape({1});
      (pipeline ? *comm : *tensor).all_reduce(failed, dist::ReduceOp::Max);
      ok = failed.data<int32_t>()[0] == 0;
    }
    out.trials.emplace_back(b, ok);
    return ok;
  };

  int64_t good = 0, bad = 0;
  for (int64_t b = std::min<int64_t>(2, cap);; b = std::min(b * 2, cap)) {
    if (!fits(b)) {
      bad = b;
      break;
    }
    good = b;
    if (b == cap) break;
  }
  if (good == 0 && bad > 1 && fits(1)) good = 1;
  if (config.batch_size_search == BatchSizeSearchMode::Binsearch && good > 0 && bad > 0) {
    while (bad - good > 1) {
      const int64_t mid = good + (bad - good) / 2;
      (fits(mid) ? good : bad) = mid;
    }
  }
  model.load_state_dict(weights, /*strict=*/true);
  if (checkpointing) set_block_checkpointing(model, false);
  // Leave the allocator as the run will use it: the user's budget (or none), no cached trial memory.
  alloc.set_memory_limit(static_cast<size_t>(user_limit));
  alloc.empty_cache();
  // Every rank learns every rank's result before any fails, so all fail or none does.
  Tensor found = empty({comm->world_size()}, DType::I64);
  comm->all_gather(scalar_tensor(good, DType::I64).reshape({1}), found);
  const int64_t* per_rank = found.data<int64_t>();
  const int64_t agreed = *std::min_element(per_rank, per_rank + comm->world_size());
  FT_CHECK(agreed > 0, "batch-size finder: not even a batch of 1 fits in the memory budget of ",
           bytes_text(out.memory_limit), good > 0 ? " on another rank" : "", " (set a larger --memory-limit)");
  out.batch_size = agreed;
  std::ostringstream r;
  r << "batch-size finder (" << name_of(config.batch_size_search) << ", budget " << bytes_text(out.memory_limit)
    << (comm->world_size() > 1 ? " per rank" : "") << "):";
  for (const auto& [b, ok] : out.trials) r << " " << b << (ok ? " ok," : " out of memory,");
  r << " -> batch size " << agreed;
  if (agreed < good) r << " (the smallest any rank found; this rank's: " << good << ")";
  if (comm->world_size() > 1) r << " per rank";
  if (bad == 0) r << " (the largest tried: max_batch_size or the data size)";
  out.report = r.str();
  return out;
}

}  // namespace ft::train
