#include "ops/common.h"

#include <cstring>
#include <map>
#include <mutex>
#include <tuple>

#include "backend/device_backend.h"

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

namespace {

// On a GPU a scalar operand is a 0-d device tensor, and making one is a kernel launch of its own
// (a fill), so every mul(x, 0.9) would launch two. The values ops use recur (momenta, epsilons,
// 1 - m, loss scales' constants), so each (device, dtype, value) is made once and kept. They are
// only ever operands (scalar_like's callers never write them). Each is made on the current stream,
// which is waited for once then, so a use on any stream later finds it written.
Tensor cached_device_scalar(Scalar s, DType dt, Device device) {
  using Key = std::tuple<int, DType, bool, uint64_t>;
  constexpr size_t kMaxCached = 4096;  // past that (values that never recur), plain fills
  static std::mutex mu;
  static std::map<Key, Tensor>* cache = new std::map<Key, Tensor>();  // leaked: device memory outlives exit
  const double d = s.to_double();
  const int64_t i = s.to_int();
  uint64_t bits = 0;
  if (s.is_floating())
    std::memcpy(&bits, &d, sizeof bits);
  else
    bits = static_cast<uint64_t>(i);
  const Key key{device.index, dt, s.is_floating(), bits};
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = cache->find(key); it != cache->end()) return it->second;
  Tensor t = full({}, s, TensorOptions(dt, device));
  if (cache->size() >= kMaxCached) return t;
  if (const auto& b = *backend::find_backend(device.type); b.synchronize_internal != nullptr) {
    note_host_sync("scalar constant (made once per device, dtype and value)");
    b.synchronize_internal(current_stream(device));
  }
  cache->emplace(key, t);
  return t;
}

}  // namespace

Tensor scalar_like(Scalar s, const Tensor& like) {
  DType dt = like.dtype();
  if (s.is_floating() && !is_floating(dt)) dt = DType::F32;
  if (!s.is_floating() && !s.is_bool() && dt == DType::Bool) dt = DType::I64;
  if (like.device().is_cuda()) return cached_device_scalar(s, dt, like.device());
  return full({}, s, TensorOptions(dt, like.device()));
}

Tensor as_rows(const Tensor& t) {
  const int64_t F = t.dim() > 0 ? t.size(-1) : 1;
  int64_t R = 1;
  for (int d = 0; d + 1 < t.dim(); ++d) R *= t.size(d);
  Tensor rows = t.detach();
  if (F > 1 && rows.stride(-1) != 1) rows = rows.contiguous();
  return rows.reshape({R, F});
}

}  // namespace ft::ops
