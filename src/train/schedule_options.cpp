// The Trainer's schedule options (train.h's ScheduleOptions): one struct of parameters per kind,
// switching kind keeps the parameters both kinds have, and the kind's schedule is made from them.
#include <algorithm>
#include <utility>

#include "fasttrain/train.h"

namespace ft::train {

namespace {

using optim::ScheduleKind;

// Alternative i of ScheduleParams must be the schedule of kind i: kind() is the variant's index.
template <size_t... I>
constexpr bool alternatives_follow_kinds(std::index_sequence<I...>) {
  return ((std::variant_alternative_t<I, ScheduleParams>::kind == static_cast<ScheduleKind>(I)) && ...);
}
static_assert(alternatives_follow_kinds(std::make_index_sequence<std::variant_size_v<ScheduleParams>>{}));

struct ParameterHelp {
  const char* name;
  const char* help;
};
constexpr ParameterHelp kParameterHelp[] = {
    {"min_lr", "cosine, wsd: final learning rate; cyclic: the bottom of the cycle"},
    {"warmup_steps", "cosine, wsd: steps of linear warmup"},
    {"step_size", "step: decay every N steps; cyclic: steps of the rising half cycle"},
    {"step_size_down", "cyclic: steps of the falling half cycle (0: step_size)"},
    {"gamma", "step, multistep, exponential, cyclic exp_range: decay factor"},
    {"milestones", "multistep: comma-separated steps where the lr is multiplied by gamma"},
    {"start_factor", "linear: lr factor at step 0"},
    {"end_factor", "linear: lr factor after linear_steps"},
    {"linear_steps", "linear: steps from start_factor to end_factor"},
    {"decay_steps", "wsd: steps of the final linear decay (0: a fifth of max_steps)"},
    {"pct_start", "onecycle: fraction of the steps spent increasing the lr"},
    {"anneal_strategy", "onecycle: cos or linear"},
    {"div_factor", "onecycle: initial lr = lr / div_factor"},
    {"final_div_factor", "onecycle: final lr = initial lr / final_div_factor"},
    {"three_phase", "onecycle: three phases (up, down, annihilate) instead of two"},
    {"cyclic_mode", "cyclic: triangular, triangular2 or exp_range"},
    {"cycle_momentum", "onecycle, cyclic: cycle momentum (sgd/lars) or beta1 (adam family) inversely to the lr"},
    {"base_momentum", "onecycle, cyclic: lowest momentum"},
    {"max_momentum", "onecycle, cyclic: highest momentum"},
};

// Copies every parameter `from` and `to` both have (same name and type).
template <class From, class To>
void carry_shared(const From& from, To& to) {
  From::fields(from, [&](const char* name, const auto& value) {
    To::fields(to, [&](const char* to_name, auto& field) {
      if constexpr (std::is_same_v<std::decay_t<decltype(value)>, std::decay_t<decltype(field)>>)
        if (std::string_view(name) == to_name) field = value;
    });
  });
}

ScheduleParams default_params(ScheduleKind kind) {
  return [&]<size_t... I>(std::index_sequence<I...>) {
    ScheduleParams out;
    ((static_cast<size_t>(kind) == I ? (out = std::variant_alternative_t<I, ScheduleParams>{}, 0) : 0), ...);
    return out;
  }
  (std::make_index_sequence<std::variant_size_v<ScheduleParams>>{});
}

}  // namespace

const char* schedule_parameter_help(std::string_view name) {
  for (const ParameterHelp& p : kParameterHelp)
    if (name == p.name) return p.help;
  return "";
}

std::string schedule_kinds_with(std::string_view name) {
  std::string kinds;
  [&]<size_t... I>(std::index_sequence<I...>) {
    (
        [&] {
          using S = std::variant_alternative_t<I, ScheduleParams>;
          bool has = false;
          const S defaults{};
          S::fields(defaults, [&](const char* field, const auto&) { has = has || name == field; });
          if (has) kinds += (kinds.empty() ? "" : ", ") + std::string(name_of(S::kind));
        }(),
        ...);
  }
  (std::make_index_sequence<std::variant_size_v<ScheduleParams>>{});
  return kinds;
}

ScheduleOptions::ScheduleOptions(ScheduleParams p) : params(std::move(p)), text(name_of(kind())) {}

ScheduleOptions ScheduleOptions::parse(const char* option, const std::string& name) {
  return ScheduleOptions(default_params(parse_name<ScheduleKind>(std::string("option ") + option, name)));
}

void ScheduleOptions::switch_to(const char* option, const std::string& name) {
  const ScheduleKind wanted = parse_name<ScheduleKind>(std::string("option ") + option, name);
  if (wanted == kind()) return;  // naming the kind again keeps its parameters
  ScheduleParams next = default_params(wanted);
  std::visit([](const auto& from, auto& to) { carry_shared(from, to); }, params, next);
  *this = ScheduleOptions(std::move(next));
}

double* ScheduleOptions::min_lr() {
  return std::visit(
      [](auto& p) -> double* {
        if constexpr (requires { p.min_lr; })
          return &p.min_lr;
        else
          return nullptr;
      },
      params);
}

void ScheduleOptions::check_kind(ScheduleKind wanted) const {
  FT_CHECK(wanted == kind(), "schedule: the parameters of ", name_of(wanted), " were asked for; the schedule is ",
           name_of(kind()));
}

std::unique_ptr<optim::Schedule> make_schedule(const TrainerConfig& c) {
  const double lr = c.optimizer.lr;
  const int64_t total = c.max_steps;
  struct Make {
    double lr;
    int64_t total;
    optim::SchedulePtr operator()(const CosineSchedule& k) const {
      return optim::make_cosine_warmup_schedule(lr, k.warmup_steps, total, k.min_lr);
    }
    optim::SchedulePtr operator()(const ConstantSchedule&) const { return optim::make_constant_schedule(lr); }
    optim::SchedulePtr operator()(const StepSchedule& k) const {
      return optim::make_step_schedule(lr, k.step_size, k.gamma);
    }
    optim::SchedulePtr operator()(const MultiStepSchedule& k) const {
      FT_CHECK(!k.milestones.steps.empty(),
               "option milestones: the multistep schedule needs at least one milestone (e.g. --milestones 100,200)");
      return optim::make_multistep_schedule(lr, k.milestones.steps, k.gamma);
    }
    optim::SchedulePtr operator()(const ExponentialSchedule& k) const {
      return optim::make_exponential_schedule(lr, k.gamma);
    }
    optim::SchedulePtr operator()(const LinearSchedule& k) const {
      return optim::make_linear_schedule(lr, k.start_factor, k.end_factor, k.linear_steps);
    }
    optim::SchedulePtr operator()(const WsdSchedule& k) const {
      const int64_t decay = k.decay_steps > 0 ? k.decay_steps : std::max<int64_t>(1, total / 5);
      return optim::make_wsd_schedule(lr, k.warmup_steps, decay, total, k.min_lr);
    }
    optim::SchedulePtr operator()(const OneCycleSchedule& k) const {
      optim::OneCycleOptions o;
      o.max_lr = lr;
      o.total_steps = total;
      o.pct_start = k.pct_start;
      o.anneal_strategy = k.anneal_strategy;
      o.cycle_momentum = k.cycle_momentum;
      o.base_momentum = k.base_momentum;
      o.max_momentum = k.max_momentum;
      o.div_factor = k.div_factor;
      o.final_div_factor = k.final_div_factor;
      o.three_phase = k.three_phase;
      return optim::make_one_cycle_schedule(o);
    }
    optim::SchedulePtr operator()(const CyclicSchedule& k) const {
      optim::CyclicOptions o;
      o.base_lr = k.min_lr;
      o.max_lr = lr;
      o.step_size_up = k.step_size;
      o.step_size_down = k.step_size_down;
      o.mode = k.cyclic_mode;
      o.gamma = k.gamma;
      o.cycle_momentum = k.cycle_momentum;
      o.base_momentum = k.base_momentum;
      o.max_momentum = k.max_momentum;
      return optim::make_cyclic_schedule(o);
    }
  };
  return std::visit(Make{lr, total}, c.schedule.params);
}

}  // namespace ft::train
