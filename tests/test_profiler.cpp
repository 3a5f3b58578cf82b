// The profiler (profiler.h) and the memory history (memory_history.h): the Chrome trace of a known
// model read back by an independent JSON reader (Python's json module) with its events and
// nesting checked; FLOPs per op against hand-computed values; the memory history replayed to the
// allocator's own peak with categories summing to it; and the Trainer's --profile and
// --memory-history files. No timed assertions.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "backend/cpu/peak_rate.h"
#include "core/size_class.h"
#include "fasttrain/fasttrain.h"
#include "fasttrain/memory_history.h"
#include "fasttrain/profile_run.h"
#include "fasttrain/profiler.h"
#include "support/trainer_configs.h"

using namespace ft;
namespace fs = std::filesystem;

namespace {

const char* kPython = "/usr/bin/python3";

std::string temp_dir(const std::string& name) { return test::scratch_dir("fasttrain_test_profiler", name); }

void write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
}

// Runs a Python check script on `args`; returns its exit status and output.
std::pair<int, std::string> run_python(const std::string& dir, const std::string& script, const std::string& args) {
  const std::string py = dir + "/check.py", out = dir + "/check.out";
  write_text(py, script);
  const int rc = std::system((std::string(kPython) + " " + py + " " + args + " > " + out + " 2>&1").c_str());
  std::ifstream f(out);
  std::stringstream ss;
  ss << f.rdbuf();
  return {WEXITSTATUS(rc), ss.str()};
}

// The checks every trace must pass, in Python's json module: the trace-event structure, lanes
// named, kernels with shapes/dtypes/flops/bytes, spans on one lane properly nested, and the
// allocator counter track. Extra checks follow as Python in `extra` (variables: events, spans).
std::string trace_checker(const std::string& extra) {
  return R"PY(
import json, sys
doc = json.load(open(sys.argv[1]))
events = doc["traceEvents"]
assert isinstance(events, list) and events, "no events"
names = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
spans = [e for e in events if e["ph"] == "X"]
for e in spans:
    for k in ("name", "cat", "pid", "tid", "ts", "dur", "args"):
        assert k in e, ("missing", k, e)
    assert e["tid"] in names, ("lane without a thread name", e)
    assert e["dur"] >= 0
kernels = [e for e in spans if e["cat"] == "kernel"]
assert kernels, "no kernel spans"
for e in kernels:
    for k in ("shapes", "dtypes", "flops", "bytes"):
        assert k in e["args"], ("kernel without", k, e)
counters = [e for e in events if e["ph"] == "C"]
assert counters and all("allocated_bytes" in c["args"] and "reserved_bytes" in c["args"] for c in counters)
# Nesting: on each lane, two spans either nest or do not overlap (1 us slack for rounding).
def inside(a, b):  # a inside b
    return a["ts"] >= b["ts"] - 1e-3 and a["ts"] + a["dur"] <= b["ts"] + b["dur"] + 1e-3
by_lane = {}
for e in spans:
    by_lane.setdefault(e["tid"], []).append(e)
for lane, es in by_lane.items():
    es.sort(key=lambda e: (e["ts"], -e["dur"]))
    stack = []
    for e in es:
        while stack and not inside(e, stack[-1]):
            assert e["ts"] >= stack[-1]["ts"] + stack[-1]["dur"] - 1e-3, ("overlap", stack[-1]["name"], e["name"])
            stack.pop()
        e["parents"] = [p["name"] for p in stack]
        stack.append(e)
)PY" + extra +
         "\nprint('ok')\n";
}

std::shared_ptr<nn::Sequential> tiny_mlp(Generator& gen) {
  auto m = std::make_shared<nn::Sequential>();
  m->push_back(std::make_shared<nn::Linear>(16, 32, true, &gen));
  m->push_back(std::make_shared<nn::ReLU>());
  m->push_back(std::make_shared<nn::Linear>(32, 4, true, &gen));
  return m;
}

// One training step of the MLP with the phases the Trainer marks.
void mlp_step(nn::Sequential& model, optim::Optimizer& opt, const Tensor& x, const Tensor& y, int64_t step) {
  profiler::StepScope s(step);
  Tensor loss;
  {
    profiler::PhaseScope phase(profiler::Phase::Forward);
    loss = cross_entropy(model(x), y);
  }
  {
    profiler::PhaseScope phase(profiler::Phase::Backward);
    loss.backward();
  }
  profiler::PhaseScope phase(profiler::Phase::Optimizer);
  opt.step();
  opt.zero_grad();
}

double flops_of(const std::vector<profiler::Span>& spans, const std::string& name) {
  double f = 0;
  for (const auto& s : spans)
    if (s.category == "kernel" && s.name == name) f += s.flops;
  return f;
}

}  // namespace

TEST(Profiler, OffRecordsNothingAndCostsOneCheck) {
  EXPECT_FALSE(profiler::active());
  Tensor a = ones({4, 4});
  profiler::Range r("not recorded");  // no session: nothing happens
  EXPECT_EQ(sum(add(a, a)).item<double>(), 32.0);
}

TEST(Profiler, MlpTraceParsesWithPythonAndNests) {
  if (!fs::exists(kPython)) GTEST_SKIP() << kPython << " not found";
  const std::string dir = temp_dir("mlp");
  fs::create_directories(dir);
  Generator gen(7);
  auto model = tiny_mlp(gen);
  profiler::name_modules(*model);
  auto opt = optim::make_adamw({optim::ParamGroup{model->parameters(), {}, "all"}});
  Tensor x = randn({8, 16}, {}, &gen), y = from_vector(std::vector<double>{0, 1, 2, 3, 0, 1, 2, 3}, {8}, DType::I64);
  profiler::set_thread_name("train");
  {
    profiler::Session session;
    EXPECT_TRUE(profiler::tracing());
    for (int64_t step = 1; step <= 2; ++step) mlp_step(*model, *opt, x, y, step);
    {
      profiler::Range user("user span");
      (void)relu(x);
    }
    session.stop();
    EXPECT_FALSE(profiler::active());
    session.write_chrome_trace(dir + "/trace.json");
  }
  profiler::forget_module_names();
  const auto [rc, out] = run_python(dir, trace_checker(R"PY(
assert "train" in names.values(), names
cats = {e["cat"] for e in spans}
for c in ("kernel", "autograd", "phase", "step", "module", "user"):
    assert c in cats, ("no", c, "spans")
steps = [e for e in spans if e["cat"] == "step"]
assert sorted(e["name"] for e in steps) == ["step 1", "step 2"], steps
phases = [e for e in spans if e["cat"] == "phase"]
assert sorted({e["name"] for e in phases}) == ["backward", "forward", "optimizer"]
for p in phases:
    assert p["parents"] and p["parents"][-1].startswith("step "), ("phase outside a step", p["name"], p["parents"])
# Forward: the modules, then the kernels in them; the first Linear's matmul is [8,16] x [32,16]^T.
mm = [e for e in spans if e["cat"] == "kernel" and e["name"] == "matmul" and e["args"]["phase"] == "forward"]
assert len(mm) == 4, [e["args"]["shapes"] for e in mm]
first = [e for e in mm if e["args"]["shapes"].startswith("[8,16]")]
assert first and first[0]["args"]["flops"] == 2 * 8 * 32 * 16, first
assert first[0]["args"]["dtypes"].startswith("f32 f32 f32"), first[0]["args"]
assert "0" in first[0]["parents"] and "(model)" in first[0]["parents"] and "forward" in first[0]["parents"], first[0]["parents"]
# Backward: autograd nodes inside the backward phase, kernels inside nodes.
nodes = [e for e in spans if e["cat"] == "autograd"]
assert {"LinearBackward", "AccumulateGrad"} <= {e["name"] for e in nodes}, {e["name"] for e in nodes}
assert all("backward" in e["parents"] for e in nodes)
bmm = [e for e in spans if e["cat"] == "kernel" and e["args"]["phase"] == "backward" and e["name"] == "matmul"]
assert bmm and all("LinearBackward" in e["parents"] for e in bmm)
# The optimizer's fused update runs inside the optimizer phase.
assert any(e["cat"] == "kernel" and "optimizer" in e["parents"] for e in spans)
user = [e for e in spans if e["cat"] == "user"]
assert user[0]["name"] == "user span" and any(e["cat"] == "kernel" and "user span" in e["parents"] for e in spans)
)PY"),
                                    dir + "/trace.json");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("ok"), std::string::npos) << out;
  fs::remove_all(dir);
}

TEST(Profiler, OneSessionAtATime) {
  profiler::Session a;
  EXPECT_THROW(profiler::Session b, Error);
  a.stop();
  profiler::Session c;  // after stop, a new one starts
  EXPECT_TRUE(c.running());
}

// A job's trace: each rank's document as its own process, shifted onto the job's time origin,
// then merged (what ProfileRun does under mpirun; the CLI case is in test_tensor_parallel).
TEST(Profiler, ATraceBecomesOneProcessOfAJobsTraceOnItsTimeOrigin) {
  profiler::Session session;
  {
    profiler::Range span("work");
    relu(ones({64}));
  }
  session.stop();
  profiler::TraceProcess process;
  process.pid = 3;
  process.name = "rank 3 (tp 1, dp 0, pp 1)";
  process.origin_unix_ns = session.start_unix_ns() - 2'000'000;  // the job began 2 ms earlier
  const nlohmann::json own = nlohmann::json::parse(session.chrome_trace_json());
  const nlohmann::json shifted = nlohmann::json::parse(session.chrome_trace_json(process));
  auto user_span = [](const nlohmann::json& doc) {
    for (const auto& e : doc["traceEvents"])
      if (e["ph"] == "X" && e["name"] == "work") return e;
    return nlohmann::json();
  };
  ASSERT_FALSE(user_span(own).is_null());
  EXPECT_EQ(user_span(shifted)["pid"], 3);
  EXPECT_NEAR(user_span(shifted)["ts"].get<double>(), user_span(own)["ts"].get<double>() + 2000.0, 1e-6);

  process.pid = 0;
  process.name = "rank 0";
  const nlohmann::json merged =
      nlohmann::json::parse(profiler::merge_chrome_traces({session.chrome_trace_json(process), shifted.dump()}));
  std::map<int, std::string> names;
  int spans = 0;
  for (const auto& e : merged["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "process_name") names[e["pid"].get<int>()] = e["args"]["name"];
    if (e["ph"] == "X" && e["name"] == "work") ++spans;
  }
  EXPECT_EQ(names, (std::map<int, std::string>{{0, "rank 0"}, {3, "rank 3 (tp 1, dp 0, pp 1)"}}));
  EXPECT_EQ(spans, 2);
  EXPECT_THROW(profiler::merge_chrome_traces({"{\"events\": []}"}), Error);
}

// FLOPs against the formulas written out by hand (a multiply-add is 2).
TEST(Profiler, FlopsOfLinearConvAttentionAndElementwise) {
  Generator gen(3);
  profiler::Session session;
  // linear: x [3, 5, 16] @ w[32, 16]^T: M = 15 rows, N = 32, K = 16.
  Tensor x = randn({3, 5, 16}, {}, &gen), w = randn({32, 16}, {}, &gen), b = randn({32}, {}, &gen);
  (void)linear(x, w, b);
  std::vector<profiler::Span> s = session.spans();
  EXPECT_EQ(flops_of(s, "matmul"), 2.0 * 15 * 32 * 16);
  // bmm: [4, 6, 7] @ [4, 7, 9]: 4 * 6 * 9 outputs of 7 multiply-adds.
  Tensor a3 = randn({4, 6, 7}, {}, &gen), b3 = randn({4, 7, 9}, {}, &gen);
  (void)matmul(a3, b3);
  s = session.spans();
  EXPECT_EQ(flops_of(s, "matmul"), 2.0 * 15 * 32 * 16 + 2.0 * 4 * 6 * 9 * 7);
  // conv2d: x [2, 3, 8, 8], w [4, 3, 3, 3], padding 1: y [2, 4, 8, 8], 3*3*3 multiply-adds each.
  Tensor cx = randn({2, 3, 8, 8}, {}, &gen), cw = randn({4, 3, 3, 3}, {}, &gen);
  (void)conv2d(cx, cw, Tensor(), {1, 1}, {1, 1});
  s = session.spans();
  EXPECT_EQ(flops_of(s, "conv2d_forward"), 2.0 * (2 * 4 * 8 * 8) * (3 * 3 * 3));
  // Grouped: w [4, 1, 3, 3] with groups 2 over 2 input channels -> Cin/g = 1.
  Tensor gx = randn({1, 2, 5, 5}, {}, &gen), gw = randn({4, 1, 3, 3}, {}, &gen);
  (void)conv2d(gx, gw, Tensor(), {1, 1}, {0, 0}, {1, 1}, 2);
  s = session.spans();
  EXPECT_EQ(flops_of(s, "conv2d_forward"), 2.0 * (2 * 4 * 8 * 8) * 27 + 2.0 * (1 * 4 * 3 * 3) * 9);
  // attention: B=2, H=3, T=16, D=8: Q K^T and P V, 2 * (2 * T * T * D) per head.
  Tensor q = randn({2, 3, 16, 8}, {}, &gen), k = randn({2, 3, 16, 8}, {}, &gen), v = randn({2, 3, 16, 8}, {}, &gen);
  (void)scaled_dot_product_attention(q, k, v, /*causal=*/false);
  s = session.spans();
  EXPECT_EQ(flops_of(s, "attention_forward"), 4.0 * 2 * 3 * 16 * 16 * 8);
  // causal: the T (T + 1) / 2 pairs at or below the diagonal.
  (void)scaled_dot_product_attention(q, k, v, /*causal=*/true);
  s = session.spans();
  EXPECT_EQ(flops_of(s, "attention_forward"), 4.0 * 2 * 3 * 16 * 16 * 8 + 4.0 * 2 * 3 * (16 * 17 / 2) * 8);
  // elementwise: one per output element.
  (void)relu(randn({10, 10}, {}, &gen));
  (void)add(randn({10, 1}, {}, &gen), randn({1, 10}, {}, &gen));
  s = session.spans();
  EXPECT_EQ(flops_of(s, "relu"), 100.0);
  EXPECT_EQ(flops_of(s, "add"), 100.0);
  // Bytes: every tensor argument once (relu: 100 f32 in, 100 out).
  for (const auto& sp : s)
    if (sp.name == "relu") EXPECT_EQ(sp.bytes, 800.0);
}

TEST(Profiler, BackwardFlopsOfLinear) {
  Generator gen(5);
  Tensor x = randn({6, 16}, {}, &gen).requires_grad_(), w = randn({8, 16}, {}, &gen).requires_grad_();
  Tensor y = linear(x, w);
  profiler::Session session;
  sum(y).backward();
  // dx = dy [6, 8] @ w [8, 16] and dw = dy^T [8, 6] @ x [6, 16]: 2 * 6 * 8 * 16 each.
  EXPECT_EQ(flops_of(session.spans(), "matmul"), 2 * (2.0 * 6 * 8 * 16));
}

// A kernel that runs others (the CPU's linear_weight_grad runs matmul for the weight's product)
// keeps only its own FLOPs in the summary, so the step's total counts each product once.
TEST(Profiler, SummaryCountsTheFlopsOfNestedKernelsOnce) {
  Generator gen(5);
  Tensor x = randn({6, 16}, {}, &gen).requires_grad_(), w = randn({8, 16}, {}, &gen).requires_grad_();
  Tensor b = randn({8}, {}, &gen).requires_grad_();
  Tensor y = linear(x, w, b);
  profiler::Session session;
  sum(y).backward();
  const std::vector<profiler::Span> spans = session.spans();
  ASSERT_GT(flops_of(spans, "linear_weight_grad"), 0.0);  // else nothing here is nested
  const double products = 2 * (2.0 * 6 * 8 * 16);         // dx = dy w and dw = dy^T x
  ASSERT_EQ(flops_of(spans, "matmul"), products);
  double all = 0;  // every span's FLOPs: the products, sum's additions, ...
  for (const profiler::Span& sp : spans) all += sp.flops;
  const train::ProfileSummary s = train::summarize(spans, profiler::PeakFlops{});
  EXPECT_EQ(s.kernel_flops, all - flops_of(spans, "linear_weight_grad"));
  for (const train::OpSummary& o : s.ops) {
    if (o.name == "matmul") EXPECT_EQ(o.flops, products);
    if (o.name == "linear_weight_grad") EXPECT_EQ(o.flops, 0.0);
  }
}

TEST(MemoryHistory, ReplaysToTheAllocatorPeakAndCategoriesSumToIt) {
  Generator gen(11);
  auto model = tiny_mlp(gen);
  auto opt = optim::make_adamw({optim::ParamGroup{model->parameters(), {}, "all"}});
  Tensor x = randn({64, 16}, {}, &gen), y = zeros({64}, DType::I64);
  Allocator& alloc = allocator_for(Device::cpu());
  alloc.reset_peak();
  memory::start_history();
  profiler::name_modules(*model);
  int64_t param_bytes = 0;
  for (const auto& [name, p] : model->named_parameters()) {
    memory::label(p, memory::Category::Parameters, name);
    param_bytes += static_cast<int64_t>(allocation_size_class(p.nbytes()));
  }
  for (int64_t step = 1; step <= 2; ++step) {
    mlp_step(*model, *opt, x, y, step);
    for (const auto& [key, t] : opt->state_tensors()) memory::label(t, memory::Category::OptimizerState, key);
  }
  memory::stop_history();
  profiler::forget_module_names();
  const int64_t allocator_peak = alloc.stats().peak_allocated_bytes;
  const std::vector<memory::Event> events = memory::history();
  ASSERT_FALSE(events.empty());
  const memory::PeakReport r = memory::analyze(events);
  EXPECT_TRUE(r.consistent) << "a running sum differs from the allocator's allocated bytes";
  EXPECT_EQ(r.peak_bytes, allocator_peak);
  int64_t sum = 0;
  for (int64_t b : r.by_category) sum += b;
  EXPECT_EQ(sum, r.peak_bytes);
  int64_t module_sum = 0;
  for (const auto& m : r.by_module) module_sum += m.bytes;
  EXPECT_EQ(module_sum, r.peak_bytes);
  EXPECT_EQ(r.by_category[static_cast<int>(memory::Category::Parameters)], param_bytes);
  // Forward outputs kept for backward exist at any peak in backward; the fc1 output's module.
  bool fc_seen = false;
  for (const auto& e : events)
    if (e.kind == memory::Event::Kind::Alloc && e.module == "0" && e.op == "matmul") fc_seen = true;
  EXPECT_TRUE(fc_seen) << "no allocation attributed to module 0's matmul";
  // Allocations made in backward name the autograd node and the module whose forward recorded it.
  bool node_seen = false;
  for (const auto& e : events)
    if (e.kind == memory::Event::Kind::Alloc && e.phase == profiler::Phase::Backward && e.node == "LinearBackward" &&
        (e.module == "0" || e.module == "2"))
      node_seen = true;
  EXPECT_TRUE(node_seen) << "no backward allocation of a Linear's node attributed to its module";
  // The JSON export reads back with the same peak.
  const nlohmann::json j = nlohmann::json::parse(memory::history_json(events, r));
  EXPECT_EQ(j["peak"]["peak_bytes"].get<int64_t>(), allocator_peak);
  EXPECT_EQ(j["events"].size(), events.size());

  // The timeline of the peak's step: after every allocation and free of that step, the
  // categories sum to the allocator's allocated bytes, and the highest point is the peak.
  const std::vector<memory::TimelinePoint> points = memory::timeline(events, r.peak_step);
  ASSERT_FALSE(points.empty());
  std::vector<int64_t> allocated_in_step;
  for (const auto& e : events)
    if (e.kind != memory::Event::Kind::Label && e.step == r.peak_step) allocated_in_step.push_back(e.allocated_after);
  ASSERT_EQ(points.size(), allocated_in_step.size());
  int64_t highest = 0;
  size_t at_peak = 0;
  for (size_t i = 0; i < points.size(); ++i) {
    int64_t total = 0;
    for (int64_t b : points[i].bytes) {
      EXPECT_GE(b, 0);
      total += b;
    }
    EXPECT_EQ(total, allocated_in_step[i]) << "point " << i;
    if (total > highest) highest = total, at_peak = i;
  }
  EXPECT_EQ(highest, r.peak_bytes);
  for (int c = 0; c < memory::kCategoryCount; ++c)  // the same split as the peak report's
    EXPECT_EQ(points[at_peak].bytes[c], r.by_category[c]) << memory::category_name(static_cast<memory::Category>(c));
  EXPECT_EQ(j["timeline"]["t_us"].size(), points.size());
  EXPECT_EQ(j["timeline"]["step"].get<int64_t>(), r.peak_step);
}

// Hand-made events: a forward block freed in backward is an activation, one freed in forward a
// temporary, a data-phase block a data batch, a labeled block its label, and the baseline "other".
TEST(MemoryHistory, CategoriesFollowPhasesAndLabels) {
  using K = memory::Event::Kind;
  using P = profiler::Phase;
  std::vector<memory::Event> ev;
  int64_t allocated = 1000;  // baseline
  auto add = [&](K kind, uint64_t ptr, int64_t bytes, P phase) {
    memory::Event e;
    e.kind = kind;
    e.seq = static_cast<int64_t>(ev.size());
    e.device = "cpu";
    e.ptr = ptr;
    e.bytes = bytes;
    e.phase = phase;
    if (kind == K::Alloc) allocated += bytes;
    if (kind == K::Free) allocated -= bytes;
    e.allocated_after = allocated;
    ev.push_back(e);
  };
  auto label = [&](uint64_t ptr, int64_t bytes, memory::Category category) {
    memory::Event e;
    e.kind = K::Label;
    e.seq = static_cast<int64_t>(ev.size());
    e.device = "cpu";
    e.ptr = ptr;
    e.bytes = bytes;
    e.category = category;
    e.module = "fc";
    ev.push_back(e);
  };
  // Of the 1000 bytes before recording: a labeled parameter (200), a labeled gradient freed at the
  // start of the step (100), an unlabeled block freed too (50), and 650 never seen: "other".
  label(9, 200, memory::Category::Parameters);
  label(8, 100, memory::Category::Gradients);
  add(K::Free, 8, 100, P::None);
  add(K::Free, 7, 50, P::None);
  add(K::Alloc, 1, 64, P::Data);      // batch
  add(K::Alloc, 2, 100, P::Forward);  // activation
  add(K::Alloc, 3, 50, P::Forward);   // temporary
  add(K::Free, 3, 50, P::Forward);
  add(K::Alloc, 4, 30, P::Backward);  // gradient, labeled below
  add(K::Alloc, 5, 40, P::Backward);  // temporary at the peak
  add(K::Free, 5, 40, P::Backward);
  add(K::Free, 2, 100, P::Backward);
  label(4, 30, memory::Category::Gradients);
  const memory::PeakReport r = memory::analyze(ev);
  EXPECT_TRUE(r.consistent);
  EXPECT_EQ(r.baseline_bytes, 1000);
  EXPECT_EQ(r.peak_bytes, 1000 - 150 + 64 + 100 + 30 + 40);
  EXPECT_EQ(r.by_category[static_cast<int>(memory::Category::Parameters)], 200);
  EXPECT_EQ(r.by_category[static_cast<int>(memory::Category::DataBatches)], 64);
  EXPECT_EQ(r.by_category[static_cast<int>(memory::Category::Activations)], 100);
  EXPECT_EQ(r.by_category[static_cast<int>(memory::Category::Gradients)], 30);
  EXPECT_EQ(r.by_category[static_cast<int>(memory::Category::Temporaries)], 40);
  EXPECT_EQ(r.by_category[static_cast<int>(memory::Category::Other)], 650);
  int64_t sum = 0;
  for (int64_t b : r.by_category) sum += b;
  EXPECT_EQ(sum, r.peak_bytes);
}

// --profile and --memory-history through the Trainer: the three files, worker lanes, phases
// inside steps (checkpoint included), and the memory attribution.
TEST(ProfileTrainer, WritesTraceSummaryAndMemoryHistory) {
  if (!fs::exists(kPython)) GTEST_SKIP() << kPython << " not found";
  const std::string dir = temp_dir("trainer");
  train::TrainerConfig c = test::tiny_char(dir);
  c.max_steps = 4;
  c.workers = 1;
  c.checkpoint.every = 3;
  ft::train::set_field(c, "profile", "2:3");
  c.profile.memory_history = true;
  test::BuiltinRun t(c);
  t.fit();
  EXPECT_FALSE(profiler::active());
  ASSERT_TRUE(fs::exists(dir + "/profile/trace.json"));
  ASSERT_TRUE(fs::exists(dir + "/profile/summary.json"));
  ASSERT_TRUE(fs::exists(dir + "/profile/memory.json"));
  const auto [rc, out] =
      run_python(dir, trace_checker(R"PY(
assert "train" in names.values() and "loader worker 0" in names.values(), names
steps = sorted(e["name"] for e in spans if e["cat"] == "step")
assert steps == ["step 2", "step 3"], steps
for step in ("step 2", "step 3"):
    inside_step = {e["name"] for e in spans if e["cat"] == "phase" and step in e["parents"]}
    assert {"data", "forward", "backward", "optimizer"} <= inside_step, (step, inside_step)
assert any(e["name"] == "checkpoint" and "step 3" in e["parents"] for e in spans), "no checkpoint phase in step 3"
assert any(e["name"] == "load batch" and names[e["tid"]] == "loader worker 0" for e in spans)
summary = json.load(open(sys.argv[2]))
assert summary["steps"] == 2 and summary["first_step"] == 2 and summary["last_step"] == 3, summary
for p in ("data", "forward", "backward", "optimizer", "other"):
    assert p in summary["phase_ms_per_step"], summary["phase_ms_per_step"]
assert summary["ops"] and summary["ops"][0]["self_ms_per_step"] >= summary["ops"][-1]["self_ms_per_step"]
assert any(o["name"] == "matmul" and o["flops_per_step"] > 0 for o in summary["ops"])
assert summary["peak"]["gflops"] > 0
mem = json.load(open(sys.argv[3]))
peak = mem["peak"]
assert peak["consistent"] and sum(peak["by_category"].values()) == peak["peak_bytes"], peak
for k in ("parameters", "gradients", "optimizer_state", "activations", "temporaries", "data_batches", "other"):
    assert k in peak["by_category"]
assert peak["by_category"]["parameters"] > 0 and peak["by_category"]["optimizer_state"] > 0
assert peak["by_module"][0]["bytes"] == max(m["bytes"] for m in peak["by_module"])
kinds = {e["kind"] for e in mem["events"]}
assert kinds == {"alloc", "free", "label"}, kinds
assert summary["memory"]["peak_bytes"] == peak["peak_bytes"]
top = summary["memory"]["top_module"]
assert top.startswith("transformer") and summary["memory"]["top_module_bytes"] > 0, summary["memory"]
)PY"),
                 dir + "/profile/trace.json " + dir + "/profile/summary.json " + dir + "/profile/memory.json");
  EXPECT_EQ(rc, 0) << out;
  fs::remove_all(dir);
}

// The peak a bf16 run is held to is the fastest bf16 product measured (AMX, vdpbf16ps, or FMA on
// widened operands), never less than the fp32 one; both come from the one measurement of
// backend/cpu/peak_rate.h where the CPU has AVX-512.
TEST(Profiler, PeakOfBf16RunsIsTheFastestBf16ProductAndFp32TheFma) {
  const profiler::PeakFlops f = profiler::measured_peak_flops(2, profiler::PeakOperands::F32);
  const profiler::PeakFlops b = profiler::measured_peak_flops(2, profiler::PeakOperands::BF16);
  EXPECT_EQ(f.threads, 2);
  EXPECT_GT(f.gflops, 0);
  EXPECT_DOUBLE_EQ(f.gflops_per_core * 2, f.gflops);
  EXPECT_GE(b.gflops, f.gflops);
  const cpu::PeakRates& r = cpu::measured_peak_rates(2);
  if (r.fp32_gflops > 0) {
    EXPECT_EQ(f.gflops, r.fp32_gflops);
    EXPECT_EQ(f.instruction, "vfmadd231ps zmm");
  }
  EXPECT_EQ(b.gflops, std::max({f.gflops, r.bf16_dot_gflops, r.amx_bf16_gflops}));
  if (b.gflops == r.amx_bf16_gflops)
    EXPECT_EQ(b.instruction, "tdpbf16ps");
  else if (b.gflops == r.bf16_dot_gflops)
    EXPECT_EQ(b.instruction, "vdpbf16ps zmm");
  else
    EXPECT_EQ(b.instruction, f.instruction);
}

// A bf16-mixed run's profile divides by the bf16 peak (it used to divide by fp32 FMA's, so a
// bf16 CNN showed conv2d at 170% "of peak").
TEST(ProfileTrainer, ABf16RunIsMeasuredAgainstTheBf16Peak) {
  const std::string dir = temp_dir("bf16");
  train::TrainerConfig c = test::tiny_char(dir);
  c.max_steps = 2;
  c.precision.mode = ft::train::Precision::BF16Mixed;
  ft::train::set_field(c, "profile", "2:2");
  test::BuiltinRun t(c);
  t.fit();
  std::ifstream f(dir + "/profile/summary.json");
  const nlohmann::json peak = nlohmann::json::parse(f)["peak"];
  const profiler::PeakFlops want = profiler::measured_peak_flops(0, profiler::PeakOperands::BF16);
  EXPECT_EQ(peak["instruction"].get<std::string>(), want.instruction);
  EXPECT_DOUBLE_EQ(peak["gflops"].get<double>(), want.gflops);
  fs::remove_all(dir);
}

TEST(ProfileTrainer, StepRangeIsChecked) {
  // Parsed once, where the text enters (flag, TOML, set_field), before any training starts.
  for (const char* bad : {"0:2", "3:2", "a:b", "2:"}) {
    train::TrainerConfig c;
    try {
      train::set_field(c, "profile", bad);
      ADD_FAILURE() << "accepted --profile " << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("profile: expected"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(c.profile.steps.empty()) << "a refused range leaves the option as it was";
  }
  train::TrainerConfig c;
  train::set_field(c, "profile", "2:4");
  EXPECT_EQ(c.profile.steps.first, 2);
  EXPECT_EQ(c.profile.steps.last, 4);
  EXPECT_EQ(c.profile.steps.text, "2:4");
}
