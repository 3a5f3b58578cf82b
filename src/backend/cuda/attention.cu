// Fused scaled dot-product attention on CUDA (FlashAttention forward, FlashAttention-2 style
// backward), the kernel-table entries attention_forward and attention_backward. Semantics are the
// CPU backend's (backend/cpu/attention.h): q [B, H, Tq, D], k and v [B, Hkv, Tk, D] with any
// strides (grouped-query attention: query head h reads KV head h / (H / Hkv)), causal masking aligned top-left (key j
// visible to query i iff j <= i), dropout on the normalised probabilities with the same Philox element rule, lse in the
// compute type.
//
// Forward, one thread block per (b, h, tile of BQ queries), K/V streamed in tiles of BK rows
// through shared memory; per query row a running max m and running sum l (online softmax):
//   S  = scale * Q K_tile^T                       (BQ x BK, registers)
//   m' = max(m, rowmax S);  P = exp(S - m');  l = l * exp(m - m') + rowsum P
//   O  = O * exp(m - m') + dropout(P) V_tile      (P goes through shared memory)
// and at the end O /= l, lse = m + log l. The T x T score matrix never exists in device memory.
//
// Backward recomputes P = exp(scale * Q K^T - lse) tile by tile. With Z = P * M (M the dropout
// multipliers, 1 without dropout), dZ = dO V^T and Di = rowsum(dO * O) (= rowsum(dZ * Z)):
//   dS = P * (dZ * M - Di),  dV = Z^T dO,  dK = scale * dS^T Q,  dQ = scale * dS K.
// Three launches, no atomics, so the results are deterministic:
//   1. Di, one warp per query row;
//   2. dK and dV, one block per (b, KV head, key tile) looping over the query heads of its group
//      and, per head, the query tiles that see it;
//   3. dQ, one block per (b, h, query tile) looping over the key tiles it sees.
// (3) recomputes S and dZ that (2) also computed: two extra tile products, the price of not
// accumulating dQ with float atomics.
//
// Two implementations, one file each, with what they share in attention.cuh:
// - attention_mma.cu: bf16 and f16 inputs on tensor cores (mma.sync m16n8k16, f32 accumulators,
//   cp.async double buffering); FT_CUDA_ATTENTION_FMA=1 sends bf16 and f16 to the FMA kernels
//   instead, a switch for comparing the two paths;
// - attention_fma.cu: f32 and f64 inputs in plain f32 FMA (f64 for f64) from shared-memory
//   tiles.
// This file is the dispatcher: it checks the operands, handles the empty cases (no queries, no
// keys, D == 0), builds the argument block, runs the backward's stage 1 (Di, the same for both),
// and picks the implementation and the compiled head dim. bf16/f16 calls are offered first to
// cuDNN's fused attention (attention_cudnn.cpp), which takes them under FT_CUDA_ATTENTION=cudnn or
// auto when the problem is one it supports.
//
// Document mask (AttentionParams::doc_starts/doc_ends): attention_document_bounds computes the
// bounds from the ids here (one thread per token, two binary searches in its row); the kernels
// skip whole tiles by them (attention.cuh).
//
// Head dims up to 128 run on the kernel for the next of 32, 64, 128, with the columns past D
// zero-filled in shared memory (they add zeros to every dot product and are never stored).
//
// Memory traffic per (b, h): the forward reads Q once and K, V once per query tile (half of that
// under causal masking; the repeats mostly hit L2) and writes O, lse (and O in f32 when the
// backward needs it). The backward reads dO and O once for Di, K and V once plus Q and dO once
// per key tile in (2), Q and dO once plus K and V once per query tile in (3), and writes dQ, dK,
// dV once: O(T * D) memory, O(T^2 * D / tile) traffic.
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <type_traits>

#include "backend/cuda/attention.cuh"
#include "backend/cuda/attention_cudnn.h"
#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"
#include "core/switches.h"

namespace ft::cuda::attention {

namespace {

// Di = sum_d dO[i][d] * O[i][d], one warp per query row (O contiguous, q's dtype or f32).
template <class T, class OT>
__global__ void attention_delta_kernel(const Args<T> a, const OT* out, acc_t<T>* delta, int64_t rows) {
  using A = acc_t<T>;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= rows) return;  // uniform per warp, so the shuffles below have all 32 lanes
  const int lane_id = threadIdx.x % 32;
  const int bh = static_cast<int>(row / a.Tq), i = static_cast<int>(row % a.Tq);
  const T* g = a.dout.head(bh / a.H, bh % a.H) + static_cast<int64_t>(i) * a.dout.st;
  const OT* o = out + row * a.dact;
  A s = A(0);
  for (int d = lane_id; d < a.dact; d += 32) s += convert<A>(g[d * a.dout.sd]) * convert<A>(o[d]);
#pragma unroll
  for (int off = 16; off > 0; off /= 2) s += __shfl_xor_sync(0xffffffffu, s, off);
  if (lane_id == 0) delta[row] = s;
}

template <class T, class V>
__global__ void attention_fill_kernel(T* p, int64_t n, V value) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    p[i] = convert<T>(value);
}

template <class T, class V>
void fill(const Tensor& t, V value, cudaStream_t stream, const char* name) {
  const int64_t n = t.numel();
  if (n == 0) return;
  attention_fill_kernel<<<grid_for(n), 256, 0, stream>>>(reinterpret_cast<T*>(t.raw_data()), n, value);
  check_launch(name);
}

// Runs f with the compiled head dim (32, 64 or 128) that holds D.
template <class F>
void with_head_dim(int64_t D, const char* name, F&& f) {
  if (D <= 32) {
    f(std::integral_constant<int, 32>{});
  } else if (D <= 64) {
    f(std::integral_constant<int, 64>{});
  } else if (D <= 128) {
    f(std::integral_constant<int, 128>{});
  } else {
    FT_FAIL(name, ": head dim ", D, " is not supported on CUDA (at most 128)");
  }
}

constexpr int64_t kMaxInt = INT32_MAX;

// FT_CUDA_ATTENTION_FMA=1 (core/switches.h) sends bf16 and f16 to the FMA kernels instead of the
// tensor-core ones: a switch for comparing the two paths.
bool use_fma_for_16bit() { return switches::cuda_attention_fma.get(); }

template <class T>
DType compute_dtype() {
  return std::is_same_v<acc_t<T>, double> ? DType::F64 : DType::F32;
}

template <class T>
Args<T> common_args(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p, const char* name) {
  const int64_t B = q.size(0), H = q.size(1), Tq = q.size(2), Tk = k.size(2), D = q.size(3);
  FT_CHECK(B * H <= kMaxInt && Tq <= kMaxInt && Tk <= kMaxInt, name, ": sizes B*H = ", B * H, ", Tq = ", Tq,
           ", Tk = ", Tk, " exceed the CUDA kernel's 32-bit indices");
  Args<T> a{};
  a.q = strided<T>(q);
  a.k = strided<T>(k);
  a.v = strided<T>(v);
  a.H = static_cast<int>(H);
  a.BH = static_cast<int>(B * H);
  a.Hkv = static_cast<int>(k.size(1));
  a.BHkv = static_cast<int>(B * k.size(1));
  a.group = static_cast<int>(H / k.size(1));
  a.Tq = static_cast<int>(Tq);
  a.Tk = static_cast<int>(Tk);
  a.dact = static_cast<int>(D);
  using A = acc_t<T>;
  a.scale = static_cast<A>(p.scale);
  a.causal = p.causal;
  a.dropout = p.dropout_p > 0;
  // The CPU's exact constants: keep iff uniform < (float)(1 - p); kept values times 1/(1 - p)
  // rounded to the compute type.
  a.keep = static_cast<float>(1.0 - p.dropout_p);
  a.inv_keep = static_cast<A>(1.0 / (1.0 - p.dropout_p));
  a.seed = p.philox.key;
  a.base = p.philox.base;
  a.device_base = p.philox.device_base;
  if (p.doc_starts.defined()) {
    FT_CHECK(Tq == Tk && p.doc_starts.is_contiguous() && p.doc_ends.is_contiguous() &&
                 p.doc_starts.dtype() == DType::I32 && p.doc_ends.dtype() == DType::I32,
             name, ": the document bounds must be dense i32 [B, T] and Tq == Tk");
    a.doc_start = reinterpret_cast<const int32_t*>(p.doc_starts.raw_data());
    a.doc_end = reinterpret_cast<const int32_t*>(p.doc_ends.raw_data());
  }
  return a;
}

// starts[b, i] and ends[b, i] of token i's document (the run of equal ids holding i) by binary
// search in its row, which is sorted when the ids are valid; steps[b, i] = ids[b, i] - ids[b, i - 1]
// (0 at i = 0), which the index check then requires to be >= 0. Bounds computed from unsorted ids
// are meaningless but still hold i in [start, end), so the attention kernels that run before the
// check's error is raised see every row's own key and produce no NaN.
__global__ void attention_document_bounds_kernel(const int32_t* __restrict__ ids, int64_t n, int T,
                                                 int32_t* __restrict__ starts, int32_t* __restrict__ ends,
                                                 int32_t* __restrict__ steps) {
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int i = static_cast<int>(idx % T);
    const int32_t* row = ids + (idx - i);
    const int32_t v = row[i];
    int lo = 0, hi = i;  // the first position in [0, i] holding v
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (row[mid] < v)
        lo = mid + 1;
      else
        hi = mid;
    }
    starts[idx] = lo;
    lo = i + 1, hi = T;  // the first position in (i, T) past v
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (row[mid] <= v)
        lo = mid + 1;
      else
        hi = mid;
    }
    ends[idx] = lo;
    steps[idx] = i > 0 ? v - row[i - 1] : 0;
  }
}

template <class T>
void forward_typed(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p, const Tensor& out,
                   const Tensor& lse, const Tensor& out_f32) {
  using A = acc_t<T>;
  constexpr const char* kName = "attention_forward";
  FT_CHECK(out.is_contiguous() && out.dtype() == q.dtype(), kName, ": out must be contiguous in q's dtype");
  FT_CHECK(lse.is_contiguous() && lse.dtype() == compute_dtype<T>(), kName, ": lse must be contiguous ",
           dtype_name(compute_dtype<T>()));
  FT_CHECK(!out_f32.defined() || (out_f32.is_contiguous() && out_f32.dtype() == DType::F32), kName,
           ": out_f32 must be contiguous f32");
  const int64_t Tq = q.size(2), Tk = k.size(2), D = q.size(3);
  const int64_t BH = q.size(0) * q.size(1);
  cudaStream_t stream = stream_for(q);
  if (Tq == 0 || BH == 0) return;
  if (Tk == 0 || D == 0) {
    // No keys: an empty weighted sum and lse = -inf. D == 0: every score is 0, lse = log(Tk).
    fill<T>(out, 0.0f, stream, kName);
    if (out_f32.defined()) fill<float>(out_f32, 0.0f, stream, kName);
    fill<A>(lse, Tk == 0 ? neg_inf<A>() : static_cast<A>(std::log(static_cast<double>(Tk))), stream, kName);
    return;
  }
  Args<T> a = common_args<T>(q, k, v, p, kName);
  a.out = reinterpret_cast<T*>(out.raw_data());
  a.out32 = out_f32.defined() ? reinterpret_cast<float*>(out_f32.raw_data()) : nullptr;
  a.lse = reinterpret_cast<A*>(lse.raw_data());
  auto engine = [&] {
    with_head_dim(D, kName, [&](auto dc) {
      constexpr int kD = decltype(dc)::value;
      if constexpr (kTcType<T>) {
        // bf16 and f16, every head dim up to 128 (padded to the compiled one), with or without
        // dropout: the tensor-core kernel (unless FT_CUDA_ATTENTION_FMA is set). Dropout is a
        // template flag: its Philox code in the unrolled score loops costs registers.
        if (!use_fma_for_16bit()) {
          a.chunks = tc_chunkable(a.q, kD, a.dact) && tc_chunkable(a.k, kD, a.dact) && tc_chunkable(a.v, kD, a.dact);
          if (a.dropout)
            tc_forward<T, kD, true>(a, BH, stream, kName);
          else
            tc_forward<T, kD, false>(a, BH, stream, kName);
          return;
        }
      }
      fma_forward<T, kD>(a, BH, stream, kName);
    });
  };
  // bf16/f16: cuDNN's fused attention instead, when FT_CUDA_ATTENTION asks for it.
  if constexpr (kTcType<T>)
    if (attention_cudnn::forward(q, k, v, p, out, lse, out_f32, engine)) return;
  engine();
}

template <class T>
void backward_typed(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                    const Tensor& dout, const AttentionParams& p, const Tensor& dq, const Tensor& dk,
                    const Tensor& dv) {
  using A = acc_t<T>;
  constexpr const char* kName = "attention_backward";
  FT_CHECK(dq.is_contiguous() && dk.is_contiguous() && dv.is_contiguous() && dq.dtype() == q.dtype() &&
               dk.dtype() == q.dtype() && dv.dtype() == q.dtype(),
           kName, ": dq, dk, dv must be contiguous in q's dtype");
  FT_CHECK(out.is_contiguous() && (out.dtype() == q.dtype() || out.dtype() == DType::F32), kName,
           ": out must be contiguous, q's dtype or f32");
  FT_CHECK(lse.is_contiguous() && lse.dtype() == compute_dtype<T>(), kName, ": lse must be contiguous ",
           dtype_name(compute_dtype<T>()));
  FT_CHECK(dout.dtype() == q.dtype() && dout.dim() == 4, kName, ": dout must be [B, H, Tq, D] in q's dtype");
  const int64_t Tq = q.size(2), Tk = k.size(2), D = q.size(3);
  const int64_t BH = q.size(0) * q.size(1);
  cudaStream_t stream = stream_for(q);
  if (Tq == 0 || Tk == 0 || D == 0 || BH == 0) {
    fill<T>(dq, 0.0f, stream, kName);
    fill<T>(dk, 0.0f, stream, kName);
    fill<T>(dv, 0.0f, stream, kName);
    return;
  }
  Args<T> a = common_args<T>(q, k, v, p, kName);
  a.dout = strided<T>(dout);
  a.lse = reinterpret_cast<A*>(lse.raw_data());
  a.dq = reinterpret_cast<T*>(dq.raw_data());
  a.dk = reinterpret_cast<T*>(dk.raw_data());
  a.dv = reinterpret_cast<T*>(dv.raw_data());

  // The engine's kernels: stage 1 (Di), then the dK/dV and dQ launches.
  auto engine = [&] {
    const int64_t rows = BH * Tq;
    Tensor delta = empty({rows}, TensorOptions(compute_dtype<T>(), q.device()));
    A* delta_p = reinterpret_cast<A*>(delta.raw_data());
    a.delta = delta_p;
    {
      constexpr int kWarps = 8;
      const int64_t blocks = (rows + kWarps - 1) / kWarps;
      FT_CHECK(blocks <= kMaxInt, kName, ": ", rows, " query rows exceed the grid limit");
      if (out.dtype() == q.dtype()) {
        attention_delta_kernel<T, T><<<static_cast<unsigned>(blocks), kWarps * 32, 0, stream>>>(
            a, reinterpret_cast<const T*>(out.raw_data()), delta_p, rows);
      } else {
        attention_delta_kernel<T, float><<<static_cast<unsigned>(blocks), kWarps * 32, 0, stream>>>(
            a, reinterpret_cast<const float*>(out.raw_data()), delta_p, rows);
      }
      check_launch(kName);
    }

    with_head_dim(D, kName, [&](auto dc) {
      constexpr int kD = decltype(dc)::value;
      if constexpr (kTcType<T>) {
        if (!use_fma_for_16bit()) {
          a.chunks = tc_chunkable(a.q, kD, a.dact) && tc_chunkable(a.k, kD, a.dact) && tc_chunkable(a.v, kD, a.dact) &&
                     tc_chunkable(a.dout, kD, a.dact);
          if (a.dropout)
            tc_backward<T, kD, true>(a, BH, stream, kName);
          else
            tc_backward<T, kD, false>(a, BH, stream, kName);
          return;
        }
      }
      fma_backward<T, kD>(a, BH, stream, kName);
    });
  };
  if constexpr (kTcType<T>)
    if (attention_cudnn::backward(q, k, v, out, lse, dout, p, dq, dk, dv, engine)) return;
  engine();
}

}  // namespace

}  // namespace ft::cuda::attention

namespace ft::cuda {

void attention_document_bounds(const Tensor& doc_ids, const Tensor& starts, const Tensor& ends,
                               const IndexErrorText& decreasing) {
  constexpr const char* kName = "attention_document_bounds";
  const int64_t n = doc_ids.numel(), T = doc_ids.size(1);
  if (n == 0) return;
  FT_CHECK(T <= INT32_MAX, kName, ": ", T, " positions exceed the kernel's 32-bit indices");
  Tensor steps = empty(doc_ids.shape(), doc_ids.options());
  cudaStream_t stream = stream_for(doc_ids);
  attention::attention_document_bounds_kernel<<<grid_for(n), 256, 0, stream>>>(
      reinterpret_cast<const int32_t*>(doc_ids.raw_data()), n, static_cast<int>(T),
      reinterpret_cast<int32_t*>(starts.raw_data()), reinterpret_cast<int32_t*>(ends.raw_data()),
      reinterpret_cast<int32_t*>(steps.raw_data()));
  check_launch(kName);
  // On the device, nothing waiting for it: a decrease is raised at the next host synchronisation.
  check_index_range(steps, std::numeric_limits<int64_t>::max(), std::nullopt, decreasing);
}

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p, const Tensor& out,
                       const Tensor& lse, const Tensor& out_f32) {
  FT_CUDA_DISPATCH_FLOATING(q.dtype(), "attention_forward",
                            [&] { attention::forward_typed<scalar_t>(q, k, v, p, out, lse, out_f32); });
}

void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                        const Tensor& dout, const AttentionParams& p, const Tensor& dq, const Tensor& dk,
                        const Tensor& dv) {
  FT_CUDA_DISPATCH_FLOATING(q.dtype(), "attention_backward",
                            [&] { attention::backward_typed<scalar_t>(q, k, v, out, lse, dout, p, dq, dk, dv); });
}

}  // namespace ft::cuda
