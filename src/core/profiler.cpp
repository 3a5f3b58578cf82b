// The profiler's recording side (fasttrain/profiler.h): per-thread span buffers, the scopes that
// fill them, the Chrome trace-event export and the measured FMA peak.
//
// Each thread appends to its own buffer under the buffer's own mutex, which only the exporting
// thread ever contends for, so threads never wait on each other while profiling. A buffer belongs
// to one session (generation); a thread that first records in a new session gets a new buffer
// and lane. Spans are written when they end, with nanosecond times from one steady clock; the
// export converts them to the trace format's microseconds.
//
// Trace format (Chrome trace-event JSON, "JSON Object Format"): complete events ("ph": "X", ts and
// dur in microseconds) per span with args {shapes, dtypes, flops, bytes, step, phase}; metadata
// events ("ph": "M") naming the process and each lane; counter events ("ph": "C") with the CPU
// allocator's allocated and reserved bytes.
#include "fasttrain/profiler.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <mutex>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "backend/cpu/peak_rate.h"
#include "core/profiler_context.h"
#include "fasttrain/allocator.h"
#include "fasttrain/atomic_file.h"
#include "fasttrain/error.h"
#include "fasttrain/parallel.h"

namespace ft::profiler {

namespace detail {
std::atomic<uint32_t> g_flags{0};
}  // namespace detail

namespace {

using detail::ThreadContext;

std::atomic<uint64_t> g_generation{0};  // of the running session (0: none ran yet)
std::atomic<int64_t> g_t0_ns{0};        // steady-clock time the session started
std::atomic<int64_t> g_step{-1};        // StepScope's step

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct ThreadBuffer {
  std::mutex mu;
  uint64_t generation = 0;
  int tid = 0;
  std::string name;
  std::vector<Span> spans;
  std::vector<CounterSample> counters;
  int64_t last_allocated = -1, last_reserved = -1;
};

struct SessionState {
  std::mutex mu;
  bool running = false;
  int next_tid = 1;
  std::vector<std::shared_ptr<ThreadBuffer>> buffers;
};
SessionState& session_state() {
  static SessionState* s = new SessionState();  // leaked: threads may record during exit
  return *s;
}

thread_local std::shared_ptr<ThreadBuffer> tls_buffer;

// This thread's buffer in the running session, or nullptr when none runs.
ThreadBuffer* thread_buffer() {
  const uint64_t gen = g_generation.load(std::memory_order_acquire);
  if (tls_buffer && tls_buffer->generation == gen) return tls_buffer.get();
  SessionState& s = session_state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.running) return nullptr;
  auto b = std::make_shared<ThreadBuffer>();
  b->generation = gen;
  b->tid = s.next_tid++;
  const std::string& name = detail::thread_context().thread_name;
  b->name = name.empty() ? "thread " + std::to_string(b->tid) : name;
  s.buffers.push_back(b);
  tls_buffer = b;
  return b.get();
}

void sample_counters(ThreadBuffer& b, int64_t t) {
  const AllocatorStats st = allocator_for(Device::cpu()).stats();
  std::lock_guard<std::mutex> lock(b.mu);
  if (st.allocated_bytes == b.last_allocated && st.reserved_bytes == b.last_reserved) return;
  b.last_allocated = st.allocated_bytes;
  b.last_reserved = st.reserved_bytes;
  b.counters.push_back({t, st.allocated_bytes, st.reserved_bytes});
}

// Records a span that started at start_ns and ends now.
void emit(std::string name, const char* category, int64_t start_ns, const detail::KernelCall* call = nullptr,
          int64_t step = -2) {
  ThreadBuffer* b = thread_buffer();
  if (b == nullptr) return;
  const int64_t end = detail::now_ns();
  Span s;
  s.name = std::move(name);
  s.category = category;
  s.tid = b->tid;
  s.start_ns = start_ns;
  s.duration_ns = std::max<int64_t>(0, end - start_ns);
  s.step = step == -2 ? g_step.load(std::memory_order_relaxed) : step;
  s.phase = detail::thread_context().phase;
  if (call != nullptr) {
    s.flops = detail::kernel_flops(*call);
    for (const auto& t : call->tensors) {
      if (!s.shapes.empty()) s.shapes += ' ';
      if (!s.dtypes.empty()) s.dtypes += ' ';
      if (!t.defined) {
        s.shapes += "-";
        s.dtypes += "-";
        continue;
      }
      s.shapes += '[';
      for (size_t i = 0; i < t.shape.size(); ++i) {
        if (i) s.shapes += ',';
        s.shapes += std::to_string(t.shape[i]);  // appended, not "," + ...: GCC 12 warns falsely (-Wrestrict) there
      }
      s.shapes += ']';
      s.dtypes += dtype_name(t.dtype);
      s.bytes += static_cast<double>(t.nbytes);
    }
  }
  {
    std::lock_guard<std::mutex> lock(b->mu);
    b->spans.push_back(std::move(s));
  }
  if (call != nullptr || std::string_view(category) == "phase") sample_counters(*b, end);
}

std::mutex g_module_mu;
std::unordered_map<const void*, std::string>& module_paths() {
  static auto* m = new std::unordered_map<const void*, std::string>();
  return *m;
}

}  // namespace

// --- thread context and scopes ---

namespace detail {

int64_t now_ns() { return steady_ns() - g_t0_ns.load(std::memory_order_relaxed); }

ThreadContext& thread_context() {
  thread_local ThreadContext ctx;
  return ctx;
}

int64_t current_step() { return g_step.load(std::memory_order_relaxed); }

AllocationContext allocation_context() {
  ThreadContext& c = thread_context();
  return {c.phase,
          current_step(),
          c.kernel,
          c.sub_op,
          c.node.empty() ? nullptr : &c.node,
          c.modules.empty() ? nullptr : &c.modules.back()};
}

void collect(KernelCall& call, const Tensor& t) {
  KernelCall::TensorInfo info;
  if (t.defined()) {
    if (std::none_of(call.tensors.begin(), call.tensors.end(), [](const auto& i) { return i.defined; }))
      call.device = t.device();
    info.defined = true;
    info.shape = t.shape().vec();
    info.dtype = t.dtype();
    info.nbytes = static_cast<int64_t>(t.nbytes());
  }
  call.tensors.push_back(std::move(info));
}
DeviceWait::DeviceWait(Device device) : device_(device) {
  if (device_.is_cuda()) synchronize(current_stream(device_));
}
DeviceWait::~DeviceWait() {
  if (!device_.is_cuda()) return;
  try {
    synchronize(current_stream(device_));
  } catch (const Error&) {
    // A failed kernel reports its own error; the span just ends.
  }
}

void collect(KernelCall& call, const std::vector<Tensor>& ts) {
  for (const Tensor& t : ts) collect(call, t);
}
void collect(KernelCall& call, math::UnaryOp op) { call.sub_op = math::unary_info(op).name; }
void collect(KernelCall& call, math::BinaryOp op) { call.sub_op = math::binary_info(op).name; }
void collect(KernelCall& call, const backend::AttentionParams& p) { call.causal = p.causal; }

void memory_name_pending(const char* kernel, const char* sub_op);  // memory_history.cpp

KernelScope::KernelScope(const char* kernel, KernelCall* call) : call_(call) {
  ThreadContext& c = thread_context();
  previous_kernel_ = c.kernel;
  previous_sub_op_ = c.sub_op;
  c.kernel = kernel;
  c.sub_op = call != nullptr ? call->sub_op : nullptr;
  if (!c.pending_allocations.empty()) memory_name_pending(kernel, c.sub_op);
  if (call_ != nullptr) start_ns_ = now_ns();
}

KernelScope::~KernelScope() {
  ThreadContext& c = thread_context();
  if (call_ != nullptr && start_ns_ >= 0 && tracing()) {
    std::string name = call_->sub_op != nullptr ? call_->sub_op : call_->kernel;
    if (call_->sub_op != nullptr && std::string_view(call_->kernel).ends_with("_backward")) name += "_backward";
    emit(std::move(name), "kernel", start_ns_, call_);
  }
  c.kernel = previous_kernel_;
  c.sub_op = previous_sub_op_;
}

NodeScope::NodeScope(std::string name, const std::string& module) {
  ThreadContext& c = thread_context();
  previous_ = std::move(c.node);
  c.node = std::move(name);
  if (!module.empty()) {
    c.modules.push_back(module);
    pushed_module_ = true;
  }
  if (tracing()) start_ns_ = now_ns();
}

NodeScope::~NodeScope() {
  ThreadContext& c = thread_context();
  if (start_ns_ >= 0 && tracing()) emit(c.node, "autograd", start_ns_);
  if (pushed_module_) c.modules.pop_back();
  c.node = std::move(previous_);
}

std::string current_module() {
  const ThreadContext& c = thread_context();
  return c.modules.empty() ? std::string() : c.modules.back();
}

// Module spans are emitted by the caller's ModuleScope; the start time rides on the stack.
namespace {
thread_local std::vector<int64_t> tls_module_starts;
}

ModuleScope::ModuleScope(std::string path) {
  thread_context().modules.push_back(std::move(path));
  tls_module_starts.push_back(tracing() ? now_ns() : -1);
}

ModuleScope::~ModuleScope() {
  ThreadContext& c = thread_context();
  const int64_t start = tls_module_starts.back();
  tls_module_starts.pop_back();
  if (start >= 0 && tracing()) emit(c.modules.back(), "module", start);
  c.modules.pop_back();
}

void set_module_path(const void* module, std::string path) {
  std::lock_guard<std::mutex> lock(g_module_mu);
  module_paths()[module] = std::move(path);
}
std::optional<std::string> module_path(const void* module) {
  std::lock_guard<std::mutex> lock(g_module_mu);
  auto it = module_paths().find(module);
  if (it == module_paths().end()) return std::nullopt;
  return it->second;
}
void clear_module_paths() {
  std::lock_guard<std::mutex> lock(g_module_mu);
  module_paths().clear();
}

}  // namespace detail

// --- public scopes ---

const char* phase_name(Phase p) {
  static constexpr const char* kNames[] = {"none",      "data",       "forward", "backward",
                                           "optimizer", "checkpoint", "eval",    "communication"};
  static_assert(sizeof kNames / sizeof kNames[0] == kPhaseCount, "a name per phase");
  return kNames[static_cast<int>(p)];
}

Phase current_phase() { return detail::thread_context().phase; }

PhaseScope::PhaseScope(Phase phase) : previous_(Phase::None) {
  if (!active()) return;
  ThreadContext& c = detail::thread_context();
  previous_ = c.phase;
  c.phase = phase;
  start_ns_ = tracing() ? detail::now_ns() : 0;
}

PhaseScope::~PhaseScope() {
  if (start_ns_ < 0) return;
  ThreadContext& c = detail::thread_context();
  if (tracing()) emit(phase_name(c.phase), "phase", start_ns_);
  c.phase = previous_;
}

Range::Range(const char* name) {  // no string is made unless tracing
  if (!tracing()) return;
  name_ = name;
  start_ns_ = detail::now_ns();
}
Range::Range(std::string name, const char* category) : category_(category) {
  if (!tracing()) return;
  name_ = std::move(name);
  start_ns_ = detail::now_ns();
}
Range::~Range() {
  if (start_ns_ >= 0 && tracing()) emit(std::move(name_), category_, start_ns_);
}

StepScope::StepScope(int64_t step) : step_(step) {
  if (!active()) return;
  g_step.store(step, std::memory_order_relaxed);
  start_ns_ = detail::now_ns();
}
StepScope::~StepScope() {
  if (start_ns_ < 0) return;
  if (tracing()) emit("step " + std::to_string(step_), "step", start_ns_, nullptr, step_);
  g_step.store(-1, std::memory_order_relaxed);
}

void set_thread_name(const std::string& name) { detail::thread_context().thread_name = name; }
void set_thread_phase(Phase phase) { detail::thread_context().phase = phase; }

// --- sessions ---

Session::Session() {
  SessionState& s = session_state();
  std::lock_guard<std::mutex> lock(s.mu);
  FT_CHECK(!s.running, "profiler: expected no other profiling session to be running, found one running");
  s.running = true;
  s.buffers.clear();
  s.next_tid = 1;
  g_t0_ns.store(steady_ns(), std::memory_order_relaxed);
  start_unix_ns_ =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  generation_ = g_generation.fetch_add(1, std::memory_order_acq_rel) + 1;
  detail::g_flags.fetch_or(detail::kTracing, std::memory_order_release);
  running_ = true;
}

Session::~Session() { stop(); }

void Session::stop() {
  if (!running_) return;
  SessionState& s = session_state();
  std::lock_guard<std::mutex> lock(s.mu);
  detail::g_flags.fetch_and(~detail::kTracing, std::memory_order_release);
  s.running = false;
  running_ = false;
}

namespace {
// The buffers of session `generation` (the state keeps only the latest session's).
std::vector<std::shared_ptr<ThreadBuffer>> buffers_of(uint64_t generation) {
  SessionState& s = session_state();
  std::lock_guard<std::mutex> lock(s.mu);
  std::vector<std::shared_ptr<ThreadBuffer>> out;
  for (const auto& b : s.buffers)
    if (b->generation == generation) out.push_back(b);
  return out;
}
}  // namespace

std::vector<Span> Session::spans() const {
  std::vector<Span> out;
  for (const auto& b : buffers_of(generation_)) {
    std::lock_guard<std::mutex> lock(b->mu);
    out.insert(out.end(), b->spans.begin(), b->spans.end());
  }
  return out;
}

std::vector<CounterSample> Session::counters() const {
  std::vector<CounterSample> out;
  for (const auto& b : buffers_of(generation_)) {
    std::lock_guard<std::mutex> lock(b->mu);
    out.insert(out.end(), b->counters.begin(), b->counters.end());
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.time_ns < b.time_ns; });
  return out;
}

std::vector<std::pair<int, std::string>> Session::thread_names() const {
  std::vector<std::pair<int, std::string>> out;
  for (const auto& b : buffers_of(generation_)) out.emplace_back(b->tid, b->name);
  return out;
}

std::string Session::chrome_trace_json(const TraceProcess& process) const {
  using nlohmann::json;
  const double us = 1e-3;
  const int pid = process.pid;
  // Times are relative to this session's start; a job's common origin shifts them by the
  // difference (the ranks' sessions start within a step of each other).
  const double shift_us =
      process.origin_unix_ns < 0 ? 0.0 : static_cast<double>(start_unix_ns_ - process.origin_unix_ns) * us;
  json events = json::array();
  events.push_back(
      {{"ph", "M"}, {"name", "process_name"}, {"pid", pid}, {"tid", 0}, {"args", {{"name", process.name}}}});
  events.push_back(
      {{"ph", "M"}, {"name", "process_sort_index"}, {"pid", pid}, {"tid", 0}, {"args", {{"sort_index", pid}}}});
  for (const auto& [tid, name] : thread_names()) {
    events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", pid}, {"tid", tid}, {"args", {{"name", name}}}});
    // The training thread first, then the workers, in Perfetto's lane order.
    events.push_back({{"ph", "M"},
                      {"name", "thread_sort_index"},
                      {"pid", pid},
                      {"tid", tid},
                      {"args", {{"sort_index", name == "train" ? 0 : tid}}}});
  }
  std::vector<Span> all = spans();
  // Per lane by start, enclosing spans before the spans they enclose.
  std::sort(all.begin(), all.end(), [](const Span& a, const Span& b) {
    if (a.tid != b.tid) return a.tid < b.tid;
    if (a.start_ns != b.start_ns) return a.start_ns < b.start_ns;
    return a.duration_ns > b.duration_ns;
  });
  for (const Span& s : all) {
    json args = {{"step", s.step}, {"phase", phase_name(s.phase)}};
    if (s.category == "kernel") {
      args["shapes"] = s.shapes;
      args["dtypes"] = s.dtypes;
      args["flops"] = s.flops;
      args["bytes"] = s.bytes;
    }
    events.push_back({{"ph", "X"},
                      {"name", s.name},
                      {"cat", s.category},
                      {"pid", pid},
                      {"tid", s.tid},
                      {"ts", static_cast<double>(s.start_ns) * us + shift_us},
                      {"dur", static_cast<double>(s.duration_ns) * us},
                      {"args", args}});
  }
  for (const CounterSample& c : counters())
    events.push_back({{"ph", "C"},
                      {"name", "cpu memory"},
                      {"pid", pid},
                      {"tid", 0},
                      {"ts", static_cast<double>(c.time_ns) * us + shift_us},
                      {"args", {{"allocated_bytes", c.allocated_bytes}, {"reserved_bytes", c.reserved_bytes}}}});
  json doc = {{"traceEvents", events}, {"displayTimeUnit", "ms"}, {"otherData", {{"producer", "fasttrain"}}}};
  return doc.dump() + "\n";
}

void Session::write_chrome_trace(const std::string& path) const { write_file_atomically(path, chrome_trace_json()); }

std::string merge_chrome_traces(const std::vector<std::string>& traces) {
  using nlohmann::json;
  json events = json::array();
  for (const std::string& text : traces) {
    json doc;
    try {
      doc = json::parse(text);
    } catch (const json::exception& e) {
      FT_FAIL("merge_chrome_traces: expected trace-event JSON, found text that does not parse (", e.what(), ")");
    }
    FT_CHECK(doc.contains("traceEvents") && doc["traceEvents"].is_array(),
             "merge_chrome_traces: expected a document with a traceEvents array, found none");
    for (auto& e : doc["traceEvents"]) events.push_back(std::move(e));
  }
  json doc = {{"traceEvents", events}, {"displayTimeUnit", "ms"}, {"otherData", {{"producer", "fasttrain"}}}};
  return doc.dump() + "\n";
}

// --- measured peak ---

namespace {

#if defined(__x86_64__)
#define FT_PEAK_TWELVE(OP) OP(3) OP(4) OP(5) OP(6) OP(7) OP(8) OP(9) OP(10) OP(11) OP(12) OP(13) OP(14)
#define FT_PEAK_YMM(i) "vfmadd231ps %%ymm1, %%ymm2, %%ymm" #i "\n\t"
// 12 independent accumulator chains hide the FMA latency; zero operands keep values finite.
#define FT_PEAK_LOOP(BODY, ZERO)                                                                                      \
  [](long n) {                                                                                                        \
    asm volatile(ZERO "1:\n\t" FT_PEAK_TWELVE(BODY) "dec %0\n\tjnz 1b"                                                \
                 : "+r"(n)                                                                                            \
                 :                                                                                                    \
                 : "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", \
                   "xmm13", "xmm14");                                                                                 \
  }
#endif

// Best of three timings of n iterations, grown until one takes 20 ms; FLOPs per second.
double time_chains(void (*run)(long), double flops_per_iteration) {
  long n = 1000;
  double best = 0;
  for (int attempt = 0; attempt < 40; ++attempt) {
    const auto t0 = std::chrono::steady_clock::now();
    run(n);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s < 0.02) {
      n *= 2;
      continue;
    }
    best = std::max(best, flops_per_iteration * static_cast<double>(n) / s);
    if (attempt >= 2 && best > 0) {
      for (int rep = 0; rep < 2; ++rep) {
        const auto t1 = std::chrono::steady_clock::now();
        run(n);
        const double s1 = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
        best = std::max(best, flops_per_iteration * static_cast<double>(n) / s1);
      }
      break;
    }
  }
  return best;
}

// Without AVX-512 (whose rates backend/cpu/peak_rate.h measures): one core's AVX2 or scalar FMA.
PeakFlops measure_one_core() {
  PeakFlops p;
#if defined(__x86_64__)
  if (__builtin_cpu_supports("fma") && __builtin_cpu_supports("avx2")) {
    p.instruction = "vfmadd231ps ymm";
    p.gflops_per_core = time_chains(FT_PEAK_LOOP(FT_PEAK_YMM,
                                                 "vpxor %%ymm1, %%ymm1, %%ymm1\n\t"
                                                 "vpxor %%ymm2, %%ymm2, %%ymm2\n\t"),
                                    12 * 16) /
                        1e9;
    return p;
  }
#endif
  // No vector FMA we can name: 12 scalar multiply-add chains the compiler keeps in registers.
  p.instruction = "scalar";
  p.gflops_per_core = time_chains(
                          [](long n) {
                            volatile float seed = 0.f;
                            float a[12];
                            for (float& x : a) x = seed;
                            const float m = seed, c = seed;
                            for (long i = 0; i < n; ++i)
                              for (float& x : a) x = x * m + c;
                            float sum = 0;
                            for (float x : a) sum += x;
                            seed = sum;
                          },
                          24) /
                      1e9;
  return p;
}

}  // namespace

void remeasure_peak_flops(int threads) { cpu::remeasure_peak_rates(threads > 0 ? threads : get_num_threads()); }

PeakFlops measured_peak_flops(int threads, PeakOperands operands) {
  PeakFlops p;
  p.threads = threads > 0 ? threads : get_num_threads();
  // One place measures the AVX-512 rates (backend/cpu/peak_rate.h, all threads at once); the
  // one-core loop above covers CPUs without AVX-512, where those rates are 0.
  const cpu::PeakRates& rates = cpu::measured_peak_rates(p.threads);
  auto take = [&](double gflops, const char* instruction) {
    if (gflops <= p.gflops) return;
    p.gflops = gflops;
    p.instruction = instruction;
  };
  take(rates.fp32_gflops, "vfmadd231ps zmm");
  if (p.gflops == 0) {
    static const PeakFlops one = measure_one_core();
    p.gflops = one.gflops_per_core * p.threads;
    p.instruction = one.instruction;
  }
  if (operands == PeakOperands::BF16) {
    take(rates.bf16_dot_gflops, "vdpbf16ps zmm");
    take(rates.amx_bf16_gflops, "tdpbf16ps");
  }
  p.gflops_per_core = p.gflops / p.threads;
  return p;
}

}  // namespace ft::profiler
