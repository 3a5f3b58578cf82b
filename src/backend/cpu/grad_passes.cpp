// CPU kernels of the passes over gradients only: clip_grad_norm_ / clip_grad_value_ and the
// GradScaler's unscale and scale update (formulas in backend/optim_math.h). Every pass walks the
// gradients in fixed blocks (multi_tensor_blocks.h) in one parallel loop; the norm and the inf
// flag keep one partial per block, combined in block order, so neither depends on the thread
// count. Values the host would otherwise have to read (the norm, the scale) are read from their
// 0-d tensors by the passes themselves, as the CUDA kernels must.
#include <cmath>
#include <vector>

#include "backend/cpu/dispatch.h"
#include "backend/cpu/multi_tensor_blocks.h"
#include "backend/cpu/optim.h"
#include "backend/optim_math.h"

namespace ft::cpu {
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

// Returns true when any element was inf or NaN (checked before scaling).
template <class T>
bool unscale_in_place(T* x, int64_t n, float inv_scale) {
  using C = compute_t<T>;
  const C c = static_cast<C>(inv_scale);
  bool bad = false;
  for (int64_t i = 0; i < n; ++i) {
    const C v = static_cast<C>(x[i]);
    bad |= !std::isfinite(v);
    x[i] = static_cast<T>(v * c);
  }
  return bad;
}

// The gradients' blocks, in a per-thread vector kept for its capacity.
std::vector<Block>& blocks_of(std::span<const Tensor> grads) {
  thread_local std::vector<Block> scratch;
  split_into_blocks(
      static_cast<int64_t>(grads.size()), [&](int64_t i) { return grads[i].numel(); }, scratch);
  return scratch;
}

template <class T>
T* block_data(const Tensor& g, const Block& blk) {
  return static_cast<T*>(g.raw_data()) + blk.first;
}

}  // namespace

void clip_grad_norm(std::span<const Tensor> grads, double max_norm, const Tensor& total_norm) {
  // Named through references: inside the parallel lambdas a thread-local's own name would denote
  // the worker thread's (empty) copy.
  std::vector<Block>& blocks = blocks_of(grads);
  thread_local std::vector<double> partial_scratch;
  std::vector<double>& partial = partial_scratch;
  partial.assign(blocks.size(), 0.0);
  for_each_block(blocks, [&](int64_t b, const Block& blk) {
    const Tensor& g = grads[blk.array];
    FT_DISPATCH_FLOATING(g.dtype(), "clip_grad_norm_",
                         [&] { partial[b] = sum_of_squares(block_data<const scalar_t>(g, blk), blk.numel); });
  });
  double sum = 0;
  for (double x : partial) sum += x;  // block order
  const bool f64 = total_norm.dtype() == DType::F64;
  if (f64)
    *total_norm.data<double>() = std::sqrt(sum);
  else
    *total_norm.data<float>() = static_cast<float>(std::sqrt(sum));

  // The scaling pass reads the norm from its tensor and leaves the gradients alone when the
  // factor is 1 (multiplying by 1 is exact).
  const void* norm_ptr = total_norm.raw_data();
  for_each_block(blocks, [&](int64_t, const Block& blk) {
    const double value = f64 ? *static_cast<const double*>(norm_ptr) : *static_cast<const float*>(norm_ptr);
    const double coef = optim_math::clip_coefficient(max_norm, value);
    if (coef >= 1) return;
    const Tensor& g = grads[blk.array];
    FT_DISPATCH_FLOATING(g.dtype(), "clip_grad_norm_", [&] {
      scale_in_place(block_data<scalar_t>(g, blk), blk.numel, static_cast<compute_t<scalar_t>>(coef));
    });
  });
}

void clip_grad_value(std::span<const Tensor> grads, double clip_value) {
  for_each_block(blocks_of(grads), [&](int64_t, const Block& blk) {
    const Tensor& g = grads[blk.array];
    FT_DISPATCH_FLOATING(g.dtype(), "clip_grad_value_", [&] {
      clamp_in_place(block_data<scalar_t>(g, blk), blk.numel, static_cast<compute_t<scalar_t>>(clip_value));
    });
  });
}

void unscale_grads(std::span<const Tensor> grads, const Tensor& scale, const Tensor& found_inf) {
  std::vector<Block>& blocks = blocks_of(grads);
  thread_local std::vector<uint8_t> found_scratch;
  std::vector<uint8_t>& block_found = found_scratch;  // see clip_grad_norm
  block_found.assign(blocks.size(), 0);
  const float* scale_ptr = scale.data<float>();
  for_each_block(blocks, [&](int64_t b, const Block& blk) {
    const float inv = optim_math::inverse_scale(*scale_ptr);
    const Tensor& g = grads[blk.array];
    FT_DISPATCH_FLOATING(g.dtype(), "GradScaler.unscale_",
                         [&] { block_found[b] = unscale_in_place(block_data<scalar_t>(g, blk), blk.numel, inv); });
  });
  uint8_t found = 0;
  for (uint8_t f : block_found) found |= f;
  *found_inf.data<float>() = found ? 1.0f : 0.0f;
}

void update_loss_scale(const Tensor& scale, const Tensor& growth_tracker, const Tensor& found_inf, double growth_factor,
                       double backoff_factor, int64_t growth_interval) {
  optim_math::update_loss_scale(*scale.data<float>(), *growth_tracker.data<int64_t>(), *found_inf.data<float>() != 0,
                                growth_factor, backoff_factor, growth_interval);
}

}  // namespace ft::cpu
