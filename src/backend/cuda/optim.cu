// CUDA kernels of the optimizer steps (SGD, Adam/AdamW, LAMB, LARS), gradient clipping and the
// loss scaler: the entries of backend/kernel_list_optim.h. The per-element math is
// backend/optim_math.h, the same functions the CPU kernels (cpu/optim.cpp, cpu/grad_passes.cpp)
// call, so both backends compute the same numbers:
//   SGD / LARS  d = trust*(g + wd*p); b = first ? d : momentum*b + (1-dampening)*d;
//               d = nesterov ? d + momentum*b : b; p -= lr*d   (SGD: trust = 1; LARS: per tensor
//               trust_coefficient*||p|| / (||g|| + wd*||p||))
//   Adam(W)     m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g^2; p -= lr/(1-b1^t) * m/(sqrt(v)/sqrt(1-b2^t)+eps)
//               with L2 (g += wd*p) or decoupled (p *= 1 - lr*wd) weight decay
//   LAMB        u = m_hat/(sqrt(v_hat)+eps) + wd*p; p -= lr * ||p||/||u|| * u
//   clipping    total = sqrt(sum g^2); g *= max_norm/(total+1e-6) when that is below 1
//   scaler      g *= 1/scale with found_inf = any non-finite g; then torch's _amp_update_scale_
//
// Layout of a launch: the elements are cut into chunks of kChunk elements that never cross a
// tensor, one thread block per chunk, all tensors of a step or gradient list in ONE launch. A
// small host table (one row per tensor: pointers, dtypes, options, index of its first chunk) is
// staged in pinned memory and copied to the device asynchronously; a block finds its tensor by a
// binary search over the rows' first chunks. Dtypes differ between tensors of one launch, so the
// kernels switch on each row's dtype code (uniform within a block: no divergence).
//
// Nothing here makes the host wait: step counts, found_inf, the loss scale and the clipping norm
// are read by the kernels from device memory. Reductions (LAMB/LARS per-tensor norms, the
// clipping norm) are deterministic: each block sums its chunk in f64 in a fixed tree order into
// its own partial, then the partials of a tensor (or of all tensors) are added in a fixed order by
// one block; no float atomics.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <type_traits>
#include <vector>

#include "backend/cuda/caching_allocator.h"
#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"
#include "backend/device_backend.h"
#include "backend/optim_math.h"
#include "fasttrain/allocator.h"
#include "fasttrain/cuda_graph.h"
#include "fasttrain/optim.h"

namespace ft::cuda {
namespace {

using backend::Segment;
namespace om = optim_math;

constexpr int kThreads = 256;  // every kernel below that reduces assumes exactly this block size
// Elements per block: enough work to amortise a block's set-up (table search, coefficients in f64)
// over 64 elements per thread; small enough that one large tensor spreads over the whole device.
constexpr int64_t kChunk = 16384;

__host__ __device__ inline int64_t chunks_of(int64_t numel) { return (numel + kChunk - 1) / kChunk; }

// --- device-side tables ---------------------------------------------------------------------------

// The fields of optim::GroupOptions the math reads (optim_math's coefficient structs take any
// struct with these names). GroupOptions lives in host memory: a copy travels in each row.
struct DeviceOptions {
  double lr, weight_decay, momentum, dampening, beta1, beta2, eps, trust_coefficient;
  bool nesterov, exclude_from_adaptation;
};

// The (parameter, gradient) dtype pairs the optimizers accept (cpu/optim.cpp's dispatch).
enum class TypePair : int32_t {
  F64_F64,
  F32_F32,
  F32_BF16,
  F32_F16,
  BF16_F32,
  BF16_BF16,
  BF16_F16,
  F16_F32,
  F16_BF16,
  F16_F16
};

// One parameter of a step (backend::Segment with device-readable options and its first chunk).
struct StepRow {
  int64_t numel, first_chunk;
  void* param;
  const void* grad;
  float* master;
  void* buffers[2];
  int64_t* step;
  int64_t buffers_first_step;
  TypePair types;
  DeviceOptions options;
  int32_t live_index;  // captured steps: the row's entry of the live options (see begin_step)
};

// One gradient of a clipping or unscaling pass.
struct GradRow {
  int64_t numel, first_chunk;
  void* data;
  DType dtype;
};

// A host table copied to the device, with what the launches need.
template <class Row>
struct Table {
  Tensor storage;  // device memory of the rows; freed after the launches, stream-ordered
  const Row* rows = nullptr;
  int count = 0;
  int64_t chunks = 0;  // over all rows
};

// Copies `rows` to the device on `stream` without making the host wait: staged in pinned memory,
// which the allocator keeps from reuse until the copy queued on `stream` has run (record_stream).
template <class Row>
Table<Row> upload(const std::vector<Row>& rows, int64_t chunks, Stream stream, const char* name) {
  static_assert(std::is_trivially_copyable_v<Row>);
  FT_CHECK(rows.size() <= static_cast<size_t>(INT_MAX), name, ": too many tensors (", rows.size(), ")");
  FT_CHECK(chunks <= INT_MAX, name, ": too many elements for one launch (", chunks, " blocks of ", kChunk, ")");
  Table<Row> t;
  t.count = static_cast<int>(rows.size());
  t.chunks = chunks;
  const int64_t nbytes = static_cast<int64_t>(rows.size() * sizeof(Row));
  if (nbytes == 0) return t;
  Tensor staging = empty_pinned({nbytes}, DType::U8);
  std::memcpy(staging.raw_data(), rows.data(), static_cast<size_t>(nbytes));
  // Without pinning (no usable device: cannot happen here) cudaMemcpyAsync copies pageable memory
  // before returning, so freeing the staging buffer right after is still safe.
  if (staging.is_pinned()) ::ft::pinned_host_allocator()->record_stream(staging.raw_data(), stream);
  // A captured copy reads the staging memory at every replay: it must stay as it is.
  if (CudaGraph* graph = capturing_graph()) graph->keep_alive(staging);
  t.storage = empty({nbytes}, TensorOptions(DType::U8, stream.device));
  check(cudaMemcpyAsync(t.storage.raw_data(), staging.raw_data(), static_cast<size_t>(nbytes), cudaMemcpyHostToDevice,
                        static_cast<cudaStream_t>(stream.handle)),
        name);
  t.rows = static_cast<const Row*>(t.storage.raw_data());
  return t;
}

// --- host side: rows of a step ----------------------------------------------------------------------

TypePair type_pair(DType param, DType grad) {
  auto with_grad = [&](TypePair f32, TypePair bf16, TypePair f16) {
    switch (grad) {
      case DType::F32: return f32;
      case DType::BF16: return bf16;
      case DType::F16: return f16;
      default: FT_FAIL("optimizer: unsupported gradient dtype ", dtype_name(grad));
    }
  };
  switch (param) {
    case DType::F64:
      FT_CHECK(grad == DType::F64, "optimizer: f64 parameter with a ", dtype_name(grad), " gradient");
      return TypePair::F64_F64;
    case DType::F32: return with_grad(TypePair::F32_F32, TypePair::F32_BF16, TypePair::F32_F16);
    case DType::BF16: return with_grad(TypePair::BF16_F32, TypePair::BF16_BF16, TypePair::BF16_F16);
    case DType::F16: return with_grad(TypePair::F16_F32, TypePair::F16_BF16, TypePair::F16_F16);
    default: FT_FAIL("optimizer: unsupported parameter dtype ", dtype_name(param));
  }
}

DeviceOptions device_options(const optim::GroupOptions& o) {
  DeviceOptions d;
  d.lr = o.lr;
  d.weight_decay = o.weight_decay;
  d.momentum = o.momentum;
  d.dampening = o.dampening;
  d.beta1 = o.beta1;
  d.beta2 = o.beta2;
  d.eps = o.eps;
  d.trust_coefficient = o.trust_coefficient;
  d.nesterov = o.nesterov;
  d.exclude_from_adaptation = o.exclude_from_adaptation;
  return d;
}

// The stream of a step's device, made current. A MultiTensorStep carries no Tensor: the device is
// that of the step counts' memory (every segment has one), else the current device.
Stream step_stream(const MultiTensorStep& st, const char* name) {
  int index = -1;
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, st.segments.front().step) == cudaSuccess &&
      (attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged)) {
    index = attr.device;
  } else {
    cudaGetLastError();  // a failed query must not resurface as the next launch's error
    check(cudaGetDevice(&index), name);
  }
  const Stream s = current_stream(Device::cuda(index));
  check(cudaSetDevice(index), name);
  return s;
}

// live_index: each segment's entry of the live options (captured steps), or empty.
Table<StepRow> step_table(const MultiTensorStep& st, const std::vector<int32_t>& live_index, Stream stream,
                          const char* name) {
  thread_local std::vector<StepRow> rows;  // kept for its capacity
  rows.clear();
  int64_t chunks = 0;
  for (const Segment& s : st.segments) {
    FT_CHECK(s.options != nullptr && s.step != nullptr, name, ": segment without options or step count");
    StepRow r{};
    r.numel = s.numel;
    r.first_chunk = chunks;
    r.param = s.param;
    r.grad = s.grad;
    r.master = s.master;
    r.buffers[0] = s.buffers[0];
    r.buffers[1] = s.buffers[1];
    r.step = s.step;
    r.buffers_first_step = s.buffers_first_step;
    r.types = type_pair(s.param_dtype, s.grad_dtype);
    FT_CHECK((s.param_dtype != DType::BF16 && s.param_dtype != DType::F16) || s.master != nullptr, name, ": a ",
             dtype_name(s.param_dtype), " parameter without an f32 master copy");
    r.options = device_options(*s.options);
    r.live_index = live_index.empty() ? 0 : live_index[rows.size()];
    rows.push_back(r);
    chunks += chunks_of(s.numel);
  }
  return upload(rows, chunks, stream, name);
}

// --- device side: shared pieces ---------------------------------------------------------------------

__device__ __forceinline__ bool skipped(const float* found_inf) { return found_inf != nullptr && *found_inf != 0.0f; }

// The part of a row this block owns: row index, first element, element count (>= 1).
struct Piece {
  int row;
  int64_t first, n;
};

// Rows with no elements own no chunk and share their first_chunk with the next row, so the last
// row whose first_chunk <= blockIdx.x is the one that owns the chunk.
template <class Row>
__device__ __forceinline__ Piece locate(const Row* rows, int count) {
  const int64_t chunk = blockIdx.x;
  int lo = 0, hi = count;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (rows[mid].first_chunk <= chunk)
      lo = mid + 1;
    else
      hi = mid;
  }
  const int row = lo - 1;
  const int64_t first = (chunk - rows[row].first_chunk) * kChunk;
  const int64_t left = rows[row].numel - first;
  return {row, first, left < kChunk ? left : kChunk};
}

// Sums v[k] over the block in a fixed tree order (the same bits on every run); every thread gets
// the result. Call from all kThreads threads of the block.
template <int N>
__device__ __forceinline__ void block_sum(double (&v)[N]) {
  __shared__ double buf[N][kThreads];
  const int t = threadIdx.x;
  for (int k = 0; k < N; ++k) buf[k][t] = v[k];
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride >>= 1) {
    if (t < stride)
      for (int k = 0; k < N; ++k) buf[k][t] += buf[k][t + stride];
    __syncthreads();
  }
  for (int k = 0; k < N; ++k) v[k] = buf[k][0];
}

template <class T>
struct Type {
  using type = T;
};

// Calls f(Type<P>{}, Type<G>{}) with the device types of a row's parameter and gradient.
template <class F>
__device__ __forceinline__ void dispatch_types(TypePair types, const F& f) {
  switch (types) {
    case TypePair::F64_F64: f(Type<double>{}, Type<double>{}); break;
    case TypePair::F32_F32: f(Type<float>{}, Type<float>{}); break;
    case TypePair::F32_BF16: f(Type<float>{}, Type<bf16_t>{}); break;
    case TypePair::F32_F16: f(Type<float>{}, Type<f16_t>{}); break;
    case TypePair::BF16_F32: f(Type<bf16_t>{}, Type<float>{}); break;
    case TypePair::BF16_BF16: f(Type<bf16_t>{}, Type<bf16_t>{}); break;
    case TypePair::BF16_F16: f(Type<bf16_t>{}, Type<f16_t>{}); break;
    case TypePair::F16_F32: f(Type<f16_t>{}, Type<float>{}); break;
    case TypePair::F16_BF16: f(Type<f16_t>{}, Type<bf16_t>{}); break;
    case TypePair::F16_F16: f(Type<f16_t>{}, Type<f16_t>{}); break;
  }
}

// The arithmetic type of an update: f64 for f64 parameters, f32 for everything else.
template <class P>
using update_t = std::conditional_t<std::is_same_v<P, double>, double, float>;
template <class P>
inline constexpr bool kHasMaster = std::is_same_v<P, bf16_t> || std::is_same_v<P, f16_t>;

// The values an update works on: the f32 master copy of a bf16/f16 parameter, else the parameter.
template <class P>
__device__ __forceinline__ update_t<P>* weights(const StepRow& r) {
  if constexpr (kHasMaster<P>)
    return r.master;
  else
    return static_cast<P*>(r.param);
}

// --- step kernels -------------------------------------------------------------------------------------

// First launch of every step: advances each count by one (the update kernels then read the new
// counts); a skipped step advances none. In a captured step it first copies each row's group
// options from `live` (written before every replay: the learning rate of this step).
__global__ void advance_steps_kernel(StepRow* rows, int count, const float* found_inf, const DeviceOptions* live) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= count) return;
  if (live != nullptr) rows[i].options = live[rows[i].live_index];
  if (!skipped(found_inf)) ++*rows[i].step;
}

__global__ void write_options_kernel(DeviceOptions* dst, DeviceOptions value) { *dst = value; }

// SGD (trust = 1) and LARS's second pass (trust from the per-tensor norms).
template <class P, class G>
__device__ __forceinline__ void momentum_piece(const StepRow& r, int64_t first, int64_t n, update_t<P> trust) {
  using C = update_t<P>;
  // The step count was advanced by advance_steps_kernel: equal to buffers_first_step on the
  // buffer's first update (PyTorch copies the gradient into a new momentum buffer).
  const om::MomentumCoefficients<C> k(r.options, trust, *r.step == r.buffers_first_step);
  P* p = static_cast<P*>(r.param) + first;
  const G* g = static_cast<const G*>(r.grad) + first;
  C* w = weights<P>(r) + first;
  if (!k.use_momentum) {
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const C pi = om::sgd_update(k, w[i], convert<C>(g[i]));
      w[i] = pi;
      if constexpr (kHasMaster<P>) p[i] = convert<P>(pi);
    }
    return;
  }
  C* b = static_cast<C*>(r.buffers[0]) + first;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    C bi = b[i];
    const C pi = om::momentum_update(k, w[i], convert<C>(g[i]), bi);
    b[i] = bi;
    w[i] = pi;
    if constexpr (kHasMaster<P>) p[i] = convert<P>(pi);
  }
}

// norms: null for SGD; LARS: [2*row] = ||p||, [2*row+1] = ||g|| (0 for excluded rows).
__global__ void __launch_bounds__(kThreads)
    momentum_kernel(const StepRow* rows, int count, const float* found_inf, const double* norms) {
  if (skipped(found_inf)) return;
  const Piece pc = locate(rows, count);
  const StepRow& r = rows[pc.row];
  const double trust =
      norms == nullptr ? 1.0 : om::lars_trust_ratio(r.options, norms[2 * pc.row], norms[2 * pc.row + 1]);
  dispatch_types(r.types, [&](auto p, auto g) {
    using P = typename decltype(p)::type;
    momentum_piece<P, typename decltype(g)::type>(r, pc.first, pc.n, static_cast<update_t<P>>(trust));
  });
}

template <bool kDecoupled>
__global__ void __launch_bounds__(kThreads) adam_kernel(const StepRow* rows, int count, const float* found_inf) {
  if (skipped(found_inf)) return;
  const Piece pc = locate(rows, count);
  const StepRow& r = rows[pc.row];
  dispatch_types(r.types, [&](auto pt, auto gt) {
    using P = typename decltype(pt)::type;
    using G = typename decltype(gt)::type;
    using C = update_t<P>;
    // Coefficients in f64 from the advanced count, rounded to C once: every element of the tensor
    // uses the same constants, as on the CPU.
    const om::AdamCoefficients<C> k(r.options, *r.step);
    P* p = static_cast<P*>(r.param) + pc.first;
    const G* g = static_cast<const G*>(r.grad) + pc.first;
    C* m = static_cast<C*>(r.buffers[0]) + pc.first;
    C* v = static_cast<C*>(r.buffers[1]) + pc.first;
    C* w = weights<P>(r) + pc.first;
    for (int64_t i = threadIdx.x; i < pc.n; i += blockDim.x) {
      C mi = m[i], vi = v[i];
      const C pi = om::adam_update<kDecoupled>(k, w[i], convert<C>(g[i]), mi, vi);
      m[i] = mi;
      v[i] = vi;
      w[i] = pi;
      if constexpr (kHasMaster<P>) p[i] = convert<P>(pi);
    }
  });
}

// LAMB pass 1: the moments, and this chunk's sums of p^2 and u^2 into partials[2*chunk + 0..1].
__global__ void __launch_bounds__(kThreads)
    lamb_moments_kernel(const StepRow* rows, int count, const float* found_inf, double* partials) {
  if (skipped(found_inf)) return;
  const Piece pc = locate(rows, count);
  const StepRow& r = rows[pc.row];
  double sums[2] = {0.0, 0.0};
  dispatch_types(r.types, [&](auto pt, auto gt) {
    using P = typename decltype(pt)::type;
    using G = typename decltype(gt)::type;
    using C = update_t<P>;
    const om::LambCoefficients<C> k(r.options, *r.step);
    const G* g = static_cast<const G*>(r.grad) + pc.first;
    C* m = static_cast<C*>(r.buffers[0]) + pc.first;
    C* v = static_cast<C*>(r.buffers[1]) + pc.first;
    const C* w = weights<P>(r) + pc.first;
    for (int64_t i = threadIdx.x; i < pc.n; i += blockDim.x) {
      C mi = m[i], vi = v[i];
      const C wi = w[i];
      const C ui = om::lamb_moments(k, wi, convert<C>(g[i]), mi, vi);
      m[i] = mi;
      v[i] = vi;
      sums[0] += static_cast<double>(wi) * wi;
      sums[1] += static_cast<double>(ui) * ui;
    }
  });
  block_sum(sums);
  if (threadIdx.x == 0) {
    partials[2 * blockIdx.x] = sums[0];
    partials[2 * blockIdx.x + 1] = sums[1];
  }
}

// LARS pass 1: this chunk's sums of p^2 and g^2; zeros for groups excluded from adaptation (their
// trust ratio is 1 whatever the norms, as on the CPU, which skips them).
__global__ void __launch_bounds__(kThreads)
    lars_norms_kernel(const StepRow* rows, int count, const float* found_inf, double* partials) {
  if (skipped(found_inf)) return;
  const Piece pc = locate(rows, count);
  const StepRow& r = rows[pc.row];
  double sums[2] = {0.0, 0.0};
  if (!r.options.exclude_from_adaptation) {
    dispatch_types(r.types, [&](auto pt, auto gt) {
      using P = typename decltype(pt)::type;
      using G = typename decltype(gt)::type;
      using C = update_t<P>;
      const G* g = static_cast<const G*>(r.grad) + pc.first;
      const C* w = weights<P>(r) + pc.first;
      for (int64_t i = threadIdx.x; i < pc.n; i += blockDim.x) {
        const double gi = convert<C>(g[i]);
        sums[0] += static_cast<double>(w[i]) * w[i];
        sums[1] += gi * gi;
      }
    });
  }
  block_sum(sums);  // outside the branch: every thread of the block must reach its barriers
  if (threadIdx.x == 0) {
    partials[2 * blockIdx.x] = sums[0];
    partials[2 * blockIdx.x + 1] = sums[1];
  }
}

// One block per row: norms[2*row + k] = sqrt(sum of the row's chunk partials), summed in a fixed
// order. Rows without elements get 0.
__global__ void __launch_bounds__(kThreads)
    row_norms_kernel(const StepRow* rows, const float* found_inf, const double* partials, double* norms) {
  if (skipped(found_inf)) return;
  const StepRow& r = rows[blockIdx.x];
  const int64_t n = chunks_of(r.numel);
  double sums[2] = {0.0, 0.0};
  for (int64_t c = threadIdx.x; c < n; c += blockDim.x) {
    sums[0] += partials[2 * (r.first_chunk + c)];
    sums[1] += partials[2 * (r.first_chunk + c) + 1];
  }
  block_sum(sums);
  if (threadIdx.x == 0) {
    norms[2 * blockIdx.x] = sqrt(sums[0]);
    norms[2 * blockIdx.x + 1] = sqrt(sums[1]);
  }
}

// LAMB pass 2: p -= lr * trust * u, u recomputed from the stored moments and the old weights.
__global__ void __launch_bounds__(kThreads)
    lamb_apply_kernel(const StepRow* rows, int count, const float* found_inf, const double* norms) {
  if (skipped(found_inf)) return;
  const Piece pc = locate(rows, count);
  const StepRow& r = rows[pc.row];
  dispatch_types(r.types, [&](auto pt, auto) {
    using P = typename decltype(pt)::type;
    using C = update_t<P>;
    const om::LambCoefficients<C> k(r.options, *r.step);
    const C step = static_cast<C>(r.options.lr * om::lamb_trust_ratio(norms[2 * pc.row], norms[2 * pc.row + 1]));
    P* p = static_cast<P*>(r.param) + pc.first;
    const C* m = static_cast<const C*>(r.buffers[0]) + pc.first;
    const C* v = static_cast<const C*>(r.buffers[1]) + pc.first;
    C* w = weights<P>(r) + pc.first;
    for (int64_t i = threadIdx.x; i < pc.n; i += blockDim.x) {
      const C pi = om::lamb_update(k, step, w[i], m[i], v[i]);
      w[i] = pi;
      if constexpr (kHasMaster<P>) p[i] = convert<P>(pi);
    }
  });
}

// --- gradient-list kernels ------------------------------------------------------------------------

Table<GradRow> grad_table(std::span<const Tensor> grads, Stream stream, const char* name) {
  thread_local std::vector<GradRow> rows;  // kept for its capacity
  rows.clear();
  int64_t chunks = 0;
  for (const Tensor& g : grads) {
    FT_CHECK(g.device() == stream.device, name, ": a gradient is on ", g.device().str(), ", expected ",
             stream.device.str());
    FT_CHECK(is_floating(g.dtype()), name, ": expected floating-point gradients, found ", dtype_name(g.dtype()));
    // Dense (contiguous or channels-last, checked by the caller): walked as a flat array.
    rows.push_back(GradRow{g.numel(), chunks, g.raw_data(), g.dtype()});
    chunks += chunks_of(g.numel());
  }
  return upload(rows, chunks, stream, name);
}

// Calls f(Type<T>{}) with the device type of a floating dtype.
template <class F>
__device__ __forceinline__ void dispatch_float(DType dtype, const F& f) {
  switch (dtype) {
    case DType::F32: f(Type<float>{}); break;
    case DType::F64: f(Type<double>{}); break;
    case DType::BF16: f(Type<bf16_t>{}); break;
    case DType::F16: f(Type<f16_t>{}); break;
    default: break;  // rejected by grad_table
  }
}

// partials[chunk] = sum of the chunk's squares, in f64.
__global__ void __launch_bounds__(kThreads) sum_squares_kernel(const GradRow* rows, int count, double* partials) {
  const Piece pc = locate(rows, count);
  const GradRow& r = rows[pc.row];
  double sum[1] = {0.0};
  dispatch_float(r.dtype, [&](auto tt) {
    using T = typename decltype(tt)::type;
    const T* x = static_cast<const T*>(r.data) + pc.first;
    for (int64_t i = threadIdx.x; i < pc.n; i += blockDim.x) {
      const double v = convert<acc_t<T>>(x[i]);
      sum[0] += v * v;
    }
  });
  block_sum(sum);
  if (threadIdx.x == 0) partials[blockIdx.x] = sum[0];
}

// One block: the global norm from the partials, in a fixed order, into the 0-d norm tensor.
__global__ void __launch_bounds__(kThreads)
    total_norm_kernel(const double* partials, int64_t count, void* norm, bool norm_f64) {
  double sum[1] = {0.0};
  for (int64_t c = threadIdx.x; c < count; c += blockDim.x) sum[0] += partials[c];
  block_sum(sum);
  if (threadIdx.x == 0) {
    const double total = sqrt(sum[0]);
    if (norm_f64)
      *static_cast<double*>(norm) = total;
    else
      *static_cast<float*>(norm) = static_cast<float>(total);
  }
}

// Scales by the clip coefficient read from the norm tensor (the value as stored, f32 or f64, as
// the CPU reads it). A coefficient >= 1 leaves the gradients alone; a NaN one scales (PyTorch).
__global__ void __launch_bounds__(kThreads)
    clip_scale_kernel(const GradRow* rows, int count, const void* norm, bool norm_f64, double max_norm) {
  const double total = norm_f64 ? *static_cast<const double*>(norm) : *static_cast<const float*>(norm);
  const double coef = om::clip_coefficient(max_norm, total);
  if (coef >= 1) return;
  const Piece pc = locate(rows, count);
  const GradRow& r = rows[pc.row];
  dispatch_float(r.dtype, [&](auto tt) {
    using T = typename decltype(tt)::type;
    using C = acc_t<T>;
    const C c = static_cast<C>(coef);
    T* x = static_cast<T*>(r.data) + pc.first;
    for (int64_t i = threadIdx.x; i < pc.n; i += blockDim.x) x[i] = convert<T>(convert<C>(x[i]) * c);
  });
}

// Clamps to [-limit, limit]; NaN stays NaN (both comparisons false), as with torch.clamp.
__global__ void __launch_bounds__(kThreads) clamp_kernel(const GradRow* rows, int count, double limit_value) {
  const Piece pc = locate(rows, count);
  const GradRow& r = rows[pc.row];
  dispatch_float(r.dtype, [&](auto tt) {
    using T = typename decltype(tt)::type;
    using C = acc_t<T>;
    const C limit = static_cast<C>(limit_value);
    T* x = static_cast<T*>(r.data) + pc.first;
    for (int64_t i = threadIdx.x; i < pc.n; i += blockDim.x) {
      const C v = convert<C>(x[i]);
      x[i] = convert<T>(v < -limit ? -limit : (v > limit ? limit : v));
    }
  });
}

// x *= 1/scale; found_inf (zeroed before the launch) is set to 1 by any block that saw an inf or
// NaN (checked before scaling). Every writer stores the same value, so the result is exact.
__global__ void __launch_bounds__(kThreads)
    unscale_kernel(const GradRow* rows, int count, const float* scale, float* found_inf) {
  const float inv = om::inverse_scale(*scale);
  const Piece pc = locate(rows, count);
  const GradRow& r = rows[pc.row];
  bool bad = false;
  dispatch_float(r.dtype, [&](auto tt) {
    using T = typename decltype(tt)::type;
    using C = acc_t<T>;
    const C c = static_cast<C>(inv);
    T* x = static_cast<T*>(r.data) + pc.first;
    for (int64_t i = threadIdx.x; i < pc.n; i += blockDim.x) {
      const C v = convert<C>(x[i]);
      bad |= !isfinite(v);
      x[i] = convert<T>(v * c);
    }
  });
  if (__syncthreads_or(bad) && threadIdx.x == 0) *found_inf = 1.0f;
}

__global__ void update_loss_scale_kernel(float* scale, int64_t* growth_tracker, const float* found_inf,
                                         double growth_factor, double backoff_factor, int64_t growth_interval) {
  om::update_loss_scale(*scale, *growth_tracker, *found_inf != 0.0f, growth_factor, backoff_factor, growth_interval);
}

Stream stream_of(const Tensor& t) {
  const Stream s = current_stream(t.device());
  check(cudaSetDevice(s.device.index), "set device");
  return s;
}

// What every step entry starts with: the device table of its segments, uploaded on the step's
// stream, and the launch that advances the step counts.
struct StepLaunch {
  Stream device_stream;
  cudaStream_t stream;
  Table<StepRow> table;
  unsigned blocks() const { return static_cast<unsigned>(table.chunks); }
  // LAMB / LARS: 2 partial sums per chunk, then 2 norms per row (freed after the launches,
  // stream-ordered like every block of the caching allocator).
  Tensor norm_scratch() const {
    return empty({2 * table.chunks + 2 * static_cast<int64_t>(table.count)},
                 TensorOptions(DType::F64, device_stream.device));
  }
};

// A captured step's rows read their options from device memory that a kernel launched before
// each replay fills from the optimizer's groups as they are then (schedules change lr, momentum,
// betas between steps). One entry per group; the groups must outlive the graph and keep their
// number while it lives.
Tensor live_options(const MultiTensorStep& st, std::vector<int32_t>& index, CudaGraph& graph, Stream stream) {
  std::vector<const optim::GroupOptions*> groups;
  for (const Segment& s : st.segments) {
    auto it = std::find(groups.begin(), groups.end(), s.options);
    index.push_back(static_cast<int32_t>(it - groups.begin()));
    if (it == groups.end()) groups.push_back(s.options);
  }
  const int64_t nbytes = static_cast<int64_t>(groups.size() * sizeof(DeviceOptions));
  Tensor live;
  {
    // Written before each replay, outside the graph: not memory a captured temporary had.
    const OutsideGraphPool outside(stream.device);
    live = empty({nbytes}, TensorOptions(DType::U8, stream.device));
  }
  graph.keep_alive(live);
  auto* dst = static_cast<DeviceOptions*>(live.raw_data());
  graph.before_replay([groups, dst, device = stream.device] {
    const auto replay_stream = static_cast<cudaStream_t>(current_stream(device).handle);
    for (size_t g = 0; g < groups.size(); ++g) {
      write_options_kernel<<<1, 1, 0, replay_stream>>>(dst + g, device_options(*groups[g]));
      check_launch("optimizer step (cuda graph): options");
    }
  });
  return live;
}

StepLaunch begin_step(const MultiTensorStep& st, const char* name) {
  StepLaunch l;
  l.device_stream = step_stream(st, name);
  l.stream = static_cast<cudaStream_t>(l.device_stream.handle);
  std::vector<int32_t> live_index;
  Tensor live;
  if (CudaGraph* graph = capturing_graph()) live = live_options(st, live_index, *graph, l.device_stream);
  l.table = step_table(st, live_index, l.device_stream, name);
  // The table is this step's own device memory: the advance kernel may write its rows' options.
  advance_steps_kernel<<<grid_for(l.table.count, kThreads), kThreads, 0, l.stream>>>(
      const_cast<StepRow*>(l.table.rows), l.table.count, st.found_inf,
      live.defined() ? static_cast<const DeviceOptions*>(live.raw_data()) : nullptr);
  check_launch(name);
  return l;
}

}  // namespace

// --- entries ----------------------------------------------------------------------------------------

void sgd_step(const MultiTensorStep& st) {
  if (st.segments.empty()) return;
  const StepLaunch l = begin_step(st, "sgd_step");
  if (l.table.chunks == 0) return;  // only empty parameters: their counts advanced, nothing else to do
  momentum_kernel<<<l.blocks(), kThreads, 0, l.stream>>>(l.table.rows, l.table.count, st.found_inf, nullptr);
  check_launch("sgd_step");
}

void adam_step(const MultiTensorStep& st, bool decoupled_weight_decay) {
  if (st.segments.empty()) return;
  const StepLaunch l = begin_step(st, "adam_step");
  if (l.table.chunks == 0) return;
  if (decoupled_weight_decay)
    adam_kernel<true><<<l.blocks(), kThreads, 0, l.stream>>>(l.table.rows, l.table.count, st.found_inf);
  else
    adam_kernel<false><<<l.blocks(), kThreads, 0, l.stream>>>(l.table.rows, l.table.count, st.found_inf);
  check_launch("adam_step");
}

void lamb_step(const MultiTensorStep& st) {
  if (st.segments.empty()) return;
  const StepLaunch l = begin_step(st, "lamb_step");
  if (l.table.chunks == 0) return;
  const Tensor scratch = l.norm_scratch();
  double* partials = scratch.data<double>();
  double* norms = partials + 2 * l.table.chunks;
  lamb_moments_kernel<<<l.blocks(), kThreads, 0, l.stream>>>(l.table.rows, l.table.count, st.found_inf, partials);
  check_launch("lamb_step");
  row_norms_kernel<<<l.table.count, kThreads, 0, l.stream>>>(l.table.rows, st.found_inf, partials, norms);
  check_launch("lamb_step");
  lamb_apply_kernel<<<l.blocks(), kThreads, 0, l.stream>>>(l.table.rows, l.table.count, st.found_inf, norms);
  check_launch("lamb_step");
}

void lars_step(const MultiTensorStep& st) {
  if (st.segments.empty()) return;
  const StepLaunch l = begin_step(st, "lars_step");
  if (l.table.chunks == 0) return;
  const Tensor scratch = l.norm_scratch();
  double* partials = scratch.data<double>();
  double* norms = partials + 2 * l.table.chunks;
  lars_norms_kernel<<<l.blocks(), kThreads, 0, l.stream>>>(l.table.rows, l.table.count, st.found_inf, partials);
  check_launch("lars_step");
  row_norms_kernel<<<l.table.count, kThreads, 0, l.stream>>>(l.table.rows, st.found_inf, partials, norms);
  check_launch("lars_step");
  momentum_kernel<<<l.blocks(), kThreads, 0, l.stream>>>(l.table.rows, l.table.count, st.found_inf, norms);
  check_launch("lars_step");
}

void clip_grad_norm(std::span<const Tensor> grads, double max_norm, const Tensor& total_norm) {
  FT_CHECK(total_norm.numel() == 1 && (total_norm.dtype() == DType::F32 || total_norm.dtype() == DType::F64),
           "clip_grad_norm: expected a one-element f32 or f64 norm tensor");
  const bool f64 = total_norm.dtype() == DType::F64;
  const Stream s = stream_of(total_norm);
  const auto stream = static_cast<cudaStream_t>(s.handle);
  const Table<GradRow> t = grad_table(grads, s, "clip_grad_norm");
  Tensor partials;
  if (t.chunks > 0) {
    partials = empty({t.chunks}, TensorOptions(DType::F64, s.device));
    sum_squares_kernel<<<static_cast<unsigned>(t.chunks), kThreads, 0, stream>>>(t.rows, t.count,
                                                                                 partials.data<double>());
    check_launch("clip_grad_norm");
  }
  // Also with no gradients: the norm is then 0, as on the CPU.
  total_norm_kernel<<<1, kThreads, 0, stream>>>(t.chunks > 0 ? partials.data<double>() : nullptr, t.chunks,
                                                total_norm.raw_data(), f64);
  check_launch("clip_grad_norm");
  if (t.chunks == 0) return;
  clip_scale_kernel<<<static_cast<unsigned>(t.chunks), kThreads, 0, stream>>>(t.rows, t.count, total_norm.raw_data(),
                                                                              f64, max_norm);
  check_launch("clip_grad_norm");
}

void clip_grad_value(std::span<const Tensor> grads, double clip_value) {
  if (grads.empty()) return;
  const Stream s = stream_of(grads.front());
  const Table<GradRow> t = grad_table(grads, s, "clip_grad_value");
  if (t.chunks == 0) return;
  clamp_kernel<<<static_cast<unsigned>(t.chunks), kThreads, 0, static_cast<cudaStream_t>(s.handle)>>>(t.rows, t.count,
                                                                                                      clip_value);
  check_launch("clip_grad_value");
}

void unscale_grads(std::span<const Tensor> grads, const Tensor& scale, const Tensor& found_inf) {
  const float* scale_ptr = scale.data<float>();
  float* flag = found_inf.data<float>();
  const Stream s = stream_of(found_inf);
  const auto stream = static_cast<cudaStream_t>(s.handle);
  // The flag is overwritten, as on the CPU: cleared here, set by the kernel (0.0f is all zero bits).
  check(cudaMemsetAsync(flag, 0, sizeof(float), stream), "unscale_grads");
  const Table<GradRow> t = grad_table(grads, s, "unscale_grads");
  if (t.chunks == 0) return;
  unscale_kernel<<<static_cast<unsigned>(t.chunks), kThreads, 0, stream>>>(t.rows, t.count, scale_ptr, flag);
  check_launch("unscale_grads");
}

void update_loss_scale(const Tensor& scale, const Tensor& growth_tracker, const Tensor& found_inf, double growth_factor,
                       double backoff_factor, int64_t growth_interval) {
  float* scale_ptr = scale.data<float>();
  int64_t* tracker = growth_tracker.data<int64_t>();
  const float* flag = found_inf.data<float>();
  const Stream s = stream_of(scale);
  update_loss_scale_kernel<<<1, 1, 0, static_cast<cudaStream_t>(s.handle)>>>(scale_ptr, tracker, flag, growth_factor,
                                                                             backoff_factor, growth_interval);
  check_launch("update_loss_scale");
}

}  // namespace ft::cuda
