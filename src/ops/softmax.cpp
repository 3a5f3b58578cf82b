// softmax and log_softmax: validation, output allocation and the fused backward (kernels and the
// math in backend/cpu/softmax.h). cross_entropy lives in loss.cpp.
#include "fasttrain/ops/softmax.h"

#include <string>

#include "backend/kernels.h"
#include "ops/autocast_policy.h"
#include "ops/common.h"

namespace ft {

using backend::kernels;

namespace {

Tensor softmax_impl(const Tensor& x, int64_t dim, bool log) {
  const char* name = log ? "log_softmax" : "softmax";
  ops::check_floating(x, name, "input");
  const int d = wrap_dim(dim, x.dim(), name);
  Tensor xc = x.contiguous();
  Tensor y = empty(x.shape(), x.options());
  kernels(xc).softmax_forward(xc, d, log, y);
  if (autograd::any_requires_grad({&x})) {
    // Only the output is needed: both gradients are functions of y and g.
    autograd::SavedTensor sy(y);
    const char* node = log ? "LogSoftmaxBackward" : "SoftmaxBackward";
    autograd::record_function(node, {&x}, {&y}, [sy, d, log, node](std::vector<Tensor>& g) {
      Tensor yv = sy.get(node);
      Tensor gc = g[0].to(yv.dtype()).contiguous();
      Tensor gx = empty(yv.shape(), yv.options());
      kernels(gc).softmax_backward(gc, yv, d, log, gx);
      return std::vector<Tensor>{gx};
    });
  }
  return y;
}

}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) {
  auto c = ops::autocast_inputs(ops::AutocastOp::softmax, x);
  return softmax_impl(c ? (*c)[0] : x, dim, false);
}
Tensor log_softmax(const Tensor& x, int64_t dim) {
  auto c = ops::autocast_inputs(ops::AutocastOp::log_softmax, x);
  return softmax_impl(c ? (*c)[0] : x, dim, true);
}

}  // namespace ft
