// The training-step benchmark of shared/BENCH.md (see fasttrain/bench.h). Every choice here
// mirrors bench/torch_bench.py so that the two JSON lines describe the same work.
#include "fasttrain/bench.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <unordered_set>

#include "fasttrain/allocator.h"
#include "fasttrain/autocast.h"
#include "fasttrain/autograd.h"
#include "fasttrain/ddp.h"
#include "fasttrain/dist.h"
#include "fasttrain/machine.h"
#include "fasttrain/models.h"
#include "fasttrain/ops.h"
#include "fasttrain/parallel.h"
#include "fasttrain/profile_run.h"
#include "fasttrain/zero.h"

namespace ft::bench {

const std::vector<std::string>& workload_names() {
  static const std::vector<std::string> names = {"mlp",      "cnn-mini",   "gpt-mini",   "gpt2-124m",
                                                 "resnet50", "llama-mini", "smollm-135m"};
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
  } else if (name == "gpt-mini" || name == "gpt2-124m") {
    w.batch = batch ? batch : 16;
    nn::GPTConfig cfg = nn::GPTConfig::preset(name);
    // The peer's GPT-2 is built with the padded vocabulary itself (50304 classes, ids drawn from
    // all of them), so the logits, the head's FLOPs and the loss's range match it.
    if (name == "gpt2-124m") cfg.vocab_size = 50304;
    w.model = std::make_shared<nn::GPT>(cfg, &gen);
    w.inputs = randint(0, cfg.vocab_size, {w.batch, cfg.context}, DType::I64, &gen);
    w.targets = randint(0, cfg.vocab_size, {w.batch, cfg.context}, DType::I64, &gen);
    w.items_per_sample = cfg.context;
    w.item_unit = "tokens";
  } else if (name == "llama-mini" || name == "smollm-135m") {
    w.batch = batch ? batch : (name == "llama-mini" ? 8 : 16);
    nn::LlamaConfig cfg = nn::LlamaConfig::preset(name);
    if (name == "smollm-135m") cfg.context = 1024;  // BENCH.md's window: a quarter of its 2048 positions' cost
    w.model = std::make_shared<nn::Llama>(cfg, &gen);
    w.inputs = randint(0, cfg.vocab_size, {w.batch, cfg.context}, DType::I64, &gen);
    w.targets = randint(0, cfg.vocab_size, {w.batch, cfg.context}, DType::I64, &gen);
    w.items_per_sample = cfg.context;
    w.item_unit = "tokens";
  } else if (name == "resnet50") {
    w.batch = batch ? batch : 128;
    w.model = nn::resnet("resnet50", 1000, &gen);
    w.inputs = randn({w.batch, 3, 224, 224}, DType::F32, &gen);
    w.targets = randint(0, 1000, {w.batch}, DType::I64, &gen);
    w.item_unit = "samples";
  } else {
    std::string known;
    for (const auto& n : workload_names()) known += (known.empty() ? "" : ", ") + n;
    FT_FAIL("bench: unknown workload '", name, "' (expected one of: ", known, ")");
  }
  return w;
}

namespace {

// The peer's loss: cross-entropy in f32 (`logits.float()`), language-model logits flattened.
// Under autocast cross_entropy computes it from 16-bit logits as they are (an f32 loss, without
// the widened copy); bf16-true runs, outside autocast, widen them first.
Tensor f32_cross_entropy(const Tensor& output, const Tensor& targets) {
  Tensor logits = output.dtype() == DType::F32 || autocast::enabled() ? output : output.to(DType::F32);
  if (logits.dim() == 3) return cross_entropy(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}));
  return cross_entropy(logits, targets);
}

}  // namespace

namespace {

// The shape of a node's i-th input, from the metadata of the node that produced it (an input
// needing no gradient has no producer: empty shape).
Shape input_shape(const autograd::Node& n, size_t i) {
  if (i >= n.next_edges.size() || !n.next_edges[i].fn) return Shape();
  const autograd::Edge& e = n.next_edges[i];
  return e.input_nr < e.fn->outputs.size() ? e.fn->outputs[e.input_nr].shape : Shape();
}

// Forward multiply-add FLOPs of the convolutions and linear layers on the graph below `root`.
double conv_linear_flops(const std::shared_ptr<autograd::Node>& root) {
  double flops = 0;
  std::vector<autograd::Node*> stack = {root.get()};
  std::unordered_set<autograd::Node*> seen;
  while (!stack.empty()) {
    autograd::Node* n = stack.back();
    stack.pop_back();
    if (!n || !seen.insert(n).second) continue;
    const std::string name = n->name();
    if ((name == "Conv2dBackward" || name == "LinearBackward") && !n->outputs.empty()) {
      const Shape w = input_shape(*n, 1);
      FT_CHECK(w.size() >= 2, "bench: model_flops needs the weight of ", name, " to require grad");
      // Per output element: one multiply-add per weight element feeding it.
      const double per_output =
          name == "LinearBackward" ? static_cast<double>(w[w.size() - 1]) : static_cast<double>(w.numel() / w[0]);
      flops += 2.0 * static_cast<double>(n->outputs[0].shape.numel()) * per_output;
    }
    for (const autograd::Edge& e : n->next_edges) stack.push_back(e.fn.get());
  }
  return flops;
}

}  // namespace

double model_flops_per_step(const Workload& w) {
  if (auto* gpt = dynamic_cast<nn::GPT*>(w.model.get())) {
    const nn::GPTConfig& c = gpt->config();
    const double n = static_cast<double>(w.model->num_parameters() - c.context * c.dim);  // all but wpe
    const double T = static_cast<double>(w.inputs.size(1));
    const double per_token = 6.0 * n + 12.0 * static_cast<double>(c.layers) * T * static_cast<double>(c.dim);
    return per_token * static_cast<double>(w.batch) * T;
  }
  if (auto* llama = dynamic_cast<nn::Llama*>(w.model.get())) {
    const nn::LlamaConfig& c = llama->config();
    // 6N per token over the parameters that multiply (an untied embedding is a lookup), plus the
    // attention's two products counted over the whole T x T square as for GPT (PaLM's convention).
    const int64_t lookup = c.tie_embeddings ? 0 : c.vocab_size * c.dim;
    const double n = static_cast<double>(w.model->num_parameters() - lookup);
    const double T = static_cast<double>(w.inputs.size(1));
    const double attention = 12.0 * static_cast<double>(c.layers * c.heads * c.head_size()) * T;
    return (6.0 * n + attention) * static_cast<double>(w.batch) * T;
  }
  const bool was_training = w.model->is_training();
  w.model->eval();
  double forward = 0;
  {
    autograd::EnableGradGuard grad;
    Tensor y = w.model->forward(w.inputs.slice(0, 0, 1));
    if (y.grad_fn()) forward = conv_linear_flops(y.grad_fn());
  }
  w.model->train(was_training);
  return 3.0 * forward * static_cast<double>(w.batch);
}

Tensor workload_loss(const Workload& w, const Tensor& output) { return f32_cross_entropy(output, w.targets); }

std::unique_ptr<optim::Optimizer> make_bench_optimizer(const nn::Module& model) {
  optim::GroupOptions o;
  o.lr = 3e-4;
  o.weight_decay = 0.1;
  o.beta1 = 0.9;
  o.beta2 = 0.999;
  o.eps = 1e-8;
  return optim::make_adamw({optim::ParamGroup{model.parameters(), o, "all"}});
}

const char* bench_precision_name(train::Precision p) {
  switch (p) {
    case train::Precision::FP32: return "fp32";
    case train::Precision::BF16Mixed: return "bf16";
    case train::Precision::FP16Mixed: return "fp16";
    case train::Precision::FP8Mixed: return "fp8";
    default: return train::precision_name(p);
  }
}

std::unique_ptr<train::StepRunner> make_step_runner(Workload& w, optim::Optimizer& opt, train::Precision precision,
                                                    int64_t accumulate, bool cuda_graphs) {
  train::StepOptions so;
  so.precision = precision;
  so.accumulate = accumulate;
  so.cuda_graphs = cuda_graphs;
  return std::make_unique<train::StepRunner>(*w.model, opt, f32_cross_entropy, so);
}

namespace {

// The kernel calls of a profiled range grouped by kernel, operand shapes and dtypes, largest
// total first: which products or copies of an op carry its time.
std::string calls_by_shape(const std::vector<profiler::Span>& spans, int steps, size_t limit) {
  struct Total {
    int64_t calls = 0;
    double ms = 0;
  };
  std::map<std::string, Total> by_key;
  for (const profiler::Span& s : spans) {
    if (s.category != "kernel") continue;
    Total& t = by_key[s.name + " " + s.shapes + " " + s.dtypes];
    ++t.calls;
    t.ms += static_cast<double>(s.duration_ns) / 1e6;
  }
  std::vector<std::pair<std::string, Total>> rows(by_key.begin(), by_key.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
  std::string out = "  kernel calls by shape (largest " + std::to_string(std::min(limit, rows.size())) + " of " +
                    std::to_string(rows.size()) + ")     calls/step  ms/step\n";
  char line[512];
  for (size_t i = 0; i < rows.size() && i < limit; ++i) {
    std::snprintf(line, sizeof line, "  %-60s %6.1f %8.3f\n", rows[i].first.c_str(),
                  static_cast<double>(rows[i].second.calls) / steps, rows[i].second.ms / steps);
    out += line;
  }
  return out;
}

// The GPU's matrix-product peak for a precision, measured as the bench's CPU peak is: the best of
// a few large square products through the engine's own matmul (cuBLASLt), so model-FLOPs
// utilisation is against what this GPU reaches, not a datasheet.
double gpu_matmul_peak_gflops(Device device, train::Precision precision) {
  const bool bf16 = train::precision_is_bf16(precision);
  const DType dt = bf16 ? DType::BF16 : precision == train::Precision::FP16Mixed ? DType::F16 : DType::F32;
  const AllowTf32Guard tf32(precision == train::Precision::TF32);
  constexpr int64_t n = 8192;
  Generator gen(1);
  const Tensor a = randn({n, n}, DType::F32, &gen).to(device, dt), b = randn({n, n}, DType::F32, &gen).to(device, dt);
  const Stream stream = current_stream(device);
  double best_s = 1e30;
  for (int i = 0; i < 6; ++i) {
    synchronize(stream);
    const auto t0 = std::chrono::steady_clock::now();
    Tensor c = matmul(a, b);
    synchronize(stream);
    if (i > 0) best_s = std::min(best_s, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return 2.0 * n * n * n / best_s / 1e9;
}

}  // namespace

BenchResult run_bench(const BenchOptions& o) {
  FT_CHECK(o.steps > 0, "bench: expected --steps > 0, found ", o.steps);
  FT_CHECK(o.warmup >= 0, "bench: expected --warmup >= 0, found ", o.warmup);
  FT_CHECK(o.threads >= 0, "bench: expected --threads > 0, found ", o.threads);
  FT_CHECK(o.batch >= 0, "bench: expected --batch > 0, found ", o.batch);
  FT_CHECK(o.accumulate >= 1, "bench: expected --accumulate >= 1, found ", o.accumulate);
  if (o.threads) set_num_threads(o.threads);
  Generator gen(o.seed);
  Workload w = make_workload(o.workload, o.batch, gen);
  const Device device = o.device;
  w.model->to(device);  // drawn on the CPU from the seed, so every device trains the same weights
  w.inputs = w.inputs.to(device);
  w.targets = w.targets.to(device);
  // Several ranks (mpirun): each takes its rows of one process's batch, so the step's mean loss
  // over the ranks is one process's loss; DDP averages the gradients.
  const std::shared_ptr<dist::Communicator> comm = dist::world();
  const int64_t global_batch = w.batch, ranks = comm->world_size();
  if (ranks > 1) {
    FT_CHECK(device.is_cpu(), "bench: several ranks run on the CPU only (found --device ", device.str(), ")");
    FT_CHECK(global_batch % ranks == 0, "bench: the global batch of ", global_batch, " does not split evenly into ",
             ranks, " ranks");
    const int64_t rows = global_batch / ranks;
    w.inputs = w.inputs.narrow(0, comm->rank() * rows, rows).contiguous();
    w.targets = w.targets.narrow(0, comm->rank() * rows, rows).contiguous();
    w.batch = rows;
  }
  FT_CHECK(w.batch % o.accumulate == 0, "bench: the batch of ", w.batch, " does not split into --accumulate ",
           o.accumulate, " equal micro-batches");
  if (o.checkpoint_blocks) nn::set_activation_checkpointing(*w.model, true);
  // Before the optimizer and any sharding: both hold views of the weights as they are then.
  if (o.channels_last && w.inputs.dim() == 4) {
    w.model->to_channels_last();
    w.inputs = w.inputs.contiguous_channels_last();
  }
  std::unique_ptr<dist::DataParallel> ddp;
  std::unique_ptr<dist::ZeroSharding> zero;
  auto opt = make_bench_optimizer(*w.model);
  const int stage = dist::zero_stage(o.strategy);
  if (ranks > 1) {
    dist::broadcast_module(*w.model, *comm);
    if (stage > 0) {
      zero = std::make_unique<dist::ZeroSharding>(*w.model, *opt, comm, stage);
      opt = zero->make_shard_optimizer();  // the whole model's optimizer (no state yet) goes
    } else {
      ddp = std::make_unique<dist::DataParallel>(*w.model, comm);
    }
  }
  auto runner = make_step_runner(w, *opt, o.precision, o.accumulate, o.cuda_graphs);
  runner->set_grad_sync(ddp ? static_cast<train::GradSync*>(ddp.get()) : zero.get());
  BenchResult r;
  // The job's step: every rank's rows (the peak below is the job's too: every rank's threads).
  r.model_flops = model_flops_per_step(w) * static_cast<double>(ranks);
  // Measured before the steps and again after them (a few tens of milliseconds each; the larger
  // rates kept) on the threads the steps use. bf16 compares against the fastest bf16 product the
  // CPU has; fp32 and fp16 against f32 FMA (f16 operands are widened to f32 on the CPU).
  const bool bf16 = train::precision_is_bf16(o.precision);
  const bool half = bf16 || o.precision == train::Precision::FP16Mixed;
  const CpuInfo cpu = cpu_info();
  r.cpu_isa = cpu.isa_flags;
  r.cpu = cpu.model;
  r.device = device;
  profiler::PeakFlops peak;  // of one rank
  auto take_cpu_peak = [&] {
    peak = profiler::measured_peak_flops(get_num_threads(),
                                         bf16 ? profiler::PeakOperands::BF16 : profiler::PeakOperands::F32);
    r.peak_gflops = peak.gflops * static_cast<double>(ranks);
  };
  if (device.is_cpu()) {
    take_cpu_peak();
    if (half) r.half_gemm = half_gemm_path();
  } else {
    r.gpu = cuda_device_name(device.index);
    r.peak_gflops = gpu_matmul_peak_gflops(device, o.precision);
    peak.gflops = peak.gflops_per_core = r.peak_gflops;
    peak.instruction = "measured matmul rate";
  }

  // As the peer: cuDNN times the algorithms of each convolution shape on its first call
  // (torch.backends.cudnn.benchmark = True), during the warm-up.
  const CudnnBenchmarkGuard cudnn_autotune(device.is_cuda());
  const Stream stream = current_stream(device);
  // With graphs, the warm-up covers the eager steps before the capture and the capture itself.
  const int64_t warmup =
      o.cuda_graphs && device.is_cuda() ? std::max<int64_t>(o.warmup, train::kGraphWarmupSteps + 1) : o.warmup;
  for (int64_t i = 0; i < warmup; ++i) runner->step(w.inputs, w.targets);
  synchronize(stream);
  if (o.detect_sync) {
    {
      const SyncTracker syncs;
      runner->step(w.inputs, w.targets);
      r.host_syncs_per_step = syncs.total();
      r.host_syncs = syncs.summary();
    }
    synchronize(stream);
  }
  Allocator& alloc = allocator_for(device);
  alloc.reset_peak();
  Tensor loss;
  for (int i = 0; i < o.steps; ++i) {
    if (ranks > 1) comm->barrier();  // every rank starts the step together (as the peer does)
    auto t0 = std::chrono::steady_clock::now();
    loss = runner->step(w.inputs, w.targets);
    synchronize(stream);  // a GPU step ends when its kernels do (the peer synchronises too)
    r.step_ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  if (ranks > 1) {  // each step's time is the slowest rank's
    Tensor mine = from_vector(r.step_ms, {static_cast<int64_t>(r.step_ms.size())}, DType::F64);
    Tensor all = empty({ranks * mine.numel()}, DType::F64);
    comm->all_gather(mine, all);
    const double* t = all.data<double>();
    for (size_t i = 0; i < r.step_ms.size(); ++i)
      for (int64_t k = 0; k < ranks; ++k) r.step_ms[i] = std::max(r.step_ms[i], t[k * mine.numel() + i]);
  }
  r.peak_allocated_bytes = alloc.stats().peak_allocated_bytes;
  r.reserved_bytes = alloc.stats().reserved_bytes;
  if (device.is_cpu()) {
    // A VM's two vCPUs sharing one core while the first measurement ran once gave a line half
    // the usual peak (docs/PERF.md).
    profiler::remeasure_peak_flops(get_num_threads());
    take_cpu_peak();
  }
  if (o.profile_steps > 0) {  // after the timed steps: tracing must not slow what is measured
    profiler::Session session;
    for (int i = 0; i < o.profile_steps; ++i) {
      const profiler::StepScope scope(o.warmup + o.steps + i + 1);
      runner->step(w.inputs, w.targets);
      synchronize(stream);
    }
    session.stop();
    const std::vector<profiler::Span> spans = session.spans();
    r.profile_table = train::summary_table(train::summarize(spans, peak), 20) +
                      calls_by_shape(spans, o.profile_steps, static_cast<size_t>(o.profile_shapes));
  }
  r.accumulate = o.accumulate;
  r.checkpoint_blocks = o.checkpoint_blocks;
  r.channels_last = o.channels_last && w.inputs.dim() == 4;
  r.cuda_graphs = runner->graph_captured();
  r.graph_refused = runner->graph_refused();
  std::vector<double> sorted = r.step_ms;
  std::sort(sorted.begin(), sorted.end());
  r.ms_per_step = sorted[sorted.size() / 2];  // the peer's median: upper middle for even counts
  r.workload = w.name;
  r.precision = o.precision;
  r.batch = global_batch;
  r.world_size = static_cast<int>(ranks);
  r.strategy = o.strategy;
  r.threads = get_num_threads();
  r.items_per_s = static_cast<double>(global_batch * w.items_per_sample) / (r.ms_per_step / 1e3);
  r.item_unit = w.item_unit;
  Tensor mean_loss = scalar_tensor(loss.item<double>(), DType::F64);
  comm->all_reduce(mean_loss, dist::ReduceOp::Avg);  // a world of one: unchanged
  r.loss = mean_loss.item<double>();
  r.params = w.model->num_parameters();
  if (r.peak_gflops > 0) r.peak_fraction = r.model_flops / (r.ms_per_step / 1e3) / (r.peak_gflops * 1e9);
  return r;
}

namespace {

// Python's round(x, digits) printed as repr(float): shortest round-trip digits, ".0" on integers.
std::string py_float(double x, int digits) {
  double scale = std::pow(10.0, digits);
  double v = std::round(x * scale) / scale;
  char buf[64];
  // repr() writes fixed notation from 1e-4 up to 1e16 and exponents outside.
  const double m = std::fabs(v);
  const bool fixed = m == 0 || (m >= 1e-4 && m < 1e16);
  auto res = std::to_chars(buf, buf + sizeof buf, v, fixed ? std::chars_format::fixed : std::chars_format::scientific);
  std::string s(buf, res.ptr);
  if (std::isfinite(v) && s.find_first_of(".e") == std::string::npos) s += ".0";
  if (!std::isfinite(v)) s = std::isnan(v) ? "NaN" : (v > 0 ? "Infinity" : "-Infinity");
  return s;
}

std::string mib(int64_t bytes) { return py_float(static_cast<double>(bytes) / (1024.0 * 1024.0), 1); }

}  // namespace

std::string to_json_line(const BenchResult& r) {
  std::string s = "{\"impl\": \"fasttrain\", \"workload\": \"" + r.workload + "\", \"device\": \"" +
                  device_type_name(r.device.type) + "\", \"precision\": \"" + bench_precision_name(r.precision) +
                  "\", \"batch\": " + std::to_string(r.batch) + ", \"threads\": " + std::to_string(r.threads) +
                  ", \"ms_per_step\": " + py_float(r.ms_per_step, 3) + ", \"" + r.item_unit +
                  "_per_s\": " + py_float(r.items_per_s, 1) + ", \"loss\": " + py_float(r.loss, 4) +
                  ", \"params\": " + std::to_string(r.params) + ", \"cpu_isa\": \"" + r.cpu_isa + "\", \"cpu\": \"" +
                  r.cpu + "\", \"model_flops\": " + std::to_string(static_cast<int64_t>(std::llround(r.model_flops))) +
                  ", \"peak_gflops\": " + py_float(r.peak_gflops, 1) +
                  ", \"peak_fraction\": " + py_float(r.peak_fraction, 4);
  if (!r.half_gemm.empty()) s += ", \"half_gemm\": \"" + r.half_gemm + "\"";
  if (!r.gpu.empty()) s += ", \"gpu\": \"" + r.gpu + "\", \"reserved_mb\": " + mib(r.reserved_bytes);
  if (r.accumulate > 1) s += ", \"accumulate\": " + std::to_string(r.accumulate);
  if (r.checkpoint_blocks) s += ", \"checkpoint_blocks\": true";
  if (r.channels_last) s += ", \"channels_last\": true";
  if (r.cuda_graphs) s += ", \"cuda_graphs\": true";
  if (r.host_syncs_per_step >= 0) s += ", \"host_syncs_per_step\": " + std::to_string(r.host_syncs_per_step);
  if (r.world_size > 1)
    s += ", \"strategy\": \"" + std::string(name_of(r.strategy)) +
         "\", \"world_size\": " + std::to_string(r.world_size) + ", \"threads_per_rank\": " + std::to_string(r.threads);
  s += ", \"peak_mem_mb\": " + mib(r.peak_allocated_bytes) + "}";
  return s;
}

}  // namespace ft::bench
