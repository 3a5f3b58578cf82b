// Gradient clipping (torch.nn.utils.clip_grad_norm_ / clip_grad_value_). The squared global norm
// is one parallel pass over every gradient (summed in f64 per fixed block, blocks added in
// order: the same result for any thread count); the clip factor min(1, max_norm/(norm + 1e-6))
// is computed by the scaling pass itself from the norm tensor, so the host never reads it.
#include <algorithm>
#include <cmath>

#include "backend/cpu/dispatch.h"
#include "fasttrain/optim.h"
#include "optim/grad_blocks.h"

namespace ft::optim {
namespace {

template <class T>
double sum_of_squares(const T* x, int64_t n) {
  double acc = 0;
  // Vectorised with several partial sums: a fixed order for a given block, whatever the threads.
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) {
    const double v = static_cast<compute_t<T>>(x[i]);
    acc += v * v;
  }
  return acc;
}

template <class T>
void scale_in_place(T* x, int64_t n, compute_t<T> c) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<T>(static_cast<compute_t<T>>(x[i]) * c);
}

// NaN stays NaN, as with torch.clamp.
template <class T>
void clamp_in_place(T* x, int64_t n, compute_t<T> limit) {
  for (int64_t i = 0; i < n; ++i) {
    const compute_t<T> v = static_cast<compute_t<T>>(x[i]);
    x[i] = static_cast<T>(v < -limit ? -limit : (v > limit ? limit : v));
  }
}

}  // namespace

Tensor clip_grad_norm_(const std::vector<Tensor>& params, double max_norm) {
  FT_CHECK(max_norm > 0, "clip_grad_norm_: expected a positive max_norm, found ", max_norm);
  // Scratch kept for its capacity. Thread-locals are named through references: inside the
  // parallel lambdas the names themselves would denote the worker thread's own (empty) copies.
  thread_local detail::GradBlocks scratch;
  thread_local std::vector<double> partial_scratch;
  detail::GradBlocks& gb = scratch;
  std::vector<double>& partial = partial_scratch;
  detail::collect_grads(params, "clip_grad_norm_", gb);
  partial.assign(gb.blocks.size(), 0.0);
  detail::for_each_grad_block(gb, [&](int64_t b, const Tensor& g, int64_t first, int64_t n) {
    FT_DISPATCH_FLOATING(g.dtype(), "clip_grad_norm_", [&] {
      partial[b] = sum_of_squares(static_cast<const scalar_t*>(g.raw_data()) + first, n);
    });
  });
  double sum = 0;
  for (double x : partial) sum += x;  // block order
  // f64 when every gradient is f64 (as PyTorch's norm), else f32.
  const bool all_f64 = !gb.grads.empty() && std::all_of(gb.grads.begin(), gb.grads.end(), [](const Tensor& g) {
    return g.dtype() == DType::F64;
  });
  Tensor norm = scalar_tensor(std::sqrt(sum), all_f64 ? DType::F64 : DType::F32);

  // The scaling kernel: reads the norm from its tensor and leaves the gradients alone when the
  // factor is 1 (multiplying by 1 is exact). A NaN norm gives a NaN factor, as in PyTorch.
  const void* norm_ptr = norm.raw_data();
  detail::for_each_grad_block(gb, [&](int64_t, const Tensor& g, int64_t first, int64_t n) {
    const double value = all_f64 ? *static_cast<const double*>(norm_ptr) : *static_cast<const float*>(norm_ptr);
    const double coef = max_norm / (value + 1e-6);
    if (coef >= 1) return;
    FT_DISPATCH_FLOATING(g.dtype(), "clip_grad_norm_", [&] {
      scale_in_place(static_cast<scalar_t*>(g.raw_data()) + first, n, static_cast<compute_t<scalar_t>>(coef));
    });
  });
  for (const Tensor& g : gb.grads) g.bump_version();
  gb.grads.clear();  // do not keep the gradients alive
  return norm;
}

void clip_grad_value_(const std::vector<Tensor>& params, double clip_value) {
  FT_CHECK(clip_value >= 0, "clip_grad_value_: expected a non-negative clip_value, found ", clip_value);
  thread_local detail::GradBlocks scratch;
  detail::GradBlocks& gb = scratch;  // see clip_grad_norm_
  detail::collect_grads(params, "clip_grad_value_", gb);
  detail::for_each_grad_block(gb, [&](int64_t, const Tensor& g, int64_t first, int64_t n) {
    FT_DISPATCH_FLOATING(g.dtype(), "clip_grad_value_", [&] {
      clamp_in_place(static_cast<scalar_t*>(g.raw_data()) + first, n, static_cast<compute_t<scalar_t>>(clip_value));
    });
  });
  for (const Tensor& g : gb.grads) g.bump_version();
  gb.grads.clear();
}

}  // namespace ft::optim
