// What a multi-tensor optimizer step hands a backend (the *_step entries of kernel_list_optim.h):
// every parameter that has a gradient, as raw pointers into device memory plus dtypes, laid end to
// end in one flat index space. A backend runs one update over all of it, however the elements fall
// into tensors (the CPU: one parallel_for; CUDA: one launch), instead of an op per tensor.
//
// The per-parameter step counts live in device memory too. A step kernel first advances every
// count by 1 - found_inf and returns at once when found_inf is set, so a skipped step leaves
// parameters, moments and counts untouched without the host ever reading the flag.
#pragma once
#include <cstdint>
#include <span>

#include "fasttrain/dtype.h"

// Declared only: every op's translation unit sees this header through the kernel table, and
// none of them needs the optimizer API.
namespace ft::optim {
struct GroupOptions;
}

namespace ft::backend {

struct Segment {
  int64_t begin = 0;  // position of the first element in the flat index space of the step
  int64_t numel = 0;  // may be 0: the parameter's step count still advances
  void* param = nullptr;
  DType param_dtype = DType::F32;
  const void* grad = nullptr;  // in the parameter's memory order
  DType grad_dtype = DType::F32;
  float* master = nullptr;                // fp32 copy of a bf16/f16 parameter; null otherwise
  void* buffers[2] = {nullptr, nullptr};  // the optimizer's buffers, f32 (f64 for f64 parameters)
  // The step at which the buffers were created: the momentum buffer's first update copies the
  // gradient (PyTorch). A skipped step does not advance *step, so the next one is "first" again.
  int64_t buffers_first_step = 0;
  int64_t* step = nullptr;  // this parameter's step count; the kernel advances it
  const optim::GroupOptions* options = nullptr;
};

struct MultiTensorStep {
  std::span<const Segment> segments;  // ascending begin
  int64_t total = 0;                  // elements over all segments
  const float* found_inf = nullptr;   // GradScaler's 0-d flag on the device; null for step()
};

}  // namespace ft::backend
