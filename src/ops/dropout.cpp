// dropout: validation, Philox offset reservation and autograd; kernels in backend/cpu/dropout.cpp.
//
// The keep mask is saved for backward as u8 (one byte per element) rather than regenerated from
// (seed, offset): backward is then a single streaming multiply with no Philox rounds, which on the
// CPU is faster than recomputing ~10 multiply rounds per 4 elements; the cost is N bytes of
// activation memory per dropout layer (a quarter of an f32 activation).
#include "backend/kernels.h"
#include "fasttrain/ops/indexing.h"
#include "fasttrain/ops/norm.h"
#include "ops/common.h"
#include "ops/mask_parts.h"

namespace ft {

using backend::kernels;

namespace {

// `counters`: the mask's counters when given (dropout_of_part), else drawn from gen.
Tensor dropout_with(const Tensor& x, double p, bool training, Generator* gen, const PhiloxDraw* counters) {
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
  const PhiloxDraw draw = counters ? *counters : g.draw(static_cast<uint64_t>((n + 3) / 4), x.device());
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

}  // namespace

Tensor dropout(const Tensor& x, double p, bool training, Generator* gen) {
  return dropout_with(x, p, training, gen, nullptr);
}

Tensor ops::dropout_of_part(const Tensor& x, double p, bool training, int64_t first, int64_t total, Generator* gen) {
  if (!training || p == 0.0 || p == 1.0 || x.dim() < 2 || x.size(1) == total) return dropout(x, p, training, gen);
  const int64_t B = x.size(0), n = x.size(1), row = x.numel() / std::max<int64_t>(B * n, 1);
  FT_CHECK(first >= 0 && first + n <= total, "dropout: positions [", first, ", ", first + n,
           ") are not positions of a sequence of ", total);
  FT_CHECK((total * row) % 4 == 0 && (first * row) % 4 == 0, "dropout: positions [", first, ", ", first + n, ") of ",
           total, " with ", row, " values each do not start on a mask counter block (a multiple of 4 elements)");
  // The whole [B, total, ...] mask numbers element (b, i, j) e = (b total + i) row + j: batch row
  // b's part is the contiguous run from e_b = (b total + first) row.
  Generator& g = gen ? *gen : default_generator();
  const PhiloxDraw whole = g.draw(static_cast<uint64_t>((B * total * row + 3) / 4), x.device());
  std::vector<Tensor> rows;
  for (int64_t b = 0; b < B; ++b) {
    PhiloxDraw part = whole;
    part.base += static_cast<uint64_t>((b * total + first) * row / 4);
    rows.push_back(dropout_with(x.narrow(0, b, 1), p, training, gen, &part));
  }
  return cat(rows, 0);
}

}  // namespace ft
