// conv2d: validation, output allocation in the input's memory format, and the backward (gradients
// of input, weight and bias from the fused oneDNN / im2col kernels in backend/cpu/conv.*).
#include "backend/kernels.h"

#include "fasttrain/ops/conv.h"
#include "fasttrain/ops/reduce.h"
#include "ops/autocast_policy.h"
#include "ops/common.h"
#include "ops/conv_layout.h"

namespace ft {

using backend::kernels;

namespace ops {

bool prefers_channels_last(const Tensor& x) { return x.dim() == 4 && x.is_channels_last() && !x.is_contiguous(); }

Tensor dense_in_format(const Tensor& x, bool channels_last) {
  Tensor d = x.detach();
  return channels_last ? d.contiguous_channels_last() : d.contiguous();
}

Tensor empty_in_format(const Shape& shape, TensorOptions opts, bool channels_last) {
  if (!channels_last) return empty(shape, opts);
  return empty_strided(shape, {shape[1] * shape[2] * shape[3], 1, shape[3] * shape[1], shape[1]}, opts);
}

}  // namespace ops

namespace {

backend::ConvParams conv_params(const Tensor& x, const Tensor& weight, const Tensor& bias, Pair stride, Pair padding,
                                Pair dilation, int64_t groups) {
  const char* op = "conv2d";
  FT_CHECK(x.dim() == 4, op, ": expected a 4-d input [N, C, H, W], found shape ", x.shape().str());
  FT_CHECK(weight.dim() == 4, op, ": expected a 4-d weight [O, C/groups, kH, kW], found shape ", weight.shape().str());
  ops::common_device({&x, &weight, &bias}, op);
  ops::check_floating(x, op, "input");
  FT_CHECK(weight.dtype() == x.dtype(), op, ": input has dtype ", dtype_name(x.dtype()), " but weight has dtype ",
           dtype_name(weight.dtype()));
  FT_CHECK(groups >= 1, op, ": groups must be positive, found ", groups);
  for (int i = 0; i < 2; ++i) {
    FT_CHECK(stride[i] >= 1, op, ": stride must be positive, found [", stride[0], ", ", stride[1], "]");
    FT_CHECK(dilation[i] >= 1, op, ": dilation must be positive, found [", dilation[0], ", ", dilation[1], "]");
    FT_CHECK(padding[i] >= 0, op, ": padding must be non-negative, found [", padding[0], ", ", padding[1], "]");
  }
  backend::ConvParams p;
  p.N = x.size(0), p.C = x.size(1), p.H = x.size(2), p.W = x.size(3);
  p.O = weight.size(0), p.kH = weight.size(2), p.kW = weight.size(3);
  FT_CHECK(p.C % groups == 0, op, ": groups ", groups, " does not divide the input's ", p.C, " channels");
  FT_CHECK(p.O % groups == 0, op, ": groups ", groups, " does not divide the weight's ", p.O, " output channels");
  FT_CHECK(weight.size(1) * groups == p.C, op, ": input has ", p.C, " channels, weight expects ",
           weight.size(1) * groups, " (weight ", weight.shape().str(), ", groups ", groups, ")");
  FT_CHECK(p.kH >= 1 && p.kW >= 1, op, ": weight has an empty kernel, shape ", weight.shape().str());
  const int64_t ekH = (p.kH - 1) * dilation[0] + 1, ekW = (p.kW - 1) * dilation[1] + 1;
  FT_CHECK(ekH <= p.H + 2 * padding[0] && ekW <= p.W + 2 * padding[1], op, ": kernel ", ekH, "x", ekW,
           " (dilated) is larger than the padded input ", p.H + 2 * padding[0], "x", p.W + 2 * padding[1]);
  if (bias.defined()) {
    FT_CHECK(bias.dim() == 1 && bias.size(0) == p.O, op, ": expected bias of shape [", p.O, "], found ",
             bias.shape().str());
    FT_CHECK(bias.dtype() == x.dtype(), op, ": input has dtype ", dtype_name(x.dtype()), " but bias has dtype ",
             dtype_name(bias.dtype()));
  }
  p.OH = (p.H + 2 * padding[0] - ekH) / stride[0] + 1;
  p.OW = (p.W + 2 * padding[1] - ekW) / stride[1] + 1;
  p.stride = stride, p.padding = padding, p.dilation = dilation, p.groups = groups;
  p.channels_last = ops::prefers_channels_last(x);
  p.weight_channels_last = groups == 1 && ops::prefers_channels_last(weight);
  return p;
}

}  // namespace

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, Pair stride, Pair padding, Pair dilation,
              int64_t groups) {
  if (auto c = ops::autocast_inputs(ops::AutocastOp::conv2d, x, weight, bias))
    return conv2d((*c)[0], (*c)[1], (*c)[2], stride, padding, dilation, groups);
  const backend::ConvParams p = conv_params(x, weight, bias, stride, padding, dilation, groups);
  const Tensor xd = ops::dense_in_format(x, p.channels_last);
  const Tensor wd = ops::dense_in_format(weight, p.weight_channels_last);
  const Tensor bd = bias.defined() ? bias.detach().contiguous() : Tensor();
  Tensor y = ops::empty_in_format({p.N, p.O, p.OH, p.OW}, x.options(), p.channels_last);
  if (p.N * p.O * p.OH * p.OW > 0) kernels(xd).conv2d_forward(p, xd, wd, bd, y);
  if (autograd::any_requires_grad({&x, &weight, &bias})) {
    const bool need_x = x.requires_grad(), need_w = weight.requires_grad(), need_b = bias.requires_grad();
    const Shape x_shape = x.shape(), w_shape = weight.shape();
    autograd::SavedTensor sx(need_w ? xd : Tensor()), sw(need_x ? wd : Tensor());
    autograd::record_function("Conv2dBackward", {&x, &weight, &bias}, {&y}, [=](std::vector<Tensor>& g) {
      const Tensor gy = ops::dense_in_format(g[0], p.channels_last);
      Tensor gx, gw, gb;
      if (p.N * p.O * p.OH * p.OW == 0) {  // nothing flowed back
        return std::vector<Tensor>{need_x ? zeros(x_shape, gy.options()) : Tensor(),
                                   need_w ? zeros(w_shape, gy.options()) : Tensor(),
                                   need_b ? zeros({p.O}, gy.options()) : Tensor()};
      }
      if (need_x) {
        gx = ops::empty_in_format(x_shape, gy.options(), p.channels_last);
        kernels(gy).conv2d_backward_data(p, gy, sw.get("Conv2dBackward"), gx);
      }
      if (need_w) {
        gw = ops::empty_in_format(w_shape, gy.options(), p.weight_channels_last);
        if (need_b) gb = empty({p.O}, gy.options());
        kernels(gy).conv2d_backward_weight(p, gy, sx.get("Conv2dBackward"), gw, gb);
      } else if (need_b) {
        gb = sum(gy, {0, 2, 3});
      }
      return std::vector<Tensor>{gx, gw, gb};
    });
  }
  return y;
}

}  // namespace ft
