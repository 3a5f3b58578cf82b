#include "backend/kernels.h"

#include "backend/cpu/kernels.h"
#include "backend/cuda_hooks.h"

#include <array>
#include <atomic>

#include "fasttrain/error.h"

namespace ft::backend {
namespace {

std::array<std::atomic<const Kernels*>, kNumDeviceTypes>& registry() {
  static std::array<std::atomic<const Kernels*>, kNumDeviceTypes> tables{};
  return tables;
}

}  // namespace

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
  if (device.type == DeviceType::CPU) return cpu_kernels();
  (void)cuda_hooks();  // the CUDA backend registers its table when the hooks are first made
  if (const Kernels* k = registry()[static_cast<size_t>(device.type)].load(std::memory_order_acquire)) return *k;
  // Only two device types exist; a third needs its own empty table here.
  static_assert(kNumDeviceTypes == 2);
  static const Kernels empty_cuda(DeviceType::CUDA);
  return empty_cuda;
}

void register_kernels(DeviceType device, const Kernels* table) {
  FT_CHECK(table != nullptr && table->device == device, "register_kernels: table for another device");
  registry()[static_cast<size_t>(device)].store(table, std::memory_order_release);
}

}  // namespace ft::backend
