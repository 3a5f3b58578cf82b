// Devices and streams. The CPU is a device like any other; every kernel names the stream it runs
// on. A CPU stream is the calling thread (kernels run synchronously on the engine's thread pool);
// a CUDA stream wraps a cudaStream_t. Nothing here needs a GPU or a driver.
#pragma once
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace ft {

enum class DeviceType : uint8_t { CPU = 0, CUDA = 1 };
inline constexpr int kNumDeviceTypes = 2;
// Per type, in the enum's order: the name in device strings ("cuda:1") and the label in messages.
inline constexpr const char* kDeviceTypeNames[] = {"cpu", "cuda"};
inline constexpr const char* kDeviceTypeLabels[] = {"CPU", "CUDA"};
static_assert(sizeof(kDeviceTypeNames) / sizeof(*kDeviceTypeNames) == kNumDeviceTypes);
static_assert(sizeof(kDeviceTypeLabels) / sizeof(*kDeviceTypeLabels) == kNumDeviceTypes);
constexpr const char* device_type_name(DeviceType t) { return kDeviceTypeNames[static_cast<int>(t)]; }
constexpr const char* device_type_label(DeviceType t) { return kDeviceTypeLabels[static_cast<int>(t)]; }

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;

  constexpr Device() = default;
  constexpr Device(DeviceType t, int i = 0) : type(t), index(i) {}
  static constexpr Device cpu() { return Device(DeviceType::CPU, 0); }
  static constexpr Device cuda(int i = 0) { return Device(DeviceType::CUDA, i); }
  // "cpu", "cuda", "cuda:1"; throws ft::Error naming the string on anything else.
  static Device parse(const std::string& s);
  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  std::string str() const;
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
};

// An ordered queue of work on one device. handle is the native stream (cudaStream_t) or null for
// the device's default stream; on the CPU it is always null.
struct Stream {
  Device device;
  void* handle = nullptr;
  bool operator==(const Stream& o) const { return device == o.device && handle == o.handle; }
};

// The stream kernels on `device` are issued to by the calling thread (thread-local, like
// torch.cuda.current_stream()).
Stream current_stream(Device device);
void set_current_stream(Stream stream);

// Makes `stream` current for the lifetime of the guard.
class StreamGuard {
 public:
  explicit StreamGuard(Stream stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  Stream previous_;
};

// A stream for work that should overlap the compute stream (host-to-device copies of the next
// batch): on CUDA, the next of kSideStreams non-blocking streams per device, handed out in turn
// (so consecutive calls give different streams). They are created on first use and never
// destroyed, like PyTorch's stream pool, so a stream handle kept by the allocators (record_stream)
// or waited on by an event stays valid however long the block or event lives. On the CPU, where
// work runs synchronously in the calling thread, it is the null stream.
inline constexpr int kSideStreams = 8;
Stream side_stream(Device device);

// A point in a stream's work (torch.cuda.Event without timing). record() marks the work issued so
// far on a stream; block() makes another stream wait for it on the device (the host goes on);
// synchronize() makes the host wait; query() says whether it has been reached. An event never
// recorded counts as reached. On the CPU every call returns at once: CPU work is complete when the
// call that issued it returns.
class Event {
 public:
  explicit Event(Device device);
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  Device device() const { return device_; }
  void record(Stream stream);
  void block(Stream stream) const;
  void synchronize() const;
  bool query() const;

 private:
  void check_stream(Stream stream, const char* what) const;
  Device device_;
  void* handle_ = nullptr;  // cudaEvent_t
};

// TF32 tensor-core products for f32 matmuls on CUDA (torch.backends.cuda.matmul.allow_tf32):
// f32 operands rounded to 10 mantissa bits inside the product, f32 accumulation. Off unless
// asked for (precision "tf32" turns it on around a step); no effect on the CPU. Thread-local, as
// autocast is, and set for a scope by the guard.
bool allow_tf32();
class AllowTf32Guard {
 public:
  explicit AllowTf32Guard(bool allow);
  ~AllowTf32Guard();
  AllowTf32Guard(const AllowTf32Guard&) = delete;
  AllowTf32Guard& operator=(const AllowTf32Guard&) = delete;

 private:
  bool previous_;
};

// cuDNN autotuning for convolutions (torch.backends.cudnn.benchmark): the first convolution of
// each problem (shapes, layout, dtype, stride, padding, dilation, groups) runs every cuDNN
// algorithm once (cudnnFind) and keeps the fastest for that problem; off, cuDNN's heuristics
// pick one without running anything. It pays when shapes repeat (fixed-size training); each new
// shape costs a search that waits for the device. Off by default, as in PyTorch.
//
// This switch and deterministic_algorithms() are process-wide (atomics), unlike allow_tf32():
// they are configuration set once at start-up, like their PyTorch counterparts, and must reach
// every thread that issues convolutions (data-parallel workers, a backward pass on another
// thread), where a thread-local value set by main would silently not apply. Plans are cached per
// value, so changing either at any time is safe. The guards restore the previous value; they are
// for scopes (tests, a benchmark), not for threads wanting different values at once.
bool cudnn_benchmark();
void set_cudnn_benchmark(bool on);
class CudnnBenchmarkGuard {
 public:
  explicit CudnnBenchmarkGuard(bool on);
  ~CudnnBenchmarkGuard();
  CudnnBenchmarkGuard(const CudnnBenchmarkGuard&) = delete;
  CudnnBenchmarkGuard& operator=(const CudnnBenchmarkGuard&) = delete;

 private:
  bool previous_;
};

// Only algorithms that give bitwise-identical results run to run
// (torch.use_deterministic_algorithms): cuDNN convolutions choose among the algorithms cuDNN
// reports as deterministic (no atomic accumulation), failing with a clear error when a problem
// has none. Off by default: the non-deterministic algorithms are often the fastest weight
// gradients.
bool deterministic_algorithms();
void set_deterministic_algorithms(bool on);
class DeterministicAlgorithmsGuard {
 public:
  explicit DeterministicAlgorithmsGuard(bool on);
  ~DeterministicAlgorithmsGuard();
  DeterministicAlgorithmsGuard(const DeterministicAlgorithmsGuard&) = delete;
  DeterministicAlgorithmsGuard& operator=(const DeterministicAlgorithmsGuard&) = delete;

 private:
  bool previous_;
};

// Host-device synchronisations (`--detect-sync`; torch.cuda.set_sync_debug_mode's question):
// while a SyncTracker is alive it counts, by name, every point where the host waits for a CUDA
// device: blocking copies (to(cpu), item()), synchronize(), Event::synchronize(), the index checks
// that read a flag back from the device, and the allocator handing cached memory back (cudaFree
// waits for the device). Process-wide: a tracker sees every thread's waits, and nested trackers
// each see all of them. Nothing is counted on the CPU, where there is nothing to wait for.
struct SyncCount {
  std::string what;  // "to(cpu): f32 [] (item)", "synchronize", "index check: embedding", ...
  int64_t count = 0;
};
class SyncTracker {
 public:
  SyncTracker();
  ~SyncTracker();
  SyncTracker(const SyncTracker&) = delete;
  SyncTracker& operator=(const SyncTracker&) = delete;
  int64_t total() const;
  std::vector<SyncCount> counts() const;  // in the order first seen
  std::string summary() const;            // "2: synchronize x1, to(cpu): f32 [] x1"; "none"

 private:
  friend void note_host_sync(const std::string& what);
  mutable std::mutex mu_;
  std::vector<SyncCount> counts_;
};

// Number of usable CUDA devices; 0 when the build has no CUDA or no driver/GPU is present.
int cuda_device_count();
bool cuda_available();
// Whether this build has the CUDA backend (whatever the machine has).
bool cuda_compiled();
// The GPU's name ("NVIDIA H100 80GB HBM3"); throws when the device is not available.
std::string cuda_device_name(int device);
// Waits for all work on the stream (no-op on the CPU).
void synchronize(Stream stream);

}  // namespace ft
