// Learning-rate schedules as pure functions of the step (include/fasttrain/schedule.h).
//
// PyTorch's step/multistep/exponential/linear schedulers update the rate recursively (each step
// multiplies the previous rate); here each value is computed in closed form from the step, which
// agrees with the recursion to rounding (a few ulps after hundreds of steps) and lets a resumed
// run, or a device-side step counter, get the value without replaying history. OneCycleLR and
// CyclicLR are closed-form in PyTorch too, and the arithmetic below follows theirs operation by
// operation (phase boundaries, cycle position) so that the values agree to the last bits.
#include "fasttrain/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/name_table.h"
#include "fasttrain/error.h"

namespace ft::optim {
namespace {

void check_lr(const char* schedule, const char* arg, double v) {
  FT_CHECK(std::isfinite(v) && v > 0, schedule, ": ", arg, " must be a finite positive number, found ", v);
}
void check_nonnegative(const char* schedule, const char* arg, double v) {
  FT_CHECK(std::isfinite(v) && v >= 0, schedule, ": ", arg, " must be a finite number >= 0, found ", v);
}
// The momentum (or Adam beta1) range a cycling schedule moves through.
void check_cycled_momentum(const char* schedule, double base, double max) {
  check_nonnegative(schedule, "base_momentum", base);
  check_nonnegative(schedule, "max_momentum", max);
  FT_CHECK(base < 1 && max < 1, schedule, ": base_momentum and max_momentum must be < 1, found ", base, " and ", max);
}
void check_step(const char* schedule, int64_t step) {
  FT_CHECK(step >= 0, schedule, ": step must be >= 0, found ", step);
}

// Cosine from `start` (pct 0) to `end` (pct 1), as PyTorch's OneCycleLR writes it.
double anneal_cos(double start, double end, double pct) {
  const double cos_out = std::cos(std::numbers::pi * pct) + 1;
  return end + (start - end) / 2.0 * cos_out;
}
double anneal_linear(double start, double end, double pct) { return (end - start) * pct + start; }

class ConstantSchedule final : public Schedule {
 public:
  explicit ConstantSchedule(double base_lr) : base_lr_(base_lr) {}
  double lr(int64_t step) const override {
    check_step("constant schedule", step);
    return base_lr_;
  }
  std::string name() const override { return "constant"; }

 private:
  double base_lr_;
};

class StepSchedule final : public Schedule {
 public:
  StepSchedule(double base_lr, int64_t step_size, double gamma)
      : base_lr_(base_lr), step_size_(step_size), gamma_(gamma) {}
  double lr(int64_t step) const override {
    check_step("step schedule", step);
    return base_lr_ * std::pow(gamma_, static_cast<double>(step / step_size_));
  }
  std::string name() const override { return "step"; }

 private:
  double base_lr_;
  int64_t step_size_;
  double gamma_;
};

class MultiStepSchedule final : public Schedule {
 public:
  MultiStepSchedule(double base_lr, std::vector<int64_t> milestones, double gamma)
      : base_lr_(base_lr), milestones_(std::move(milestones)), gamma_(gamma) {}
  double lr(int64_t step) const override {
    check_step("multistep schedule", step);
    const auto passed = std::upper_bound(milestones_.begin(), milestones_.end(), step) - milestones_.begin();
    return base_lr_ * std::pow(gamma_, static_cast<double>(passed));
  }
  std::string name() const override { return "multistep"; }

 private:
  double base_lr_;
  std::vector<int64_t> milestones_;
  double gamma_;
};

class ExponentialSchedule final : public Schedule {
 public:
  ExponentialSchedule(double base_lr, double gamma) : base_lr_(base_lr), gamma_(gamma) {}
  double lr(int64_t step) const override {
    check_step("exponential schedule", step);
    return base_lr_ * std::pow(gamma_, static_cast<double>(step));
  }
  std::string name() const override { return "exponential"; }

 private:
  double base_lr_, gamma_;
};

class LinearSchedule final : public Schedule {
 public:
  LinearSchedule(double base_lr, double start_factor, double end_factor, int64_t total_iters)
      : base_lr_(base_lr), start_(start_factor), end_(end_factor), total_(total_iters) {}
  double lr(int64_t step) const override {
    check_step("linear schedule", step);
    const double t = static_cast<double>(std::min(step, total_));
    return base_lr_ * (start_ + (end_ - start_) * t / static_cast<double>(total_));
  }
  std::string name() const override { return "linear"; }

 private:
  double base_lr_, start_, end_;
  int64_t total_;
};

// Linear warmup to base_lr over warmup steps (step k gets (k+1)/warmup of it), then a half cosine
// to min_lr reached at total_steps. The arithmetic is the Trainer's historical cosine schedule's.
class CosineWarmupSchedule final : public Schedule {
 public:
  CosineWarmupSchedule(double base_lr, int64_t warmup, int64_t total, double min_lr)
      : base_lr_(base_lr), min_lr_(min_lr), warmup_(warmup), total_(total) {}
  double lr(int64_t step) const override {
    check_step("cosine schedule", step);
    if (step < warmup_) return base_lr_ * static_cast<double>(step + 1) / static_cast<double>(warmup_);
    const double span = static_cast<double>(std::max<int64_t>(1, total_ - warmup_));
    const double progress = std::min(1.0, static_cast<double>(step - warmup_) / span);
    return min_lr_ + 0.5 * (base_lr_ - min_lr_) * (1.0 + std::cos(std::numbers::pi * progress));
  }
  std::string name() const override { return "cosine"; }

 private:
  double base_lr_, min_lr_;
  int64_t warmup_, total_;
};

// Warmup-stable-decay: the same warmup as the cosine schedule, a plateau at base_lr, and a linear
// decay over the last decay_steps that reaches min_lr at total_steps.
class WsdSchedule final : public Schedule {
 public:
  WsdSchedule(double base_lr, int64_t warmup, int64_t decay, int64_t total, double min_lr)
      : base_lr_(base_lr), min_lr_(min_lr), warmup_(warmup), decay_(decay), total_(total) {}
  double lr(int64_t step) const override {
    check_step("wsd schedule", step);
    if (step < warmup_) return base_lr_ * static_cast<double>(step + 1) / static_cast<double>(warmup_);
    if (step >= total_) return min_lr_;
    const int64_t decay_start = total_ - decay_;
    if (step < decay_start) return base_lr_;
    const double progress = static_cast<double>(step - decay_start) / static_cast<double>(decay_);
    return base_lr_ + (min_lr_ - base_lr_) * progress;
  }
  std::string name() const override { return "wsd"; }

 private:
  double base_lr_, min_lr_;
  int64_t warmup_, decay_, total_;
};

// OneCycleLR: phases end at fractional steps (pct_start*total - 1, ...) exactly as PyTorch places
// them; each phase anneals lr and momentum between its start and end values.
class OneCycleSchedule final : public Schedule {
 public:
  explicit OneCycleSchedule(const OneCycleOptions& o) : o_(o) {
    const double initial = o.max_lr / o.div_factor;
    const double min = initial / o.final_div_factor;
    const double up_end = static_cast<double>(o.pct_start * static_cast<double>(o.total_steps)) - 1;
    const double last = static_cast<double>(o.total_steps - 1);
    if (o.three_phase) {
      phases_ = {{up_end, initial, o.max_lr, o.max_momentum, o.base_momentum},
                 {2 * o.pct_start * static_cast<double>(o.total_steps) - 2, o.max_lr, initial, o.base_momentum,
                  o.max_momentum},
                 {last, initial, min, o.max_momentum, o.max_momentum}};
    } else {
      phases_ = {{up_end, initial, o.max_lr, o.max_momentum, o.base_momentum},
                 {last, o.max_lr, min, o.base_momentum, o.max_momentum}};
    }
  }
  double lr(int64_t step) const override { return at(step).first; }
  std::optional<double> momentum(int64_t step) const override {
    if (!o_.cycle_momentum) return std::nullopt;
    return at(step).second;
  }
  std::string name() const override { return "one_cycle"; }

 private:
  struct Phase {
    double end_step, start_lr, end_lr, start_momentum, end_momentum;
  };
  // (lr, momentum) at a step; steps past the end hold the final values (PyTorch raises there).
  std::pair<double, double> at(int64_t step) const {
    check_step("one_cycle schedule", step);
    const double s = static_cast<double>(std::min(step, o_.total_steps - 1));
    double start = 0;
    for (size_t i = 0; i < phases_.size(); ++i) {
      const Phase& p = phases_[i];
      if (s <= p.end_step || i + 1 == phases_.size()) {
        const double pct = (s - start) / (p.end_step - start);
        if (o_.anneal_strategy == AnnealStrategy::Cos)
          return {anneal_cos(p.start_lr, p.end_lr, pct), anneal_cos(p.start_momentum, p.end_momentum, pct)};
        return {anneal_linear(p.start_lr, p.end_lr, pct), anneal_linear(p.start_momentum, p.end_momentum, pct)};
      }
      start = p.end_step;
    }
    FT_FAIL("one_cycle schedule: no phase for step ", step);  // unreachable: the last phase takes all
  }
  OneCycleOptions o_;
  std::vector<Phase> phases_;
};

// CyclicLR: the position in the cycle x in [0, 1) rises over step_size_up steps and falls over
// step_size_down; the amplitude is scaled per cycle (triangular2) or per step (exp_range).
// Momentum moves opposite to the rate, from max_momentum down to base_momentum.
class CyclicSchedule final : public Schedule {
 public:
  explicit CyclicSchedule(const CyclicOptions& o) : o_(o) {
    const double up = static_cast<double>(o.step_size_up);
    const double down = o.step_size_down == 0 ? up : static_cast<double>(o.step_size_down);
    total_size_ = up + down;
    step_ratio_ = up / total_size_;
  }
  double lr(int64_t step) const override {
    const auto [height, scale] = position(step);
    return o_.base_lr + (o_.max_lr - o_.base_lr) * height * scale;
  }
  std::optional<double> momentum(int64_t step) const override {
    if (!o_.cycle_momentum) return std::nullopt;
    const auto [height, scale] = position(step);
    return o_.max_momentum - (o_.max_momentum - o_.base_momentum) * height * scale;
  }
  std::string name() const override { return "cyclic"; }

 private:
  // (fraction of the way up the triangle, amplitude scale) at a step.
  std::pair<double, double> position(int64_t step) const {
    check_step("cyclic schedule", step);
    const double s = static_cast<double>(step);
    const double cycle = std::floor(1 + s / total_size_);
    const double x = 1. + s / total_size_ - cycle;
    const double height = x <= step_ratio_ ? x / step_ratio_ : (x - 1) / (step_ratio_ - 1);
    double scale = 1;
    if (o_.mode == CyclicMode::Triangular2)
      scale = 1 / std::pow(2., cycle - 1);
    else if (o_.mode == CyclicMode::ExpRange)
      scale = std::pow(o_.gamma, s);
    return {height, scale};
  }
  CyclicOptions o_;
  double total_size_ = 0, step_ratio_ = 0;
};

}  // namespace

SchedulePtr make_constant_schedule(double base_lr) {
  check_lr("constant schedule", "base_lr", base_lr);
  return std::make_unique<ConstantSchedule>(base_lr);
}

SchedulePtr make_step_schedule(double base_lr, int64_t step_size, double gamma) {
  check_lr("step schedule", "base_lr", base_lr);
  FT_CHECK(step_size >= 1, "step schedule: step_size must be >= 1, found ", step_size);
  check_nonnegative("step schedule", "gamma", gamma);
  return std::make_unique<StepSchedule>(base_lr, step_size, gamma);
}

SchedulePtr make_multistep_schedule(double base_lr, std::vector<int64_t> milestones, double gamma) {
  check_lr("multistep schedule", "base_lr", base_lr);
  check_nonnegative("multistep schedule", "gamma", gamma);
  for (size_t i = 0; i < milestones.size(); ++i) {
    FT_CHECK(milestones[i] >= 0, "multistep schedule: milestones must be >= 0, found ", milestones[i], " at index ", i);
    FT_CHECK(i == 0 || milestones[i] > milestones[i - 1],
             "multistep schedule: milestones must be strictly increasing, found ", milestones[i], " after ",
             i == 0 ? 0 : milestones[i - 1], " at index ", i);
  }
  return std::make_unique<MultiStepSchedule>(base_lr, std::move(milestones), gamma);
}

SchedulePtr make_exponential_schedule(double base_lr, double gamma) {
  check_lr("exponential schedule", "base_lr", base_lr);
  check_lr("exponential schedule", "gamma", gamma);
  return std::make_unique<ExponentialSchedule>(base_lr, gamma);
}

SchedulePtr make_linear_schedule(double base_lr, double start_factor, double end_factor, int64_t total_iters) {
  check_lr("linear schedule", "base_lr", base_lr);
  // PyTorch's bounds: the recursive form divides by the start factor, so it must be positive.
  FT_CHECK(std::isfinite(start_factor) && start_factor > 0 && start_factor <= 1,
           "linear schedule: start_factor must be in (0, 1], found ", start_factor);
  FT_CHECK(std::isfinite(end_factor) && end_factor >= 0 && end_factor <= 1,
           "linear schedule: end_factor must be in [0, 1], found ", end_factor);
  FT_CHECK(total_iters >= 1, "linear schedule: total_iters must be >= 1, found ", total_iters);
  return std::make_unique<LinearSchedule>(base_lr, start_factor, end_factor, total_iters);
}

SchedulePtr make_cosine_warmup_schedule(double base_lr, int64_t warmup_steps, int64_t total_steps, double min_lr) {
  check_lr("cosine schedule", "base_lr", base_lr);
  FT_CHECK(warmup_steps >= 0, "cosine schedule: warmup_steps must be >= 0, found ", warmup_steps);
  FT_CHECK(total_steps >= 1, "cosine schedule: total_steps must be >= 1, found ", total_steps);
  FT_CHECK(std::isfinite(min_lr) && min_lr >= 0 && min_lr <= base_lr,
           "cosine schedule: min_lr must be in [0, base_lr = ", base_lr, "], found ", min_lr);
  return std::make_unique<CosineWarmupSchedule>(base_lr, warmup_steps, total_steps, min_lr);
}

SchedulePtr make_wsd_schedule(double base_lr, int64_t warmup_steps, int64_t decay_steps, int64_t total_steps,
                              double min_lr) {
  check_lr("wsd schedule", "base_lr", base_lr);
  FT_CHECK(warmup_steps >= 0, "wsd schedule: warmup_steps must be >= 0, found ", warmup_steps);
  FT_CHECK(decay_steps >= 1, "wsd schedule: decay_steps must be >= 1, found ", decay_steps);
  FT_CHECK(total_steps >= 1, "wsd schedule: total_steps must be >= 1, found ", total_steps);
  FT_CHECK(warmup_steps + decay_steps <= total_steps,
           "wsd schedule: warmup_steps + decay_steps must be <= ", "total_steps = ", total_steps, ", found ",
           warmup_steps, " + ", decay_steps);
  FT_CHECK(std::isfinite(min_lr) && min_lr >= 0 && min_lr <= base_lr,
           "wsd schedule: min_lr must be in [0, base_lr = ", base_lr, "], found ", min_lr);
  return std::make_unique<WsdSchedule>(base_lr, warmup_steps, decay_steps, total_steps, min_lr);
}

SchedulePtr make_one_cycle_schedule(const OneCycleOptions& o) {
  check_lr("one_cycle schedule", "max_lr", o.max_lr);
  FT_CHECK(o.total_steps >= 1, "one_cycle schedule: total_steps must be >= 1, found ", o.total_steps);
  FT_CHECK(o.pct_start >= 0 && o.pct_start <= 1, "one_cycle schedule: pct_start must be in [0, 1], found ",
           o.pct_start);
  // The warmup phase ends at pct_start*total_steps - 1; when that is step 0 the phase has no
  // length and its position is 0/0 (PyTorch divides by zero there too).
  FT_CHECK(o.pct_start * static_cast<double>(o.total_steps) != 1,
           "one_cycle schedule: pct_start * total_steps must not be 1 (an empty warmup phase), found ", o.pct_start,
           " * ", o.total_steps);
  check_lr("one_cycle schedule", "div_factor", o.div_factor);
  check_lr("one_cycle schedule", "final_div_factor", o.final_div_factor);
  if (o.cycle_momentum) check_cycled_momentum("one_cycle schedule", o.base_momentum, o.max_momentum);
  return std::make_unique<OneCycleSchedule>(o);
}

SchedulePtr make_cyclic_schedule(const CyclicOptions& o) {
  check_lr("cyclic schedule", "base_lr", o.base_lr);
  check_lr("cyclic schedule", "max_lr", o.max_lr);
  FT_CHECK(o.step_size_up >= 1, "cyclic schedule: step_size_up must be >= 1, found ", o.step_size_up);
  FT_CHECK(o.step_size_down >= 0, "cyclic schedule: step_size_down must be >= 0 (0: equal to step_size_up), found ",
           o.step_size_down);
  check_lr("cyclic schedule", "gamma", o.gamma);
  if (o.cycle_momentum) check_cycled_momentum("cyclic schedule", o.base_momentum, o.max_momentum);
  return std::make_unique<CyclicSchedule>(o);
}

namespace {
// In enum order (schedule.h); PyTorch's names.
constexpr NamedValue<ScheduleKind> kScheduleKinds[] = {{ScheduleKind::Cosine, "cosine"},
                                                       {ScheduleKind::Constant, "constant"},
                                                       {ScheduleKind::Step, "step"},
                                                       {ScheduleKind::MultiStep, "multistep"},
                                                       {ScheduleKind::Exponential, "exponential"},
                                                       {ScheduleKind::Linear, "linear"},
                                                       {ScheduleKind::Wsd, "wsd"},
                                                       {ScheduleKind::OneCycle, "onecycle"},
                                                       {ScheduleKind::Cyclic, "cyclic"}};
constexpr NamedValue<AnnealStrategy> kAnnealStrategies[] = {{AnnealStrategy::Cos, "cos"},
                                                            {AnnealStrategy::Linear, "linear"}};
constexpr NamedValue<CyclicMode> kCyclicModes[] = {{CyclicMode::Triangular, "triangular"},
                                                   {CyclicMode::Triangular2, "triangular2"},
                                                   {CyclicMode::ExpRange, "exp_range"}};
static_assert(ft::detail::rows_start_in_enum_order(kScheduleKinds, std::size(kScheduleKinds)) &&
                  ft::detail::rows_start_in_enum_order(kAnnealStrategies, std::size(kAnnealStrategies)) &&
                  ft::detail::rows_start_in_enum_order(kCyclicModes, std::size(kCyclicModes)),
              "one row per value, in enum order");
}  // namespace

std::span<const NamedValue<ScheduleKind>> option_names(ScheduleKind) { return kScheduleKinds; }
std::span<const NamedValue<AnnealStrategy>> option_names(AnnealStrategy) { return kAnnealStrategies; }
std::span<const NamedValue<CyclicMode>> option_names(CyclicMode) { return kCyclicModes; }

}  // namespace ft::optim
