// Matrix products: validation, the rank cases of torch.matmul, and gradients. Every product,
// forward or backward, is one call of the matmul kernel on views: transposes are stride swaps that
// the kernel hands to BLAS/oneDNN as flags, broadcast batch dims are zero strides, and the
// gradient of a broadcast operand is reduced inside the GEMMs (see backend/cpu/linalg.h).
#include "fasttrain/ops/linalg.h"

#include "backend/composed.h"
#include "backend/kernels.h"
#include "fasttrain/ops/elementwise.h"
#include "fasttrain/ops/reduce.h"
#include "ops/autocast_policy.h"
#include "ops/common.h"

namespace ft {

using backend::kernels;

namespace {

void check_pair(const Tensor& a, const Tensor& b, const char* op) {
  FT_CHECK(a.defined() && b.defined(), op, ": expected two defined tensors");
  ops::common_device({&a, &b}, op);
  ops::check_floating(a, op, "first operand");
  ops::check_floating(b, op, "second operand");
  FT_CHECK(a.dtype() == b.dtype(), op, ": dtype mismatch, first operand is ", dtype_name(a.dtype()),
           " but second operand is ", dtype_name(b.dtype()));
}

Shape batch_of(const Shape& s) {
  Shape b = s;
  b.resize(s.size() - 2);
  return b;
}

Shape with_matrix(Shape batch, int64_t rows, int64_t cols) {
  batch.push_back(rows);
  batch.push_back(cols);
  return batch;
}

// The gradient of an operand of logical shape `shape` whose batch dims were broadcast to `full`:
// g[i] = lhs[i] @ rhs[i], summed over the broadcast batches. The sum is accumulated inside the
// GEMMs through a zero-stride view of the reduced gradient (for bf16/f16 the backend accumulates
// in an f32 buffer and rounds once).
Tensor operand_grad(const Tensor& lhs, const Tensor& rhs, const Shape& shape, const Shape& full, DType dt) {
  if (shape == full) {
    Tensor g = empty(shape, TensorOptions(dt, lhs.device()));
    kernels(g).matmul(lhs, rhs, g, false, Tensor());
    return g;
  }
  Tensor g = zeros(shape, TensorOptions(dt, lhs.device()));
  kernels(g).matmul(lhs, rhs, g.expand(full), /*accumulate=*/true, Tensor());
  return g;
}

// a [..., M, K] x b [..., K, N], equal ranks >= 2, batch dims broadcast.
Tensor matmul_nd(const Tensor& a, const Tensor& b, const char* op) {
  const int nd = a.dim();
  Shape batch = broadcast_shapes(batch_of(a.shape()), batch_of(b.shape()), op);
  const int64_t M = a.size(nd - 2), K = a.size(nd - 1), N = b.size(nd - 1);
  const Shape full_a = with_matrix(batch, M, K), full_b = with_matrix(batch, K, N);
  Tensor out = empty(with_matrix(batch, M, N), a.options());
  kernels(out).matmul(a.detach().expand(full_a), b.detach().expand(full_b), out, false, Tensor());
  if (autograd::any_requires_grad({&a, &b})) {
    const bool need_a = a.requires_grad(), need_b = b.requires_grad();
    autograd::SavedTensor sa(need_b ? a : Tensor()), sb(need_a ? b : Tensor());
    const Shape sha = a.shape(), shb = b.shape();
    const DType dt = a.dtype();
    autograd::record_function("MatmulBackward", {&a, &b}, {&out}, [=](std::vector<Tensor>& g) {
      Tensor ga, gb;
      if (need_a) {  // dA = dY B^T
        Tensor bt = sb.get("MatmulBackward").expand(full_b).transpose(-1, -2);
        ga = operand_grad(g[0], bt, sha, full_a, dt);
      }
      if (need_b) {  // dB = A^T dY
        Tensor at = sa.get("MatmulBackward").expand(full_a).transpose(-1, -2);
        gb = operand_grad(at, g[0], shb, full_b, dt);
      }
      return std::vector<Tensor>{ga, gb};
    });
  }
  return out;
}

}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  if (auto c = ops::autocast_inputs(ops::AutocastOp::matmul, a, b)) return matmul((*c)[0], (*c)[1]);
  check_pair(a, b, "matmul");
  FT_CHECK(a.dim() >= 1 && b.dim() >= 1, "matmul: both operands need at least 1 dimension, found shapes ",
           a.shape().str(), " and ", b.shape().str());
  const int64_t ka = a.size(-1), kb = b.dim() == 1 ? b.size(0) : b.size(-2);
  FT_CHECK(ka == kb, "matmul: inner dimensions differ: ", a.shape().str(), " x ", b.shape().str());
  if (a.dim() == 1 && b.dim() == 1) return matmul_nd(a.unsqueeze(0), b.unsqueeze(1), "matmul").reshape({});
  if (b.dim() == 1) return matmul(a, b.unsqueeze(1)).squeeze(-1);
  if (a.dim() == 1) return matmul(a.unsqueeze(0), b).squeeze(-2);
  if (a.dim() >= 3 && b.dim() == 2) {
    // Fold the batch into the rows: one large GEMM (and one for dB) instead of many small ones.
    Shape lead = a.shape();
    lead.resize(a.dim() - 1);
    Shape out_shape = lead;
    out_shape.push_back(b.size(1));
    return matmul_nd(a.reshape({lead.numel(), ka}), b, "matmul").view(out_shape);
  }
  Tensor aa = a, bb = b;
  while (aa.dim() < bb.dim()) aa = aa.unsqueeze(0);
  while (bb.dim() < aa.dim()) bb = bb.unsqueeze(0);
  FT_CHECK(aa.dim() <= kMaxDims, "matmul: at most ", kMaxDims, " dimensions");
  return matmul_nd(aa, bb, "matmul");
}

Tensor bmm(const Tensor& a, const Tensor& b) {
  if (auto c = ops::autocast_inputs(ops::AutocastOp::bmm, a, b)) return bmm((*c)[0], (*c)[1]);
  check_pair(a, b, "bmm");
  FT_CHECK(a.dim() == 3 && b.dim() == 3, "bmm: expected two 3-d tensors, found shapes ", a.shape().str(), " and ",
           b.shape().str());
  FT_CHECK(a.size(0) == b.size(0), "bmm: batch sizes differ: ", a.shape().str(), " x ", b.shape().str());
  FT_CHECK(a.size(2) == b.size(1), "bmm: inner dimensions differ: ", a.shape().str(), " x ", b.shape().str());
  return matmul_nd(a, b, "bmm");
}

namespace {

// linear's checks of a layer's parameters, W [out, in] and b undefined or [out], for an input
// like `x` (its dtype and device) with `features` features: x's last dim when `hidden` is false,
// else the hidden activations of gelu_mlp (the first weight's rows). `layer` names the layer in
// the messages ("" for linear itself).
void check_layer_params(const char* op, const char* layer, const Tensor& x, bool hidden, int64_t features,
                        const Tensor& weight, const Tensor& bias) {
  FT_CHECK(weight.defined(), op, ": ", layer, "weight must be defined");
  ops::common_device({&x, &weight, &bias}, op);
  FT_CHECK(weight.dtype() == x.dtype(), op, ": ", layer, "weight is ", dtype_name(weight.dtype()), " but input is ",
           dtype_name(x.dtype()));
  FT_CHECK(weight.dim() == 2, op, ": ", layer, "weight must be 2-d [out, in], found shape ", weight.shape().str());
  const int64_t in = weight.size(1), out_f = weight.size(0);
  if (features != in) {
    if (hidden)
      FT_FAIL(op, ": the hidden activations have ", features, " features (the first weight's rows), ", layer, "weight ",
              weight.shape().str(), " expects ", in);
    FT_FAIL(op, ": ", layer, "input has ", features, " features (last dim of ", x.shape().str(), "), ", layer,
            "weight ", weight.shape().str(), " expects ", in);
  }
  if (bias.defined()) {
    FT_CHECK(bias.dtype() == x.dtype(), op, ": ", layer, "bias is ", dtype_name(bias.dtype()), " but input is ",
             dtype_name(x.dtype()));
    FT_CHECK(bias.dim() == 1 && bias.size(0) == out_f, op, ": ", layer, "bias has shape ", bias.shape().str(),
             ", expected [", out_f, "]");
  }
}

// linear's checks of y = x W^T + b: x floating-point with at least one dimension, the last its
// features, then the layer's parameters as above.
void check_linear(const char* op, const char* layer, const Tensor& x, const Tensor& weight, const Tensor& bias) {
  FT_CHECK(x.defined() && weight.defined(), op, ": input and ", layer, "weight must be defined");
  ops::check_floating(x, op, "input");
  FT_CHECK(x.dim() >= 1, op, ": input must have at least 1 dimension, found a 0-d tensor");
  check_layer_params(op, layer, x, false, x.size(-1), weight, bias);
}

// x's shape with its last dim replaced by `features`.
Shape with_features(const Tensor& x, int64_t features) {
  Shape s = x.shape();
  s.resize(s.size() - 1);
  s.push_back(features);
  return s;
}

}  // namespace

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  if (auto c = ops::autocast_inputs(ops::AutocastOp::linear, x, weight, bias)) return linear((*c)[0], (*c)[1], (*c)[2]);
  check_linear("linear", "", x, weight, bias);
  const int64_t in = weight.size(1), out_f = weight.size(0);
  Shape lead = x.shape();
  lead.resize(x.dim() - 1);
  const int64_t R = lead.numel();
  Shape y_shape = lead;
  y_shape.push_back(out_f);
  // Leading dims flattened into rows (a view unless x's strides forbid it).
  Tensor x2 = x.detach().reshape({R, in});
  Tensor y2 = empty({R, out_f}, x.options());
  kernels(y2).matmul(x2, weight.detach().t(), y2, false, bias.defined() ? bias.detach() : Tensor());
  Tensor y = y2.view(y_shape);
  if (autograd::any_requires_grad({&x, &weight, &bias})) {
    const bool need_x = x.requires_grad(), need_w = weight.requires_grad();
    const bool need_b = bias.defined() && bias.requires_grad();
    autograd::SavedTensor sx(need_w ? x : Tensor()), sw(need_x ? weight : Tensor());
    const Shape x_shape = x.shape();
    autograd::record_function("LinearBackward", {&x, &weight, &bias}, {&y}, [=](std::vector<Tensor>& g) {
      Tensor gy = g[0].reshape({R, out_f});
      Tensor gx, gw, gb;
      if (need_x) {  // dx = dy W
        gx = empty({R, in}, gy.options());
        kernels(gx).matmul(gy, sw.get("LinearBackward"), gx, false, Tensor());
        gx = gx.view(x_shape);
      }
      // dW = dy^T x and db = the sum of dy over the rows, in one kernel where the device fuses them.
      if (need_b) gb = empty({out_f}, gy.options());
      if (need_w) {
        gw = empty({out_f, in}, gy.options());
        kernels(gw).linear_weight_grad(gy, sx.get("LinearBackward").reshape({R, in}), gw, gb);
      } else if (need_b) {
        kernels(gb).sum(gy, {true, false}, 1.0, gb);
      }
      return std::vector<Tensor>{gx, gw, gb};
    });
  }
  return y;
}

Tensor gelu_mlp(const Tensor& x, const Tensor& w1, const Tensor& b1, const Tensor& w2, const Tensor& b2,
                GeluApprox approximate) {
  if (auto c = ops::autocast_inputs(ops::AutocastOp::linear, x, w1, b1, w2, b2))
    return gelu_mlp((*c)[0], (*c)[1], (*c)[2], (*c)[3], (*c)[4], approximate);
  const char* op = "gelu_mlp";
  check_linear(op, "first ", x, w1, b1);
  const int64_t in = w1.size(1), hid = w1.size(0);
  check_layer_params(op, "second ", x, true, hid, w2, b2);
  const int64_t out_f = w2.size(0);
  const int64_t R = with_features(x, 1).numel();  // rows: the leading dims (not numel / in: in may be 0)
  const math::UnaryOp act = approximate == GeluApprox::Tanh ? math::UnaryOp::GeluTanh : math::UnaryOp::Gelu;
  const Tensor w1d = w1.detach(), w2d = w2.detach();
  Tensor x2 = x.detach().reshape({R, in});
  Tensor pre = empty({R, hid}, x.options()), h = empty({R, hid}, x.options());
  const backend::Kernels& k = kernels(pre);
  if (k.linear_gelu.has_value())
    k.linear_gelu(x2, w1d, b1.defined() ? b1.detach() : Tensor(), act, pre, h);
  else
    backend::composed::linear_gelu(x2, w1d, b1.defined() ? b1.detach() : Tensor(), act, pre, h);
  Tensor y2 = empty({R, out_f}, x.options());
  k.matmul(h, w2d.t(), y2, false, b2.defined() ? b2.detach() : Tensor());
  Tensor y = y2.view(with_features(x, out_f));
  if (!autograd::any_requires_grad({&x, &w1, &b1, &w2, &b2})) return y;

  const bool need_x = x.requires_grad(), need_w1 = w1.requires_grad(), need_w2 = w2.requires_grad();
  const bool need_b1 = b1.defined() && b1.requires_grad(), need_b2 = b2.defined() && b2.requires_grad();
  const bool need_pre = need_x || need_w1 || need_b1;
  // Kept for the backward: what each gradient reads (the same as linear, gelu, linear keep).
  autograd::SavedTensor sx(need_w1 ? x : Tensor()), spre(need_pre ? pre : Tensor()), sh(need_w2 ? h : Tensor()),
      sw1(need_x ? w1 : Tensor()), sw2(need_pre ? w2 : Tensor());
  const Shape x_shape = x.shape();
  const char* node = "GeluMlpBackward";
  autograd::record_function(node, {&x, &w1, &b1, &w2, &b2}, {&y}, [=](std::vector<Tensor>& g) {
    const Tensor gy = g[0].reshape({R, out_f});
    const backend::Kernels& kb = kernels(gy);
    Tensor gx, gw1, gb1, gw2, gb2;
    // The second linear's parameters: dW2 = dy^T h, db2 = dy's column sums.
    if (need_b2) gb2 = empty({out_f}, gy.options());
    if (need_w2) {
      gw2 = empty({out_f, hid}, gy.options());
      kb.linear_weight_grad(gy, sh.get(node), gw2, gb2);
    } else if (need_b2) {
      kb.sum(gy, {true, false}, 1.0, gb2);
    }
    if (!need_pre) return std::vector<Tensor>{gx, gw1, gb1, gw2, gb2};
    // dpre = (dy W2) * gelu'(pre), and db1 = its column sums, in one product where the device fuses them.
    Tensor dpre = empty({R, hid}, gy.options());
    if (need_b1) gb1 = empty({hid}, gy.options());
    if (kb.matmul_gelu_backward.has_value())
      kb.matmul_gelu_backward(gy, sw2.get(node), spre.get(node), act, dpre, gb1);
    else
      backend::composed::matmul_gelu_backward(gy, sw2.get(node), spre.get(node), act, dpre, gb1);
    if (need_w1) {  // dW1 = dpre^T x
      gw1 = empty({hid, in}, gy.options());
      kb.linear_weight_grad(dpre, sx.get(node).reshape({R, in}), gw1, Tensor());
    }
    if (need_x) {  // dx = dpre W1
      gx = empty({R, in}, gy.options());
      kb.matmul(dpre, sw1.get(node), gx, false, Tensor());
      gx = gx.view(x_shape);
    }
    return std::vector<Tensor>{gx, gw1, gb1, gw2, gb2};
  });
  return y;
}

}  // namespace ft
