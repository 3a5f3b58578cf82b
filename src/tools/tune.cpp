// The tuner (include/fasttrain/tune.h). A greedy search: starting from the user's configuration,
// each dimension (threads, workers, precision, batch size; checkpointing and accumulation when a
// larger batch does not fit) proposes candidates from what the current best trial measured, each
// candidate runs as a short trial, and the fastest that keeps the loss trajectory becomes the
// current best for the next dimension. Speed is the median over a trial's steps after warm-up,
// so a slow first step (allocation, page faults) does not decide anything.
//
// Loss check. Settings that leave each step's arithmetic the same up to rounding (threads,
// workers, precision, checkpointing, accumulation at the same effective batch) are compared step
// by step: mean_t |l_t - r_t| / |r_t| <= loss_tolerance. A larger batch sees more data per step,
// so it is compared by the mean loss of its last steps, which must not be worse than the
// reference's by more than the tolerance (a linearly scaled lr that diverges fails this).
#include "fasttrain/tune.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <thread>

#include "fasttrain/allocator.h"
#include "fasttrain/atomic_file.h"
#include "fasttrain/error.h"
#include "fasttrain/machine.h"

namespace ft::train {

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

std::string format(const char* fmt, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

constexpr int64_t kMostWorkers = 8;  // the largest loader worker count tried

bool has_bf16_hardware() { return cpu_info().bf16_hardware; }

// How a candidate's loss is compared with its reference's.
enum class Compare { StepByStep, FinalLoss };

struct Candidate {
  std::vector<TuneChange> changes;  // added to the current best's
  Compare compare = Compare::StepByStep;
};

class Tuner {
 public:
  Tuner(const TrainerConfig& start, const TaskFactory& make_task, const TuneOptions& o,
        const std::function<void(const std::string&)>& note)
      : start_(start), make_task_(make_task), o_(o), note_(note), began_(Clock::now()) {}

  TuneResult run() {
    TuneTrial& first = run_trial({}, std::nullopt, Compare::StepByStep);
    FT_CHECK(first.ran, "tune: the starting configuration does not train: ", first.verdict);
    first.verdict = "start";
    first.kept = true;
    report(first);
    start_seconds_ = seconds_since(began_);
    search_threads();
    search_workers();
    search_precision();
    search_batch_size();
    TuneResult r;
    r.trials = trials_;
    r.best = best_;
    r.speedup = trials_[best_].items_per_s / trials_[0].items_per_s;
    return r;
  }

 private:
  static double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

  const TuneTrial& best() const { return trials_[best_]; }

  // Runs the candidates against the current best and makes the fastest that keeps the loss its
  // new best. Returns the candidates' trials.
  std::vector<int64_t> try_candidates(const std::vector<Candidate>& candidates) {
    std::vector<int64_t> ran;
    int64_t winner = best_;
    for (const Candidate& c : candidates) {
      std::vector<TuneChange> changes = best().changes;
      for (const TuneChange& change : c.changes) {
        changes.erase(std::remove_if(changes.begin(), changes.end(),
                                     [&](const TuneChange& x) { return x.option == change.option; }),
                      changes.end());
        changes.push_back(change);
      }
      TuneTrial& t = run_trial(changes, best_, c.compare);
      ran.push_back(t.index);
      if (t.ran && t.verdict.empty()) {
        const double needed = trials_[winner].items_per_s * (winner == best_ ? o_.min_speedup : 1.0);
        if (t.items_per_s >= needed) {
          winner = t.index;
          t.verdict = "faster";
        } else {
          t.verdict = "slower";
        }
      }
      report(t);
    }
    for (int64_t i : ran)
      if (i != winner && trials_[i].verdict == "faster")
        trials_[i].verdict = "faster, but trial " + std::to_string(winner) + " more so";
    if (winner != best_) {
      trials_[winner].kept = true;
      trials_[winner].verdict = "kept";
      best_ = winner;
    }
    return ran;
  }

  void search_threads() {
    const int64_t cores = std::max<int64_t>(1, std::thread::hardware_concurrency());
    const int64_t now = best().config.threads == 0 ? cores : best().config.threads;
    std::vector<Candidate> candidates;
    for (int64_t n : {cores, std::max<int64_t>(1, cores / 2)})
      if (n != now && (candidates.empty() || candidates.back().changes[0].value != std::to_string(n)))
        candidates.push_back({{{"threads", std::to_string(n),
                                n == cores ? "all " + std::to_string(cores) + " cores"
                                           : "half the cores: less contention with loader workers"}}});
    try_candidates(candidates);
  }

  void search_workers() {
    const TuneTrial& b = best();
    const double share = b.step_ms > 0 ? b.data_wait_ms / b.step_ms : 0;
    if (share < 0.03) return;  // the batches are ready: more workers cannot help
    const std::string why = "waiting for data " + format("%.0f", 100 * share) + "% of the step";
    std::vector<Candidate> candidates;
    for (int64_t w : {int64_t{2}, int64_t{4}, kMostWorkers})
      if (w > b.config.workers) candidates.push_back({{{"workers", std::to_string(w), why}}});
    try_candidates(candidates);
  }

  void search_precision() {
    if (best().config.precision.mode != Precision::FP32 || !has_bf16_hardware()) return;
    try_candidates({{{{"precision", "bf16-mixed",
                       std::string("fp32 on a CPU with bf16 hardware (") + cpu_info().detected_level + ")"}}}});
  }

  // Larger batches with the learning rate scaled linearly; when one does not fit in memory, the
  // same effective batch through activation checkpointing and through accumulation.
  void search_batch_size() {
    const TrainerConfig& c = best().config;
    if (c.batch_size == 0) return;  // the batch-size finder already chooses it
    std::vector<Candidate> candidates;
    std::vector<Candidate> if_too_big;
    for (int64_t k : {2, 4}) {
      const std::string why = "a batch " + std::to_string(k) + "x larger with the lr scaled " + std::to_string(k) + "x";
      std::vector<TuneChange> scaled = {{"batch_size", std::to_string(c.batch_size * k), why},
                                        {"lr", format("%.6g", c.optimizer.lr * k), why}};
      if (const double* min_lr = c.schedule.min_lr()) scaled.push_back({"min_lr", format("%.6g", *min_lr * k), why});
      candidates.push_back({scaled, Compare::FinalLoss});
      std::vector<TuneChange> checkpointed = scaled;
      checkpointed.push_back({"checkpoint_blocks", "true", "the larger batch did not fit: recompute blocks"});
      if (!c.precision.checkpoint_blocks) if_too_big.push_back({checkpointed, Compare::FinalLoss});
      std::vector<TuneChange> accumulated = {
          {"accumulate", std::to_string(c.accumulate * k), "the larger batch did not fit: accumulate micro-batches"},
          scaled[1],
          scaled[2]};
      if_too_big.push_back({accumulated, Compare::FinalLoss});
    }
    const std::vector<int64_t> ran = try_candidates(candidates);
    bool out_of_memory = false;
    for (int64_t i : ran) out_of_memory |= trials_[i].verdict.find("out of memory") != std::string::npos;
    if (out_of_memory) try_candidates(if_too_big);
  }

  TuneTrial& run_trial(const std::vector<TuneChange>& changes, std::optional<int64_t> compared_with, Compare compare) {
    TuneTrial t;
    t.index = static_cast<int64_t>(trials_.size());
    t.changes = changes;
    t.compared_with = compared_with;
    t.config = start_;
    for (const TuneChange& c : changes) set_field(t.config, c.option, c.value);
    // The loader's workers fill prefetch x workers batches ahead while the first steps run; the
    // timed steps come after the largest such backlog is drained, so they see the loader's
    // steady rate. Every trial runs as many steps, so their lr schedules are the same.
    const int64_t most_workers = std::max<int64_t>(kMostWorkers, start_.workers);
    warmup_ = o_.warmup_steps + most_workers * t.config.prefetch;
    t.config.max_steps = warmup_ + o_.trial_steps;
    t.config.max_epochs = 0;
    t.config.eval_every = 0;
    t.config.eval_batches = 2;  // at the end only, the same batches for every trial
    t.config.log_every_n_steps = 1;
    t.config.checkpoint.every = 0;
    t.config.checkpoint.early_stopping_patience = 0;
    t.config.tensorboard = false;
    t.config.progress = false;
    t.config.run_dir = o_.out_dir + "/trials/trial-" + std::to_string(t.index);
    // A trial is skipped when it would end past the budget, judged by the start's duration.
    if (t.index > 0 && seconds_since(began_) + 1.2 * start_seconds_ > o_.budget_s) {
      t.verdict = "skipped: budget";
      trials_.push_back(t);
      return trials_.back();
    }
    Allocator& allocator = allocator_for(Device::cpu());
    allocator.reset_peak();
    try {
      Trainer trainer(t.config);
      BuiltinTask task = make_task_(trainer.config());
      t.val_loss = trainer.fit(*task.module, *task.data).final_val_loss;
      measure(trainer.history(), t);
      t.peak_bytes = allocator.stats().peak_allocated_bytes;
      t.ran = true;
    } catch (const OutOfMemoryError& e) {
      t.verdict = std::string("failed: out of memory (") + e.what() + ")";
    } catch (const std::exception& e) {
      t.verdict = std::string("failed: ") + e.what();
    }
    if (t.ran && compared_with) check_loss(trials_[*compared_with], compare, t);
    trials_.push_back(t);
    return trials_.back();
  }

  void measure(const std::vector<MetricRow>& history, TuneTrial& t) const {
    // Totals over the timed steps (items / seconds), not a median: a loader that keeps up with
    // only some steps shows in the total.
    double items = 0, seconds = 0, wait_ms = 0, previous_elapsed = 0;
    int64_t timed = 0;
    t.losses.clear();
    for (const MetricRow& row : history) {
      if (row.split != "train") continue;
      t.losses.push_back(row.loss);
      if (row.step > warmup_) {
        const double dt = row.elapsed_s - previous_elapsed;
        items += row.items_per_s * dt;
        seconds += dt;
        wait_ms += row.data_wait_ms;
        ++timed;
      }
      previous_elapsed = row.elapsed_s;
    }
    t.items_per_s = seconds > 0 ? items / seconds : 0;
    t.step_ms = timed ? 1000 * seconds / static_cast<double>(timed) : 0;
    t.data_wait_ms = timed ? wait_ms / static_cast<double>(timed) : 0;
  }

  void check_loss(const TuneTrial& reference, Compare compare, TuneTrial& t) const {
    if (compare == Compare::StepByStep) {
      // Over the steps both ran (trials with more loader workers run more warm-up steps).
      const size_t n = std::min(t.losses.size(), reference.losses.size());
      t.loss_difference = loss_trajectory_difference({t.losses.begin(), t.losses.begin() + n},
                                                     {reference.losses.begin(), reference.losses.begin() + n});
    } else {
      // The same validation batches for both: a fair measure of what each has learned.
      t.loss_difference = (t.val_loss - reference.val_loss) / std::abs(reference.val_loss);  // < 0: lower
    }
    if (!std::isfinite(*t.loss_difference) || *t.loss_difference > o_.loss_tolerance)
      t.verdict = "loss differs by " + format("%.1f", 100 * *t.loss_difference) + "% (tolerance " +
                  format("%.1f", 100 * o_.loss_tolerance) + "%)";
  }

  void report(const TuneTrial& t) const {
    if (!note_) return;
    std::string what;
    for (const TuneChange& c : t.changes) what += (what.empty() ? "" : ", ") + c.option + "=" + c.value;
    note_("trial " + std::to_string(t.index) + " [" + (what.empty() ? "start" : what) +
          "]: " + (t.ran ? format("%.0f", t.items_per_s) + " items/s, " : "") + t.verdict);
  }

  TrainerConfig start_;
  const TaskFactory& make_task_;
  TuneOptions o_;
  const std::function<void(const std::string&)>& note_;
  Clock::time_point began_;
  double start_seconds_ = 0;
  std::vector<TuneTrial> trials_;
  int64_t best_ = 0;
  int64_t warmup_ = 0;  // steps of the trial being run that are not timed
};

}  // namespace

double loss_trajectory_difference(const std::vector<double>& a, const std::vector<double>& b) {
  FT_CHECK(a.size() == b.size() && !a.empty(),
           "loss_trajectory_difference: expected two trajectories of the same "
           "positive length, found ",
           a.size(), " and ", b.size(), " steps");
  double sum = 0;
  for (size_t i = 0; i < a.size(); ++i) sum += std::abs(a[i] - b[i]) / std::abs(b[i]);
  return sum / static_cast<double>(a.size());
}

TuneResult tune(const TrainerConfig& start, const TaskFactory& make_task, const TuneOptions& options,
                const std::function<void(const std::string&)>& note) {
  FT_CHECK(options.budget_s > 0, "tune: expected a positive budget, found ", options.budget_s, " s");
  FT_CHECK(options.trial_steps >= 2 && options.warmup_steps >= 0, "tune: expected trial_steps >= 2 and warmup_steps ",
           ">= 0, found ", options.trial_steps, " and ", options.warmup_steps);
  FT_CHECK(!options.out_dir.empty(), "tune: expected an output folder, found none");
  start.validate();
  return Tuner(start, make_task, options, note).run();
}

TrainerConfig tuned_config(const TrainerConfig& start, const TuneResult& result) {
  TrainerConfig c = start;
  for (const TuneChange& change : result.trials.at(result.best).changes) set_field(c, change.option, change.value);
  return c;
}

std::string tune_table(const TuneResult& result) {
  std::ostringstream os;
  char line[1024];
  std::snprintf(line, sizeof line, "%-5s %11s %9s %9s %9s %8s  %-34s %s\n", "trial", "items/s", "step ms", "wait ms",
                "peak MiB", "loss", "verdict", "settings");
  os << line;
  for (const TuneTrial& t : result.trials) {
    std::string what;
    for (const TuneChange& c : t.changes) what += (what.empty() ? "" : " ") + c.option + "=" + c.value;
    if (what.empty()) what = "(start)";
    const double final_loss = t.losses.empty() ? NAN : t.losses.back();
    std::snprintf(line, sizeof line, "%-5lld %11.1f %9.2f %9.2f %9.1f %8.4f  %-34s %s\n",
                  static_cast<long long>(t.index), t.items_per_s, t.step_ms, t.data_wait_ms, t.peak_bytes / 1048576.0,
                  final_loss, t.verdict.c_str(), what.c_str());
    os << line;
  }
  return os.str();
}

void write_tune_outputs(const TrainerConfig& start, const TuneResult& result, const std::string& out_dir) {
  fs::create_directories(out_dir);
  std::string csv =
      "trial,settings,items_per_s,step_ms,data_wait_ms,peak_bytes,final_loss,loss_difference,kept,verdict\n";
  for (const TuneTrial& t : result.trials) {
    std::string what;
    for (const TuneChange& c : t.changes) what += (what.empty() ? "" : " ") + c.option + "=" + c.value;
    std::string verdict = t.verdict;
    std::replace(verdict.begin(), verdict.end(), ',', ';');
    std::replace(verdict.begin(), verdict.end(), '\n', ' ');
    csv += std::to_string(t.index) + "," + what + "," + format("%.3f", t.items_per_s) + "," +
           format("%.3f", t.step_ms) + "," + format("%.3f", t.data_wait_ms) + "," + std::to_string(t.peak_bytes) + "," +
           (t.losses.empty() ? "" : format("%.6g", t.losses.back())) + "," +
           (t.loss_difference ? format("%.6g", *t.loss_difference) : "") + "," + (t.kept ? "1" : "0") + "," + verdict +
           "\n";
  }
  write_file_atomically(out_dir + "/tune.csv", csv);
  const TuneTrial& best = result.trials.at(result.best);
  std::string header = "# fasttrain tune: trial " + std::to_string(best.index) + ", " + format("%.2f", result.speedup) +
                       "x the starting configuration's " + format("%.0f", result.trials[0].items_per_s) + " items/s (" +
                       format("%.0f", best.items_per_s) + " measured); every trial in tune.csv\n";
  write_file_atomically(out_dir + "/run.toml", header + config_to_toml(tuned_config(start, result)));
}

}  // namespace ft::train
