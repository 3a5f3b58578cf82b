// The profiler: spans of time on every thread, written as a Chrome trace (trace-event JSON, opened
// by Perfetto and chrome://tracing), and the memory history of the allocators (memory.h).
//
// What is recorded while a Session is open:
//   - every kernel call through the kernel table (src/backend/kernels.h, the one place ops reach a
//     device), with its input shapes and dtypes, FLOPs (src/core/op_flops.cpp) and bytes moved;
//   - every autograd node run by backward ("LinearBackward"), enclosing the kernels it calls;
//   - phases (data, forward, backward, optimizer, checkpoint, eval) as enclosing spans, from
//     PhaseScope, and steps (StepScope);
//   - user spans (Range, like torch.profiler.record_function);
//   - the allocators' allocated and reserved bytes as counter tracks.
// One lane (tid) per thread, named by set_thread_name ("train", "loader worker 0").
//
// Off, the whole cost on the hot path is one relaxed atomic load per kernel call, module call,
// autograd node and phase (active() below); nothing is allocated and no clock is read.
#pragma once
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace ft::nn {
class Module;
}

namespace ft::profiler {

namespace detail {
// Bit 0: a Session records spans; bit 1: the memory history records allocations.
inline constexpr uint32_t kTracing = 1, kMemoryHistory = 2;
extern std::atomic<uint32_t> g_flags;
}  // namespace detail

// Whether a Session or the memory history is recording (the hot-path test).
inline bool active() noexcept { return detail::g_flags.load(std::memory_order_relaxed) != 0; }
inline bool tracing() noexcept { return (detail::g_flags.load(std::memory_order_relaxed) & detail::kTracing) != 0; }

// What part of a training step a thread is in. Recorded with every span and allocation, so time
// and memory can be attributed to it. Loader worker threads are in Data for their whole life.
// Communication: a data-parallel step waiting for gradient all-reduces backward did not hide.
enum class Phase : uint8_t { None, Data, Forward, Backward, Optimizer, Checkpoint, Eval, Communication };
inline constexpr int kPhaseCount = 8;
const char* phase_name(Phase p);  // "none", "data", "forward", ...
Phase current_phase();            // this thread's

// While a session or the memory history records: sets this thread's phase for the scope (its
// allocations are attributed to it) and, while tracing, records the scope as a span. Otherwise
// it does nothing.
class PhaseScope {
 public:
  explicit PhaseScope(Phase phase);
  ~PhaseScope();
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

 private:
  Phase previous_;
  int64_t start_ns_ = -1;  // -1: not traced
};

// A user span (torch.profiler.record_function): recorded while tracing, free otherwise.
class Range {
 public:
  explicit Range(const char* name);
  // `category`: the span's trace category (a static string), "user" unless given: the
  // communication thread's collectives are "communication".
  explicit Range(std::string name, const char* category = "user");
  ~Range();
  Range(const Range&) = delete;
  Range& operator=(const Range&) = delete;

 private:
  std::string name_;
  const char* category_ = "user";
  int64_t start_ns_ = -1;
};

// A training step as an enclosing span "step N"; events inside carry the step number.
class StepScope {
 public:
  explicit StepScope(int64_t step);
  ~StepScope();
  StepScope(const StepScope&) = delete;
  StepScope& operator=(const StepScope&) = delete;

 private:
  int64_t step_, start_ns_ = -1;
};

// Registers the module paths of `root` and its descendants ("transformer.h.0.attn"; the root is
// "(model)") so module spans and the memory history name them; unregistered modules appear under their
// type name. Forget them with forget_module_names() before the modules are destroyed.
void name_modules(nn::Module& root);
void forget_module_names();

// Names this thread's lane in traces. Cheap: only a thread-local string is set.
void set_thread_name(const std::string& name);
// Marks this thread as a data loader thread: its allocations count as data batches.
void set_thread_phase(Phase phase);

// One recorded span. Times are nanoseconds since the Session started.
struct Span {
  std::string name;      // kernel ("matmul", "relu", "conv2d_forward"), node, phase, "step N" or user name
  std::string category;  // "kernel", "autograd", "phase", "step", "user"
  int tid = 0;           // lane
  int64_t start_ns = 0, duration_ns = 0;
  int64_t step = -1;  // the StepScope it ran in (-1: none)
  Phase phase = Phase::None;
  double flops = 0;    // kernels with a formula in op_flops.cpp; 0 otherwise
  double bytes = 0;    // kernels: bytes of every tensor argument (each read or written once)
  std::string shapes;  // kernels: "[64,128] [128,256] [64,256]", one per tensor argument
  std::string dtypes;  // kernels: "f32 f32 f32"
};

// An allocator counter sample (the "C" track).
struct CounterSample {
  int64_t time_ns = 0;
  int64_t allocated_bytes = 0, reserved_bytes = 0;
};

// Where one process's trace sits in a job's combined trace (merge_chrome_traces): its Chrome
// trace "process" (pid and name; Perfetto shows one group of lanes per process) and the job's
// common time origin on the system clock, so that the ranks' spans line up.
struct TraceProcess {
  int pid = 1;
  std::string name = "fasttrain";
  int64_t origin_unix_ns = -1;  // <0: this session's own start
};

// Records while open; one Session at a time in a process (a second one is an ft::Error).
class Session {
 public:
  Session();
  ~Session();  // stops
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  void stop();  // idempotent; spans still open on other threads are dropped
  bool running() const { return running_; }

  // Everything recorded so far (after stop(): everything), spans in order of their end per thread.
  std::vector<Span> spans() const;
  std::vector<CounterSample> counters() const;
  // lane -> thread name
  std::vector<std::pair<int, std::string>> thread_names() const;

  // The trace as Chrome trace-event JSON text ({"traceEvents": [...], ...}), and written to a
  // file atomically.
  std::string chrome_trace_json(const TraceProcess& process = {}) const;
  void write_chrome_trace(const std::string& path) const;
  // When the session started, in nanoseconds since the Unix epoch (the system clock): the ranks of
  // a job take the earliest of theirs as the origin of the combined trace.
  int64_t start_unix_ns() const { return start_unix_ns_; }

 private:
  bool running_ = false;
  uint64_t generation_ = 0;
  int64_t start_unix_ns_ = 0;
};

// One trace-event document holding the events of every document in `traces` (each a
// chrome_trace_json, of a different pid): a job's ranks side by side in one file.
std::string merge_chrome_traces(const std::vector<std::string>& traces);

// The peak arithmetic rate of this machine for a run's matrix products, measured (not looked up).
// GFLOP/s counting a multiply-add as 2 FLOPs, for `threads` threads (0: get_num_threads()),
// measured once per process and thread count.
// - F32 (fp32, tf32, and f16, whose operands the CPU widens): the widest fp32 FMA the CPU has.
//   With AVX-512, 12 independent vfmadd231ps zmm chains run on every thread at once (the rate
//   `fasttrain bench` reports as peak_gflops); otherwise one core's AVX2 or scalar chains for
//   about 20 ms, times `threads`.
// - BF16 (bf16-mixed, bf16-true): the fastest bf16 product the CPU has: the AMX tile multiply,
//   vdpbf16ps, or FMA on widened operands, whichever measured the most.
enum class PeakOperands { F32, BF16 };
struct PeakFlops {
  double gflops = 0;           // for `threads` threads
  double gflops_per_core = 0;  // gflops / threads
  int threads = 1;
  std::string instruction;  // "vfmadd231ps zmm", "vfmadd231ps ymm", "scalar", "vdpbf16ps zmm", "tdpbf16ps"
};
PeakFlops measured_peak_flops(int threads = 0, PeakOperands operands = PeakOperands::F32);
// Measures the AVX-512 rates on `threads` threads again and keeps, per rate, the larger of this
// and the earlier measurement for the calls that follow. A virtual machine's two vCPUs can share
// one physical core for a while, and a measurement then reads half the rate.
void remeasure_peak_flops(int threads);

}  // namespace ft::profiler
