// Devices and streams. The CPU is a device like any other; every kernel names the stream it runs
// on. A CPU stream is the calling thread (kernels run synchronously on the engine's thread pool);
// a CUDA stream wraps a cudaStream_t. Nothing here needs a GPU or a driver.
#pragma once
#include <cstdint>
#include <string>

namespace ft {

enum class DeviceType : uint8_t { CPU = 0, CUDA = 1 };
inline constexpr int kNumDeviceTypes = 2;

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

// Number of usable CUDA devices; 0 when the build has no CUDA or no driver/GPU is present.
int cuda_device_count();
bool cuda_available();
// Waits for all work on the stream (no-op on the CPU).
void synchronize(Stream stream);

}  // namespace ft
