// The kernel table per device (ggml's backend interface, MLX's eval_cpu / eval_gpu): an op in
// src/ops validates its inputs, decides dtypes and records autograd, then runs
//
//   backend::kernels(x.device()).unary(op, x, out);
//
// Each backend fills a Kernels table once (the CPU per instruction-set level, at first use; CUDA
// when its record is made) and hands it out through its record (device_backend.h). An entry a backend does not provide
// stays empty, and calling it raises "no <device> kernel for <name>" here, the one place that error is made. It is also
// the one place the profiler watches ops: a kernel call is a span named by its slot.
#pragma once
#include <type_traits>
#include <utility>

#include "backend/kernel_list.h"
#include "backend/kernel_list_optim.h"
#include "core/profiler_context.h"
#include "fasttrain/device.h"

namespace ft::backend {

[[noreturn]] void missing_kernel(DeviceType device, const char* name);

// One table slot: a function pointer that knows its own name and its table's device, so an
// empty slot can say which kernel is missing where.
template <class Sig>
class Kernel;
template <class R, class... Args>
class Kernel<R(Args...)> {
 public:
  using Fn = R (*)(Args...);
  explicit constexpr Kernel(const char* name) : name_(name) {}
  Kernel& operator=(Fn fn) {
    fn_ = fn;
    return *this;
  }
  R operator()(Args... args) const {
    if (fn_ == nullptr) missing_kernel(device_, name_);
    // The profiler's one hook into ops: a relaxed load when off (core/profiler_context.h).
    if (profiler::active()) [[unlikely]]
      return profiler::detail::profiled_kernel_call(name_, fn_, std::forward<Args>(args)...);
    return fn_(std::forward<Args>(args)...);
  }
  bool has_value() const { return fn_ != nullptr; }
  const char* name() const { return name_; }
  void set_device(DeviceType d) { device_ = d; }

 private:
  Fn fn_ = nullptr;
  const char* name_;
  DeviceType device_ = DeviceType::CPU;
};

struct Kernels {
#define FT_KERNEL_SLOT(name, sig) Kernel<sig> name{#name};
  FT_KERNELS(FT_KERNEL_SLOT)
  FT_KERNELS_OPTIM(FT_KERNEL_SLOT)
  FT_KERNELS_FUSED(FT_KERNEL_SLOT)
#undef FT_KERNEL_SLOT

  explicit Kernels(DeviceType device);
  // Calls f(slot) for every entry a backend must provide, in list order (completeness checks,
  // listings); for_each_fused for the optional fusions (kernel_list.h's FT_KERNELS_FUSED).
  template <class F>
  void for_each(F&& f) const {
#define FT_KERNEL_VISIT(name, sig) f(name);
    FT_KERNELS(FT_KERNEL_VISIT)
    FT_KERNELS_OPTIM(FT_KERNEL_VISIT)
#undef FT_KERNEL_VISIT
  }
  template <class F>
  void for_each_fused(F&& f) const {
#define FT_KERNEL_VISIT(name, sig) f(name);
    FT_KERNELS_FUSED(FT_KERNEL_VISIT)
#undef FT_KERNEL_VISIT
  }
  DeviceType device;
};

// The table in effect for a device: its backend record's (device_backend.h). A device type without
// a backend in this build gets an empty table, so every kernel call names what is missing.
const Kernels& kernels(Device device);
inline const Kernels& kernels(const Tensor& on) { return kernels(on.device()); }

}  // namespace ft::backend
