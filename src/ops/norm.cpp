// layer_norm, rms_norm and batch_norm: validation, output allocation and autograd. The fused
// forward and backward kernels are in backend/cpu/norm.cpp.
//
// Statistics and per-feature parameters are handled in the compute dtype (f32, or f64 for f64
// inputs), whatever the input dtype: weight/bias/running statistics may be f32 for a bf16 input
// (PyTorch's mixed-precision batch norm). Gradients come back in each parameter's own dtype.
#include "fasttrain/ops/norm.h"

#include <array>

#include "backend/kernels.h"
#include "core/switches.h"
#include "fasttrain/ops/elementwise.h"
#include "ops/common.h"

namespace ft {

using backend::kernels;

using autograd::SavedTensor;

namespace {

DType compute_dtype(DType t) { return t == DType::F64 ? DType::F64 : DType::F32; }

// A per-feature parameter as a dense compute-dtype tensor (no copy when it already is one).
Tensor as_compute(const Tensor& t, DType ct) {
  if (!t.defined()) return t;
  return t.detach().to(ct).contiguous();
}

void check_param(const Tensor& p, const Tensor& x, const char* op, const char* what) {
  if (!p.defined()) return;
  ops::check_floating(p, op, what);
  FT_CHECK(p.device() == x.device(), op, ": ", what, " is on ", p.device().str(), " but the input is on ",
           x.device().str());
}

// ---------------------------------------------------------------------------------------------
// layer_norm / rms_norm, and their fused forms with a residual add before them

void check_row_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, const Tensor& bias,
                    double eps, const char* op) {
  ops::check_floating(x, op, "input");
  check_param(weight, x, op, "weight");
  check_param(bias, x, op, "bias");
  const int k = normalized_shape.size();
  FT_CHECK(k >= 1, op, ": normalized_shape must have at least one dimension, found []");
  bool tail_ok = x.dim() >= k;
  for (int i = 0; tail_ok && i < k; ++i) tail_ok = x.size(x.dim() - k + i) == normalized_shape[i];
  FT_CHECK(tail_ok, op, ": input of shape ", x.shape().str(), " does not end with normalized_shape ",
           normalized_shape.str());
  for (const auto& [p, what] : {std::pair<const Tensor*, const char*>{&weight, "weight"}, {&bias, "bias"}}) {
    FT_CHECK(!p->defined() || p->shape() == normalized_shape, op, ": ", what, " has shape ",
             p->defined() ? p->shape().str() : "", ", expected normalized_shape ", normalized_shape.str());
  }
  FT_CHECK(eps >= 0, op, ": eps must be non-negative, found ", eps);
}

// The norm of x, or with `residual` defined of sum = x + residual (x's shape; x's dtype or one
// row_norm_residual_ok allows; checked by the caller), computed in the same pass: {sum (x's dtype;
// undefined without a residual), y}.
ResidualNorm row_norm(const Tensor& x, const Tensor& residual, const Shape& normalized_shape, const Tensor& weight,
                      const Tensor& bias, double eps, bool rms) {
  const DType ct = compute_dtype(x.dtype());
  const int64_t N = normalized_shape.numel();
  const int64_t M = N ? x.numel() / N : 0;
  const bool fused = residual.defined();
  Tensor xc = x.detach().contiguous();
  Tensor rc = fused ? residual.detach().contiguous().view({M, N}) : Tensor();
  Tensor wc = as_compute(weight, ct), bc = as_compute(bias, ct);
  Tensor sum = fused ? empty(x.shape(), x.options()) : Tensor();
  Tensor y = empty(x.shape(), x.options());
  Tensor mean = rms ? Tensor() : empty({M}, TensorOptions(ct, x.device()));
  Tensor rstd = empty({M}, TensorOptions(ct, x.device()));
  kernels(y).row_norm_forward(xc.view({M, N}), rc, wc, bc, eps, rms, fused ? sum.view({M, N}) : Tensor(), y, mean,
                              rstd);

  if (autograd::any_requires_grad({&x, &residual, &weight, &bias})) {
    const bool need_x = x.requires_grad() || residual.requires_grad(), need_w = weight.requires_grad(),
               need_b = bias.requires_grad();
    SavedTensor sx(fused ? sum.detach() : xc), smean(mean), srstd(rstd), sw(wc);
    const DType wdt = weight.defined() ? weight.dtype() : ct, bdt = bias.defined() ? bias.dtype() : ct;
    const DType rdt = fused ? residual.dtype() : ct;
    const Shape wshape = normalized_shape;
    const char* node =
        fused ? (rms ? "AddRmsNormBackward" : "AddLayerNormBackward") : (rms ? "RmsNormBackward" : "LayerNormBackward");
    // Gradients: of y (and of the sum, which the residual stream carries on) in; of x (and the
    // residual: the same tensor, as a sum's inputs get), weight and bias out.
    auto backward = [=](std::vector<Tensor>& g) {
      const Tensor& gy = g[fused ? 1 : 0];
      Tensor xv = sx.get(node), wv = sw.get(node);
      Tensor dy = gy.to(xv.dtype()).contiguous();
      Tensor dsum = fused ? g[0].to(xv.dtype()).contiguous().view({M, N}) : Tensor();
      Tensor dx = need_x ? empty(xv.shape(), xv.options()) : Tensor();
      Tensor dw = need_w ? empty({N}, TensorOptions(ct, xv.device())) : Tensor();
      Tensor db = need_b ? empty({N}, TensorOptions(ct, xv.device())) : Tensor();
      kernels(xv).row_norm_backward(dy.view({M, N}), dsum, xv.view({M, N}), smean.get(node), srstd.get(node), wv, rms,
                                    dx, dw, db);
      if (dw.defined()) dw = dw.view(wshape).to(wdt);
      if (db.defined()) db = db.view(wshape).to(bdt);
      if (fused) return std::vector<Tensor>{dx, dx.defined() ? dx.to(rdt) : dx, dw, db};
      return std::vector<Tensor>{dx, dw, db};
    };
    if (fused)
      autograd::record_function(node, {&x, &residual, &weight, &bias}, {&sum, &y}, backward);
    else
      autograd::record_function(node, {&x, &weight, &bias}, {&y}, backward);
  }
  return {sum, y};
}

// FT_FUSED_ADD_NORM=off (core/switches.h): add() and the norm apart, the benchmark's A/B of the
// fusion.
bool fused_add_norm_off() { return !switches::fused_add_norm.get(); }

// x + residual, then its norm: one kernel each way where the two have one shape and dtypes the
// kernels take (row_norm_residual_ok); otherwise (a broadcast residual, a residual of higher
// precision than x) add() and the norm.
ResidualNorm add_row_norm(const Tensor& x, const Tensor& residual, const Shape& normalized_shape, const Tensor& weight,
                          const Tensor& bias, double eps, bool rms) {
  const char* op = rms ? "add_rms_norm" : "add_layer_norm";
  FT_CHECK(residual.defined(), op, ": expected a residual tensor, found an undefined one");
  check_row_norm(x, normalized_shape, weight, bias, eps, op);
  ops::check_floating(residual, op, "residual");
  FT_CHECK(residual.device() == x.device(), op, ": residual is on ", residual.device().str(), " but the input is on ",
           x.device().str());
  if (residual.shape() != x.shape() || !backend::row_norm_residual_ok(x.dtype(), residual.dtype()) ||
      fused_add_norm_off()) {
    Tensor sum = add(x, residual);
    return {sum, row_norm(sum, Tensor(), normalized_shape, weight, bias, eps, rms).normed};
  }
  return row_norm(x, residual, normalized_shape, weight, bias, eps, rms);
}

// ---------------------------------------------------------------------------------------------
// batch_norm

// An empty tensor in x's memory format: NHWC strides when `channels_last`, else contiguous.
Tensor empty_in_format(const Tensor& x, bool channels_last) {
  if (!channels_last) return empty(x.shape(), x.options());
  const Shape& s = x.shape();
  return empty_strided(s, {s[1] * s[2] * s[3], 1, s[3] * s[1], s[1]}, x.options());
}

Tensor in_format(const Tensor& t, bool channels_last) {
  return channels_last ? t.contiguous_channels_last() : t.contiguous();
}

}  // namespace

Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, const Tensor& bias,
                  double eps) {
  check_row_norm(x, normalized_shape, weight, bias, eps, "layer_norm");
  return row_norm(x, Tensor(), normalized_shape, weight, bias, eps, false).normed;
}

Tensor rms_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight, double eps) {
  check_row_norm(x, normalized_shape, weight, Tensor(), eps, "rms_norm");
  return row_norm(x, Tensor(), normalized_shape, weight, Tensor(), eps, true).normed;
}

ResidualNorm add_layer_norm(const Tensor& x, const Tensor& residual, const Shape& normalized_shape,
                            const Tensor& weight, const Tensor& bias, double eps) {
  return add_row_norm(x, residual, normalized_shape, weight, bias, eps, false);
}

ResidualNorm add_rms_norm(const Tensor& x, const Tensor& residual, const Shape& normalized_shape, const Tensor& weight,
                          double eps) {
  return add_row_norm(x, residual, normalized_shape, weight, Tensor(), eps, true);
}

namespace {

// What a batch norm has decided before it normalises: the input in the layout its kernels read,
// that layout, and the statistics and parameters per channel in the compute dtype.
struct BatchNormPlan {
  Tensor xc;
  backend::BatchNormLayout L;
  bool channels_last = false;
  DType ct = DType::F32;
  Tensor wc, bc, mean, invstd;
};

// Validates a batch norm's arguments and computes its statistics: the batch's (updating the
// running statistics) in training, the running ones in eval.
BatchNormPlan plan_batch_norm(const char* op, const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                              const Tensor& weight, const Tensor& bias, bool training, double momentum, double eps) {
  ops::check_floating(x, op, "input");
  FT_CHECK(x.dim() >= 2, op, ": expected an input of shape [N, C, ...] with at least 2 dimensions, found shape ",
           x.shape().str());
  const int64_t C = x.size(1);
  const std::pair<const Tensor*, const char*> params[] = {
      {&weight, "weight"}, {&bias, "bias"}, {&running_mean, "running_mean"}, {&running_var, "running_var"}};
  for (const auto& [p, what] : params) {
    if (!p->defined()) continue;
    check_param(*p, x, op, what);
    FT_CHECK(p->dim() == 1 && p->size(0) == C, op, ": ", what, " has shape ", p->shape().str(), ", expected [", C,
             "] for an input with ", C, " channels");
  }
  FT_CHECK(running_mean.defined() == running_var.defined(), op,
           ": running_mean and running_var must both be given or both be undefined, found only ",
           running_mean.defined() ? "running_mean" : "running_var");
  FT_CHECK(training || running_mean.defined(), op,
           ": eval mode (training=false) needs running_mean and running_var, found none");
  FT_CHECK(eps >= 0, op, ": eps must be non-negative, found ", eps);
  int64_t S = 1;
  for (int i = 2; i < x.dim(); ++i) S *= x.size(i);
  const int64_t N = x.size(0);
  FT_CHECK(!training || N * S > 1, op, ": expected more than 1 value per channel when training, found input of shape ",
           x.shape().str());

  BatchNormPlan p;
  // Dense NCHW stays NCHW; dense NHWC stays NHWC (rows of C); anything else is made contiguous.
  p.channels_last = !x.is_contiguous() && x.is_channels_last();
  p.xc = p.channels_last ? x.detach() : x.detach().contiguous();
  p.L.N = N;
  p.L.C = C;
  p.L.S = S;
  p.L.rows = p.channels_last || S == 1;

  p.ct = compute_dtype(x.dtype());
  const TensorOptions copts(p.ct, x.device());
  p.wc = as_compute(weight, p.ct);
  p.bc = as_compute(bias, p.ct);
  p.mean = empty({C}, copts);
  autograd::NoGradGuard ng;
  if (training) {
    Tensor var = empty({C}, copts);
    kernels(p.xc).batch_norm_stats(p.xc, p.L, p.mean, var);
    // invstd and PyTorch's running-statistics rule (the unbiased variance) in one kernel.
    p.invstd = empty({C}, copts);
    const bool running = running_mean.defined();
    FT_CHECK(!running || (running_mean.is_contiguous() && running_var.is_contiguous()), op,
             ": running_mean and running_var must be contiguous");
    kernels(p.xc).batch_norm_update(p.mean, var, static_cast<double>(N * S), momentum, eps, p.invstd,
                                    running ? running_mean.detach() : Tensor(),
                                    running ? running_var.detach() : Tensor());
    if (running) {
      Tensor(running_mean).bump_version();
      Tensor(running_var).bump_version();
    }
  } else {
    p.mean.copy_(running_mean.detach());
    p.invstd = rsqrt(add(running_var.detach().to(p.ct), eps));
  }
  return p;
}

// The batch norm's part of a backward: what it saved, and dx, dw, db from the gradient of its
// output (after the fused ReLU where p.L.relu, whose mask it recomputes from x and b).
class BatchNormGrads {
 public:
  BatchNormGrads(const BatchNormPlan& p, const Tensor& x, const Tensor& weight, const Tensor& bias, bool training)
      : x_(p.xc),
        mean_(p.mean),
        invstd_(p.invstd),
        w_(p.wc),
        b_(p.L.relu ? p.bc : Tensor()),
        L_(p.L),
        channels_last_(p.channels_last),
        training_(training),
        need_x_(x.requires_grad()),
        need_w_(weight.requires_grad()),
        need_b_(bias.requires_grad()),
        ct_(p.ct),
        wdt_(weight.defined() ? weight.dtype() : p.ct),
        bdt_(bias.defined() ? bias.dtype() : p.ct) {}

  std::array<Tensor, 3> operator()(const Tensor& grad, const char* node) const {
    Tensor xv = x_.get(node);
    Tensor dy = in_format(grad.to(xv.dtype()), channels_last_);
    const TensorOptions copts(ct_, xv.device());
    Tensor dx = need_x_ ? empty_in_format(xv, channels_last_) : Tensor();
    Tensor dw = need_w_ ? empty({L_.C}, copts) : Tensor();
    Tensor db = need_b_ ? empty({L_.C}, copts) : Tensor();
    kernels(dy).batch_norm_backward(dy, xv, L_, mean_.get(node), invstd_.get(node), w_.get(node), b_.get(node),
                                    training_, dx, dw, db);
    if (dw.defined()) dw = dw.to(wdt_);
    if (db.defined()) db = db.to(bdt_);
    return {dx, dw, db};
  }

 private:
  SavedTensor x_, mean_, invstd_, w_, b_;
  backend::BatchNormLayout L_;
  bool channels_last_, training_, need_x_, need_w_, need_b_;
  DType ct_, wdt_, bdt_;
};

Tensor batch_norm_impl(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                       const Tensor& bias, bool training, double momentum, double eps, bool relu) {
  const char* op = relu ? "batch_norm_relu" : "batch_norm";
  BatchNormPlan p = plan_batch_norm(op, x, running_mean, running_var, weight, bias, training, momentum, eps);
  p.L.relu = relu;
  Tensor y = empty_in_format(x, p.channels_last);
  kernels(p.xc).batch_norm_apply(p.xc, p.L, p.mean, p.invstd, p.wc, p.bc, y);
  if (autograd::any_requires_grad({&x, &weight, &bias})) {
    const BatchNormGrads grads(p, x, weight, bias, training);
    const char* node = relu ? "BatchNormReluBackward" : "BatchNormBackward";
    autograd::record_function(node, {&x, &weight, &bias}, {&y}, [grads, node](std::vector<Tensor>& g) {
      auto [dx, dw, db] = grads(g[0], node);
      return std::vector<Tensor>{dx, dw, db};
    });
  }
  return y;
}

}  // namespace

Tensor batch_norm(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                  const Tensor& bias, bool training, double momentum, double eps) {
  return batch_norm_impl(x, running_mean, running_var, weight, bias, training, momentum, eps, false);
}

Tensor batch_norm_relu(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, const Tensor& weight,
                       const Tensor& bias, bool training, double momentum, double eps) {
  return batch_norm_impl(x, running_mean, running_var, weight, bias, training, momentum, eps, true);
}

Tensor batch_norm_add_relu(const Tensor& x, const Tensor& residual, const Tensor& running_mean,
                           const Tensor& running_var, const Tensor& weight, const Tensor& bias, bool training,
                           double momentum, double eps) {
  const char* op = "batch_norm_add_relu";
  FT_CHECK(residual.defined(), op, ": expected a residual tensor, found an undefined one");
  ops::check_floating(residual, op, "residual");
  FT_CHECK(residual.shape() == x.shape(), op, ": residual has shape ", residual.shape().str(),
           ", expected the input's shape ", x.shape().str());
  FT_CHECK(residual.device() == x.device(), op, ": residual is on ", residual.device().str(), " but the input is on ",
           x.device().str());
  // The unfused ops where the device has no fused kernel, or where the add would promote (a
  // residual of another dtype): the same values, through the tensors between them.
  if (!kernels(x).batch_norm_add_relu.has_value() || residual.dtype() != x.dtype())
    return relu(add(batch_norm(x, running_mean, running_var, weight, bias, training, momentum, eps), residual));
  BatchNormPlan p = plan_batch_norm(op, x, running_mean, running_var, weight, bias, training, momentum, eps);
  Tensor y = empty_in_format(x, p.channels_last);
  kernels(p.xc).batch_norm_add_relu(p.xc, p.L, p.mean, p.invstd, p.wc, p.bc,
                                    in_format(residual.detach(), p.channels_last), y);
  if (autograd::any_requires_grad({&x, &residual, &weight, &bias})) {
    // y > 0 exactly where bn(x) + residual > 0: y is the ReLU's mask, and the tensor the next
    // layer reads (a convolution keeps it anyway), where the unfused ReLU kept the sum.
    const BatchNormGrads grads(p, x, weight, bias, training);
    const SavedTensor sy(y);
    const bool channels_last = p.channels_last;
    const char* node = "BatchNormAddReluBackward";
    autograd::record_function(node, {&x, &residual, &weight, &bias}, {&y},
                              [grads, sy, channels_last, node](std::vector<Tensor>& g) {
                                Tensor yv = sy.get(node);
                                Tensor gy = in_format(g[0].to(yv.dtype()), channels_last);
                                Tensor gsum = empty_in_format(yv, channels_last);  // of bn(x) + residual
                                kernels(yv).unary_backward(math::UnaryOp::Relu, gy, yv, yv, gsum);
                                auto [dx, dw, db] = grads(gsum, node);
                                return std::vector<Tensor>{dx, gsum, dw, db};
                              });
  }
  return y;
}

}  // namespace ft
