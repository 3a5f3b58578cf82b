// What the Trainer trains, in PyTorch Lightning's shape: a TrainModule (the model, what one
// training and one validation batch compute, which parameters the optimizer gets) and a
// DataModule (the training and validation datasets, built once the batch size is known). The
// Trainer (train.h) owns everything else: precision, accumulation, clipping, schedules, finders,
// checkpoints and resume, logging. The built-in tasks (tasks.h) are ordinary modules on this
// interface. Standard library and public fasttrain headers only.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fasttrain/dataset.h"
#include "fasttrain/loader.h"
#include "fasttrain/nn.h"
#include "fasttrain/optim.h"

namespace ft::train {

// What the Trainer's throughput counts (items_per_s in metrics.csv and the summary).
enum class ItemUnit { Samples, Tokens };
const char* item_unit_name(ItemUnit unit);  // "samples", "tokens"

// A value to log beside the loss: a 0-d tensor left on the device (the Trainer reads it at log
// intervals only, so logging costs no synchronisation per step).
struct Metric {
  std::string name;  // "accuracy" -> train_accuracy / val_accuracy
  Tensor value;
};

// What training_step and validation_step return for one batch.
struct StepOutput {
  Tensor loss;                  // 0-d: the batch's mean loss (training: backward starts here)
  std::vector<Metric> metrics;  // batch means; averaged over the log interval or the split
};

// One evaluation over the validation split: the loss and each metric, averaged over the split's
// samples (batch means weighted by the batch's rows).
struct EvalResult {
  double loss = 0;
  std::vector<std::pair<std::string, double>> metrics;
  std::optional<double> metric(std::string_view name) const;
};

// A run's stated goal and whether the final evaluation met it.
struct Goal {
  std::string sentence;  // e.g. "val accuracy 97.10% (goal >= 95.0%: met)"
  bool met = false;
};

class TrainModule {
 public:
  virtual ~TrainModule() = default;
  // The model whose parameters are trained, checkpointed and put in train/eval mode.
  virtual nn::Module& model() = 0;
  // Forward of one training micro-batch to its loss (under the run's autocast; the Trainer scales,
  // accumulates and runs backward). The batch's floating fields are bf16 in bf16-true runs.
  virtual StepOutput training_step(const data::Batch& batch) = 0;
  // One validation batch, under inference mode with the model in eval mode.
  virtual StepOutput validation_step(const data::Batch& batch) = 0;
  // The optimizer's parameter groups from the run's options (lr, weight decay, betas, ...). The
  // default: weight decay for matrices, none for biases and norm weights (optim::decay_groups).
  virtual std::vector<optim::ParamGroup> param_groups(const optim::GroupOptions& options);
  // What throughput counts, and how many of it a batch holds (default: samples, its rows).
  virtual ItemUnit unit() const { return ItemUnit::Samples; }
  virtual int64_t items_in(const data::Batch& batch) const { return batch.rows; }
  // The lowest achievable validation loss where the module knows it (reported beside the loss).
  virtual std::optional<double> loss_floor() const { return std::nullopt; }
  // The module's goal for the final evaluation, if it has one (reported in the summary).
  virtual std::optional<Goal> judge(const EvalResult& result) const {
    (void)result;
    return std::nullopt;
  }
  // A JSON object written to the run folder's task.json: what a reader of the run needs besides
  // the config (a vocabulary, class names). "{}" by default.
  virtual std::string description_json() const { return "{}"; }
};

// The training data: a map-style dataset (with an optional sampler; default: a new random
// permutation every epoch) or an iterable one. Sample fields are what training_step reads.
struct TrainData {
  data::DatasetPtr dataset;
  data::SamplerPtr sampler;  // map-style only; null: RandomSampler with the run's seed
  data::IterableDatasetPtr stream;
};
// The validation data: read in order from the start of its epoch 0 at every evaluation, so
// evaluations compare like with like; eval_batches (0: all) bounds how many batches are read.
struct ValData {
  data::DatasetPtr dataset;
  data::IterableDatasetPtr stream;
};

class DataModule {
 public:
  virtual ~DataModule() = default;
  // Called once the batch size is known (after the batch-size finder with batch_size auto).
  virtual TrainData train_data(int64_t batch_size) const = 0;
  virtual ValData val_data(int64_t batch_size) const = 0;
};

// A DataModule over fixed datasets (Lightning's LightningDataModule.from_datasets).
class DatasetModule : public DataModule {
 public:
  DatasetModule(TrainData train, ValData val) : train_(std::move(train)), val_(std::move(val)) {}
  TrainData train_data(int64_t) const override { return train_; }
  ValData val_data(int64_t) const override { return val_; }

 private:
  TrainData train_;
  ValData val_;
};

}  // namespace ft::train
