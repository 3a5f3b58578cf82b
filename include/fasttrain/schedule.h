// Learning-rate (and momentum) schedules with torch.optim.lr_scheduler semantics. A schedule is
// a pure function of the step: value(step) is what the optimizer uses for its step-th update
// (0-based), so a resumed run needs only the step, and the CUDA graphs of a later issue can read
// the value from a device scalar written each step. Implemented in src/optim/schedule.cpp.
//
// Step counting follows PyTorch's usual loop (`opt.step(); sched.step()`): value(0) is the
// learning rate before any scheduler.step() call, value(k) the one after k calls.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fasttrain/names.h"

namespace ft::optim {

// The Trainer's schedules by kind (TrainerConfig::schedule; names: cosine, constant, step,
// multistep, exponential, linear, wsd, onecycle, cyclic).
enum class ScheduleKind { Cosine, Constant, Step, MultiStep, Exponential, Linear, Wsd, OneCycle, Cyclic };
// OneCycleLR's anneal_strategy: "cos" or "linear".
enum class AnnealStrategy { Cos, Linear };
// CyclicLR's mode: "triangular", "triangular2" or "exp_range".
enum class CyclicMode { Triangular, Triangular2, ExpRange };
std::span<const NamedValue<ScheduleKind>> option_names(ScheduleKind);  // names.h
std::span<const NamedValue<AnnealStrategy>> option_names(AnnealStrategy);
std::span<const NamedValue<CyclicMode>> option_names(CyclicMode);

class Schedule {
 public:
  virtual ~Schedule() = default;
  // The learning rate for the step-th update (step >= 0).
  virtual double lr(int64_t step) const = 0;
  // The momentum (SGD/LARS momentum, Adam-family beta1) for the step-th update when the schedule
  // cycles it (1cycle, cyclic with cycle_momentum); nullopt otherwise.
  virtual std::optional<double> momentum(int64_t /*step*/) const { return std::nullopt; }
  virtual std::string name() const = 0;
};
using SchedulePtr = std::unique_ptr<Schedule>;

// Each factory validates its arguments (positive sizes, factors in range, milestones increasing)
// and throws ft::Error naming the schedule, the argument, what was expected and what was found.

// ConstantLR with factor 1: always base_lr.
SchedulePtr make_constant_schedule(double base_lr);
// StepLR: base_lr * gamma^floor(step / step_size).
SchedulePtr make_step_schedule(double base_lr, int64_t step_size, double gamma = 0.1);
// MultiStepLR: base_lr * gamma^(number of milestones <= step).
SchedulePtr make_multistep_schedule(double base_lr, std::vector<int64_t> milestones, double gamma = 0.1);
// ExponentialLR: base_lr * gamma^step.
SchedulePtr make_exponential_schedule(double base_lr, double gamma);
// LinearLR: factor moves linearly from start_factor to end_factor over total_iters steps, then stays.
SchedulePtr make_linear_schedule(double base_lr, double start_factor = 1.0 / 3, double end_factor = 1.0,
                                 int64_t total_iters = 5);
// Linear warmup from base_lr/warmup_steps... to base_lr over warmup_steps, then a half cosine
// from base_lr to min_lr at total_steps (nanoGPT / HF get_cosine_schedule_with_warmup with a floor);
// min_lr after total_steps.
SchedulePtr make_cosine_warmup_schedule(double base_lr, int64_t warmup_steps, int64_t total_steps, double min_lr);
// Warmup-stable-decay: linear warmup over warmup_steps, base_lr until total_steps - decay_steps,
// then linear decay to min_lr at total_steps.
SchedulePtr make_wsd_schedule(double base_lr, int64_t warmup_steps, int64_t decay_steps, int64_t total_steps,
                              double min_lr);

// OneCycleLR with PyTorch's defaults.
struct OneCycleOptions {
  double max_lr = 0.1;
  int64_t total_steps = 100;
  double pct_start = 0.3;
  AnnealStrategy anneal_strategy = AnnealStrategy::Cos;
  bool cycle_momentum = true;
  double base_momentum = 0.85;
  double max_momentum = 0.95;
  double div_factor = 25;
  double final_div_factor = 1e4;
  bool three_phase = false;
};
SchedulePtr make_one_cycle_schedule(const OneCycleOptions& o);

// CyclicLR with PyTorch's defaults (scale_fn from the mode).
struct CyclicOptions {
  double base_lr = 1e-3;
  double max_lr = 6e-3;
  int64_t step_size_up = 2000;
  int64_t step_size_down = 0;  // 0: equal to step_size_up (PyTorch's None)
  CyclicMode mode = CyclicMode::Triangular;
  double gamma = 1.0;  // exp_range
  bool cycle_momentum = true;
  double base_momentum = 0.8;
  double max_momentum = 0.9;
};
SchedulePtr make_cyclic_schedule(const CyclicOptions& o);

}  // namespace ft::optim
