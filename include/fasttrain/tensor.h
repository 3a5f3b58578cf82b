// Tensor: a cheap, reference-counted handle to a view (shape, strides, offset, dtype) of a shared
// Storage on one device. Copying a Tensor copies the handle; views share storage and its version
// counter, so autograd can detect in-place changes to anything it saved.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fasttrain/allocator.h"
#include "fasttrain/device.h"
#include "fasttrain/dtype.h"
#include "fasttrain/error.h"
#include "fasttrain/shape.h"

namespace ft {

namespace autograd {
struct Node;
}

// A Python-like number: ops take one where PyTorch takes a Python scalar. Floating scalars do not
// promote a tensor's dtype (bf16 tensor * 0.5 stays bf16), as in PyTorch.
class Scalar {
 public:
  Scalar(double v) : d_(v), is_float_(true) {}
  Scalar(float v) : d_(v), is_float_(true) {}
  Scalar(int v) : i_(v), d_(v) {}
  Scalar(int64_t v) : i_(v), d_(static_cast<double>(v)) {}
  Scalar(bool v) : i_(v), d_(v), is_bool_(true) {}
  double to_double() const { return d_; }
  int64_t to_int() const { return is_float_ ? static_cast<int64_t>(d_) : i_; }
  bool is_floating() const { return is_float_; }
  bool is_bool() const { return is_bool_; }

 private:
  int64_t i_ = 0;
  double d_ = 0;
  bool is_float_ = false;
  bool is_bool_ = false;
};

// Memory shared by a tensor and its views.
struct Storage {
  DataPtr data;
  size_t nbytes = 0;
  Device device;
  bool pinned = false;  // page-locked host memory (empty_pinned): async host-to-device copies
  // Bumped by every in-place write (unless in inference mode); shared by all views.
  std::atomic<uint32_t> version{0};
  void* ptr() const { return data.get(); }
};

class Tensor;
using GradHook = std::function<Tensor(const Tensor&)>;    // may return a replacement gradient
using PostAccumulateHook = std::function<void(Tensor&)>;  // leaf's .grad is final for this pass

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  Shape shape;
  Strides strides;     // in elements
  int64_t offset = 0;  // in elements
  DType dtype = DType::F32;

  // Autograd state.
  bool requires_grad = false;
  std::shared_ptr<TensorImpl> grad;
  std::shared_ptr<autograd::Node> grad_fn;         // null for leaves
  uint32_t output_nr = 0;                          // which output of grad_fn this tensor is
  std::weak_ptr<autograd::Node> grad_accumulator;  // leaves only, created lazily
  std::vector<GradHook> hooks;                     // leaves only; non-leaf hooks live on grad_fn
  std::vector<PostAccumulateHook> post_accumulate_hooks;
  bool retains_grad = false;
  std::string name;  // optional, used in error messages and by modules
};

struct TensorOptions {
  DType dtype = DType::F32;
  Device device = Device::cpu();
  bool requires_grad = false;
  TensorOptions() = default;
  TensorOptions(DType t) : dtype(t) {}
  TensorOptions(Device d) : device(d) {}
  TensorOptions(DType t, Device d) : dtype(t), device(d) {}
  TensorOptions with_dtype(DType t) const {
    auto o = *this;
    o.dtype = t;
    return o;
  }
  TensorOptions with_device(Device d) const {
    auto o = *this;
    o.device = d;
    return o;
  }
  TensorOptions with_requires_grad(bool r) const {
    auto o = *this;
    o.requires_grad = r;
    return o;
  }
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  bool defined() const { return impl_ != nullptr; }
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool same(const Tensor& o) const { return impl_ == o.impl_; }

  // --- metadata ---
  DType dtype() const { return checked().dtype; }
  Device device() const { return checked().storage->device; }
  const Shape& shape() const { return checked().shape; }
  const Strides& strides() const { return checked().strides; }
  int64_t offset() const { return checked().offset; }
  int dim() const { return checked().shape.size(); }
  int64_t size(int64_t d) const;
  int64_t stride(int64_t d) const;
  int64_t numel() const { return checked().shape.numel(); }
  size_t element_size() const { return dtype_size(dtype()); }
  size_t nbytes() const { return numel() * element_size(); }
  bool is_contiguous() const;
  // True when the memory is dense in NHWC order for a 4-d tensor (channels-last).
  bool is_channels_last() const;
  // True for page-locked host memory (empty_pinned with a CUDA device present).
  bool is_pinned() const { return storage()->pinned; }
  TensorOptions options() const { return TensorOptions(dtype(), device()); }
  const std::shared_ptr<Storage>& storage() const { return checked().storage; }
  uint32_t version() const { return storage()->version.load(std::memory_order_relaxed); }
  void bump_version() const;  // called by in-place ops; skipped in inference mode

  // --- data access (CPU tensors) ---
  void* raw_data() const;  // pointer to the first element (storage + offset)
  template <class T>
  T* data() const {
    FT_CHECK(dtype_of<T>::value == dtype(), "data<", dtype_name(dtype_of<T>::value), ">(): tensor has dtype ",
             dtype_name(dtype()));
    return static_cast<T*>(raw_data());
  }
  // The single value of a one-element tensor, converted to T (synchronises with the device).
  template <class T>
  T item() const {
    return static_cast<T>(item_double());
  }
  double item_double() const;
  // All values in logical (row-major) order, converted to double: for tests and printing.
  std::vector<double> to_vector() const;

  // --- views (share storage; differentiable) ---
  Tensor view(const Shape& shape) const;     // requires compatible strides; -1 infers one size
  Tensor reshape(const Shape& shape) const;  // view when possible, copy otherwise
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  Tensor transpose(int64_t d0, int64_t d1) const;
  Tensor t() const { return transpose(0, 1); }
  Tensor permute(const Dims& order) const;
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;  // python a[s:e:st]
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor select(int64_t dim, int64_t index) const;  // removes `dim`
  Tensor expand(const Shape& shape) const;          // -1 keeps a size; broadcast rules
  Tensor expand_as(const Tensor& other) const { return expand(other.shape()); }
  Tensor squeeze(int64_t dim) const;
  Tensor squeeze() const;  // all size-1 dims
  Tensor unsqueeze(int64_t dim) const;
  Tensor contiguous() const;                // self if already contiguous
  Tensor contiguous_channels_last() const;  // NHWC memory order for 4-d tensors
  Tensor as_strided(const Shape& shape, const Strides& strides, int64_t offset) const;  // not differentiable

  // --- conversion and copies ---
  // One entry point for dtype and device moves; returns self when nothing changes.
  Tensor to(DType dtype) const;
  Tensor to(Device device) const;
  Tensor to(Device device, DType dtype, bool non_blocking = false) const;
  Tensor clone() const;
  Tensor detach() const;  // shares storage, no autograd history
  // In-place writes (bump the version counter; not recorded by autograd).
  Tensor& copy_(const Tensor& src);
  Tensor& fill_(Scalar value);
  Tensor& zero_() { return fill_(0); }

  // --- autograd ---
  bool requires_grad() const { return defined() && impl_->requires_grad; }
  Tensor& requires_grad_(bool r = true);
  bool is_leaf() const { return checked().grad_fn == nullptr; }
  const std::shared_ptr<autograd::Node>& grad_fn() const { return checked().grad_fn; }
  Tensor grad() const;  // undefined until a backward pass reaches this tensor
  void set_grad(const Tensor& g) const;
  // Backward from this tensor. `grad` defaults to 1 for a one-element tensor.
  void backward(const Tensor& grad = Tensor(), bool retain_graph = false) const;
  void register_hook(GradHook hook) const;
  void register_post_accumulate_grad_hook(PostAccumulateHook hook) const;
  void retain_grad() const;

  // --- operator sugar (see ops.h for the full set) ---
  Tensor operator-() const;

 private:
  TensorImpl& checked() const {
    FT_CHECK(impl_ != nullptr, "operation on an undefined tensor");
    return *impl_;
  }
  std::shared_ptr<TensorImpl> impl_;
};

// --- creation ---
Tensor empty(const Shape& shape, TensorOptions opts = {});
Tensor empty_strided(const Shape& shape, const Strides& strides, TensorOptions opts = {});
// The *_like functions: t's shape, dtype and device, and t's memory layout when t is dense in
// some dimension order (contiguous, channels-last, a permutation: PyTorch's preserve_format), else
// contiguous.
Tensor empty_like(const Tensor& t);
// A contiguous CPU tensor in page-locked memory (pin_memory=True), from which the CUDA backend
// copies to the device asynchronously. Without a usable CUDA device it is ordinary 64-byte-aligned
// host memory (is_pinned() false): pinning only pays off when there is a device to copy to.
Tensor empty_pinned(const Shape& shape, DType dtype = DType::F32);
Tensor zeros(const Shape& shape, TensorOptions opts = {});
Tensor ones(const Shape& shape, TensorOptions opts = {});
Tensor full(const Shape& shape, Scalar value, TensorOptions opts = {});
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);
Tensor full_like(const Tensor& t, Scalar value);
Tensor scalar_tensor(Scalar value, TensorOptions opts = {});  // 0-d
Tensor arange(Scalar start, Scalar end, Scalar step = 1, TensorOptions opts = {});
inline Tensor arange(Scalar end, TensorOptions opts = {}) { return arange(0, end, 1, opts); }
// Values given row-major; converted to opts.dtype.
Tensor from_vector(const std::vector<double>& values, const Shape& shape, TensorOptions opts = {});

// Wraps caller memory without copying (torch.from_numpy / as_tensor). The deleter, if any, runs
// when the last view of the tensor goes away; without one the caller keeps the memory alive.
Tensor from_blob(void* data, const Shape& shape, const Strides& strides, TensorOptions opts = {},
                 std::function<void(void*)> deleter = nullptr);
Tensor from_blob(void* data, const Shape& shape, TensorOptions opts = {}, std::function<void(void*)> deleter = nullptr);

// Readable printing, PyTorch style, summarised with "..." past 1000 elements.
std::ostream& operator<<(std::ostream& os, const Tensor& t);
std::string to_string(const Tensor& t);

}  // namespace ft
