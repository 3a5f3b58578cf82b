// Learning-rate schedules (src/optim/schedule.cpp): every value against PyTorch 1.13's schedulers
// (tests/parity/cases_schedule.py), the cosine schedule against the Trainer's, properties that
// follow from the definitions, and argument validation.
#include <gtest/gtest.h>

#include <cmath>

#include "fasttrain/fasttrain.h"
#include "fasttrain/schedule.h"
#include "fasttrain/train.h"
#include "support/expect_error.h"
#include "support/parity.h"

using namespace ft;
using namespace ft::optim;
using test::expect_error;

namespace {

SchedulePtr schedule_from(const nlohmann::json& p) {
  const auto kind = p.at("kind").get<std::string>();
  if (kind == "constant") return make_constant_schedule(p["base_lr"]);
  if (kind == "step") return make_step_schedule(p["base_lr"], p["step_size"], p["gamma"]);
  if (kind == "multistep") return make_multistep_schedule(p["base_lr"], p["milestones"], p["gamma"]);
  if (kind == "exponential") return make_exponential_schedule(p["base_lr"], p["gamma"]);
  if (kind == "linear") return make_linear_schedule(p["base_lr"], p["start_factor"], p["end_factor"], p["total_iters"]);
  if (kind == "cosine")
    return make_cosine_warmup_schedule(p["base_lr"], p["warmup_steps"], p["total_steps"], p["min_lr"]);
  if (kind == "wsd")
    return make_wsd_schedule(p["base_lr"], p["warmup_steps"], p["decay_steps"], p["total_steps"], p["min_lr"]);
  if (kind == "one_cycle") {
    OneCycleOptions o;
    o.max_lr = p["max_lr"];
    o.total_steps = p["total_steps"];
    o.pct_start = p["pct_start"];
    o.anneal_strategy = parse_name<AnnealStrategy>("anneal_strategy", p["anneal_strategy"].get<std::string>());
    o.cycle_momentum = p["cycle_momentum"];
    o.base_momentum = p["base_momentum"];
    o.max_momentum = p["max_momentum"];
    o.div_factor = p["div_factor"];
    o.final_div_factor = p["final_div_factor"];
    o.three_phase = p["three_phase"];
    return make_one_cycle_schedule(o);
  }
  CyclicOptions o;
  o.base_lr = p["base_lr"];
  o.max_lr = p["max_lr"];
  o.step_size_up = p["step_size_up"];
  o.step_size_down = p["step_size_down"];
  o.mode = parse_name<CyclicMode>("mode", p["mode"].get<std::string>());
  o.gamma = p["gamma"];
  o.cycle_momentum = p["cycle_momentum"];
  o.base_momentum = p["base_momentum"];
  o.max_momentum = p["max_momentum"];
  return make_cyclic_schedule(o);
}

void check_against_pytorch(const std::string& name) {
  SCOPED_TRACE(name);
  FT_PARITY_CASE(c, "schedule_" + name);
  const auto schedule = schedule_from(c.params());
  const int64_t steps = c.param<int64_t>("steps");
  const bool cycled = c.params().value("cycle_momentum", false);
  std::vector<double> lrs, momenta;
  for (int64_t s = 0; s < steps; ++s) {
    lrs.push_back(schedule->lr(s));
    const auto m = schedule->momentum(s);
    EXPECT_EQ(m.has_value(), cycled) << "step " << s;
    momenta.push_back(m.value_or(0));
  }
  c.expect_output(from_vector(lrs, {steps}, DType::F64), 0);
  if (cycled) c.expect_output(from_vector(momenta, {steps}, DType::F64), 1);
}

}  // namespace

TEST(Schedule, ConstantMatchesPyTorch) { check_against_pytorch("constant"); }
TEST(Schedule, StepMatchesPyTorch) {
  check_against_pytorch("step");
  check_against_pytorch("step_every");
}
TEST(Schedule, MultiStepMatchesPyTorch) {
  check_against_pytorch("multistep");
  check_against_pytorch("multistep_at_zero");
}
TEST(Schedule, ExponentialMatchesPyTorch) { check_against_pytorch("exponential"); }
TEST(Schedule, LinearMatchesPyTorch) {
  check_against_pytorch("linear_default");
  check_against_pytorch("linear_to_zero");
  check_against_pytorch("linear_down");
}
TEST(Schedule, CosineWarmupMatchesFormula) {
  check_against_pytorch("cosine");
  check_against_pytorch("cosine_no_warmup");
  check_against_pytorch("cosine_long_warmup");
}
TEST(Schedule, WarmupStableDecayMatchesFormula) {
  check_against_pytorch("wsd");
  check_against_pytorch("wsd_no_warmup");
}
TEST(Schedule, OneCycleMatchesPyTorch) {
  for (const char* n : {"one_cycle_default", "one_cycle_linear", "one_cycle_three_phase",
                        "one_cycle_three_phase_linear", "one_cycle_options", "one_cycle_no_momentum", "one_cycle_tiny"})
    check_against_pytorch(n);
}
TEST(Schedule, OneCycleBeta1MatchesPyTorchAdam) {
  check_against_pytorch("one_cycle_adam");
  check_against_pytorch("one_cycle_adam_three_phase_linear");
}
TEST(Schedule, CyclicMatchesPyTorch) {
  for (const char* n : {"cyclic_triangular", "cyclic_triangular_asymmetric", "cyclic_triangular2", "cyclic_exp_range",
                        "cyclic_no_momentum"})
    check_against_pytorch(n);
}

TEST(Schedule, OneCycleHoldsFinalValuesPastTheEnd) {
  OneCycleOptions o;
  o.total_steps = 20;
  const auto s = make_one_cycle_schedule(o);
  EXPECT_DOUBLE_EQ(s->lr(19), o.max_lr / o.div_factor / o.final_div_factor);
  EXPECT_EQ(s->lr(25), s->lr(19));
  EXPECT_EQ(*s->momentum(25), *s->momentum(19));
  EXPECT_DOUBLE_EQ(*s->momentum(19), o.max_momentum);
}

TEST(Schedule, NamesAndNoMomentumWhereNotCycled) {
  EXPECT_EQ(make_step_schedule(0.1, 2)->name(), "step");
  EXPECT_EQ(make_wsd_schedule(0.1, 1, 2, 5, 0)->name(), "wsd");
  EXPECT_FALSE(make_cosine_warmup_schedule(0.1, 1, 5, 0)->momentum(3).has_value());
  CyclicOptions c;
  c.cycle_momentum = false;
  EXPECT_FALSE(make_cyclic_schedule(c)->momentum(3).has_value());
}

TEST(Schedule, RejectsBadArguments) {
  expect_error([] { make_constant_schedule(0); },
               "constant schedule: base_lr must be a finite positive number, found 0");
  expect_error([] { make_constant_schedule(NAN); }, "base_lr");
  expect_error([] { make_step_schedule(0.1, 0); }, "step schedule: step_size must be >= 1, found 0");
  expect_error([] { make_step_schedule(0.1, 2, -1); }, "step schedule: gamma");
  expect_error([] { make_multistep_schedule(0.1, {3, 3}); }, "milestones must be strictly increasing, found 3 after 3");
  expect_error([] { make_multistep_schedule(0.1, {-1}); }, "milestones must be >= 0, found -1");
  expect_error([] { make_exponential_schedule(0.1, 0); }, "exponential schedule: gamma");
  expect_error([] { make_linear_schedule(0.1, 0); }, "linear schedule: start_factor must be in (0, 1], found 0");
  expect_error([] { make_linear_schedule(0.1, 0.5, 1.5); }, "end_factor must be in [0, 1], found 1.5");
  expect_error([] { make_linear_schedule(0.1, 0.5, 1, 0); }, "total_iters must be >= 1, found 0");
  expect_error([] { make_cosine_warmup_schedule(0.1, -1, 10, 0); }, "cosine schedule: warmup_steps must be >= 0");
  expect_error([] { make_cosine_warmup_schedule(0.1, 1, 0, 0); }, "total_steps must be >= 1, found 0");
  expect_error([] { make_cosine_warmup_schedule(0.1, 1, 10, 0.2); }, "min_lr must be in [0, base_lr = 0.1], found 0.2");
  expect_error([] { make_wsd_schedule(0.1, 5, 6, 10, 0); },
               "wsd schedule: warmup_steps + decay_steps must be <= total_steps = 10, found 5 + 6");
  expect_error([] { make_wsd_schedule(0.1, 0, 0, 10, 0); }, "decay_steps must be >= 1, found 0");

  OneCycleOptions o;
  o.pct_start = 1.5;
  expect_error([&] { make_one_cycle_schedule(o); }, "one_cycle schedule: pct_start must be in [0, 1], found 1.5");
  o = {};
  o.total_steps = 0;
  expect_error([&] { make_one_cycle_schedule(o); }, "total_steps must be >= 1, found 0");
  // anneal_strategy and mode are enums; their names are checked where text becomes one.
  expect_error([] { parse_name<AnnealStrategy>("anneal_strategy", "cosine"); },
               "anneal_strategy: expected cos or linear, found 'cosine'");
  o = {};
  o.total_steps = 10;
  o.pct_start = 0.1;
  expect_error([&] { make_one_cycle_schedule(o); }, "pct_start * total_steps must not be 1");
  o = {};
  o.max_momentum = 1.0;
  expect_error([&] { make_one_cycle_schedule(o); }, "max_momentum must be < 1");
  o = {};
  o.div_factor = 0;
  expect_error([&] { make_one_cycle_schedule(o); }, "div_factor");

  expect_error([] { parse_name<CyclicMode>("mode", "triangle"); },
               "mode: expected triangular, triangular2 or exp_range, found 'triangle'");
  CyclicOptions c;
  c.step_size_up = 0;
  expect_error([&] { make_cyclic_schedule(c); }, "step_size_up must be >= 1, found 0");
  c = {};
  c.step_size_down = -2;
  expect_error([&] { make_cyclic_schedule(c); }, "step_size_down must be >= 0");
  c = {};
  c.max_lr = -1;
  expect_error([&] { make_cyclic_schedule(c); }, "cyclic schedule: max_lr must be a finite positive number, found -1");

  expect_error([] { make_step_schedule(0.1, 2)->lr(-1); }, "step schedule: step must be >= 0, found -1");
}
