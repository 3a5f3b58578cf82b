// The CPU's backend record (device_backend.h): its kernel table for the instruction-set level in
// effect, the host caching allocator, one device, and copies that are a memcpy. Its work is done
// when a kernel returns (kernels run on the calling thread and the engine's thread pool), so it has
// no streams, events or graphs, and nothing to wait for: those entries stay empty.
#include <cstring>

#include "backend/cpu/kernels.h"
#include "backend/device_backend.h"
#include "core/host_allocator.h"

namespace ft::cpu {
namespace {

const backend::Kernels& kernels() { return backend::cpu_kernels(); }

int device_count() { return 1; }

std::string device_name(int) { return "cpu"; }

void memcpy_host(void* dst, Device, const void* src, Device, size_t nbytes, Stream, bool) {
  std::memcpy(dst, src, nbytes);
}

}  // namespace

const backend::DeviceBackend& make_backend() {
  static const backend::DeviceBackend record = [] {
    backend::DeviceBackend b;
    b.type = DeviceType::CPU;
    b.kernels = kernels;
    b.allocator = host_allocator;
    b.device_count = device_count;
    b.device_name = device_name;
    b.memcpy = memcpy_host;
    return b;
  }();
  return record;
}

}  // namespace ft::cpu
