// Reductions: sum and mean here; var, max and argmax in reduce_extrema.cpp.
#include "fasttrain/ops/reduce.h"

#include "backend/kernels.h"
#include "fasttrain/ops/elementwise.h"
#include "ops/common.h"

namespace ft {

using backend::kernels;

namespace {

Tensor sum_impl(const Tensor& x, const Dims& dims, bool keepdim, bool average, const char* name) {
  std::vector<bool> mask = ops::reduced_dims_mask(dims, x.dim(), name);
  Shape out_shape = ops::reduced_shape(x.shape(), mask, keepdim);
  int64_t count = 1;
  for (int i = 0; i < x.dim(); ++i)
    if (mask[i]) count *= x.size(i);
  DType out_dtype = is_floating(x.dtype()) ? x.dtype() : DType::I64;
  if (average) {
    ops::check_floating(x, name, "input");
  }
  Tensor out = empty(out_shape, TensorOptions(out_dtype, x.device()));
  kernels(x).sum(x, mask, average ? 1.0 / std::max<int64_t>(count, 1) : 1.0, out);
  if (autograd::any_requires_grad({&x})) {
    Shape in_shape = x.shape();
    Shape kept_shape = ops::reduced_shape(x.shape(), mask, true);
    double scale = average ? 1.0 / std::max<int64_t>(count, 1) : 1.0;
    autograd::record_function(average ? "MeanBackward" : "SumBackward", {&x}, {&out},
                              [in_shape, kept_shape, scale](std::vector<Tensor>& g) {
                                Tensor gk = g[0].reshape(kept_shape);
                                if (scale != 1.0) gk = mul(gk, scale);
                                return std::vector<Tensor>{gk.expand(in_shape).contiguous()};
                              });
  }
  return out;
}

Dims all_dims(const Tensor& x) {
  Dims d;
  for (int i = 0; i < x.dim(); ++i) d.push_back(i);
  return d;
}

}  // namespace

Tensor sum(const Tensor& x) { return sum_impl(x, all_dims(x), false, false, "sum"); }
// As in PyTorch 1.13, an empty dims list reduces every dim.
Tensor sum(const Tensor& x, const Dims& dims, bool keepdim) {
  return sum_impl(x, dims.empty() ? all_dims(x) : dims, keepdim, false, "sum");
}
Tensor mean(const Tensor& x) { return sum_impl(x, all_dims(x), false, true, "mean"); }
Tensor mean(const Tensor& x, const Dims& dims, bool keepdim) {
  return sum_impl(x, dims.empty() ? all_dims(x) : dims, keepdim, true, "mean");
}

}  // namespace ft
