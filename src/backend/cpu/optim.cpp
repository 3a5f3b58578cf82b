// CPU kernels of the multi-tensor optimizer steps (SGD, Adam/AdamW, LAMB, LARS; the formulas are
// in backend/optim_math.h). A pass is ONE parallel_for over the flat index space of all segments:
// each thread takes an equal share of the elements, whatever the tensor sizes (a big tensor is
// split between threads, many small ones share one), and applies the whole update to each element
// in one read and one write of p, g and the moments (Adam: 28 bytes per f32 element, where
// PyTorch's foreach path makes about six passes). Nothing is allocated once the scratch vectors
// have grown.
//
// LAMB and LARS also need per-tensor norms: a first pass sums every segment in fixed blocks
// (multi_tensor_blocks.h), then adds a segment's blocks in order, so the norms, and the result,
// do not depend on the thread count.
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "backend/cpu/multi_tensor_blocks.h"
#include "backend/cpu/optim.h"
#include "backend/optim_math.h"
#include "fasttrain/optim.h"
#include "fasttrain/parallel.h"

namespace ft::cpu {
namespace {

using backend::Segment;
namespace om = optim_math;

// Calls f(P{}, G{}) with the C++ types of a segment's parameter and gradient (the combinations the
// optimizers accept: f64 with f64; f32/bf16/f16 parameters with f32/bf16/f16 gradients).
template <class F>
void dispatch_param_grad(DType param, DType grad, F&& f) {
  auto with_grad = [&](auto p) {
    switch (grad) {
      case DType::F32: return f(p, float{});
      case DType::BF16: return f(p, bf16{});
      case DType::F16: return f(p, f16{});
      default: FT_FAIL("optimizer: unsupported gradient dtype ", dtype_name(grad));
    }
  };
  switch (param) {
    case DType::F64:
      FT_CHECK(grad == DType::F64, "optimizer: f64 parameter with a ", dtype_name(grad), " gradient");
      return f(double{}, double{});
    case DType::F32: return with_grad(float{});
    case DType::BF16: return with_grad(bf16{});
    case DType::F16: return with_grad(f16{});
    default: FT_FAIL("optimizer: unsupported parameter dtype ", dtype_name(param));
  }
}

// The arithmetic type of an update: f64 for f64 parameters, f32 for everything else.
template <class P>
using update_t = std::conditional_t<std::is_same_v<P, double>, double, float>;
template <class P>
inline constexpr bool has_master_v = std::is_same_v<P, bf16> || std::is_same_v<P, f16>;

// The values an update works on: the f32 master copy of a bf16/f16 parameter, else the parameter.
template <class P>
update_t<P>* weights(const Segment& s) {
  if constexpr (has_master_v<P>)
    return s.master;
  else
    return static_cast<P*>(s.param);
}

template <class G, class C>
C load_grad(const G* g, int64_t i) {
  return static_cast<C>(static_cast<compute_t<G>>(g[i]));
}

bool skipped(const MultiTensorStep& st) { return st.found_inf != nullptr && *st.found_inf != 0; }

// The step-count kernel: += 1 for every parameter (the caller returned first when the step is
// skipped); the passes read the advanced counts.
void advance_steps(const MultiTensorStep& st) {
  for (const Segment& s : st.segments) ++*s.step;
}

// Calls kernel(segment, segment_index, first, count) for each piece of [0, total) a thread owns.
template <class Kernel>
void run_pass(const MultiTensorStep& st, const Kernel& kernel) {
  // ~64 KiB of f32 per chunk at least: smaller work is not worth waking a thread for.
  constexpr int64_t kGrain = 16384;
  struct Context {
    std::span<const Segment> segments;
    const Kernel* kernel;
  } ctx{st.segments, &kernel};
  // The lambda captures one pointer, so std::function stores it inline (no allocation).
  parallel_for(0, st.total, kGrain, [c = &ctx](int64_t begin, int64_t end) {
    const auto segs = c->segments;
    auto it =
        std::upper_bound(segs.begin(), segs.end(), begin, [](int64_t x, const Segment& s) { return x < s.begin; }) - 1;
    for (; it != segs.end() && it->begin < end; ++it) {
      const int64_t lo = std::max(begin, it->begin), hi = std::min(end, it->begin + it->numel);
      if (lo < hi) (*c->kernel)(*it, it - segs.begin(), lo - it->begin, hi - lo);
    }
  });
}

// Per-tensor norms for LAMB/LARS: kernel(segment, first, count, sums) adds its squared sums to
// sums[0..1] (f64) for one block. Returns norms[2 * i + k] = sqrt(sum of segment i's blocks, in
// order); 0 for segments where wanted(segment) is false. Valid until the next call on this thread.
template <class Kernel, class Wanted>
const double* run_norm_pass(const MultiTensorStep& st, const Kernel& kernel, const Wanted& wanted) {
  // Scratch kept for its capacity, named through references: inside the parallel lambda a
  // thread-local's own name would denote the worker thread's (empty) copy.
  thread_local std::vector<Block> blocks_scratch;
  thread_local std::vector<double> sums_scratch, norms_scratch;
  std::vector<Block>& blocks = blocks_scratch;
  std::vector<double>& block_sums = sums_scratch;
  std::vector<double>& norms = norms_scratch;
  const auto segs = st.segments;
  split_into_blocks(
      static_cast<int64_t>(segs.size()), [&](int64_t i) { return wanted(segs[i]) ? segs[i].numel : int64_t{0}; },
      blocks);
  block_sums.assign(2 * blocks.size(), 0.0);
  double* sums = block_sums.data();
  for_each_block(blocks,
                 [&](int64_t b, const Block& blk) { kernel(segs[blk.array], blk.first, blk.numel, sums + 2 * b); });
  norms.assign(2 * segs.size(), 0.0);
  for (size_t b = 0; b < blocks.size(); ++b)  // in block order: fixed whatever the threads
    for (int k = 0; k < 2; ++k) norms[2 * blocks[b].array + k] += block_sums[2 * b + k];
  for (double& n : norms) n = std::sqrt(n);
  return norms.data();
}

// --- SGD and LARS: one pass of the momentum update -----------------------------------------------

template <class P, class G>
void momentum_pass(const Segment& s, int64_t first, int64_t n, update_t<P> trust) {
  using C = update_t<P>;
  const om::MomentumCoefficients<C> k(*s.options, trust, *s.step == s.buffers_first_step);
  P* __restrict p = static_cast<P*>(s.param) + first;
  const G* __restrict g = static_cast<const G*>(s.grad) + first;
  C* __restrict w = weights<P>(s) + first;
  if (!k.use_momentum) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) {
      const C pi = om::sgd_update(k, w[i], load_grad<G, C>(g, i));
      w[i] = pi;
      if constexpr (has_master_v<P>) p[i] = P(pi);
    }
    return;
  }
  C* __restrict b = static_cast<C*>(s.buffers[0]) + first;
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    C bi = b[i];
    const C pi = om::momentum_update(k, w[i], load_grad<G, C>(g, i), bi);
    b[i] = bi;
    w[i] = pi;
    if constexpr (has_master_v<P>) p[i] = P(pi);
  }
}

template <class P, class G>
void lars_norms(const Segment& s, int64_t first, int64_t n, double* sums) {
  using C = update_t<P>;
  const G* __restrict g = static_cast<const G*>(s.grad) + first;
  const C* __restrict w = weights<P>(s) + first;
  double w_sq = 0, g_sq = 0;
#pragma omp simd reduction(+ : w_sq, g_sq)
  for (int64_t i = 0; i < n; ++i) {
    const double gi = load_grad<G, C>(g, i);
    w_sq += static_cast<double>(w[i]) * w[i];
    g_sq += gi * gi;
  }
  sums[0] += w_sq;
  sums[1] += g_sq;
}

// --- Adam / AdamW: one pass ---------------------------------------------------------------------

template <bool kDecoupled, class P, class G>
void adam_pass(const Segment& s, int64_t first, int64_t n) {
  using C = update_t<P>;
  const om::AdamCoefficients<C> k(*s.options, *s.step);
  P* __restrict p = static_cast<P*>(s.param) + first;
  const G* __restrict g = static_cast<const G*>(s.grad) + first;
  C* __restrict m = static_cast<C*>(s.buffers[0]) + first;
  C* __restrict v = static_cast<C*>(s.buffers[1]) + first;
  C* __restrict w = weights<P>(s) + first;
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    C mi = m[i], vi = v[i];
    const C pi = om::adam_update<kDecoupled>(k, w[i], load_grad<G, C>(g, i), mi, vi);
    m[i] = mi;
    v[i] = vi;
    w[i] = pi;
    if constexpr (has_master_v<P>) p[i] = P(pi);
  }
}

// --- LAMB: moments and norms, then the update ---------------------------------------------------

template <class P, class G>
void lamb_moments_and_norms(const Segment& s, int64_t first, int64_t n, double* sums) {
  using C = update_t<P>;
  const om::LambCoefficients<C> k(*s.options, *s.step);
  const G* __restrict g = static_cast<const G*>(s.grad) + first;
  C* __restrict m = static_cast<C*>(s.buffers[0]) + first;
  C* __restrict v = static_cast<C*>(s.buffers[1]) + first;
  const C* __restrict w = weights<P>(s) + first;
  double w_sq = 0, u_sq = 0;
#pragma omp simd reduction(+ : w_sq, u_sq)
  for (int64_t i = 0; i < n; ++i) {
    C mi = m[i], vi = v[i];
    const C ui = om::lamb_moments(k, w[i], load_grad<G, C>(g, i), mi, vi);
    m[i] = mi;
    v[i] = vi;
    w_sq += static_cast<double>(w[i]) * w[i];
    u_sq += static_cast<double>(ui) * ui;
  }
  sums[0] += w_sq;
  sums[1] += u_sq;
}

template <class P>
void lamb_apply(const Segment& s, int64_t first, int64_t n, double w_norm, double u_norm) {
  using C = update_t<P>;
  const om::LambCoefficients<C> k(*s.options, *s.step);
  const C step = static_cast<C>(s.options->lr * om::lamb_trust_ratio(w_norm, u_norm));
  P* __restrict p = static_cast<P*>(s.param) + first;
  const C* __restrict m = static_cast<const C*>(s.buffers[0]) + first;
  const C* __restrict v = static_cast<const C*>(s.buffers[1]) + first;
  C* __restrict w = weights<P>(s) + first;
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const C pi = om::lamb_update(k, step, w[i], m[i], v[i]);
    w[i] = pi;
    if constexpr (has_master_v<P>) p[i] = P(pi);
  }
}

}  // namespace

void sgd_step(const MultiTensorStep& st) {
  if (skipped(st)) return;
  advance_steps(st);
  run_pass(st, [](const Segment& s, int64_t, int64_t first, int64_t n) {
    dispatch_param_grad(s.param_dtype, s.grad_dtype,
                        [&](auto p, auto g) { momentum_pass<decltype(p), decltype(g)>(s, first, n, 1); });
  });
}

void adam_step(const MultiTensorStep& st, bool decoupled_weight_decay) {
  if (skipped(st)) return;
  advance_steps(st);
  auto pass = [](auto decoupled) {
    return [](const Segment& s, int64_t, int64_t first, int64_t n) {
      dispatch_param_grad(s.param_dtype, s.grad_dtype, [&](auto p, auto g) {
        adam_pass<decltype(decoupled)::value, decltype(p), decltype(g)>(s, first, n);
      });
    };
  };
  if (decoupled_weight_decay)
    run_pass(st, pass(std::true_type{}));
  else
    run_pass(st, pass(std::false_type{}));
}

void lamb_step(const MultiTensorStep& st) {
  if (skipped(st)) return;
  advance_steps(st);
  const double* norms = run_norm_pass(
      st,
      [](const Segment& s, int64_t first, int64_t n, double* sums) {
        dispatch_param_grad(s.param_dtype, s.grad_dtype, [&](auto p, auto g) {
          lamb_moments_and_norms<decltype(p), decltype(g)>(s, first, n, sums);
        });
      },
      [](const Segment&) { return true; });
  run_pass(st, [norms](const Segment& s, int64_t index, int64_t first, int64_t n) {
    dispatch_param_grad(s.param_dtype, s.grad_dtype, [&](auto p, auto) {
      lamb_apply<decltype(p)>(s, first, n, norms[2 * index], norms[2 * index + 1]);
    });
  });
}

void lars_step(const MultiTensorStep& st) {
  if (skipped(st)) return;
  advance_steps(st);
  const double* norms = run_norm_pass(
      st,
      [](const Segment& s, int64_t first, int64_t n, double* sums) {
        dispatch_param_grad(s.param_dtype, s.grad_dtype,
                            [&](auto p, auto g) { lars_norms<decltype(p), decltype(g)>(s, first, n, sums); });
      },
      [](const Segment& s) { return !s.options->exclude_from_adaptation; });
  run_pass(st, [norms](const Segment& s, int64_t index, int64_t first, int64_t n) {
    dispatch_param_grad(s.param_dtype, s.grad_dtype, [&](auto p, auto g) {
      using C = update_t<decltype(p)>;
      const double trust = om::lars_trust_ratio(*s.options, norms[2 * index], norms[2 * index + 1]);
      momentum_pass<decltype(p), decltype(g)>(s, first, n, static_cast<C>(trust));
    });
  });
}

}  // namespace ft::cpu
