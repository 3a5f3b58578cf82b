#include "fasttrain/device.h"

#include <algorithm>
#include <atomic>
#include <mutex>

#include "backend/device_backend.h"
#include "fasttrain/cuda_graph.h"
#include "fasttrain/error.h"

namespace ft {

namespace {

// "'cpu', 'cuda' or 'cuda:N'": the CPU by name alone, every other type with or without an index.
std::string device_forms() {
  std::vector<std::string> forms{"'cpu'"};
  for (int t = 1; t < kNumDeviceTypes; ++t) {
    const std::string name = kDeviceTypeNames[t];
    forms.push_back("'" + name + "'");
    forms.push_back("'" + name + ":N'");
  }
  std::string out;
  for (size_t i = 0; i < forms.size(); ++i) out += (i == 0 ? "" : i + 1 == forms.size() ? " or " : ", ") + forms[i];
  return out;
}

}  // namespace

Device Device::parse(const std::string& s) {
  if (s == "cpu") return Device::cpu();
  for (int t = 1; t < kNumDeviceTypes; ++t) {
    const std::string name = kDeviceTypeNames[t];
    const auto type = static_cast<DeviceType>(t);
    if (s == name) return Device(type, 0);
    if (s.rfind(name + ":", 0) != 0) continue;
    const std::string idx = s.substr(name.size() + 1);
    const bool digits = !idx.empty() && idx.find_first_not_of("0123456789") == std::string::npos;
    FT_CHECK(digits && idx.size() < 4, "device '", s, "': expected ", device_forms());
    return Device(type, std::stoi(idx));
  }
  FT_FAIL("device '", s, "': expected ", device_forms());
}

std::string Device::str() const {
  if (type == DeviceType::CPU) return "cpu";
  return std::string(device_type_name(type)) + ":" + std::to_string(index);
}

namespace {
thread_local Stream tls_cuda_stream[64];
}

Stream current_stream(Device device) {
  if (device.is_cpu()) return Stream{device, nullptr};
  FT_CHECK(device.index >= 0 && device.index < 64, "device index ", device.index, " out of range");
  Stream s = tls_cuda_stream[device.index];
  s.device = device;
  return s;
}

void set_current_stream(Stream stream) {
  if (stream.device.is_cpu()) return;
  tls_cuda_stream[stream.device.index] = stream;
}

StreamGuard::StreamGuard(Stream stream) : previous_(current_stream(stream.device)) { set_current_stream(stream); }
StreamGuard::~StreamGuard() { set_current_stream(previous_); }

namespace {
thread_local bool tls_allow_tf32 = false;
}
bool allow_tf32() { return tls_allow_tf32; }
AllowTf32Guard::AllowTf32Guard(bool allow) : previous_(tls_allow_tf32) { tls_allow_tf32 = allow; }
AllowTf32Guard::~AllowTf32Guard() { tls_allow_tf32 = previous_; }

// Process-wide, not thread-local: see device.h. Relaxed order is enough, as each flag is read
// on its own and only selects which cached convolution plan a call uses.
namespace {
std::atomic<bool> g_cudnn_benchmark{false};
std::atomic<bool> g_deterministic_algorithms{false};
}  // namespace
bool cudnn_benchmark() { return g_cudnn_benchmark.load(std::memory_order_relaxed); }
void set_cudnn_benchmark(bool on) { g_cudnn_benchmark.store(on, std::memory_order_relaxed); }
CudnnBenchmarkGuard::CudnnBenchmarkGuard(bool on) : previous_(cudnn_benchmark()) { set_cudnn_benchmark(on); }
CudnnBenchmarkGuard::~CudnnBenchmarkGuard() { set_cudnn_benchmark(previous_); }
bool deterministic_algorithms() { return g_deterministic_algorithms.load(std::memory_order_relaxed); }
void set_deterministic_algorithms(bool on) { g_deterministic_algorithms.store(on, std::memory_order_relaxed); }
DeterministicAlgorithmsGuard::DeterministicAlgorithmsGuard(bool on) : previous_(deterministic_algorithms()) {
  set_deterministic_algorithms(on);
}
DeterministicAlgorithmsGuard::~DeterministicAlgorithmsGuard() { set_deterministic_algorithms(previous_); }

int cuda_device_count() {
  const backend::DeviceBackend* b = backend::find_backend(DeviceType::CUDA);
  return b != nullptr ? b->device_count() : 0;
}
bool cuda_available() { return cuda_device_count() > 0; }
bool cuda_compiled() { return backend::find_backend(DeviceType::CUDA) != nullptr; }
std::string cuda_device_name(int device) {
  const int n = cuda_device_count();
  FT_CHECK(device >= 0 && device < n, "cuda_device_name(", device, "): device is not available (", n,
           " CUDA devices found)");
  return backend::find_backend(DeviceType::CUDA)->device_name(device);
}

void synchronize(Stream stream) {
  const backend::DeviceBackend& b = backend::require_backend(stream.device, "synchronize");
  if (b.synchronize == nullptr) return;                     // the device's work is done when its kernels return
  if (host_sync_tracking()) note_host_sync("synchronize");  // no string built on the untracked path
  b.synchronize(stream);
}

// --- host-device synchronisations ----------------------------------------------------------------
namespace {
std::atomic<int> live_trackers{0};
std::mutex trackers_mu;
std::vector<SyncTracker*>& trackers() {
  static auto* t = new std::vector<SyncTracker*>();  // leaked: trackers may outlive static destruction
  return *t;
}
}  // namespace

bool host_sync_tracking() { return live_trackers.load(std::memory_order_relaxed) > 0 || capturing_graph() != nullptr; }

void note_host_sync(const std::string& what) {
  if (capturing_graph() != nullptr)  // a graph's replay cannot stop for the host
    throw GraphCaptureError(what + " waits for the device, which a CUDA graph cannot do");
  if (!host_sync_tracking()) return;
  std::lock_guard<std::mutex> lock(trackers_mu);
  for (SyncTracker* t : trackers()) {
    std::lock_guard<std::mutex> tl(t->mu_);
    auto it = std::find_if(t->counts_.begin(), t->counts_.end(), [&](const SyncCount& c) { return c.what == what; });
    if (it == t->counts_.end())
      t->counts_.push_back({what, 1});
    else
      ++it->count;
  }
}

SyncTracker::SyncTracker() {
  std::lock_guard<std::mutex> lock(trackers_mu);
  trackers().push_back(this);
  live_trackers.fetch_add(1, std::memory_order_relaxed);
}

SyncTracker::~SyncTracker() {
  std::lock_guard<std::mutex> lock(trackers_mu);
  auto& all = trackers();
  all.erase(std::find(all.begin(), all.end(), this));
  live_trackers.fetch_sub(1, std::memory_order_relaxed);
}

int64_t SyncTracker::total() const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t n = 0;
  for (const SyncCount& c : counts_) n += c.count;
  return n;
}

std::vector<SyncCount> SyncTracker::counts() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counts_;
}

std::string SyncTracker::summary() const {
  const std::vector<SyncCount> all = counts();
  if (all.empty()) return "none";
  std::string s = std::to_string(total()) + ":";
  for (size_t i = 0; i < all.size(); ++i) s += (i ? ", " : " ") + all[i].what + " x" + std::to_string(all[i].count);
  return s;
}

}  // namespace ft

// --- side streams and events -------------------------------------------------------------------
namespace ft {
Stream side_stream(Device device) {
  const backend::DeviceBackend& b = backend::require_backend(device, "side_stream");
  if (b.stream_create == nullptr) return Stream{device, nullptr};  // one queue: the calling thread
  struct Pool {
    std::mutex mu;
    void* streams[kSideStreams] = {};
    int next = 0;
  };
  static Pool pools[64];  // per device index, as the current-stream table
  FT_CHECK(device.index < 64, "side_stream(", device.str(), "): device index out of range");
  Pool& pool = pools[device.index];
  std::lock_guard<std::mutex> lock(pool.mu);
  void*& handle = pool.streams[pool.next];
  pool.next = (pool.next + 1) % kSideStreams;
  if (handle == nullptr) handle = b.stream_create(device.index);
  return Stream{device, handle};
}

Event::Event(Device device) : device_(device) {
  const backend::DeviceBackend& b = backend::require_backend(device, "Event");
  if (b.event_create != nullptr) handle_ = b.event_create(device.index);
}

Event::~Event() {
  if (handle_ != nullptr) backend::find_backend(device_.type)->event_destroy(handle_);
}

void Event::check_stream(Stream stream, const char* what) const {
  FT_CHECK(stream.device == device_, "Event::", what, ": the event belongs to ", device_.str(), ", the stream to ",
           stream.device.str());
}

void Event::record(Stream stream) {
  check_stream(stream, "record");
  if (handle_ != nullptr) backend::find_backend(device_.type)->event_record(handle_, stream);
}

void Event::block(Stream stream) const {
  check_stream(stream, "block");
  if (handle_ != nullptr) backend::find_backend(device_.type)->stream_wait_event(stream, handle_);
}

void Event::synchronize() const {
  if (handle_ == nullptr) return;
  if (host_sync_tracking()) note_host_sync("Event::synchronize");
  backend::find_backend(device_.type)->event_synchronize(handle_);
}

bool Event::query() const { return handle_ == nullptr || backend::find_backend(device_.type)->event_query(handle_); }

}  // namespace ft
