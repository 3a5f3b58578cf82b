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

std::vector<bool> reduced_dims_mask(const Dims& dims, int ndim, const char* op) {
  std::vector<bool> mask(std::max(ndim, 0), false);
  for (int64_t d : dims) {
    int w = wrap_dim(d, ndim, op);
    if (ndim == 0) continue;
    FT_CHECK(!mask[w], op, ": dimension ", w, " appears more than once in ", dims.str());
    mask[w] = true;
  }
  return mask;
}

Shape reduced_shape(const Shape& shape, const std::vector<bool>& mask, bool keepdim) {
  Shape out;
  for (int i = 0; i < shape.size(); ++i) {
    if (!mask[i])
      out.push_back(shape[i]);
    else if (keepdim)
      out.push_back(1);
  }
  return out;
}

Tensor scalar_like(Scalar s, const Tensor& like) {
  DType dt = like.dtype();
  if (s.is_floating() && !is_floating(dt)) dt = DType::F32;
  if (!s.is_floating() && !s.is_bool() && dt == DType::Bool) dt = DType::I64;
  return full({}, s, TensorOptions(dt, like.device()));
}

}  // namespace ft::ops
