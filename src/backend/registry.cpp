// The one list of device backends: a maker per DeviceType, each returning its record. A device
// type this build has no backend for has no maker. Nothing else in the engine names a backend.
#include <array>
#include <iterator>

#include "backend/device_backend.h"
#include "fasttrain/error.h"

namespace ft {
namespace cpu {
const backend::DeviceBackend& make_backend();  // src/backend/cpu/runtime.cpp
}
#ifdef FASTTRAIN_WITH_CUDA
namespace cuda {
const backend::DeviceBackend& make_backend();  // src/backend/cuda/runtime.cu
}
#endif
}  // namespace ft

namespace ft::backend {
namespace {

using Maker = const DeviceBackend& (*)();

// Indexed by DeviceType, in its order.
constexpr Maker kMakers[] = {
    &cpu::make_backend,
#ifdef FASTTRAIN_WITH_CUDA
    &cuda::make_backend,
#else
    nullptr,
#endif
};
static_assert(std::size(kMakers) == kNumDeviceTypes, "one maker (or nullptr) per DeviceType");

}  // namespace

const DeviceBackend* find_backend(DeviceType type) {
  // Every record at once, on the first call: making one loads nothing (the CUDA record's driver
  // and libraries load on its first device query and kernel), and one table afterwards keeps this
  // lookup, which every kernel call and allocation makes, to one load.
  static const std::array<const DeviceBackend*, kNumDeviceTypes> records = [] {
    std::array<const DeviceBackend*, kNumDeviceTypes> r{};
    for (size_t t = 0; t < std::size(kMakers); ++t) {
      if (kMakers[t] == nullptr) continue;
      r[t] = &kMakers[t]();
      FT_CHECK(r[t]->type == static_cast<DeviceType>(t), "backend registry: the maker for ", kDeviceTypeNames[t],
               " made another device's record");
    }
    return r;
  }();
  return records[static_cast<size_t>(type)];
}

const DeviceBackend& require_backend(Device device, const char* what) {
  const DeviceBackend* b = find_backend(device.type);
  FT_CHECK(b != nullptr, what, "(", device.str(), "): this build has no ", device_type_label(device.type), " support");
  const int n = b->device_count();
  FT_CHECK(device.index >= 0 && device.index < n, what, "(", device.str(), "): device is not available (", n, " ",
           device_type_label(device.type), " devices found)");
  return *b;
}

}  // namespace ft::backend
