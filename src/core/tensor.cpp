// Tensor handles: metadata, creation, conversion and copies. View ops live in views.cpp and
// printing in print.cpp.
#include "fasttrain/tensor.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/dispatch.h"
#include "backend/device_backend.h"
#include "backend/kernels.h"
#include "fasttrain/autograd.h"
#include "fasttrain/ops/elementwise.h"

namespace ft {

int64_t Tensor::size(int64_t d) const { return shape()[wrap_dim(d, dim(), "size")]; }
int64_t Tensor::stride(int64_t d) const { return strides()[wrap_dim(d, dim(), "stride")]; }

bool Tensor::is_contiguous() const {
  const auto& s = shape();
  const auto& st = strides();
  if (s.numel() == 0) return true;  // no element to be out of place (PyTorch agrees), whatever the strides
  int64_t expected = 1;
  for (int i = s.size() - 1; i >= 0; --i) {
    if (s[i] == 1) continue;
    if (st[i] != expected) return false;
    expected *= s[i];
  }
  return true;
}

bool Tensor::is_channels_last() const {
  if (dim() != 4) return false;
  const auto& s = shape();
  const auto& st = strides();
  // memory order N, H, W, C
  const int order[4] = {1, 3, 2, 0};
  int64_t expected = 1;
  for (int k : order) {
    if (s[k] != 1 && st[k] != expected) return false;
    expected *= s[k];
  }
  return true;
}

void Tensor::bump_version() const {
  if (!autograd::inference_mode_enabled()) storage()->version.fetch_add(1, std::memory_order_relaxed);
}

void* Tensor::raw_data() const {
  const auto& impl = checked();
  // ZeRO stage 3 releases a parameter's memory between its uses (the Storage stays, so every
  // view and saved tensor sees the memory again once gathered): a read now is a bug, not data.
  if (!impl.storage->data && impl.storage->nbytes > 0) [[unlikely]]
    FT_FAIL("tensor ", impl.name.empty() ? std::string() : "'" + impl.name + "' ", impl.shape.str(),
            ": its memory is released (a ZeRO stage 3 parameter read outside its gather)");
  return static_cast<char*>(impl.storage->ptr()) + impl.offset * static_cast<int64_t>(dtype_size(impl.dtype));
}

double Tensor::item_double() const {
  FT_CHECK(numel() == 1, "item(): expected a tensor with one element, found shape ", shape().str());
  // Read the element in place: item() is called every log step and must not allocate on the CPU.
  Tensor c = device().is_cpu() ? *this : to(Device::cpu());
  return FT_DISPATCH_ALL(c.dtype(), "item", [&]() -> double {
    return static_cast<double>(static_cast<compute_t<scalar_t>>(*static_cast<const scalar_t*>(c.raw_data())));
  });
}

std::vector<double> Tensor::to_vector() const {
  Tensor c = device().is_cpu() ? *this : to(Device::cpu());
  Tensor d = empty(shape(), DType::F64);
  backend::kernels(d).copy(d, c);
  const double* p = d.data<double>();
  return std::vector<double>(p, p + d.numel());
}

// --- creation ---

// `pinned` takes the memory from the page-locked host allocator instead of the device's.
static std::shared_ptr<Storage> new_storage(size_t nbytes, Device device, Allocator* pinned = nullptr) {
  auto st = std::make_shared<Storage>();
  Allocator& allocator = pinned ? *pinned : allocator_for(device);
  st->data = allocator.allocate(nbytes, current_stream(device));
  st->nbytes = nbytes;
  st->device = device;
  st->pinned = pinned != nullptr;
  return st;
}

static Tensor make_tensor(std::shared_ptr<Storage> st, const Shape& shape, const Strides& strides, int64_t offset,
                          DType dtype) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::move(st);
  impl->shape = shape;
  impl->strides = strides;
  impl->offset = offset;
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

static void check_shape(const Shape& shape, const char* what) {
  for (int64_t s : shape) FT_CHECK(s >= 0, what, ": negative size in shape ", shape.str());
}

static void apply_requires_grad(Tensor& t, const TensorOptions& opts) {
  if (opts.requires_grad) t.requires_grad_(true);
}

Tensor empty(const Shape& shape, TensorOptions opts) {
  check_shape(shape, "empty");
  Tensor t = make_tensor(new_storage(shape.numel() * dtype_size(opts.dtype), opts.device), shape,
                         contiguous_strides(shape), 0, opts.dtype);
  apply_requires_grad(t, opts);
  return t;
}

Tensor empty_strided(const Shape& shape, const Strides& strides, TensorOptions opts) {
  check_shape(shape, "empty_strided");
  FT_CHECK(shape.size() == strides.size(), "empty_strided: shape ", shape.str(), " and strides ", strides.str(),
           " differ in rank");
  int64_t extent = 1;
  for (int i = 0; i < shape.size(); ++i) {
    FT_CHECK(strides[i] >= 0, "empty_strided: negative stride in ", strides.str());
    if (shape[i] == 0) extent = 0;
  }
  if (extent != 0)
    for (int i = 0; i < shape.size(); ++i) extent += (shape[i] - 1) * strides[i];
  Tensor t = make_tensor(new_storage(extent * dtype_size(opts.dtype), opts.device), shape, strides, 0, opts.dtype);
  apply_requires_grad(t, opts);
  return t;
}

// The strides a *_like tensor takes (PyTorch's memory_format=preserve_format): those of `t` when
// its elements fill its memory without gaps or overlap in some dimension order (contiguous,
// channels-last, a permutation of either), else contiguous ones (slices, broadcasts). A
// channels-last activation's gradient seed or buffer then stays channels-last, instead of costing
// a transposing copy at the next convolution.
static Strides like_strides(const Tensor& t) {
  std::vector<int> dims;
  for (int d = 0; d < t.dim(); ++d)
    if (t.size(d) != 1) dims.push_back(d);
  std::sort(dims.begin(), dims.end(), [&](int a, int b) { return t.stride(a) < t.stride(b); });
  int64_t dense = 1;
  for (int d : dims) {
    if (t.stride(d) != dense) return contiguous_strides(t.shape());
    dense *= t.size(d);
  }
  return t.strides();
}

Tensor empty_like(const Tensor& t) { return empty_strided(t.shape(), like_strides(t), t.options()); }

Tensor empty_pinned(const Shape& shape, DType dtype) {
  check_shape(shape, "empty_pinned");
  // Without a usable CUDA device pinned_host_allocator() is null: ordinary CPU memory.
  return make_tensor(new_storage(shape.numel() * dtype_size(dtype), Device::cpu(), pinned_host_allocator()), shape,
                     contiguous_strides(shape), 0, dtype);
}

Tensor full(const Shape& shape, Scalar value, TensorOptions opts) {
  bool rg = opts.requires_grad;
  Tensor t = empty(shape, opts.with_requires_grad(false));
  {
    autograd::NoGradGuard ng;
    t.fill_(value);
  }
  if (rg) t.requires_grad_(true);
  return t;
}
Tensor zeros(const Shape& shape, TensorOptions opts) { return full(shape, 0, opts); }
Tensor ones(const Shape& shape, TensorOptions opts) { return full(shape, 1, opts); }
Tensor full_like(const Tensor& t, Scalar value) {
  Tensor out = empty_like(t);
  autograd::NoGradGuard ng;
  out.fill_(value);
  return out;
}
Tensor zeros_like(const Tensor& t) { return full_like(t, 0); }
Tensor ones_like(const Tensor& t) { return full_like(t, 1); }
Tensor scalar_tensor(Scalar value, TensorOptions opts) { return full({}, value, opts); }

Tensor arange(Scalar start, Scalar end, Scalar step, TensorOptions opts) {
  double s = start.to_double(), e = end.to_double(), st = step.to_double();
  FT_CHECK(st != 0, "arange: step must be nonzero");
  FT_CHECK((e - s) / st >= 0, "arange: start ", s, ", end ", e, " and step ", st, " give a negative length");
  int64_t n = static_cast<int64_t>(std::ceil((e - s) / st));
  std::vector<double> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = s + i * st;
  return from_vector(v, {n}, opts);
}

Tensor from_vector(const std::vector<double>& values, const Shape& shape, TensorOptions opts) {
  FT_CHECK(static_cast<int64_t>(values.size()) == shape.numel(), "from_vector: ", values.size(),
           " values do not fill shape ", shape.str(), " (", shape.numel(), " elements)");
  Tensor src = from_blob(const_cast<double*>(values.data()), shape, DType::F64);
  Tensor out = empty(shape, TensorOptions(opts.dtype, Device::cpu()));
  backend::kernels(out).copy(out, src);
  out = out.to(opts.device);
  if (opts.requires_grad) out.requires_grad_(true);
  return out;
}

Tensor from_blob(void* data, const Shape& shape, const Strides& strides, TensorOptions opts,
                 std::function<void(void*)> deleter) {
  FT_CHECK(data != nullptr || shape.numel() == 0, "from_blob: null data pointer for shape ", shape.str());
  FT_CHECK(shape.size() == strides.size(), "from_blob: shape ", shape.str(), " and strides ", strides.str(),
           " differ in rank");
  check_shape(shape, "from_blob");
  int64_t extent = shape.numel() == 0 ? 0 : 1;
  for (int i = 0; i < shape.size() && extent; ++i) extent += (shape[i] - 1) * strides[i];
  auto st = std::make_shared<Storage>();
  if (!deleter) deleter = [](void*) {};
  st->data = DataPtr(data, std::move(deleter));
  st->nbytes = extent * dtype_size(opts.dtype);
  st->device = opts.device;
  Tensor t = make_tensor(std::move(st), shape, strides, 0, opts.dtype);
  apply_requires_grad(t, opts);
  return t;
}

Tensor from_blob(void* data, const Shape& shape, TensorOptions opts, std::function<void(void*)> deleter) {
  return from_blob(data, shape, contiguous_strides(shape), opts, std::move(deleter));
}

// --- conversion ---

Tensor Tensor::to(DType dtype) const { return to(device(), dtype); }
Tensor Tensor::to(Device dev) const { return to(dev, dtype()); }

// Raw copy of a dense tensor between devices; dtype unchanged.
static Tensor copy_across_devices(const Tensor& src, Device dst_dev, bool non_blocking) {
  // The device side does the copy (either side may be the host, or both a device).
  const Device copier = dst_dev.is_cpu() ? src.device() : dst_dev;
  const backend::DeviceBackend& b = backend::require_backend(copier, "to");
  Tensor c = src.contiguous();
  Tensor out = empty(c.shape(), TensorOptions(c.dtype(), dst_dev));
  const Stream stream = current_stream(copier);
  if (!non_blocking && host_sync_tracking())
    note_host_sync(detail::concat("to(", dst_dev.str(), "): ", dtype_name(c.dtype()), " ", c.shape().str()));
  b.memcpy(out.raw_data(), dst_dev, c.raw_data(), c.device(), c.nbytes(), stream, non_blocking);
  // Only a copy from page-locked memory is still reading the source after the call returns (from
  // pageable memory the driver stages it first): keep the block from reuse until it is done.
  if (non_blocking && c.is_pinned()) pinned_host_allocator()->record_stream(c.raw_data(), stream);
  return out;
}

Tensor Tensor::to(Device dev, DType dt, bool non_blocking) const {
  if (dev == device() && dt == dtype()) return *this;
  Tensor out;
  if (dev == device()) {
    // A dense channels-last tensor stays channels-last (PyTorch's preserve_format): autocast's
    // bf16 copies of NHWC activations and weights would otherwise arrive NCHW at every
    // convolution, which then reorders them on each call.
    if (dim() == 4 && is_channels_last() && !is_contiguous()) {
      const Shape& s = shape();
      out = empty_strided(s, {s[1] * s[2] * s[3], 1, s[3] * s[1], s[1]}, TensorOptions(dt, dev));
    } else {
      out = empty(shape(), TensorOptions(dt, dev));
    }
    backend::kernels(out).copy(out, *this);
  } else if (dt == dtype()) {
    out = copy_across_devices(*this, dev, non_blocking);
  } else if (device().is_cpu()) {  // convert first so fewer bytes cross the bus when narrowing
    out = copy_across_devices(to(dt), dev, non_blocking);
  } else {
    out = copy_across_devices(*this, dev, non_blocking).to(dt);
  }
  if (autograd::any_requires_grad({this}) && is_floating(dt)) {
    Device src_dev = device();
    DType src_dt = dtype();
    autograd::record_function("ToBackward", {this}, {&out}, [src_dev, src_dt](std::vector<Tensor>& g) {
      return std::vector<Tensor>{g[0].to(src_dev, src_dt)};
    });
  }
  return out;
}

Tensor Tensor::clone() const {
  Tensor out = empty(shape(), options());
  {
    autograd::NoGradGuard ng;
    out.copy_(*this);
  }
  if (autograd::any_requires_grad({this}))
    autograd::record_function("CloneBackward", {this}, {&out},
                              [](std::vector<Tensor>& g) { return std::vector<Tensor>{g[0]}; });
  return out;
}

Tensor Tensor::detach() const {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = storage();
  impl->shape = shape();
  impl->strides = strides();
  impl->offset = offset();
  impl->dtype = dtype();
  return Tensor(std::move(impl));
}

static void check_inplace_allowed(const Tensor& t, const char* what) {
  FT_CHECK(!(autograd::grad_enabled() && t.requires_grad()), what, ": in-place write to a tensor that requires grad",
           " while grad mode is on; use the out-of-place op, or write under NoGradGuard");
}

Tensor& Tensor::copy_(const Tensor& src) {
  check_inplace_allowed(*this, "copy_");
  FT_CHECK(broadcast_shapes(shape(), src.shape(), "copy_") == shape(), "copy_: source shape ", src.shape().str(),
           " does not broadcast to destination shape ", shape().str());
  // Across devices the source moves first (converted on the way); the copy into this tensor's
  // view is then a kernel of this tensor's device.
  backend::kernels(*this).copy(*this, device() == src.device() ? src : src.to(device(), dtype()));
  bump_version();
  return *this;
}

Tensor& Tensor::fill_(Scalar value) {
  check_inplace_allowed(*this, "fill_");
  backend::kernels(*this).fill(*this, value);
  bump_version();
  return *this;
}

Tensor& Tensor::requires_grad_(bool r) {
  FT_CHECK(is_leaf() || r, "requires_grad_(false): only leaf tensors can stop requiring grad; use detach()");
  FT_CHECK(!r || is_floating(dtype()), "requires_grad_: only floating-point tensors can require grad, found ",
           dtype_name(dtype()));
  impl()->requires_grad = r;
  return *this;
}

Tensor Tensor::operator-() const { return neg(*this); }

}  // namespace ft
