#include "ops/common.h"

namespace ft::ops {

Device common_device(std::initializer_list<const Tensor*> ts, const char* op) {
  const Tensor* first = nullptr;
  for (const Tensor* t : ts) {
    if (!t || !t->defined()) continue;
    if (!first) {
      first = t;
      continue;
    }
    FT_CHECK(t->device() == first->device(), op, ": expected all tensors on one device, found ", first->device().str(),
             " and ", t->device().str());
  }
  FT_CHECK(first != nullptr, op, ": no defined tensor among the inputs");
  return first->device();
}

void check_floating(const Tensor& t, const char* op, const char* what) {
  FT_CHECK(is_floating(t.dtype()), op, ": ", what, " must be a floating-point tensor, found ", dtype_name(t.dtype()));
}

void check_cpu(const Tensor& t, const char* op) {
  FT_CHECK(t.device().is_cpu(), op, ": no kernel for device ", t.device().str(), " in this build yet");
}

Tensor scalar_like(Scalar s, const Tensor& like) {
  DType dt = like.dtype();
  if (s.is_floating() && !is_floating(dt)) dt = DType::F32;
  if (!s.is_floating() && !s.is_bool() && dt == DType::Bool) dt = DType::I64;
  return full({}, s, TensorOptions(dt, like.device()));
}

}  // namespace ft::ops
