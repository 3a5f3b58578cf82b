// --profile START:END and --memory-history for one Trainer::fit (fit.cpp calls before_step and
// after_step around every step and finish at the end): opens the profiler session and the memory
// history for the steps asked, labels what the Trainer knows (parameters, gradients, optimizer
// state, batches), and writes <run_dir>/profile/{trace.json, summary.json, memory.json}.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fasttrain/dist.h"
#include "fasttrain/loader.h"
#include "fasttrain/memory_history.h"
#include "fasttrain/nn.h"
#include "fasttrain/optim.h"
#include "fasttrain/profiler.h"
#include "fasttrain/train.h"

namespace ft::train {

// The per-step breakdown of a profiled range: time per phase, top ops by self time.
struct OpSummary {
  std::string name;
  int64_t calls = 0;
  double self_ms = 0, flops = 0, bytes = 0;
};
struct ProfileSummary {
  int64_t first_step = 0, last_step = 0, steps = 0;
  double step_ms = 0;                                    // mean
  std::vector<std::pair<std::string, double>> phase_ms;  // per step, "other" last
  std::vector<OpSummary> ops;                            // by self time, largest first
  double kernel_flops = 0;                               // per step
  profiler::PeakFlops peak;
};
ProfileSummary summarize(const std::vector<profiler::Span>& spans, const profiler::PeakFlops& peak);
std::string summary_json(const ProfileSummary& s, const memory::PeakReport* memory);
std::string summary_table(const ProfileSummary& s, size_t top_ops = 12);
std::string memory_table(const memory::PeakReport& r, size_t top_modules = 5);

// Labels every parameter, buffer, gradient and optimizer state tensor for the memory history.
void label_training_state(nn::Module& model, const optim::Optimizer& optimizer);
// Labels a batch's fields as data batches (the loader's buffers are made before recording).
void label_batch(const data::Batch& batch);

class ProfileRun {
 public:
  // nullptr when neither --profile nor --memory-history is set. `note` prints a line.
  // In a job of several processes every rank creates one with the job's communicator `job` and
  // a label for its process in the trace ("rank 2 (tp 0, dp 1, pp 0)"): every rank traces its
  // own steps (pipeline stages and tensor ranks do different work), and at the end rank 0
  // writes one trace.json holding every rank's lanes (a Chrome trace process per rank, with
  // its training, loader and communication threads), on a common time axis. Rank 0 alone writes
  // the summary, the advice and the memory history, from its own steps.
  static std::unique_ptr<ProfileRun> create(const TrainerConfig& c, std::string run_dir, nn::Module& model,
                                            const optim::Optimizer& optimizer,
                                            std::function<void(const std::string&)> note,
                                            std::shared_ptr<dist::Communicator> job = nullptr,
                                            std::string rank_label = {});
  ~ProfileRun();
  void before_step(int64_t step);  // the 1-based number of the step about to run
  void after_step(int64_t step);
  void finish();  // ends a range the run did not reach the end of, and writes the files

 private:
  ProfileRun() = default;
  void start();
  void stop_and_write();
  bool writes() const { return !job_ || job_->rank() == 0; }  // rank 0 (or a single process) writes the files
  // This rank's trace, or (rank 0) every rank's merged: a collective of the job.
  std::string job_trace() const;

  std::string dir_;
  TrainerConfig config_;  // what the advisor judges
  nn::Module* model_ = nullptr;
  const optim::Optimizer* optimizer_ = nullptr;
  std::function<void(const std::string&)> note_;
  bool trace_ = false, memory_ = false;
  int64_t first_ = 0, last_ = 0;
  bool started_ = false, done_ = false;
  profiler::PeakFlops peak_;
  std::unique_ptr<profiler::Session> session_;
  std::unique_ptr<profiler::StepScope> step_scope_;
  std::shared_ptr<dist::Communicator> job_;  // null: one process
  std::string rank_label_;
};

}  // namespace ft::train
