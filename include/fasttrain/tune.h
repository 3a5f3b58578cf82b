// `fasttrain tune`: short measured trials of the settings that change a run's speed but not what
// it learns — threads, loader workers, precision, batch size (with the learning rate scaled
// linearly), activation checkpointing, accumulation — searched one setting at a time from the
// user's configuration, within a time budget. A setting is kept only when it is faster and keeps
// the loss trajectory of the configuration it replaces; the result is always the configuration of
// a trial that ran. Implemented in src/tools/tune.cpp.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fasttrain/tasks.h"
#include "fasttrain/train.h"

namespace ft::train {

struct TuneOptions {
  double budget_s = 300;         // wall time for all trials (--budget 5m)
  int64_t trial_steps = 12;      // optimizer steps per trial
  int64_t warmup_steps = 3;      // first steps of a trial left out of its speed (allocation, caches)
  double loss_tolerance = 0.03;  // largest mean relative loss difference a kept setting may cause
  double min_speedup = 1.03;     // a setting must be this much faster to replace the current one
  std::string out_dir;           // trial run folders, tune.csv and run.toml
};

// One setting a trial changes relative to the configuration it is compared with, and why it was
// proposed.
struct TuneChange {
  std::string option, value, reason;
};

struct TuneTrial {
  int64_t index = 0;
  std::vector<TuneChange> changes;        // relative to the start configuration (empty: the start)
  TrainerConfig config;                   // as the trial ran (trial_steps, no checkpoints)
  std::optional<int64_t> compared_with;   // the trial whose loss trajectory this one must keep
  double items_per_s = 0;                 // median over the steps after warm-up
  double step_ms = 0;                     // median step time after warm-up
  double data_wait_ms = 0;                // median time per step waiting for the batch
  int64_t peak_bytes = 0;                 // allocator high-water mark during the trial
  std::vector<double> losses;             // training loss of every step
  double val_loss = 0;                    // on the same validation batches for every trial
  std::optional<double> loss_difference;  // mean relative difference to compared_with
  bool ran = false, kept = false;
  std::string verdict;  // "start", "kept", "slower", "loss differs by 7.1%", "failed: ...", "skipped: budget"
};

struct TuneResult {
  std::vector<TuneTrial> trials;
  int64_t best = 0;      // index of the winning trial (0: the start configuration)
  double speedup = 1.0;  // best's items/s over the start's
};

// Builds a fresh module and data for a configuration (the built-in tasks: make_builtin_task).
using TaskFactory = std::function<BuiltinTask(const TrainerConfig&)>;

// Runs the trials. `note` receives one line per trial as it finishes.
TuneResult tune(const TrainerConfig& start, const TaskFactory& make_task, const TuneOptions& options,
                const std::function<void(const std::string&)>& note = {});

// The mean over steps of |a_t - b_t| / |b_t|: how far trajectory `a` strays from `b` (same steps).
double loss_trajectory_difference(const std::vector<double>& a, const std::vector<double>& b);

// The winner's settings applied to `start` (its steps, intervals and folders untouched): what
// run.toml holds.
TrainerConfig tuned_config(const TrainerConfig& start, const TuneResult& result);
// Writes <out_dir>/tune.csv (one row per trial) and <out_dir>/run.toml (tuned_config).
void write_tune_outputs(const TrainerConfig& start, const TuneResult& result, const std::string& out_dir);
// The trials as a text table (what `fasttrain tune` prints).
std::string tune_table(const TuneResult& result);

}  // namespace ft::train
