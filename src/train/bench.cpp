// The training-step benchmark of shared/BENCH.md (see fasttrain/bench.h). Every choice here
// mirrors bench/torch_bench.py so that the two JSON lines describe the same work.
#include "fasttrain/bench.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>

#include "fasttrain/autocast.h"
#include "fasttrain/autograd.h"
#include "fasttrain/ops.h"
#include "fasttrain/parallel.h"

namespace ft::bench {

const std::vector<std::string>& workload_names() {
  static const std::vector<std::string> names = {"mlp", "cnn-mini", "gpt-mini"};
  return names;
}

Workload make_workload(const std::string& name, int64_t batch, Generator& gen) {
  FT_CHECK(batch >= 0, "bench: expected a positive batch size, found ", batch);
  Workload w;
  w.name = name;
  if (name == "mlp") {
    w.batch = batch ? batch : 256;
    w.model = nn::mlp({784, 1024, 1024, 10}, &gen);
    w.inputs = randn({w.batch, 784}, DType::F32, &gen);
    w.targets = randint(0, 10, {w.batch}, DType::I64, &gen);
    w.item_unit = "samples";
  } else if (name == "cnn-mini") {
    w.batch = batch ? batch : 64;
    w.model = nn::cnn_mini(3, 10, &gen);
    w.inputs = randn({w.batch, 3, 32, 32}, DType::F32, &gen);
    w.targets = randint(0, 10, {w.batch}, DType::I64, &gen);
    w.item_unit = "samples";
  } else if (name == "gpt-mini") {
    w.batch = batch ? batch : 16;
    nn::GPTConfig cfg = nn::GPTConfig::preset("gpt-mini");
    w.model = std::make_shared<nn::GPT>(cfg, &gen);
    w.inputs = randint(0, cfg.vocab_size, {w.batch, cfg.context}, DType::I64, &gen);
    w.targets = randint(0, cfg.vocab_size, {w.batch, cfg.context}, DType::I64, &gen);
    w.items_per_sample = cfg.context;
    w.item_unit = "tokens";
  } else {
    std::string known;
    for (const auto& n : workload_names()) known += (known.empty() ? "" : ", ") + n;
    FT_FAIL("bench: unknown workload '", name, "' (expected one of: ", known, ")");
  }
  return w;
}

Tensor workload_loss(const Workload& w, const Tensor& output) {
  Tensor logits = output.dtype() == DType::F32 ? output : output.to(DType::F32);
  if (logits.dim() == 3) return cross_entropy(logits.reshape({-1, logits.size(-1)}), w.targets.reshape({-1}));
  return cross_entropy(logits, w.targets);
}

std::unique_ptr<optim::Optimizer> make_bench_optimizer(const nn::Module& model) {
  optim::GroupOptions o;
  o.lr = 3e-4;
  o.weight_decay = 0.1;
  o.beta1 = 0.9;
  o.beta2 = 0.999;
  o.eps = 1e-8;
  return optim::make_adamw({optim::ParamGroup{model.parameters(), o, "all"}});
}

Precision precision_from_name(const std::string& name) {
  if (name == "fp32") return Precision::FP32;
  if (name == "bf16") return Precision::BF16;
  FT_FAIL("bench: unknown precision '", name, "' (expected fp32 or bf16)");
}

const char* precision_name(Precision p) { return p == Precision::BF16 ? "bf16" : "fp32"; }

Tensor train_step(Workload& w, optim::Optimizer& opt, Precision precision) {
  opt.zero_grad(/*set_to_none=*/true);
  Tensor loss;
  {
    // The peer's `with torch.autocast(...)`: forward and loss inside the region, backward outside.
    autocast::AutocastGuard amp(DType::BF16, precision == Precision::BF16);
    loss = workload_loss(w, w.model->forward(w.inputs));
  }
  loss.backward();
  opt.step();
  return loss;
}

BenchResult run_bench(const BenchOptions& o) {
  FT_CHECK(o.steps > 0, "bench: expected --steps > 0, found ", o.steps);
  FT_CHECK(o.warmup >= 0, "bench: expected --warmup >= 0, found ", o.warmup);
  FT_CHECK(o.threads >= 0, "bench: expected --threads > 0, found ", o.threads);
  FT_CHECK(o.batch >= 0, "bench: expected --batch > 0, found ", o.batch);
  if (o.threads) set_num_threads(o.threads);
  Generator gen(o.seed);
  Workload w = make_workload(o.workload, o.batch, gen);
  auto opt = make_bench_optimizer(*w.model);

  for (int i = 0; i < o.warmup; ++i) train_step(w, *opt, o.precision);
  BenchResult r;
  Tensor loss;
  for (int i = 0; i < o.steps; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    loss = train_step(w, *opt, o.precision);
    r.step_ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::vector<double> sorted = r.step_ms;
  std::sort(sorted.begin(), sorted.end());
  r.ms_per_step = sorted[sorted.size() / 2];  // the peer's median: upper middle for even counts
  r.workload = w.name;
  r.precision = o.precision;
  r.batch = w.batch;
  r.threads = get_num_threads();
  r.items_per_s = static_cast<double>(w.batch * w.items_per_sample) / (r.ms_per_step / 1e3);
  r.item_unit = w.item_unit;
  r.loss = loss.item<double>();
  r.params = w.model->num_parameters();
  return r;
}

namespace {

// Python's round(x, digits) printed as repr(float): shortest round-trip digits, ".0" on integers.
std::string py_float(double x, int digits) {
  double scale = std::pow(10.0, digits);
  double v = std::round(x * scale) / scale;
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, v);
  std::string s(buf, res.ptr);
  if (std::isfinite(v) && s.find_first_of(".e") == std::string::npos) s += ".0";
  if (!std::isfinite(v)) s = std::isnan(v) ? "NaN" : (v > 0 ? "Infinity" : "-Infinity");
  return s;
}

}  // namespace

std::string to_json_line(const BenchResult& r) {
  std::string s = "{\"impl\": \"fasttrain\", \"workload\": \"" + r.workload + "\", \"device\": \"cpu\", \"precision\": \"" +
                  precision_name(r.precision) + "\", \"batch\": " + std::to_string(r.batch) +
                  ", \"threads\": " + std::to_string(r.threads) + ", \"ms_per_step\": " + py_float(r.ms_per_step, 3) +
                  ", \"" + r.item_unit + "_per_s\": " + py_float(r.items_per_s, 1) +
                  ", \"loss\": " + py_float(r.loss, 4) + ", \"params\": " + std::to_string(r.params) + "}";
  return s;
}

}  // namespace ft::bench
