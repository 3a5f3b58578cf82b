// dropout: validation, Philox offset reservation and autograd; kernels in backend/cpu/dropout.cpp.
//
// The keep mask is saved for backward as u8 (one byte per element) rather than regenerated from
// (seed, offset): backward is then a single streaming multiply with no Philox rounds, which on the
// CPU is faster than recomputing ~10 multiply rounds per 4 elements; the cost is N bytes of
// activation memory per dropout layer (a quarter of an f32 activation).
#include "backend/kernels.h"
#include "fasttrain/ops/norm.h"
#include "ops/common.h"

namespace ft {

using backend::kernels;

Tensor dropout(const Tensor& x, double p, bool training, Generator* gen) {
  const char* op = "dropout";
  FT_CHECK(p >= 0.0 && p <= 1.0, op, ": probability p must be in [0, 1], found ", p);
  ops::check_floating(x, op, "input");
  if (!training || p == 0.0) return x;
  if (p == 1.0) {
    // Everything dropped: zeros, with a zero gradient.
    Tensor y = zeros(x.shape(), x.options());
    if (autograd::any_requires_grad({&x})) {
      Shape shape = x.shape();
      TensorOptions opts = x.options();
      autograd::record_function("DropoutBackward", {&x}, {&y}, [shape, opts](std::vector<Tensor>&) {
        return std::vector<Tensor>{zeros(shape, opts)};
      });
    }
    return y;
  }
  Generator& g = gen ? *gen : default_generator();
  const int64_t n = x.numel();
  // One counter block per 4 elements, as every other draw (the kernel may compute a few blocks
  // past the end in its last vector group, but never uses their words).
  const PhiloxDraw draw = g.draw(static_cast<uint64_t>((n + 3) / 4), x.device());
  const double scale = 1.0 / (1.0 - p);
  Tensor xc = x.detach().contiguous();
  Tensor y = empty(x.shape(), x.options());
  Tensor mask = empty(x.shape(), TensorOptions(DType::U8, x.device()));
  kernels(xc).dropout_forward(xc, static_cast<float>(1.0 - p), scale, draw, y, mask);
  if (autograd::any_requires_grad({&x})) {
    autograd::SavedTensor smask(mask);
    autograd::record_function("DropoutBackward", {&x}, {&y}, [smask, scale](std::vector<Tensor>& gr) {
      Tensor m = smask.get("DropoutBackward");
      Tensor dy = gr[0].contiguous();
      Tensor dx = empty(dy.shape(), dy.options());
      kernels(dy).dropout_backward(dy, m, scale, dx);
      return std::vector<Tensor>{dx};
    });
  }
  return y;
}

}  // namespace ft
