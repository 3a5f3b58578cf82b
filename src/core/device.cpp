#include "fasttrain/device.h"

#include "fasttrain/error.h"
#include "backend/cuda_hooks.h"

namespace ft {

Device Device::parse(const std::string& s) {
  if (s == "cpu") return Device::cpu();
  if (s == "cuda") return Device::cuda(0);
  if (s.rfind("cuda:", 0) == 0) {
    std::string idx = s.substr(5);
    bool digits = !idx.empty() && idx.find_first_not_of("0123456789") == std::string::npos;
    FT_CHECK(digits && idx.size() < 4, "device '", s, "': expected 'cpu', 'cuda' or 'cuda:N'");
    return Device::cuda(std::stoi(idx));
  }
  FT_FAIL("device '", s, "': expected 'cpu', 'cuda' or 'cuda:N'");
}

std::string Device::str() const {
  if (type == DeviceType::CPU) return "cpu";
  return "cuda:" + std::to_string(index);
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

int cuda_device_count() { return cuda_hooks().device_count ? cuda_hooks().device_count() : 0; }
bool cuda_available() { return cuda_device_count() > 0; }

void synchronize(Stream stream) {
  if (stream.device.is_cpu()) return;
  FT_CHECK(cuda_hooks().synchronize, "synchronize: this build has no CUDA support");
  cuda_hooks().synchronize(stream);
}

}  // namespace ft
