// Optimizers (src/optim/): PyTorch parity of whole trajectories (LAMB and LARS against reference
// implementations in tests/parity/cases_optim.py), state save/load, master weights for bf16
// parameters, option and state validation, the found_inf skip, the multi-tensor pass's properties
// (no allocation per step, results independent of the thread count), and gradient clipping.
#include <gtest/gtest.h>

#include <filesystem>

#include "fasttrain/fasttrain.h"
#include "fasttrain/optim.h"
#include "fasttrain/safetensors.h"
#include "support/expect_error.h"
#include "support/parity.h"

using namespace ft;
using namespace ft::optim;
using test::expect_error;

namespace {

std::unique_ptr<Optimizer> make(const std::string& kind, std::vector<ParamGroup> groups) {
  if (kind == "sgd") return make_sgd(std::move(groups));
  if (kind == "adam") return make_adam(std::move(groups));
  if (kind == "lamb") return make_lamb(std::move(groups));
  if (kind == "lars") return make_lars(std::move(groups));
  return make_adamw(std::move(groups));
}

GroupOptions options_from(const nlohmann::json& g) {
  GroupOptions o;
  o.lr = g.at("lr").get<double>();
  o.weight_decay = g.value("weight_decay", 0.0);
  o.momentum = g.value("momentum", 0.0);
  o.dampening = g.value("dampening", 0.0);
  o.nesterov = g.value("nesterov", false);
  o.beta1 = g.value("beta1", 0.9);
  o.beta2 = g.value("beta2", 0.999);
  o.eps = g.value("eps", 1e-8);
  o.trust_coefficient = g.value("trust_coefficient", 0.001);
  o.exclude_from_adaptation = g.value("exclude_from_adaptation", false);
  return o;
}

void check_trajectory(const std::string& name) {
  SCOPED_TRACE(name);
  FT_PARITY_CASE(c, name);
  const int n = c.param<int>("nparams"), steps = c.param<int>("steps");
  std::vector<Tensor> params;
  for (int k = 0; k < n; ++k) params.push_back(c.input("p" + std::to_string(k)).clone().requires_grad_());
  std::vector<ParamGroup> groups;
  for (const auto& g : c.params()["groups"]) {
    ParamGroup pg;
    for (int k : g["params"]) pg.params.push_back(params[k]);
    pg.options = options_from(g);
    groups.push_back(pg);
  }
  auto opt = make(c.param<std::string>("kind"), groups);
  for (int s = 0; s < steps; ++s) {
    for (int k = 0; k < n; ++k) {
      const std::string g = "g" + std::to_string(k) + "_" + std::to_string(s);
      params[k].set_grad(c.has(g) ? c.input(g) : Tensor());
    }
    opt->step();
    for (int k = 0; k < n; ++k) c.expect_output(params[k], s * n + k);
  }
  EXPECT_EQ(opt->step_count(), steps);
}

// A model-like parameter list: matrices and vectors, with deterministic gradients per step.
std::vector<Tensor> make_params(int count, DType dtype = DType::F32, uint64_t seed = 1) {
  Generator gen(seed);
  std::vector<Tensor> ps;
  for (int i = 0; i < count; ++i) {
    Shape s = i % 3 == 2 ? Shape{17 + i} : Shape{8 + i, 5};
    ps.push_back(randn(s, DType::F32, &gen).to(dtype).requires_grad_());
  }
  return ps;
}

void set_grads(const std::vector<Tensor>& ps, int step, DType dtype = DType::F32) {
  Generator gen(1000 + step);
  for (const auto& p : ps) p.set_grad(randn(p.shape(), DType::F32, &gen).to(dtype));
}

std::vector<ParamGroup> two_groups(const std::vector<Tensor>& ps, const GroupOptions& o) {
  ParamGroup a{{}, o, "decay"}, b{{}, o, "no_decay"};
  b.options.lr = o.lr / 3;
  b.options.weight_decay = 0;
  for (const auto& p : ps) (p.dim() >= 2 ? a : b).params.push_back(p);
  return {a, b};
}

std::vector<Tensor> clones(const std::vector<Tensor>& ps) {
  std::vector<Tensor> out;
  for (const auto& p : ps) out.push_back(p.detach().clone().requires_grad_());
  return out;
}

void expect_identical(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].to_vector(), b[i].to_vector()) << "parameter " << i;
}

}  // namespace

TEST(OptimParity, Sgd) {
  for (const char* dt : {"f32", "f64"})
    for (const char* v : {"plain", "momentum_wd", "dampening", "nesterov", "groups"})
      check_trajectory(std::string("sgd_") + v + "_" + dt);
}

TEST(OptimParity, Adam) {
  for (const char* dt : {"f32", "f64"}) {
    check_trajectory(std::string("adam_") + dt);
    check_trajectory(std::string("adam_l2_") + dt);
  }
}

TEST(OptimParity, AdamW) {
  for (const char* dt : {"f32", "f64"}) {
    check_trajectory(std::string("adamw_") + dt);
    check_trajectory(std::string("adamw_groups_") + dt);
  }
}

TEST(OptimParity, Lamb) {
  for (const char* dt : {"f32", "f64"}) check_trajectory(std::string("lamb_") + dt);
}

TEST(OptimParity, Lars) {
  for (const char* dt : {"f32", "f64"}) {
    check_trajectory(std::string("lars_") + dt);
    check_trajectory(std::string("lars_nesterov_") + dt);
  }
}

// Saving after 3 steps and loading into a fresh optimizer continues exactly the same trajectory.
TEST(OptimState, SaveLoadContinuesIdentically) {
  const auto dir = std::filesystem::temp_directory_path() / ("ft_optim_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  for (const std::string kind : {"sgd", "adam", "adamw", "lamb", "lars"}) {
    SCOPED_TRACE(kind);
    for (DType dt : {DType::F32, DType::BF16}) {
      GroupOptions o;
      o.lr = 0.01;
      o.weight_decay = 0.1;
      o.momentum = 0.9;
      std::vector<Tensor> a = make_params(6, dt);
      auto opt_a = make(kind, two_groups(a, o));
      for (int s = 0; s < 3; ++s) {
        set_grads(a, s, dt);
        opt_a->step();
      }
      const std::string file = (dir / (kind + ".safetensors")).string();
      save_safetensors(file, opt_a->state_tensors(), opt_a->state_metadata());

      std::vector<Tensor> b = clones(a);
      GroupOptions other = o;
      other.lr = 5;  // restored from the metadata
      auto opt_b = make(kind, two_groups(b, other));
      SafetensorsFile f = load_safetensors(file);
      opt_b->load_state_tensors(f.tensors);
      opt_b->load_state_metadata(f.metadata);
      EXPECT_EQ(opt_b->step_count(), 3);
      EXPECT_EQ(opt_b->param_groups()[1].options.lr, o.lr / 3);
      for (int s = 3; s < 6; ++s) {
        set_grads(a, s, dt);
        set_grads(b, s, dt);
        opt_a->step();
        opt_b->step();
      }
      expect_identical(a, b);
    }
  }
  std::filesystem::remove_all(dir);
}

TEST(OptimState, NamesAndContents) {
  std::vector<Tensor> ps = make_params(3);
  GroupOptions o;
  auto opt = make_adamw({{{ps[0], ps[1]}, o, "decay"}, {{ps[2]}, o, "no_decay"}});
  ps[1].set_grad(ones_like(ps[1]));
  opt->step();
  std::vector<std::string> names;
  for (const auto& [n, t] : opt->state_tensors()) names.push_back(n);
  // Only the parameter that had a gradient has state.
  EXPECT_EQ(names, (std::vector<std::string>{"0.1.step", "0.1.exp_avg", "0.1.exp_avg_sq"}));
  EXPECT_EQ(opt->state_tensors()[0].second.item<int64_t>(), 1);
  EXPECT_EQ(opt->state_tensors()[0].second.dtype(), DType::I64);
  auto meta = opt->state_metadata();
  EXPECT_EQ(meta.at("optimizer"), "adamw");
  EXPECT_EQ(meta.at("1.name"), "no_decay");
  EXPECT_EQ(std::stod(meta.at("0.eps")), 1e-8);
  // SGD without momentum keeps only the step count.
  auto sgd = make_sgd({{{ps[0]}, o, ""}});
  ps[0].set_grad(ones_like(ps[0]));
  sgd->step();
  EXPECT_EQ(sgd->state_tensors().size(), 1u);
}

TEST(OptimState, LoadRejectsMismatchesAndChangesNothing) {
  std::vector<Tensor> ps = make_params(3);
  GroupOptions o;
  auto opt = make_adam({{ps, o, "all"}});
  set_grads(ps, 0);
  opt->step();
  TensorMap good = opt->state_tensors();
  const std::vector<double> before = good[1].second.to_vector();
  auto with = [&](const std::string& key, Tensor t) {
    TensorMap m = good;
    for (auto& [n, v] : m)
      if (n == key) v = t;
    if (std::none_of(m.begin(), m.end(), [&](auto& e) { return e.first == key; })) m.emplace_back(key, t);
    return m;
  };
  auto without = [&](const std::string& key) {
    TensorMap m;
    for (auto& e : good)
      if (e.first != key) m.push_back(e);
    return m;
  };
  TensorMap bad_value = with("0.0.exp_avg", full(ps[0].shape(), 123.0));
  bad_value.emplace_back("0.9.exp_avg", zeros({1}));  // fails after a valid entry was read
  expect_error([&] { opt->load_state_tensors(bad_value); }, "entry '0.9.exp_avg' is for parameter 9 but group 0 has 3");
  expect_error(
      [&] {
        opt->load_state_tensors(with("0.0.exp_avg", zeros({2, 2})));
      },
      "adam state: entry '0.0.exp_avg' has shape [2, 2], the parameter [8, 5]");
  expect_error([&] { opt->load_state_tensors(with("0.0.exp_avg", zeros(ps[0].shape(), DType::F64))); },
               "entry '0.0.exp_avg' has dtype f64, expected f32");
  expect_error([&] { opt->load_state_tensors(without("0.1.exp_avg_sq")); }, "entry '0.1.exp_avg_sq' is missing");
  expect_error([&] { opt->load_state_tensors(with("1.0.step", scalar_tensor(int64_t{1}, DType::I64))); },
               "is for group 1 but the optimizer has 1 groups");
  expect_error([&] { opt->load_state_tensors(with("0.0.momentum_buffer", zeros(ps[0].shape()))); },
               "'momentum_buffer' is not a state of f32 parameters of this adam group");
  expect_error([&] { opt->load_state_tensors(with("exp_avg", zeros({1}))); }, "is not named <group>.<index>.<state>");
  expect_error([&] { opt->load_state_tensors(with("0.0.step", scalar_tensor(1.5))); }, "must be one integer");
  EXPECT_EQ(opt->state_tensors()[1].second.to_vector(), before);

  auto meta = opt->state_metadata();
  meta["optimizer"] = "sgd";
  expect_error([&] { opt->load_state_metadata(meta); }, "saved by optimizer 'sgd', expected 'adam'");
  meta = opt->state_metadata();
  meta["0.lr"] = "fast";
  expect_error([&] { opt->load_state_metadata(meta); }, "metadata '0.lr' is not a number: 'fast'");
  EXPECT_EQ(opt->param_groups()[0].options.lr, o.lr);
}

// bf16 parameters are updated through an fp32 master copy: the master follows exactly the
// trajectory of an f32 parameter, and the bf16 parameter is its rounding.
TEST(OptimMasterWeights, Bf16FollowsTheF32Trajectory) {
  for (const std::string kind : {"sgd", "adamw", "lamb", "lars"}) {
    SCOPED_TRACE(kind);
    std::vector<Tensor> low = make_params(4, DType::BF16);
    std::vector<Tensor> ref;
    for (const auto& p : low) ref.push_back(p.detach().to(DType::F32).requires_grad_());
    GroupOptions o;
    o.lr = 1e-4;  // updates far below bf16 resolution: lost without a master copy
    o.momentum = 0.9;
    o.weight_decay = 0.1;
    auto opt_low = make(kind, {{low, o, ""}});
    auto opt_ref = make(kind, {{ref, o, ""}});
    for (int s = 0; s < 4; ++s) {
      set_grads(low, s, DType::BF16);
      for (size_t i = 0; i < ref.size(); ++i) ref[i].set_grad(low[i].grad().to(DType::F32));
      opt_low->step();
      opt_ref->step();
    }
    TensorMap state = opt_low->state_tensors();
    for (size_t i = 0; i < low.size(); ++i) {
      const std::string master = "0." + std::to_string(i) + ".master";
      auto it = std::find_if(state.begin(), state.end(), [&](auto& e) { return e.first == master; });
      ASSERT_NE(it, state.end()) << master;
      EXPECT_EQ(it->second.to_vector(), ref[i].to_vector());
      EXPECT_EQ(low[i].to_vector(), ref[i].to(DType::BF16).to_vector());
    }
  }
}

// Per-tensor norms (LAMB, LARS) are summed in fixed blocks in a fixed order, so they too give
// bitwise the same trajectory for any thread count.
TEST(OptimMultiTensor, ResultsDoNotDependOnThreadCount) {
  const int threads = get_num_threads();
  for (const std::string kind : {"adamw", "lamb", "lars"}) {
    SCOPED_TRACE(kind);
    std::vector<std::vector<Tensor>> results;
    for (int t : {1, 2, 3}) {
      set_num_threads(t);
      Generator gen(3);
      std::vector<Tensor> ps{randn({300, 301}, DType::F32, &gen).requires_grad_(),
                             randn({7}, DType::F32, &gen).requires_grad_(),
                             randn({50000}, DType::F32, &gen).requires_grad_()};
      GroupOptions o;
      o.weight_decay = 0.1;
      o.momentum = 0.9;
      auto opt = make(kind, {{ps, o, ""}});
      for (int s = 0; s < 3; ++s) {
        set_grads(ps, s);
        opt->step();
      }
      results.push_back(ps);
    }
    set_num_threads(threads);
    expect_identical(results[0], results[1]);
    expect_identical(results[0], results[2]);
  }
}

// Once the state exists a step allocates nothing from the tensor allocator.
TEST(OptimMultiTensor, NoAllocationPerStep) {
  for (const std::string kind : {"sgd", "adam", "adamw", "lamb", "lars"}) {
    SCOPED_TRACE(kind);
    std::vector<Tensor> ps = make_params(50);
    GroupOptions o;
    o.momentum = 0.9;
    auto opt = make(kind, two_groups(ps, o));
    set_grads(ps, 0);
    opt->step();  // creates the state
    auto& alloc = allocator_for(Device::cpu());
    Tensor clean = scalar_tensor(0.0f), overflow = scalar_tensor(1.0f);
    const int64_t before = alloc.stats().num_allocs;
    for (int s = 0; s < 3; ++s) opt->step();
    opt->step(clean);
    opt->step(overflow);
    EXPECT_EQ(alloc.stats().num_allocs, before);
  }
}

TEST(Optim, SkipsParametersWithoutGradient) {
  std::vector<Tensor> ps = make_params(2);
  const std::vector<double> before0 = ps[0].to_vector(), before1 = ps[1].to_vector();
  auto opt = make_adamw({{ps, GroupOptions{}, ""}});
  ps[0].set_grad(ones_like(ps[0]));
  const uint32_t version0 = ps[0].version(), version1 = ps[1].version();
  opt->step();
  EXPECT_NE(ps[0].to_vector(), before0);
  EXPECT_GT(ps[0].version(), version0);  // in-place update is visible to autograd's checks
  EXPECT_EQ(ps[1].to_vector(), before1);
  EXPECT_EQ(ps[1].version(), version1);
}

// step(found_inf): a set flag leaves parameters, moments and step counts bitwise unchanged, so a
// run with a skipped step continues exactly like a run that never saw it (bias correction and
// SGD's first momentum step included); a clear flag is the same as step().
TEST(OptimSkip, SkippedStepChangesNothing) {
  for (const std::string kind : {"sgd", "adam", "adamw", "lamb", "lars"}) {
    SCOPED_TRACE(kind);
    for (DType dt : {DType::F32, DType::BF16}) {
      GroupOptions o;
      o.lr = 0.01;
      o.momentum = 0.9;
      o.weight_decay = 0.1;
      std::vector<Tensor> a = make_params(4, dt), b = clones(a), c = clones(a);
      auto opt_a = make(kind, two_groups(a, o)), opt_b = make(kind, two_groups(b, o)),
           opt_c = make(kind, two_groups(c, o));
      Tensor overflow = scalar_tensor(1.0f), clean = scalar_tensor(0.0f);
      // a: its very first step is skipped; then a, b (no skipped step) and c (clear flag) agree.
      set_grads(a, 99, dt);
      opt_a->step(overflow);
      expect_identical(a, b);
      EXPECT_TRUE(opt_a->state_tensors().empty());  // no state yet: every step so far was skipped
      for (int s = 0; s < 4; ++s) {
        set_grads(a, s, dt);
        set_grads(b, s, dt);
        set_grads(c, s, dt);
        if (s == 2) {  // a skipped step in the middle: nothing at all changes
          TensorMap before;
          for (const auto& [n, t] : opt_a->state_tensors()) before.emplace_back(n, t.clone());
          std::vector<Tensor> params_before = clones(a);
          opt_a->step(overflow);
          expect_identical(a, params_before);
          const TensorMap after = opt_a->state_tensors();
          ASSERT_EQ(after.size(), before.size());
          for (size_t k = 0; k < after.size(); ++k)
            EXPECT_EQ(after[k].second.to_vector(), before[k].second.to_vector()) << after[k].first;
        }
        opt_a->step(clean);
        opt_b->step();
        opt_c->step(clean);
      }
      expect_identical(a, b);
      expect_identical(a, c);
      EXPECT_EQ(opt_a->state_tensors()[0].second.item<int64_t>(), 4);  // "0.0.step": skipped steps not counted
    }
  }
}

TEST(OptimSkip, ValidatesTheFlag) {
  std::vector<Tensor> ps = make_params(1);
  auto opt = make_adam({{ps, GroupOptions{}, ""}});
  set_grads(ps, 0);
  expect_error([&] { opt->step(scalar_tensor(1.0, DType::F64)); },
               "adam: found_inf must be a 0-d f32 tensor, found f64 []");
  expect_error([&] { opt->step(zeros({2})); }, "found_inf must be a 0-d f32 tensor, found f32 [2]");
  expect_error([&] { opt->step(Tensor()); }, "found_inf must be a 0-d f32 tensor, found undefined");
}

TEST(Optim, SetMomentum) {
  std::vector<Tensor> ps = make_params(2);
  auto sgd = make_sgd({{{ps[0]}, GroupOptions{}, "a"}, {{ps[1]}, GroupOptions{}, "b"}});
  sgd->set_momentum(0.85);
  for (const auto& g : sgd->param_groups()) EXPECT_EQ(g.options.momentum, 0.85);
  auto adam = make_adamw({{ps, GroupOptions{}, ""}});
  adam->set_momentum(0.95);
  EXPECT_EQ(adam->param_groups()[0].options.beta1, 0.95);
  EXPECT_EQ(adam->param_groups()[0].options.momentum, 0.0);
  expect_error([&] { adam->set_momentum(1.0); }, "adamw: Invalid beta parameter at index 0: 1");
  auto lamb = make_lamb({{ps, GroupOptions{}, ""}});
  lamb->set_momentum(0.8);
  EXPECT_EQ(lamb->param_groups()[0].options.beta1, 0.8);
  auto lars = make_lars({{ps, GroupOptions{}, ""}});
  lars->set_momentum(0.8);
  EXPECT_EQ(lars->param_groups()[0].options.momentum, 0.8);
  expect_error([&] { sgd->set_momentum(-1); }, "sgd: Invalid momentum value: -1");
}

// Each optimizer knows its kind; the kind's name is what configs and saved states hold, and it
// parses back to the same kind.
TEST(Optim, KindsNamesAndFamilies) {
  std::vector<Tensor> ps = make_params(1);
  const std::pair<std::unique_ptr<Optimizer>, OptimizerKind> made[] = {
      {make_adamw({{ps, GroupOptions{}, ""}}), OptimizerKind::AdamW},
      {make_adam({{ps, GroupOptions{}, ""}}), OptimizerKind::Adam},
      {make_sgd({{ps, GroupOptions{}, ""}}), OptimizerKind::SGD},
      {make_lamb({{ps, GroupOptions{}, ""}}), OptimizerKind::LAMB},
      {make_lars({{ps, GroupOptions{}, ""}}), OptimizerKind::LARS}};
  ASSERT_EQ(std::size(made), kOptimizerKindCount);
  for (const auto& [opt, kind] : made) {
    EXPECT_EQ(opt->kind(), kind);
    EXPECT_EQ(opt->name(), optimizer_name(kind));
    EXPECT_EQ(optimizer_kind_from_name(opt->name()), kind);
    EXPECT_EQ(opt->state_metadata().at("optimizer"), opt->name());
  }
  EXPECT_EQ(optimizer_name(OptimizerKind::AdamW), std::string("adamw"));
  EXPECT_EQ(optimizer_name(OptimizerKind::LARS), std::string("lars"));
  for (OptimizerKind k : {OptimizerKind::AdamW, OptimizerKind::Adam, OptimizerKind::LAMB})
    EXPECT_EQ(optimizer_family(k), OptimizerFamily::Adam) << optimizer_name(k);
  for (OptimizerKind k : {OptimizerKind::SGD, OptimizerKind::LARS})
    EXPECT_EQ(optimizer_family(k), OptimizerFamily::Momentum) << optimizer_name(k);
  expect_error([] { optimizer_kind_from_name("lion"); },
               "optimizer: expected adamw, adam, sgd, lamb or lars, found 'lion'");
  expect_error([] { optimizer_kind_from_name("AdamW"); }, "found 'AdamW'");
  expect_error([] { optimizer_kind_from_name(""); }, "found ''");
}

TEST(Optim, ZeroGradAndSetLr) {
  std::vector<Tensor> ps = make_params(2);
  auto opt = make_sgd({{{ps[0]}, GroupOptions{}, "a"}, {{ps[1]}, GroupOptions{}, "b"}});
  set_grads(ps, 0);
  opt->zero_grad(false);
  EXPECT_EQ(ps[0].grad().to_vector(), std::vector<double>(ps[0].numel(), 0.0));
  opt->zero_grad();
  EXPECT_FALSE(ps[0].grad().defined());
  EXPECT_FALSE(ps[1].grad().defined());
  opt->set_lr(0.25);
  for (const auto& g : opt->param_groups()) EXPECT_EQ(g.options.lr, 0.25);
  expect_error([&] { opt->set_lr(-1); }, "sgd: Invalid learning rate: -1");
}

TEST(Optim, ValidatesOptions) {
  std::vector<Tensor> ps = make_params(1);
  auto with = [&](auto edit) {
    GroupOptions o;
    edit(o);
    return std::vector<ParamGroup>{{ps, o, "g"}};
  };
  expect_error([&] { make_sgd(with([](GroupOptions& o) { o.lr = -0.1; })); },
               "sgd: Invalid learning rate: -0.1 (group 0 ('g'))");
  expect_error([&] { make_sgd(with([](GroupOptions& o) { o.momentum = -1; })); }, "sgd: Invalid momentum value: -1");
  expect_error([&] { make_sgd(with([](GroupOptions& o) { o.weight_decay = -1; })); }, "Invalid weight_decay value: -1");
  expect_error([&] { make_sgd(with([](GroupOptions& o) { o.nesterov = true; })); },
               "Nesterov momentum requires a momentum and zero dampening");
  expect_error(
      [&] {
        make_sgd(with([](GroupOptions& o) {
          o.nesterov = true;
          o.momentum = 0.9;
          o.dampening = 0.1;
        }));
      },
      "Nesterov momentum requires a momentum and zero dampening");
  expect_error([&] { make_adam(with([](GroupOptions& o) { o.beta1 = 1.0; })); },
               "adam: Invalid beta parameter at index 0: 1");
  expect_error([&] { make_adamw(with([](GroupOptions& o) { o.beta2 = -0.5; })); },
               "adamw: Invalid beta parameter at index 1: -0.5");
  expect_error([&] { make_adamw(with([](GroupOptions& o) { o.eps = 0; })); }, "adamw: Invalid epsilon value: 0");
  expect_error([&] { make_lamb(with([](GroupOptions& o) { o.beta2 = 1; })); },
               "lamb: Invalid beta parameter at index 1: 1");
  expect_error([&] { make_lamb(with([](GroupOptions& o) { o.weight_decay = -0.1; })); },
               "lamb: Invalid weight_decay value: -0.1");
  expect_error([&] { make_lars(with([](GroupOptions& o) { o.trust_coefficient = 0; })); },
               "lars: Invalid trust_coefficient value: 0 (expected > 0; group 0 ('g'))");
  expect_error([&] { make_lars(with([](GroupOptions& o) { o.momentum = -0.5; })); },
               "lars: Invalid momentum value: -0.5");
  expect_error([&] { make_lars(with([](GroupOptions& o) { o.nesterov = true; })); },
               "lars: Nesterov momentum requires a momentum and zero dampening");
  expect_error([&] { make_adamw(with([](GroupOptions& o) { o.lr = std::nan(""); })); }, "Invalid learning rate: nan");
  // Edited through param_groups() after construction: caught at the next step.
  auto opt = make_adamw(with([](GroupOptions&) {}));
  opt->param_groups()[0].options.beta1 = 2;
  expect_error([&] { opt->step(); }, "Invalid beta parameter at index 0: 2");
}

TEST(Optim, ValidatesParametersAndGradients) {
  std::vector<Tensor> ps = make_params(2);
  expect_error(
      [&] {
        make_sgd({{{ps[0], ps[0]}, GroupOptions{}, ""}});
      },
      "some parameters appear in more than one parameter group");
  expect_error([&] { make_sgd({{{}, GroupOptions{}, ""}}); }, "empty parameter list");
  expect_error(
      [&] {
        make_sgd({{{zeros({3}, DType::I64)}, GroupOptions{}, ""}});
      },
      "parameter 0 of group 0 has dtype i64, expected a floating dtype");
  expect_error(
      [&] {
        make_sgd({{{zeros({3, 4}).t()}, GroupOptions{}, "w"}});
      },
      "parameter 0 of group 0 ('w') is not dense (expected contiguous or channels-last memory");
  auto opt = make_adamw({{ps, GroupOptions{}, ""}});
  ps[0].impl()->grad = zeros({2, 2}).impl_ptr();  // bypasses set_grad's own check
  expect_error([&] { opt->step(); }, "adamw: gradient of parameter 0 of group 0 has shape [2, 2], expected [8, 5]");
  ps[0].set_grad(zeros(ps[0].shape(), DType::F64));
  expect_error([&] { opt->step(); }, "has dtype f64 for a f32 parameter (expected f32, bf16 or f16)");
  EXPECT_EQ(opt->step_count(), 0);
  EXPECT_TRUE(opt->state_tensors().empty());  // nothing was changed by the failed steps
}

TEST(Optim, Bf16GradientsForF32Parameters) {
  std::vector<Tensor> a = make_params(3), b = clones(a);
  auto opt_a = make_adamw({{a, GroupOptions{}, ""}}), opt_b = make_adamw({{b, GroupOptions{}, ""}});
  set_grads(a, 0, DType::BF16);
  for (size_t i = 0; i < a.size(); ++i) b[i].set_grad(a[i].grad().to(DType::F32));
  opt_a->step();
  opt_b->step();
  expect_identical(a, b);
}

TEST(DecayGroups, MatricesDecayVectorsDoNot) {
  Tensor w = randn({4, 3}).requires_grad_(), b = zeros({4}).requires_grad_(), ln = ones({3}).requires_grad_();
  Tensor emb = randn({10, 3}).requires_grad_(), frozen = randn({3, 3});
  GroupOptions o;
  o.weight_decay = 0.1;
  o.lr = 0.5;
  auto groups = decay_groups({{"fc.weight", w},
                              {"fc.bias", b},
                              {"ln.weight", ln},
                              {"wte.weight", emb},
                              {"frozen", frozen},
                              {"lm_head.weight", emb}},
                             o);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].name, "decay");
  EXPECT_EQ(groups[1].name, "no_decay");
  ASSERT_EQ(groups[0].params.size(), 2u);  // the tied lm_head weight appears once
  EXPECT_TRUE(groups[0].params[0].same(w));
  EXPECT_TRUE(groups[0].params[1].same(emb));
  ASSERT_EQ(groups[1].params.size(), 2u);
  EXPECT_TRUE(groups[1].params[0].same(b));
  EXPECT_EQ(groups[0].options.weight_decay, 0.1);
  EXPECT_EQ(groups[1].options.weight_decay, 0.0);
  EXPECT_EQ(groups[1].options.lr, 0.5);
  expect_error([&] { decay_groups({{"x", Tensor()}}, o); }, "decay_groups: parameter 'x' is undefined");
}

// Conv weights after Module::to_channels_last() are NHWC-dense: the fused pass must pair each
// element with its own gradient and state whatever the layouts.
TEST(OptimLayouts, ChannelsLastParametersTrainLikeContiguousOnes) {
  Generator gen(3);
  Tensor init = randn({4, 3, 3, 3}, {}, &gen);
  Tensor a = init.clone().requires_grad_();
  Tensor b = init.contiguous_channels_last().detach().requires_grad_();
  ASSERT_TRUE(b.is_channels_last());
  optim::GroupOptions o;
  o.lr = 0.1;
  o.weight_decay = 0.01;
  auto opt_a = optim::make_adamw({{{a}, o, "a"}});
  auto opt_b = optim::make_adamw({{{b}, o, "b"}});
  for (int step = 0; step < 3; ++step) {
    Tensor g = randn({4, 3, 3, 3}, {}, &gen);
    a.set_grad(g);
    // alternate the gradient's layout: matching channels-last, then plain contiguous
    b.set_grad(step % 2 == 0 ? g.contiguous_channels_last() : g.clone());
    opt_a->step();
    opt_b->step();
  }
  EXPECT_TRUE(b.is_channels_last());
  EXPECT_EQ(a.to_vector(), b.to_vector());
}

namespace {

// Runs clip_grad_norm_ / clip_grad_value_ on the case's gradients and compares with PyTorch.
void check_clip(const std::string& name) {
  SCOPED_TRACE(name);
  FT_PARITY_CASE(c, name);
  const int n = c.param<int>("ngrads");
  std::vector<Tensor> params;
  for (int k = 0; k < n; ++k) {
    Tensor g = c.input("g" + std::to_string(k));
    params.push_back(zeros_like(g).requires_grad_());
    params.back().set_grad(g.clone());
  }
  int first = 0;
  if (c.param<std::string>("fn") == "norm") {
    Tensor norm = clip_grad_norm_(params, c.param<double>("limit"));
    EXPECT_EQ(norm.dtype(), c.dtype() == DType::F64 ? DType::F64 : DType::F32);
    EXPECT_EQ(norm.dim(), 0);
    c.expect_output(norm.to(c.dtype()), 0);
    first = 1;
  } else {
    clip_grad_value_(params, c.param<double>("limit"));
  }
  for (int k = 0; k < n; ++k) c.expect_output(params[k].grad(), first + k);
}

}  // namespace

TEST(Clip, MatchesPyTorch) {
  for (const char* dt : {"f32", "f64", "bf16"})
    for (const char* v : {"norm", "norm_noop", "value"}) check_clip(std::string("clip_") + v + "_" + dt);
}

TEST(Clip, NormDoesNotDependOnThreadCount) {
  const int threads = get_num_threads();
  std::vector<std::vector<double>> norms, grads;
  for (int t : {1, 2, 3}) {
    set_num_threads(t);
    std::vector<Tensor> ps = make_params(5);
    ps.push_back(zeros({123457}).requires_grad_());
    set_grads(ps, 0);
    norms.push_back(clip_grad_norm_(ps, 0.5).to_vector());
    grads.push_back(ps.back().grad().to_vector());
  }
  set_num_threads(threads);
  EXPECT_EQ(norms[0], norms[1]);
  EXPECT_EQ(norms[0], norms[2]);
  EXPECT_EQ(grads[0], grads[2]);
}

TEST(Clip, SkipsMissingGradientsAndPropagatesNonFinite) {
  std::vector<Tensor> ps = make_params(3);
  ps[0].set_grad(full(ps[0].shape(), 3.0));
  Tensor norm = clip_grad_norm_(ps, 1.0);  // ps[1], ps[2] have no gradient
  EXPECT_FLOAT_EQ(norm.item<float>(), 3.0f * std::sqrt(static_cast<float>(ps[0].numel())));
  EXPECT_FALSE(ps[1].grad().defined());
  ps[1].set_grad(full(ps[1].shape(), std::nan("")));
  EXPECT_TRUE(std::isnan(clip_grad_norm_(ps, 1.0).item<float>()));
  EXPECT_TRUE(std::isnan(ps[0].grad().to_vector()[0]));          // as in PyTorch: a NaN factor
  EXPECT_EQ(clip_grad_norm_({ps[2]}, 1.0).item<float>(), 0.0f);  // nothing to clip
}

TEST(Clip, ValidatesInput) {
  std::vector<Tensor> ps = make_params(2);
  set_grads(ps, 0);
  expect_error([&] { clip_grad_norm_(ps, 0); }, "clip_grad_norm_: expected a positive max_norm, found 0");
  expect_error([&] { clip_grad_norm_(ps, std::nan("")); }, "expected a positive max_norm, found nan");
  expect_error([&] { clip_grad_value_(ps, -1); }, "clip_grad_value_: expected a non-negative clip_value, found -1");
  expect_error([&] { clip_grad_norm_({Tensor()}, 1); }, "clip_grad_norm_: parameter 0 is undefined");
  Tensor p = zeros({3, 4}).requires_grad_();
  p.impl()->grad = zeros({4, 3}).t().impl_ptr();  // a transposed view: not dense in any order we walk
  expect_error([&] { clip_grad_value_({p}, 1); }, "clip_grad_value_: the gradient of parameter 0 is not dense");
}
