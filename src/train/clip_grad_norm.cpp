// Gradient clipping by global norm. The squared norm is one parallel pass over every gradient
// (f32 read once, summed in f64 per chunk, chunks added in a fixed order so the result does not
// depend on the thread count); the rescale is a second pass only when the norm is too large.
#include <cmath>
#include <vector>

#include "fasttrain/autograd.h"
#include "fasttrain/ops.h"
#include "fasttrain/parallel.h"
#include "fasttrain/train.h"

namespace ft::train {

namespace {

// Fixed chunking (independent of threads) keeps the reduction order, hence the result, fixed.
constexpr int64_t kChunk = 1 << 14;

struct Span {
  const float* p;
  int64_t n;
};

// Sum of squares of every gradient: the f32 ones as chunks of one parallel loop over all of
// them, any other dtype or layout through the ops (none in the models trained here).
double sum_of_squares(const std::vector<Tensor>& grads) {
  std::vector<Span> chunks;
  double other = 0;
  for (const Tensor& g : grads) {
    if (g.dtype() != DType::F32 || !g.is_contiguous()) {
      autograd::NoGradGuard ng;
      other += sum(square(g.to(DType::F64))).item<double>();
      continue;
    }
    const float* p = g.data<float>();
    for (int64_t lo = 0; lo < g.numel(); lo += kChunk) chunks.push_back({p + lo, std::min(kChunk, g.numel() - lo)});
  }
  std::vector<double> partial(chunks.size(), 0.0);
  parallel_for(0, static_cast<int64_t>(chunks.size()), 1, [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) {
      double acc = 0;
      for (int64_t i = 0; i < chunks[c].n; ++i) acc += static_cast<double>(chunks[c].p[i]) * chunks[c].p[i];
      partial[c] = acc;
    }
  });
  for (double x : partial) other += x;
  return other;
}

}  // namespace

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm) {
  FT_CHECK(std::isfinite(max_norm) && max_norm > 0, "clip_grad_norm: expected a positive max_norm, found ", max_norm);
  std::vector<Tensor> grads;
  for (const Tensor& p : params)
    if (Tensor g = p.grad(); g.defined()) {
      FT_CHECK(g.device().is_cpu(), "clip_grad_norm: gradients on ", g.device().str(), " are not supported yet");
      grads.push_back(g);
    }
  const double norm = std::sqrt(sum_of_squares(grads));
  // PyTorch's clip coefficient: max_norm / (norm + 1e-6), applied only when below 1.
  const double coef = max_norm / (norm + 1e-6);
  if (coef < 1.0) {
    autograd::NoGradGuard ng;
    for (Tensor& g : grads) mul_(g, coef);
  }
  return norm;
}

}  // namespace ft::train
