// FLOPs of one kernel call, from the shapes of its tensor arguments (the profiler's "flops" and
// the summary's GFLOP/s). A multiply-add counts 2. A kernel without a case here counts 0; adding an
// op needs nothing else from the profiler.
//
//   matmul(a[..., M, K], b, out[..., M, N])           2 * numel(out) * K   (bias add not counted)
//   linear_weight_grad(gy[R, out], x[R, in], gw, gb)   2 * numel(gw) * R   (bias sums not counted)
//   conv2d_forward(x, w[Cout, Cin/g, kh, kw], b, y)    2 * numel(y) * Cin/g * kh * kw
//   conv2d_backward_data(gy, w, gx)                    2 * numel(gy) * Cin/g * kh * kw
//   conv2d_backward_weight(gy, x, gw, gb)              2 * numel(gy) * Cin/g * kh * kw
//   linear_gelu(x[R, K], ...), matmul_gelu_backward(gy[R, K], ...)  (2 * K + 1) * numel(pre / dpre): + the GELU
//   attention_forward(q[B, H, Tq, D], k[B, H, Tk, D])  2 GEMMs (Q K^T, P V): 4 * B * H * pairs * D
//   attention_backward                                 5 GEMMs (S again, dV, dP, dQ, dK): 10 * B * H * pairs * D
//       pairs = Tq * Tk, or with a causal mask (top-left aligned) sum over i < Tq of min(Tk, i + 1)
//   unary, binary, where, clamp, add_inplace           1 per output element
//   unary_backward, clamp_backward                     2 per element (derivative, times the gradient)
//   sum, var                                           1 per input element
//   softmax_forward / softmax_backward                 5 / 3 per element
//   row_norm_forward / row_norm_backward               8 / 12 per element (layer or RMS norm), + 1 for a fused add
//   cross_entropy_forward / _backward                  5 / 3 per logit
// The elementwise counts are what the arithmetic needs, not what the instructions execute (exp is
// one), so for them "bytes" is the more telling figure.
#include <algorithm>
#include <string_view>

#include "core/profiler_context.h"

namespace ft::profiler::detail {

namespace {

double numel(const KernelCall::TensorInfo& t) {
  if (!t.defined) return 0;
  double n = 1;
  for (int64_t d : t.shape) n *= static_cast<double>(d);
  return n;
}

const KernelCall::TensorInfo* arg(const KernelCall& c, size_t i) {
  return i < c.tensors.size() && c.tensors[i].defined ? &c.tensors[i] : nullptr;
}

// Multiply-adds per output element of a convolution: the weight's elements per output channel.
double conv_macs_per_output(const KernelCall::TensorInfo& w) {
  return w.shape.empty() || w.shape[0] == 0 ? 0 : numel(w) / static_cast<double>(w.shape[0]);
}

double attention_pairs(int64_t tq, int64_t tk, bool causal) {
  if (!causal) return static_cast<double>(tq) * static_cast<double>(tk);
  double pairs = 0;
  for (int64_t i = 0; i < tq; ++i) pairs += static_cast<double>(std::min<int64_t>(tk, i + 1));
  return pairs;
}

double attention_flops(const KernelCall& c, double gemms) {
  const auto* q = arg(c, 0);
  const auto* k = arg(c, 1);
  if (!q || !k || q->shape.size() != 4 || k->shape.size() != 4) return 0;
  const double bh = static_cast<double>(q->shape[0]) * static_cast<double>(q->shape[1]);
  return 2 * gemms * bh * attention_pairs(q->shape[2], k->shape[2], c.causal) * static_cast<double>(q->shape[3]);
}

}  // namespace

double kernel_flops(const KernelCall& c) {
  const std::string_view k = c.kernel != nullptr ? c.kernel : "";
  auto n = [&](size_t i) { return arg(c, i) ? numel(*arg(c, i)) : 0.0; };
  if (k == "matmul") {  // a, b, out, bias
    const auto* a = arg(c, 0);
    if (!a || a->shape.empty()) return 0;
    return 2 * n(2) * static_cast<double>(a->shape.back());
  }
  if (k == "linear_weight_grad") {  // gy, x, gw, gb
    const auto* gy = arg(c, 0);
    if (!gy || gy->shape.empty()) return 0;
    return 2 * n(2) * static_cast<double>(gy->shape.front());
  }
  if (k == "linear_gelu" || k == "matmul_gelu_backward") {  // x w b pre y / gy w pre dpre db: + the GELU
    const auto* a = arg(c, 0);
    if (!a || a->shape.empty()) return 0;
    return (2 * static_cast<double>(a->shape.back()) + 1) * n(3);
  }
  if (k == "conv2d_forward") return arg(c, 1) ? 2 * n(3) * conv_macs_per_output(*arg(c, 1)) : 0;          // x w b y
  if (k == "conv2d_backward_data") return arg(c, 1) ? 2 * n(0) * conv_macs_per_output(*arg(c, 1)) : 0;    // gy w gx
  if (k == "conv2d_backward_weight") return arg(c, 2) ? 2 * n(0) * conv_macs_per_output(*arg(c, 2)) : 0;  // gy x gw
  if (k == "attention_forward") return attention_flops(c, 2);
  if (k == "attention_backward") return attention_flops(c, 5);
  const double out = c.tensors.empty() ? 0 : numel(c.tensors.back());
  if (k == "unary" || k == "binary" || k == "where" || k == "clamp") return out;
  if (k == "add_inplace") return n(0);
  if (k == "unary_backward" || k == "clamp_backward") return 2 * out;
  if (k == "sum" || k == "var") return n(0);
  if (k == "softmax_forward") return 5 * n(0);
  if (k == "softmax_backward") return 3 * n(0);
  if (k == "row_norm_forward") return 8 * n(0) + n(1);    // x residual ...: + the fused add
  if (k == "row_norm_backward") return 12 * n(2) + n(1);  // dy dsum x ...
  if (k == "cross_entropy_forward") return 5 * n(0);
  if (k == "cross_entropy_backward") return 3 * n(0);
  return 0;
}

}  // namespace ft::profiler::detail
