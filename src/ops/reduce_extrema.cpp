// var, max and argmax: validation, output allocation and backward (kernels in
// backend/cpu/reduce_extrema.h). As in PyTorch 1.13, an empty `dims` list reduces every dim.
#include <cmath>

#include "backend/kernels.h"
#include "fasttrain/ops/elementwise.h"
#include "fasttrain/ops/reduce.h"
#include "ops/common.h"

namespace ft {

using backend::kernels;

namespace {

Dims dims_or_all(const Tensor& x, const Dims& dims) {
  if (!dims.empty()) return dims;
  Dims d;
  for (int i = 0; i < x.dim(); ++i) d.push_back(i);
  return d;
}

// max or argmax along one dim; `values` left undefined when !want_values.
ValuesIndices max_dim_impl(const Tensor& x, int64_t dim, bool keepdim, bool want_values, const char* name) {
  const int d = wrap_dim(dim, x.dim(), name);
  // A 0-d tensor is its own max along dim 0 (PyTorch allows dim 0 / -1 there).
  Tensor xr = x.dim() == 0 ? x.reshape({1}) : x;
  FT_CHECK(xr.size(d) > 0, name, ": cannot reduce over dimension ", d, " of size 0 (input shape ", x.shape().str(),
           ")");
  std::vector<bool> mask(xr.dim(), false);
  mask[d] = true;
  Shape out_shape = x.dim() == 0 ? Shape{} : ops::reduced_shape(xr.shape(), mask, keepdim);
  Tensor xc = xr.contiguous();
  ValuesIndices r;
  if (want_values) r.values = empty(out_shape, x.options());
  r.indices = empty(out_shape, TensorOptions(DType::I64, x.device()));
  kernels(xc).max_dim(xc, d, r.values, r.indices);
  return r;
}

}  // namespace

Tensor var(const Tensor& x, const Dims& dims, int64_t correction, bool keepdim) {
  const char* name = "var";
  ops::check_floating(x, name, "input");
  FT_CHECK(correction >= 0, name, ": correction must be >= 0, found ", correction);
  const Dims rd = dims_or_all(x, dims);
  std::vector<bool> mask = ops::reduced_dims_mask(rd, x.dim(), name);
  int64_t count = 1;
  for (int i = 0; i < x.dim(); ++i)
    if (mask[i]) count *= x.size(i);
  // PyTorch's divisor: max(count - correction, 0); dividing by 0 gives inf (or NaN for 0/0).
  const double divisor = static_cast<double>(std::max<int64_t>(count - correction, 0));
  Tensor out = empty(ops::reduced_shape(x.shape(), mask, keepdim), x.options());
  if (x.dim() == 0) {
    kernels(out).var(x.reshape({1}), {true}, divisor, out);
  } else {
    kernels(x).var(x, mask, divisor, out);
  }
  if (autograd::any_requires_grad({&x})) {
    autograd::SavedTensor sx(x);
    Shape kept = ops::reduced_shape(x.shape(), mask, true);
    autograd::record_function("VarBackward", {&x}, {&out}, [sx, kept, rd, divisor](std::vector<Tensor>& g) {
      // d var / d x_i = 2 (x_i - mean) / divisor; composed from existing ops (three light passes).
      Tensor xv = sx.get("VarBackward");
      Tensor centred = sub(xv, mean(xv, rd, true));
      return std::vector<Tensor>{mul(centred, mul(g[0].reshape(kept), 2.0 / divisor))};
    });
  }
  return out;
}

Tensor max(const Tensor& x) {
  const char* name = "max";
  FT_CHECK(x.numel() > 0, name, ": cannot take the max of an empty tensor (shape ", x.shape().str(), ")");
  Tensor xc = x.contiguous();
  Tensor value = empty({}, x.options());
  kernels(xc).max_all(xc, value, Tensor());
  if (autograd::any_requires_grad({&x})) {
    autograd::SavedTensor sx(x), sv(value);
    autograd::record_function("MaxBackward", {&x}, {&value}, [sx, sv](std::vector<Tensor>& g) {
      // The gradient is split evenly among every element equal to the max (all NaNs when the
      // max is NaN), like PyTorch's amax.
      Tensor xv = sx.get("MaxBackward"), vv = sv.get("MaxBackward");
      Tensor hit = std::isnan(vv.item_double()) ? ne(xv, xv) : eq(xv, vv);
      Tensor m = hit.to(xv.dtype());
      return std::vector<Tensor>{mul(m, div(g[0], sum(m)))};
    });
  }
  return value;
}

ValuesIndices max(const Tensor& x, int64_t dim, bool keepdim) {
  ValuesIndices r = max_dim_impl(x, dim, keepdim, true, "max");
  if (is_floating(x.dtype()) && autograd::any_requires_grad({&x})) {
    autograd::SavedTensor si(r.indices);
    const Shape in_shape = x.shape();
    const int d = x.dim() == 0 ? 0 : wrap_dim(dim, x.dim(), "max");
    autograd::record_function("MaxDimBackward", {&x}, {&r.values}, [si, in_shape, d](std::vector<Tensor>& g) {
      // The gradient goes to the selected (first maximal) element only.
      Tensor idx = si.get("MaxDimBackward");
      Tensor gc = g[0].contiguous();
      Shape s = in_shape.size() == 0 ? Shape{1} : in_shape;
      Tensor gx = empty(s, gc.options());
      kernels(gc).max_dim_backward(gc, idx, d, gx);
      return std::vector<Tensor>{in_shape.size() == 0 ? gx.reshape({}) : gx};
    });
  }
  return r;
}

Tensor argmax(const Tensor& x, int64_t dim, bool keepdim) {
  return max_dim_impl(x, dim, keepdim, false, "argmax").indices;
}

Tensor argmax(const Tensor& x) {
  const char* name = "argmax";
  FT_CHECK(x.numel() > 0, name, ": cannot take the argmax of an empty tensor (shape ", x.shape().str(), ")");
  Tensor index = empty({}, TensorOptions(DType::I64, x.device()));
  kernels(index).max_all(x.contiguous(), Tensor(), index);
  return index;
}

}  // namespace ft
