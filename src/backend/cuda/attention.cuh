// What the fused-attention files share: the dispatcher (attention.cu: checks, empty cases, the
// argument block, stage 1 of the backward, the choice of implementation) and its two
// implementations, attention_mma.cu (tensor-core kernels, bf16 and f16) and attention_fma.cu
// (CUDA-core FMA kernels, every floating type). Here: the argument block of one call, the dropout
// rule both apply to the score matrix, the launch helper, and the entry points of each
// implementation that the dispatcher calls (defined and instantiated in its own file).
//
// Document mask: the forward and dQ kernels start their key loop at the tile holding the first
// query row's document start (keys before it are in earlier documents for every row of the
// tile), the dK/dV kernels end their query loop at the last key's document end; inside a tile,
// each score also needs j >= its row's start. Without a mask the start is 0 and the end Tq.
//
// Dropout: score element (bh, i, j) has index idx = (bh * Tq + i) * Tk + j and is kept iff
// uniform01(word idx % 4 of Philox counter block base + idx / 4) < keep, kept values scaled by
// 1 / keep: the CPU's rule (backend/cpu/attention.cpp), so both devices drop the same elements.
#pragma once
#include <cstdint>
#include <limits>
#include <type_traits>

#include "backend/cuda/common.cuh"
#include "backend/random_math.h"

namespace ft::cuda::attention {

// Largest dynamic shared memory a block may opt into on Hopper (227 KiB).
constexpr size_t kMaxSmem = 227 * 1024;

template <class A>
__host__ __device__ __forceinline__ A neg_inf() {
  return -std::numeric_limits<A>::infinity();
}

// A [B, H, T, D] operand with arbitrary element strides.
template <class T>
struct Strided {
  const T* p;
  int64_t sb, sh, st, sd;
  __device__ __forceinline__ const T* head(int b, int h) const { return p + b * sb + h * sh; }
};

template <class T>
Strided<T> strided(const Tensor& t) {
  return {reinterpret_cast<const T*>(t.raw_data()), t.stride(0), t.stride(1), t.stride(2), t.stride(3)};
}

// Everything the kernels of one call need, passed by value.
template <class T>
struct Args {
  using A = acc_t<T>;
  Strided<T> q, k, v, dout;
  T* out;           // forward: [B, H, Tq, D] contiguous
  float* out32;     // forward: the same before rounding, or null
  A* lse;           // [B, H, Tq]: written by the forward, read by the backward
  const A* delta;   // backward: Di per query row
  T *dq, *dk, *dv;  // backward: contiguous, shaped like q, k, v
  // H query heads, Hkv key/value heads; query head h reads KV head h / group (grouped-query
  // attention, group = H / Hkv; 1 without).
  int H, BH, Hkv, BHkv, group, Tq, Tk, dact;
  A scale, inv_keep;
  float keep;
  bool causal, dropout;
  // Document mask (AttentionParams), or null: query i sees keys [doc_start[b * Tq + i], i], key j is
  // seen by queries [j, doc_end[b * Tk + j]); both never decrease along T (Tq == Tk here).
  const int32_t* doc_start;
  const int32_t* doc_end;
  bool chunks;  // tensor-core path: every operand read is 16-byte chunks (tc_chunkable)
  uint64_t seed, base;
  const uint64_t* device_base;  // in a CUDA graph's replay: added to base (PhiloxDraw)
};

// The first Philox counter block of this launch's dropout: in a CUDA graph's replay the counter
// the replay started at (device memory) is added, so it is read once per thread, not per element.
template <class T>
__device__ __forceinline__ uint64_t drop_base(const Args<T>& a) {
  return a.dropout && a.device_base != nullptr ? a.base + *a.device_base : a.base;
}

// Dropout multiplier of score element (bh, i, j): the CPU's rule, element index
// ((bh * Tq + i) * Tk + j) drawn from word idx % 4 of Philox counter block base + idx / 4.
// `base` is drop_base(a), read once per thread at the kernel's start.
template <class T>
__device__ __forceinline__ acc_t<T> dropout_mult(const Args<T>& a, uint64_t base, int bh, int i, int j) {
  const uint64_t idx = (static_cast<uint64_t>(bh) * a.Tq + i) * a.Tk + j;
  const random_math::PhiloxBlock w = random_math::philox4x32(a.seed, base + idx / 4);
  const uint32_t u = static_cast<uint32_t>(idx & 3);
  const uint32_t word = u == 0 ? w.v[0] : u == 1 ? w.v[1] : u == 2 ? w.v[2] : w.v[3];
  return random_math::uniform01(word) < a.keep ? a.inv_keep : acc_t<T>(0);
}

template <class Kernel, class T>
void launch(Kernel kernel, int64_t blocks, int threads, size_t smem, cudaStream_t stream, const Args<T>& args,
            const char* name) {
  FT_CHECK(blocks <= INT32_MAX, name, ": ", blocks, " thread blocks exceed the grid limit");
  // Above 48 KiB a kernel must opt in to its dynamic shared memory.
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)), name);
  kernel<<<static_cast<unsigned>(blocks), threads, smem, stream>>>(args);
  check_launch(name);
}

// The input types the tensor-core kernels take.
template <class T>
constexpr bool kTcType = std::is_same_v<T, bf16_t> || std::is_same_v<T, f16_t>;

// True when every row of the operand is D contiguous, 16-byte aligned elements, so tiles can
// be copied in 16-byte chunks.
template <class T>
bool tc_chunkable(const Strided<T>& s, int D, int dact) {
  constexpr int64_t E = 16 / sizeof(T);
  return dact == D && s.sd == 1 && s.st % E == 0 && s.sh % E == 0 && s.sb % E == 0 &&
         reinterpret_cast<uintptr_t>(s.p) % 16 == 0;
}

// The first visible key of query row i of batch b: its document's start under a document mask,
// else 0 (also for padded rows past Tq).
template <class T>
__device__ __forceinline__ int doc_row_start(const Args<T>& a, int b, int i) {
  return a.doc_start != nullptr && i < a.Tq ? a.doc_start[static_cast<int64_t>(b) * a.Tq + i] : 0;
}
// Where the forward and dQ kernels start walking keys for the query tile at i0: the tile of BK keys
// holding the first row's start (tiles stay aligned to multiples of BK, so a window of one document
// runs the causal path exactly).
template <int BK, class T>
__device__ __forceinline__ int doc_first_key(const Args<T>& a, int b, int i0) {
  return doc_row_start(a, b, i0) / BK * BK;
}
// One past the last query that sees any of the keys [j0, j0 + BK): the end of the last key's
// document under a document mask, else Tq.
template <int BK, class T>
__device__ __forceinline__ int doc_query_end(const Args<T>& a, int b, int j0) {
  return a.doc_end != nullptr ? a.doc_end[static_cast<int64_t>(b) * a.Tk + min(j0 + BK, a.Tk) - 1] : a.Tq;
}

// Query head h of a (b, h) pair reads KV head h / a.group; the dK/dV kernels run one block per
// (b, KV head, key tile) and sum its group's query heads in order (no atomics: deterministic).

// Entry points of the tensor-core kernels (attention_mma.cu), T bf16 or f16, D the compiled head
// dim (32, 64, 128): the launches of one call, with a.chunks set by the caller (tc_chunkable).
template <class T, int D, bool DROPOUT>
void tc_forward(const Args<T>& a, int64_t BH, cudaStream_t stream, const char* name);
template <class T, int D, bool DROPOUT>
void tc_backward(const Args<T>& a, int64_t BH, cudaStream_t stream, const char* name);

// Entry points of the FMA kernels (attention_fma.cu), every floating type, D as above. The
// backward's stage 1 (Di in a.delta) has run.
template <class T, int D>
void fma_forward(const Args<T>& a, int64_t BH, cudaStream_t stream, const char* name);
template <class T, int D>
void fma_backward(const Args<T>& a, int64_t BH, cudaStream_t stream, const char* name);

}  // namespace ft::cuda::attention
