#include "backend/kernels.h"

#include <array>

#include "backend/device_backend.h"
#include "fasttrain/error.h"

namespace ft::backend {

Kernels::Kernels(DeviceType d) : device(d) {
#define FT_KERNEL_SET_DEVICE(name, sig) name.set_device(d);
  FT_KERNELS(FT_KERNEL_SET_DEVICE)
  FT_KERNELS_OPTIM(FT_KERNEL_SET_DEVICE)
  FT_KERNELS_FUSED(FT_KERNEL_SET_DEVICE)
#undef FT_KERNEL_SET_DEVICE
}

void missing_kernel(DeviceType device, const char* name) {
  FT_FAIL("no ", device_type_name(device), " kernel for ", name);
}

const Kernels& kernels(Device device) {
  if (const DeviceBackend* b = find_backend(device.type)) return b->kernels();
  // No backend for this type in this build: an empty table, so the call names the missing kernel.
  static const auto empty = [] {
    std::array<const Kernels*, kNumDeviceTypes> tables{};
    for (int t = 0; t < kNumDeviceTypes; ++t) tables[t] = new Kernels(static_cast<DeviceType>(t));
    return tables;
  }();
  return *empty[static_cast<size_t>(device.type)];
}

}  // namespace ft::backend
