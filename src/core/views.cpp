// View ops: new shape/strides/offset over the same storage. Each is differentiable; its backward
// maps the gradient back to the base's shape.
#include <algorithm>

#include "fasttrain/autograd.h"
#include "fasttrain/ops/elementwise.h"
#include "fasttrain/tensor.h"

namespace ft {

using autograd::record_function;

static Tensor alias(const Tensor& base, const Shape& shape, const Strides& strides, int64_t offset) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = base.storage();
  impl->shape = shape;
  impl->strides = strides;
  impl->offset = offset;
  impl->dtype = base.dtype();
  return Tensor(std::move(impl));
}

// Resolves a single -1 in `shape` against numel.
static Shape infer_shape(const Shape& shape, int64_t numel, const char* what) {
  Shape out = shape;
  int infer = -1;
  int64_t known = 1;
  for (int i = 0; i < out.size(); ++i) {
    if (out[i] == -1) {
      FT_CHECK(infer < 0, what, ": only one dimension can be -1, found shape ", shape.str());
      infer = i;
    } else {
      FT_CHECK(out[i] >= 0, what, ": invalid size ", out[i], " in shape ", shape.str());
      known *= out[i];
    }
  }
  if (infer >= 0) {
    FT_CHECK(known != 0 && numel % known == 0, what, ": shape ", shape.str(), " is invalid for ", numel, " elements");
    out[infer] = numel / known;
  }
  FT_CHECK(out.numel() == numel, what, ": shape ", out.str(), " (", out.numel(),
           " elements) is invalid for a tensor of ", numel, " elements");
  return out;
}

// Strides for viewing a tensor (shape, strides) as new_shape without copying, if possible
// (the stride-compatibility rule of torch.view). Returns false when a copy is needed.
static bool compute_view_strides(const Shape& shape, const Strides& strides, const Shape& new_shape, Strides& out) {
  out = Strides::filled(new_shape.size(), 1);
  bool contiguous = true;
  int64_t expected = 1;
  for (int i = shape.size() - 1; i >= 0; --i) {
    if (shape[i] != 1 && strides[i] != expected) contiguous = false;
    expected *= shape[i];
  }
  if (contiguous || shape.numel() == 0) {
    out = contiguous_strides(new_shape);
    return true;
  }
  int view_d = new_shape.size() - 1;
  int64_t chunk_base_stride = strides.size() ? strides.back() : 1;
  int64_t tensor_numel = 1, view_numel = 1;
  for (int d = shape.size() - 1; d >= 0; --d) {
    tensor_numel *= shape[d];
    if (d == 0 || (shape[d - 1] != 1 && strides[d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || new_shape[view_d] == 1)) {
        out[view_d] = view_numel * chunk_base_stride;
        view_numel *= new_shape[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return false;
      if (d > 0) {
        chunk_base_stride = strides[d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  return view_d == -1;
}

Tensor Tensor::view(const Shape& new_shape_in) const {
  Shape new_shape = infer_shape(new_shape_in, numel(), "view");
  Strides st;
  FT_CHECK(compute_view_strides(shape(), strides(), new_shape, st), "view: shape ", new_shape.str(),
           " is not compatible with the strides ", strides().str(), " of a tensor of shape ", shape().str(),
           "; use reshape()");
  Tensor out = alias(*this, new_shape, st, offset());
  if (autograd::any_requires_grad({this})) {
    Shape in_shape = shape();
    record_function("ViewBackward", {this}, {&out},
                    [in_shape](std::vector<Tensor>& g) { return std::vector<Tensor>{g[0].reshape(in_shape)}; });
  }
  return out;
}

Tensor Tensor::reshape(const Shape& new_shape_in) const {
  Shape new_shape = infer_shape(new_shape_in, numel(), "reshape");
  Strides st;
  if (compute_view_strides(shape(), strides(), new_shape, st)) return view(new_shape);
  return contiguous().view(new_shape);
}

Tensor Tensor::flatten(int64_t start_dim, int64_t end_dim) const {
  if (dim() == 0) return reshape({1});
  int s = wrap_dim(start_dim, dim(), "flatten"), e = wrap_dim(end_dim, dim(), "flatten");
  FT_CHECK(s <= e, "flatten: start_dim ", start_dim, " comes after end_dim ", end_dim);
  Shape ns;
  for (int i = 0; i < s; ++i) ns.push_back(size(i));
  int64_t p = 1;
  for (int i = s; i <= e; ++i) p *= size(i);
  ns.push_back(p);
  for (int i = e + 1; i < dim(); ++i) ns.push_back(size(i));
  return reshape(ns);
}

Tensor Tensor::transpose(int64_t d0_in, int64_t d1_in) const {
  int d0 = wrap_dim(d0_in, dim(), "transpose"), d1 = wrap_dim(d1_in, dim(), "transpose");
  if (dim() == 0) return *this;
  Shape sh = shape();
  Strides st = strides();
  std::swap(sh[d0], sh[d1]);
  std::swap(st[d0], st[d1]);
  Tensor out = alias(*this, sh, st, offset());
  if (autograd::any_requires_grad({this}))
    record_function("TransposeBackward", {this}, {&out},
                    [d0, d1](std::vector<Tensor>& g) { return std::vector<Tensor>{g[0].transpose(d0, d1)}; });
  return out;
}

Tensor Tensor::permute(const Dims& order) const {
  FT_CHECK(order.size() == dim(), "permute: expected ", dim(), " dimensions in the order, found ", order.size(), " (",
           order.str(), ")");
  Dims ord = Dims::filled(dim(), 0), inverse = Dims::filled(dim(), 0);
  std::vector<bool> seen(dim(), false);
  Shape sh = Shape::filled(dim(), 0);
  Strides st = Strides::filled(dim(), 0);
  for (int i = 0; i < dim(); ++i) {
    int d = wrap_dim(order[i], dim(), "permute");
    FT_CHECK(!seen[d], "permute: dimension ", d, " repeated in ", order.str());
    seen[d] = true;
    ord[i] = d;
    inverse[d] = i;
    sh[i] = size(d);
    st[i] = stride(d);
  }
  Tensor out = alias(*this, sh, st, offset());
  if (autograd::any_requires_grad({this}))
    record_function("PermuteBackward", {this}, {&out},
                    [inverse](std::vector<Tensor>& g) { return std::vector<Tensor>{g[0].permute(inverse)}; });
  return out;
}

// Backward of an op that selected part of the input: scatter the gradient into zeros.
static std::vector<Tensor> scatter_into_zeros(const Tensor& grad, const Shape& base_shape,
                                              const std::function<Tensor(const Tensor&)>& select) {
  Tensor g = zeros(base_shape, grad.options());
  select(g).copy_(grad);
  return {g};
}

Tensor Tensor::slice(int64_t dim_in, int64_t start, int64_t end, int64_t step) const {
  int d = wrap_dim(dim_in, dim(), "slice");
  FT_CHECK(step > 0, "slice: step must be positive, found ", step);
  int64_t n = size(d);
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  Shape sh = shape();
  Strides st = strides();
  sh[d] = (end - start + step - 1) / step;
  st[d] = stride(d) * step;
  Tensor out = alias(*this, sh, st, offset() + start * stride(d));
  if (autograd::any_requires_grad({this})) {
    Shape base = shape();
    record_function("SliceBackward", {this}, {&out}, [base, d, start, end, step](std::vector<Tensor>& g) {
      if (step != 1)
        return scatter_into_zeros(g[0], base, [&](const Tensor& z) { return z.slice(d, start, end, step); });
      // A contiguous range: zero only what lies outside it, so a large slice (GPT's head, the
      // embedding's real rows) is written once rather than zeroed and then overwritten.
      Tensor full = empty(base, g[0].options());
      if (start > 0) full.slice(d, 0, start).fill_(0);
      if (end < base[d]) full.slice(d, end, base[d]).fill_(0);
      full.slice(d, start, end).copy_(g[0]);
      return std::vector<Tensor>{full};
    });
  }
  return out;
}

Tensor Tensor::narrow(int64_t dim_in, int64_t start, int64_t length) const {
  int d = wrap_dim(dim_in, dim(), "narrow");
  FT_CHECK(start >= 0 && length >= 0 && start + length <= size(d), "narrow: range [", start, ", ", start + length,
           ") is outside dimension ", d, " of size ", size(d));
  return slice(d, start, start + length);
}

Tensor Tensor::select(int64_t dim_in, int64_t index) const {
  int d = wrap_dim(dim_in, dim(), "select");
  int64_t n = size(d);
  FT_CHECK(index >= -n && index < n, "select: index ", index, " is out of range for dimension ", d, " of size ", n);
  if (index < 0) index += n;
  return slice(d, index, index + 1).squeeze(d);
}

Tensor Tensor::expand(const Shape& target) const {
  FT_CHECK(target.size() >= dim(), "expand: target shape ", target.str(), " has fewer dimensions than the tensor ",
           shape().str());
  int lead = target.size() - dim();
  Shape sh = Shape::filled(target.size(), 0);
  Strides st = Strides::filled(target.size(), 0);
  for (int i = 0; i < target.size(); ++i) {
    int64_t want = target[i];
    if (i < lead) {
      FT_CHECK(want >= 0, "expand: size -1 is not allowed for a new leading dimension in ", target.str());
      sh[i] = want;
      st[i] = 0;
      continue;
    }
    int64_t have = size(i - lead);
    if (want == -1) want = have;
    FT_CHECK(have == want || have == 1, "expand: cannot expand shape ", shape().str(), " to ", target.str(),
             " (dimension ", i, ": ", have, " vs ", want, ")");
    sh[i] = want;
    st[i] = have == want ? stride(i - lead) : 0;
  }
  Tensor out = alias(*this, sh, st, offset());
  if (autograd::any_requires_grad({this})) {
    Shape base = shape();
    record_function("ExpandBackward", {this}, {&out},
                    [base](std::vector<Tensor>& g) { return std::vector<Tensor>{sum_to_shape(g[0], base)}; });
  }
  return out;
}

Tensor Tensor::squeeze(int64_t dim_in) const {
  if (dim() == 0) return *this;
  int d = wrap_dim(dim_in, dim(), "squeeze");
  if (size(d) != 1) return *this;
  Shape sh = shape();
  sh.erase(d);
  return view(sh);
}

Tensor Tensor::squeeze() const {
  Shape sh;
  for (int64_t s : shape())
    if (s != 1) sh.push_back(s);
  return sh == shape() ? *this : view(sh);
}

Tensor Tensor::unsqueeze(int64_t dim_in) const {
  int d = wrap_dim(dim_in, dim() + 1, "unsqueeze");
  Shape sh = shape();
  Strides st = strides();
  int64_t s = d < dim() ? stride(d) * size(d) : 1;
  sh.insert(d, 1);
  st.insert(d, s);
  Tensor out = alias(*this, sh, st, offset());
  if (autograd::any_requires_grad({this}))
    record_function("UnsqueezeBackward", {this}, {&out},
                    [d](std::vector<Tensor>& g) { return std::vector<Tensor>{g[0].squeeze(d)}; });
  return out;
}

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return clone();
}

Tensor Tensor::contiguous_channels_last() const {
  FT_CHECK(dim() == 4, "contiguous_channels_last: expected a 4-d tensor, found shape ", shape().str());
  if (is_channels_last()) return *this;
  const Shape& s = shape();
  Strides st = {s[1] * s[2] * s[3], 1, s[3] * s[1], s[1]};
  Tensor out = empty_strided(s, st, options());
  {
    autograd::NoGradGuard ng;
    out.copy_(*this);
  }
  if (autograd::any_requires_grad({this}))
    record_function("ChannelsLastBackward", {this}, {&out},
                    [](std::vector<Tensor>& g) { return std::vector<Tensor>{g[0]}; });
  return out;
}

Tensor Tensor::as_strided(const Shape& shape, const Strides& strides, int64_t offset) const {
  return alias(*this, shape, strides, offset);
}

}  // namespace ft
