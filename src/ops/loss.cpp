// cross_entropy on class-index targets, PyTorch semantics: class dim 1 ([N, C] or [N, C, d...];
// an unbatched [C] with a 0-d target also works), ignore_index positions contribute 0 and are
// left out of the Mean's denominator (so a Mean over only ignored targets is 0/0 = NaN, as in
// PyTorch), label smoothing eps gives (1 - eps) * nll + eps * mean_c(-log p_c). One fused kernel
// computes log-sum-exp, the target gather and the smoothing term per position; the backward is
// one fused kernel too (math in backend/cpu/loss.h).
#include <string>

#include "backend/kernels.h"
#include "fasttrain/ops/elementwise.h"
#include "fasttrain/ops/reduce.h"
#include "fasttrain/ops/softmax.h"
#include "ops/autocast_policy.h"
#include "ops/common.h"

namespace ft {

using backend::kernels;

Tensor cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index, double label_smoothing,
                     Reduction reduction) {
  // Under autocast 16-bit logits are read as they are (the kernels compute in f32) and the loss is
  // f32, as if they had been widened.
  const DType out_dtype = ops::autocast_result_dtype(ops::AutocastOp::cross_entropy, logits);
  const char* op = "cross_entropy";
  ops::common_device({&logits, &target}, op);
  ops::check_floating(logits, op, "logits");
  FT_CHECK(target.dtype() == DType::I64 || target.dtype() == DType::I32, op,
           ": target must be an integer tensor of class indices (i64 or i32), found ", dtype_name(target.dtype()));
  FT_CHECK(logits.dim() >= 1, op, ": logits must have shape [N, C] or [N, C, d...] (or [C]), found a 0-d tensor");
  FT_CHECK(label_smoothing >= 0.0 && label_smoothing <= 1.0, op, ": label_smoothing must be in [0, 1], found ",
           label_smoothing);
  // The target's expected shape: logits without the class dim.
  Shape expected;
  for (int i = 0; i < logits.dim(); ++i)
    if (i != (logits.dim() == 1 ? 0 : 1)) expected.push_back(logits.size(i));
  FT_CHECK(target.shape() == expected, op, ": target has shape ", target.shape().str(), ", expected ", expected.str(),
           " to match logits ", logits.shape().str());
  const int64_t N = logits.dim() == 1 ? 1 : logits.size(0);
  const int64_t C = logits.dim() == 1 ? logits.size(0) : logits.size(1);
  FT_CHECK(C > 0, op, ": logits have 0 classes (shape ", logits.shape().str(), ")");
  const int64_t S = N == 0 ? 1 : logits.numel() / (N * C);
  kernels(target).check_index_range(target, C, ignore_index, [op, C, ignore_index](int64_t v, int64_t i) {
    return detail::concat(op, ": target ", v, " at position ", i, " is out of range for ", C,
                          " classes (expected in [0, ", C - 1, "] or ignore_index ", ignore_index, ")");
  });

  Tensor x = logits.contiguous();
  Tensor t = target.to(DType::I64).contiguous();
  const DType acc = logits.dtype() == DType::F64 ? DType::F64 : DType::F32;
  // The Mean's denominator, the targets not ignored, stays on the device: nothing waits for it.
  Tensor count;
  if (reduction == Reduction::Mean) count = sum(logical_not(eq(t, ignore_index))).to(acc);
  Tensor loss = empty({N * S}, TensorOptions(acc, logits.device()));
  Tensor lse = empty({N * S}, TensorOptions(acc, logits.device()));
  kernels(x).cross_entropy_forward(x, N, C, S, t, ignore_index, label_smoothing, loss, lse);

  Tensor out;
  switch (reduction) {
    case Reduction::None: out = loss.view(expected).to(out_dtype); break;
    case Reduction::Sum: out = sum(loss).to(out_dtype); break;
    // count == 0 gives 0/0 = NaN, like PyTorch; the gradient is then 0 (every position ignored).
    case Reduction::Mean: out = div(sum(loss), count).to(out_dtype); break;
  }
  if (autograd::any_requires_grad({&logits})) {
    autograd::SavedTensor sx(x), st(t), slse(lse), scount(count);
    Shape lshape = logits.shape();
    autograd::record_function("CrossEntropyBackward", {&logits}, {&out}, [=](std::vector<Tensor>& g) {
      const char* node = "CrossEntropyBackward";
      Tensor xv = sx.get(node);
      // The Mean's 1/count rides on the upstream gradient (a device value); with every target
      // ignored the kernel writes zeros whatever it is, so max(count, 1) only keeps it finite.
      Tensor gc = g[0].to(acc);
      if (reduction == Reduction::Mean) gc = div(gc, clamp(scount.get(node), 1.0, std::nullopt));
      gc = gc.contiguous();
      Tensor gx = empty(lshape, xv.options());
      kernels(xv).cross_entropy_backward(xv, N, C, S, st.get(node), slse.get(node), ignore_index, label_smoothing, gc,
                                         1.0, gx);
      return std::vector<Tensor>{gx};
    });
  }
  return out;
}

}  // namespace ft
