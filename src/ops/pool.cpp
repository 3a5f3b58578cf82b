// Pooling ops: validation, output allocation in the input's memory format, and backward through
// the fused kernels of backend/cpu/pool.*.
#include "backend/kernels.h"

#include "fasttrain/ops/conv.h"
#include "ops/common.h"
#include "ops/conv_layout.h"

namespace ft {

using backend::kernels;

namespace {

std::string pair_str(Pair p) { return detail::concat("[", p[0], ", ", p[1], "]"); }

backend::PoolParams pool_input(const Tensor& x, const char* op) {
  FT_CHECK(x.dim() == 4, op, ": expected a 4-d input [N, C, H, W], found shape ", x.shape().str());
  ops::check_floating(x, op, "input");
  FT_CHECK(x.size(2) > 0 && x.size(3) > 0, op, ": input has an empty spatial size, shape ", x.shape().str());
  backend::PoolParams p;
  p.N = x.size(0), p.C = x.size(1), p.H = x.size(2), p.W = x.size(3);
  p.channels_last = ops::prefers_channels_last(x);
  return p;
}

// Fills kernel/stride/padding/dilation and the output size (floor mode, as PyTorch's default).
void window_params(backend::PoolParams& p, Pair kernel, Pair stride, Pair padding, Pair dilation, const char* op) {
  FT_CHECK(kernel[0] >= 1 && kernel[1] >= 1, op, ": kernel size must be positive, found ", pair_str(kernel));
  FT_CHECK(stride[0] >= 0 && stride[1] >= 0, op, ": stride must be positive (or 0 for the kernel size), found ",
           pair_str(stride));
  FT_CHECK(dilation[0] >= 1 && dilation[1] >= 1, op, ": dilation must be positive, found ", pair_str(dilation));
  FT_CHECK(padding[0] >= 0 && padding[1] >= 0, op, ": padding must be non-negative, found ", pair_str(padding));
  FT_CHECK(padding[0] <= kernel[0] / 2 && padding[1] <= kernel[1] / 2, op, ": padding ", pair_str(padding),
           " must be at most half the kernel size ", pair_str(kernel));
  p.kH = kernel[0], p.kW = kernel[1];
  p.sH = stride[0] == 0 ? kernel[0] : stride[0];
  p.sW = stride[1] == 0 ? kernel[1] : stride[1];
  p.pH = padding[0], p.pW = padding[1], p.dH = dilation[0], p.dW = dilation[1];
  const int64_t ekH = (p.kH - 1) * p.dH + 1, ekW = (p.kW - 1) * p.dW + 1;
  FT_CHECK(ekH <= p.H + 2 * p.pH && ekW <= p.W + 2 * p.pW, op, ": kernel ", ekH, "x", ekW,
           " (dilated) is larger than the padded input ", p.H + 2 * p.pH, "x", p.W + 2 * p.pW);
  p.OH = (p.H + 2 * p.pH - ekH) / p.sH + 1;
  p.OW = (p.W + 2 * p.pW - ekW) / p.sW + 1;
}

// Records a backward that turns the output gradient (made dense in the input's format) into the
// input gradient with `kernel(p, gy, gx)`.
template <class K>
void record_pool_backward(const char* name, const Tensor& x, Tensor& y, const backend::PoolParams& p, K kernel) {
  if (!autograd::any_requires_grad({&x})) return;
  const Shape xs = x.shape();
  autograd::record_function(name, {&x}, {&y}, [=](std::vector<Tensor>& g) {
    const Tensor gy = ops::dense_in_format(g[0], p.channels_last);
    Tensor gx = ops::empty_in_format(xs, gy.options(), p.channels_last);
    if (gx.numel() > 0) kernel(p, gy, gx);
    return std::vector<Tensor>{gx};
  });
}

}  // namespace

Tensor max_pool2d(const Tensor& x, Pair kernel, Pair stride, Pair padding, Pair dilation) {
  const char* op = "max_pool2d";
  backend::PoolParams p = pool_input(x, op);
  window_params(p, kernel, stride, padding, dilation, op);
  const Tensor xd = ops::dense_in_format(x, p.channels_last);
  Tensor y = ops::empty_in_format({p.N, p.C, p.OH, p.OW}, x.options(), p.channels_last);
  Tensor indices = ops::empty_in_format({p.N, p.C, p.OH, p.OW}, TensorOptions(DType::I64, x.device()), p.channels_last);
  if (y.numel() > 0) kernels(xd).max_pool2d_forward(p, xd, y, indices);
  autograd::SavedTensor si(autograd::any_requires_grad({&x}) ? indices : Tensor());
  record_pool_backward("MaxPool2dBackward", x, y, p,
                       [si](const backend::PoolParams& p, const Tensor& gy, const Tensor& gx) {
                         kernels(gy).max_pool2d_backward(p, gy, si.get("MaxPool2dBackward"), gx);
                       });
  return y;
}

Tensor avg_pool2d(const Tensor& x, Pair kernel, Pair stride, Pair padding, bool count_include_pad) {
  const char* op = "avg_pool2d";
  backend::PoolParams p = pool_input(x, op);
  window_params(p, kernel, stride, padding, {1, 1}, op);
  p.count_include_pad = count_include_pad;
  const Tensor xd = ops::dense_in_format(x, p.channels_last);
  Tensor y = ops::empty_in_format({p.N, p.C, p.OH, p.OW}, x.options(), p.channels_last);
  if (y.numel() > 0) kernels(xd).avg_pool2d_forward(p, xd, y);
  record_pool_backward("AvgPool2dBackward", x, y, p,
                       [](const backend::PoolParams& p, const Tensor& gy, const Tensor& gx) {
                         kernels(gx).avg_pool2d_backward(p, gy, gx);
                       });
  return y;
}

Tensor adaptive_avg_pool2d(const Tensor& x, Pair output_size) {
  const char* op = "adaptive_avg_pool2d";
  backend::PoolParams p = pool_input(x, op);
  FT_CHECK(output_size[0] >= 1 && output_size[1] >= 1, op, ": output size must be positive, found ",
           pair_str(output_size));
  p.OH = output_size[0], p.OW = output_size[1];
  const Tensor xd = ops::dense_in_format(x, p.channels_last);
  Tensor y = ops::empty_in_format({p.N, p.C, p.OH, p.OW}, x.options(), p.channels_last);
  if (y.numel() > 0) kernels(xd).adaptive_avg_pool2d_forward(p, xd, y);
  record_pool_backward("AdaptiveAvgPool2dBackward", x, y, p,
                       [](const backend::PoolParams& p, const Tensor& gy, const Tensor& gx) {
                         kernels(gx).adaptive_avg_pool2d_backward(p, gy, gx);
                       });
  return y;
}

}  // namespace ft
