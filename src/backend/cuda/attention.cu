// Fused scaled dot-product attention on CUDA (FlashAttention forward, FlashAttention-2 style
// backward), the kernel-table entries attention_forward and attention_backward. Semantics are the
// CPU backend's (backend/cpu/attention.h): q [B, H, Tq, D], k and v [B, H, Tk, D] with any
// strides, causal masking aligned top-left (key j visible to query i iff j <= i), dropout on the
// normalised probabilities with the same Philox element rule, lse in the compute type.
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
//   2. dK and dV, one block per (b, h, key tile) looping over the query tiles that see it;
//   3. dQ, one block per (b, h, query tile) looping over the key tiles it sees.
// (3) recomputes S and dZ that (2) also computed: two extra tile products, the price of not
// accumulating dQ with float atomics.
//
// bf16 and f16 inputs run the same math on tensor cores (section "Tensor-core path" below):
// mma.sync m16n8k16 with f32 accumulators for all five tile products (S = Q K^T, O += P V in the
// forward; S^T = K Q^T, dZ^T = V dO^T, dV += Z^T dO, dK += dS^T Q in the dK/dV kernel; S = Q K^T,
// dZ = dO V^T, dQ += dS K in the dQ kernel), 4 warps per block, each warp 16 rows of a 64-row
// tile, the other operand streamed through double-buffered shared memory by cp.async. Softmax,
// lse, Di and dropout stay in f32 as above; only P and dS are rounded to the input type to enter
// their products. FT_CUDA_ATTENTION_FMA=1 sends bf16 and f16 to the FMA kernels instead.
//
// The FMA kernels (f32 and f64 inputs) compute in plain f32 FMA (f64 for f64) from shared-memory
// tiles, every operand widened to the compute type on load; each thread owns a register tile of
// rows ty + r*TY and columns tx + c*16, so a row's 16 owners are half a warp and row reductions
// are 4 shuffles.
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
#include <type_traits>

#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"
#include "backend/random_math.h"
#include "core/switches.h"

namespace ft::cuda {

namespace {

// Columns of a register tile are spread over 16 consecutive lanes (half a warp).
constexpr int kTX = 16;
// Largest dynamic shared memory a block may opt into on Hopper (227 KiB).
constexpr size_t kMaxSmem = 227 * 1024;

// 16-byte shared-memory vectors: LDS.128 along the reduction dimension of a tile product.
template <class A>
struct Vec16;
template <>
struct Vec16<float> {
  using type = float4;
};
template <>
struct Vec16<double> {
  using type = double2;
};
template <class A>
constexpr int kVW = 16 / static_cast<int>(sizeof(A));

// u is a compile-time constant after unrolling, so these select a register, never index memory.
__device__ __forceinline__ float lane(const float4& v, int u) {
  return u == 0 ? v.x : u == 1 ? v.y : u == 2 ? v.z : v.w;
}
__device__ __forceinline__ double lane(const double2& v, int u) { return u == 0 ? v.x : v.y; }

// Full-precision exp and log (not the __expf intrinsics): the result is compared with the CPU
// backend's at 1e-5, and each exp is amortised over 2*D FMAs.
__device__ __forceinline__ float exp_acc(float x) { return expf(x); }
__device__ __forceinline__ double exp_acc(double x) { return exp(x); }
__device__ __forceinline__ float log_acc(float x) { return logf(x); }
__device__ __forceinline__ double log_acc(double x) { return log(x); }

template <class A>
__host__ __device__ __forceinline__ A neg_inf() {
  return -std::numeric_limits<A>::infinity();
}

// Reductions over the 16 lanes that own one row (xor offsets below 16 stay in the half warp).
template <class A>
__device__ __forceinline__ A row_max(A v) {
#pragma unroll
  for (int off = kTX / 2; off > 0; off /= 2) v = fmax(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}
template <class A>
__device__ __forceinline__ A row_sum(A v) {
#pragma unroll
  for (int off = kTX / 2; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
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
  int H, BH, Tq, Tk, dact;
  A scale, inv_keep;
  float keep;
  bool causal, dropout;
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

// Rows [row0, row0 + ROWS) of one head into a shared tile [ROWS][ld], widened to the compute
// type. Rows at or past n and columns at or past dact are zero: padded keys must not put NaN
// into 0 * V, and padded columns must add nothing to dot products.
template <int ROWS, int D, int NT, class T, class A>
__device__ __forceinline__ void load_rows(A* dst, int ld, const T* src, int64_t st, int64_t sd, int row0, int n,
                                          int dact) {
  for (int idx = threadIdx.x; idx < ROWS * D; idx += NT) {
    const int r = idx / D, d = idx % D;
    const int t = row0 + r;
    A val = A(0);
    if (t < n && d < dact) val = convert<A>(src[static_cast<int64_t>(t) * st + static_cast<int64_t>(d) * sd]);
    dst[r * ld + d] = val;
  }
}

// acc[r][c] += sum_k X[ty + r*TY][k] * Y[tx + c*16][k] (both tiles row-major, row stride LD).
// X reads are half-warp broadcasts; Y's 16 rows sit 4 banks apart (LD = K + 16 bytes), so each
// quarter warp's 16-byte loads cover all 32 banks once.
template <int R, int C, int K, int LD, int TY, class A>
__device__ __forceinline__ void tile_nt(const A* X, const A* Y, int ty, int tx, A (&acc)[R][C]) {
  using V = typename Vec16<A>::type;
  constexpr int VW = kVW<A>;
#pragma unroll 2
  for (int kk = 0; kk < K; kk += VW) {
    V x[R], y[C];
#pragma unroll
    for (int r = 0; r < R; ++r) x[r] = *reinterpret_cast<const V*>(X + (ty + r * TY) * LD + kk);
#pragma unroll
    for (int c = 0; c < C; ++c) y[c] = *reinterpret_cast<const V*>(Y + (tx + c * kTX) * LD + kk);
#pragma unroll
    for (int u = 0; u < VW; ++u)
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int c = 0; c < C; ++c) acc[r][c] += lane(x[r], u) * lane(y[c], u);
  }
}

// acc[r][c] += sum_k X[ty + r*TY][k] * Y[k][tx + c*16] (X row stride LDX, Y row stride LDY).
// Y reads are 16 consecutive words per half warp, broadcast to the other half.
template <int R, int C, int K, int LDX, int LDY, int TY, class A>
__device__ __forceinline__ void tile_nn(const A* X, const A* Y, int ty, int tx, A (&acc)[R][C]) {
  using V = typename Vec16<A>::type;
  constexpr int VW = kVW<A>;
#pragma unroll 2
  for (int kk = 0; kk < K; kk += VW) {
    V x[R];
#pragma unroll
    for (int r = 0; r < R; ++r) x[r] = *reinterpret_cast<const V*>(X + (ty + r * TY) * LDX + kk);
#pragma unroll
    for (int u = 0; u < VW; ++u) {
      A y[C];
#pragma unroll
      for (int c = 0; c < C; ++c) y[c] = Y[(kk + u) * LDY + tx + c * kTX];
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int c = 0; c < C; ++c) acc[r][c] += lane(x[r], u) * y[c];
    }
  }
}

// Tile shapes per compute type and head dim: the score tile's rows x columns and TY thread rows
// of 16 lanes. The f32 shapes were picked among nearby ones by timing the kernels on an H200 at
// T = 1024 with D = 64 and 128. f64 (a checking path) uses 32 x 32 tiles so that its shared
// memory stays under the opt-in limit.
template <class A, int D>
struct Tiles {
  static constexpr bool wide = D >= 128;
  static constexpr int fwd_bq = 64, fwd_bk = 32, fwd_ty = 8;
  static constexpr int kv_bk = 64, kv_bq = wide ? 32 : 64, kv_ty = wide ? 16 : 8;
  static constexpr int q_bq = 64, q_bk = wide ? 32 : 64, q_ty = 8;
};
template <int D>
struct Tiles<double, D> {
  static constexpr int fwd_bq = 32, fwd_bk = 32, fwd_ty = 8;
  static constexpr int kv_bk = 32, kv_bq = 32, kv_ty = 8;
  static constexpr int q_bq = 32, q_bk = 32, q_ty = 8;
};

// The kernels declare __launch_bounds__(threads, 1): given the thread count alone, ptxas aimed
// some of them at 128 registers and spilled; this way every accumulator stays in registers.
template <class A, int D, int ROWS, int COLS, int TY>
constexpr void check_tile_shape() {
  static_assert(TY * kTX % 32 == 0, "a block is whole warps");
  static_assert(ROWS % TY == 0 && COLS % kTX == 0 && D % kTX == 0, "tiles split evenly over the threads");
  static_assert(COLS % kVW<A> == 0 && D % kVW<A> == 0, "tile products read 16-byte vectors");
}

// ---------------------------------------------------------------------------------------------
// Forward

template <class A, int D, int BQ, int BK>
constexpr size_t forward_smem() {
  constexpr int LDD = D + kVW<A>, LDP = BK + kVW<A>;
  return (static_cast<size_t>(BQ + 2 * BK) * LDD + static_cast<size_t>(BQ) * LDP) * sizeof(A);
}

template <class T, int D, int BQ, int BK, int TY>
__global__ void __launch_bounds__(TY* kTX, 1) attention_forward_kernel(const Args<T> a) {
  const uint64_t base = drop_base(a);
  using A = acc_t<T>;
  constexpr int NT = TY * kTX, VW = kVW<A>, LDD = D + VW, LDP = BK + VW;
  constexpr int RQ = BQ / TY, CK = BK / kTX, CD = D / kTX;
  check_tile_shape<A, D, BQ, BK, TY>();
  extern __shared__ __align__(16) unsigned char smem_raw[];
  A* sQ = reinterpret_cast<A*>(smem_raw);
  A* sK = sQ + BQ * LDD;
  A* sV = sK + BK * LDD;
  A* sP = sV + BK * LDD;

  const int tx = threadIdx.x % kTX, ty = threadIdx.x / kTX;
  const int nqt = (a.Tq + BQ - 1) / BQ;
  const int bh = blockIdx.x % a.BH;
  // The last query tiles see the most keys under causal masking: they get the lowest block
  // indices, so they start first and the short tiles fill the tail.
  const int qt = nqt - 1 - static_cast<int>(blockIdx.x / a.BH);
  const int b = bh / a.H, h = bh % a.H;
  const int i0 = qt * BQ;

  load_rows<BQ, D, NT>(sQ, LDD, a.q.head(b, h), a.q.st, a.q.sd, i0, a.Tq, a.dact);

  A m[RQ], l[RQ], o[RQ][CD];
#pragma unroll
  for (int r = 0; r < RQ; ++r) {
    m[r] = neg_inf<A>();
    l[r] = A(0);
#pragma unroll
    for (int e = 0; e < CD; ++e) o[r][e] = A(0);
  }

  // Keys from i0 + BQ on are above the diagonal for every query of the tile.
  const int kend = a.causal ? min(a.Tk, i0 + BQ) : a.Tk;
  for (int k0 = 0; k0 < kend; k0 += BK) {
    // Every thread has finished reading the previous sK, sV and sP (and sQ is complete on the
    // first pass).
    __syncthreads();
    load_rows<BK, D, NT>(sK, LDD, a.k.head(b, h), a.k.st, a.k.sd, k0, a.Tk, a.dact);
    load_rows<BK, D, NT>(sV, LDD, a.v.head(b, h), a.v.st, a.v.sd, k0, a.Tk, a.dact);
    __syncthreads();

    A s[RQ][CK];
#pragma unroll
    for (int r = 0; r < RQ; ++r)
#pragma unroll
      for (int c = 0; c < CK; ++c) s[r][c] = A(0);
    tile_nt<RQ, CK, D, LDD, TY>(sQ, sK, ty, tx, s);

#pragma unroll
    for (int r = 0; r < RQ; ++r) {
      const int ir = ty + r * TY, i = i0 + ir;
      A mx = neg_inf<A>();
#pragma unroll
      for (int c = 0; c < CK; ++c) {
        const int j = k0 + tx + c * kTX;
        const bool visible = j < a.Tk && !(a.causal && j > i);
        s[r][c] = visible ? s[r][c] * a.scale : neg_inf<A>();
        mx = fmax(mx, s[r][c]);
      }
      mx = row_max(mx);
      const A m_new = fmax(m[r], mx);
      // A row with no visible key yet keeps m = -inf; shifting by 0 then gives exp(-inf) = 0
      // everywhere instead of exp(-inf - -inf) = NaN. (Key 0 is in the first tile and visible to
      // every row, so this only guards padded rows and future changes.)
      const A shift = m_new == neg_inf<A>() ? A(0) : m_new;
      const A alpha = exp_acc(m[r] - shift);
      A sum = A(0);
#pragma unroll
      for (int c = 0; c < CK; ++c) {
        A p = exp_acc(s[r][c] - shift);
        sum += p;  // the normaliser uses the undropped probabilities (PyTorch's semantics)
        if (a.dropout && p != A(0) && i < a.Tq) p *= dropout_mult(a, base, bh, i, k0 + tx + c * kTX);
        sP[ir * LDP + tx + c * kTX] = p;
      }
      sum = row_sum(sum);
      l[r] = l[r] * alpha + sum;
      m[r] = m_new;
#pragma unroll
      for (int e = 0; e < CD; ++e) o[r][e] *= alpha;
    }
    // sP is complete before any thread multiplies it into V.
    __syncthreads();
    tile_nn<RQ, CD, BK, LDP, LDD, TY>(sP, sV, ty, tx, o);
  }

#pragma unroll
  for (int r = 0; r < RQ; ++r) {
    const int i = i0 + ty + r * TY;
    if (i >= a.Tq) continue;
    const A inv = l[r] > A(0) ? A(1) / l[r] : A(0);
    const int64_t row = static_cast<int64_t>(bh) * a.Tq + i;
#pragma unroll
    for (int e = 0; e < CD; ++e) {
      const int d = tx + e * kTX;
      if (d >= a.dact) continue;
      const A val = o[r][e] * inv;
      a.out[row * a.dact + d] = convert<T>(val);
      if (a.out32) a.out32[row * a.dact + d] = static_cast<float>(val);
    }
    if (tx == 0) a.lse[row] = l[r] > A(0) ? m[r] + log_acc(l[r]) : neg_inf<A>();
  }
}

// ---------------------------------------------------------------------------------------------
// Backward

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

template <class A, int D, int BK, int BQ>
constexpr size_t backward_kv_smem() {
  constexpr int LDD = D + kVW<A>, LDS = BQ + kVW<A>;
  return (static_cast<size_t>(2 * BK + 2 * BQ) * LDD + static_cast<size_t>(2 * BK) * LDS + 2 * BQ) * sizeof(A);
}

// dK and dV of one (b, h, tile of BK keys): thread rows are keys, columns queries, so the score
// tile is computed transposed (S^T = K Q^T) and dV, dK accumulate in registers over all query
// tiles.
template <class T, int D, int BK, int BQ, int TY>
__global__ void __launch_bounds__(TY* kTX, 1) attention_backward_kv_kernel(const Args<T> a) {
  const uint64_t base = drop_base(a);
  using A = acc_t<T>;
  constexpr int NT = TY * kTX, VW = kVW<A>, LDD = D + VW, LDS = BQ + VW;
  constexpr int RK = BK / TY, CQ = BQ / kTX, CD = D / kTX;
  check_tile_shape<A, D, BK, BQ, TY>();
  extern __shared__ __align__(16) unsigned char smem_raw[];
  A* sK = reinterpret_cast<A*>(smem_raw);
  A* sV = sK + BK * LDD;
  A* sQ = sV + BK * LDD;
  A* sdO = sQ + BQ * LDD;
  A* sZ = sdO + BQ * LDD;  // [BK][LDS]: Z^T = (P * M)^T
  A* sdS = sZ + BK * LDS;  // [BK][LDS]: dS^T
  A* sL = sdS + BK * LDS;  // [BQ]: lse of the tile's queries
  A* sDi = sL + BQ;        // [BQ]: Di of the tile's queries

  const int tx = threadIdx.x % kTX, ty = threadIdx.x / kTX;
  const int bh = blockIdx.x % a.BH;
  // Under causal masking the first key tiles are seen by the most queries: lowest indices first.
  const int kt = static_cast<int>(blockIdx.x / a.BH);
  const int b = bh / a.H, h = bh % a.H;
  const int j0 = kt * BK;
  const int64_t row0 = static_cast<int64_t>(bh) * a.Tq;

  load_rows<BK, D, NT>(sK, LDD, a.k.head(b, h), a.k.st, a.k.sd, j0, a.Tk, a.dact);
  load_rows<BK, D, NT>(sV, LDD, a.v.head(b, h), a.v.st, a.v.sd, j0, a.Tk, a.dact);

  A dk[RK][CD], dv[RK][CD];
#pragma unroll
  for (int r = 0; r < RK; ++r)
#pragma unroll
    for (int e = 0; e < CD; ++e) dk[r][e] = dv[r][e] = A(0);

  // Queries before j0 see none of these keys: start at the query tile holding row j0.
  const int qstart = a.causal ? (j0 / BQ) * BQ : 0;
  for (int i0 = qstart; i0 < a.Tq; i0 += BQ) {
    // The previous pass's reads of sQ, sdO, sZ, sdS, sL, sDi are done before they are replaced.
    __syncthreads();
    load_rows<BQ, D, NT>(sQ, LDD, a.q.head(b, h), a.q.st, a.q.sd, i0, a.Tq, a.dact);
    load_rows<BQ, D, NT>(sdO, LDD, a.dout.head(b, h), a.dout.st, a.dout.sd, i0, a.Tq, a.dact);
    for (int t = threadIdx.x; t < BQ; t += NT) {
      const bool in = i0 + t < a.Tq;
      sL[t] = in ? a.lse[row0 + i0 + t] : A(0);
      sDi[t] = in ? a.delta[row0 + i0 + t] : A(0);
    }
    // Also orders this block's sK, sV loads (before the loop) before their first reads.
    __syncthreads();

    A s[RK][CQ], dz[RK][CQ];
#pragma unroll
    for (int r = 0; r < RK; ++r)
#pragma unroll
      for (int c = 0; c < CQ; ++c) s[r][c] = dz[r][c] = A(0);
    tile_nt<RK, CQ, D, LDD, TY>(sK, sQ, ty, tx, s);    // S^T
    tile_nt<RK, CQ, D, LDD, TY>(sV, sdO, ty, tx, dz);  // dZ^T = V dO^T

#pragma unroll
    for (int r = 0; r < RK; ++r) {
      const int jr = ty + r * TY, j = j0 + jr;
#pragma unroll
      for (int c = 0; c < CQ; ++c) {
        const int ic = tx + c * kTX, i = i0 + ic;
        const bool visible = i < a.Tq && j < a.Tk && !(a.causal && j > i);
        const A p = visible ? exp_acc(s[r][c] * a.scale - sL[ic]) : A(0);
        const A mult = (a.dropout && visible) ? dropout_mult(a, base, bh, i, j) : A(1);
        sZ[jr * LDS + ic] = p * mult;
        sdS[jr * LDS + ic] = p * (dz[r][c] * mult - sDi[ic]);
      }
    }
    // sZ and sdS are complete before the products read whole rows of them.
    __syncthreads();
    tile_nn<RK, CD, BQ, LDS, LDD, TY>(sZ, sdO, ty, tx, dv);  // dV += Z^T dO
    tile_nn<RK, CD, BQ, LDS, LDD, TY>(sdS, sQ, ty, tx, dk);  // dK += dS^T Q (scaled at the end)
  }

#pragma unroll
  for (int r = 0; r < RK; ++r) {
    const int j = j0 + ty + r * TY;
    if (j >= a.Tk) continue;
    const int64_t row = static_cast<int64_t>(bh) * a.Tk + j;
#pragma unroll
    for (int e = 0; e < CD; ++e) {
      const int d = tx + e * kTX;
      if (d >= a.dact) continue;
      a.dk[row * a.dact + d] = convert<T>(dk[r][e] * a.scale);
      a.dv[row * a.dact + d] = convert<T>(dv[r][e]);
    }
  }
}

template <class A, int D, int BQ, int BK>
constexpr size_t backward_q_smem() {
  constexpr int LDD = D + kVW<A>, LDS = BK + kVW<A>;
  return (static_cast<size_t>(2 * BQ + 2 * BK) * LDD + static_cast<size_t>(BQ) * LDS) * sizeof(A);
}

// dQ of one (b, h, tile of BQ queries), accumulated in registers over the key tiles it sees.
template <class T, int D, int BQ, int BK, int TY>
__global__ void __launch_bounds__(TY* kTX, 1) attention_backward_q_kernel(const Args<T> a) {
  const uint64_t base = drop_base(a);
  using A = acc_t<T>;
  constexpr int NT = TY * kTX, VW = kVW<A>, LDD = D + VW, LDS = BK + VW;
  constexpr int RQ = BQ / TY, CK = BK / kTX, CD = D / kTX;
  check_tile_shape<A, D, BQ, BK, TY>();
  extern __shared__ __align__(16) unsigned char smem_raw[];
  A* sQ = reinterpret_cast<A*>(smem_raw);
  A* sdO = sQ + BQ * LDD;
  A* sK = sdO + BQ * LDD;
  A* sV = sK + BK * LDD;
  A* sdS = sV + BK * LDD;  // [BQ][LDS]

  const int tx = threadIdx.x % kTX, ty = threadIdx.x / kTX;
  const int nqt = (a.Tq + BQ - 1) / BQ;
  const int bh = blockIdx.x % a.BH;
  const int qt = nqt - 1 - static_cast<int>(blockIdx.x / a.BH);  // heavy causal tiles first
  const int b = bh / a.H, h = bh % a.H;
  const int i0 = qt * BQ;
  const int64_t row0 = static_cast<int64_t>(bh) * a.Tq;

  load_rows<BQ, D, NT>(sQ, LDD, a.q.head(b, h), a.q.st, a.q.sd, i0, a.Tq, a.dact);
  load_rows<BQ, D, NT>(sdO, LDD, a.dout.head(b, h), a.dout.st, a.dout.sd, i0, a.Tq, a.dact);

  A lse[RQ], di[RQ], dq[RQ][CD];
#pragma unroll
  for (int r = 0; r < RQ; ++r) {
    const int i = i0 + ty + r * TY;
    lse[r] = i < a.Tq ? a.lse[row0 + i] : A(0);
    di[r] = i < a.Tq ? a.delta[row0 + i] : A(0);
#pragma unroll
    for (int e = 0; e < CD; ++e) dq[r][e] = A(0);
  }

  const int kend = a.causal ? min(a.Tk, i0 + BQ) : a.Tk;
  for (int k0 = 0; k0 < kend; k0 += BK) {
    // The previous pass's reads of sK and sdS are done (and sQ, sdO are complete on the first).
    __syncthreads();
    load_rows<BK, D, NT>(sK, LDD, a.k.head(b, h), a.k.st, a.k.sd, k0, a.Tk, a.dact);
    load_rows<BK, D, NT>(sV, LDD, a.v.head(b, h), a.v.st, a.v.sd, k0, a.Tk, a.dact);
    __syncthreads();

    A s[RQ][CK], dz[RQ][CK];
#pragma unroll
    for (int r = 0; r < RQ; ++r)
#pragma unroll
      for (int c = 0; c < CK; ++c) s[r][c] = dz[r][c] = A(0);
    tile_nt<RQ, CK, D, LDD, TY>(sQ, sK, ty, tx, s);
    tile_nt<RQ, CK, D, LDD, TY>(sdO, sV, ty, tx, dz);

#pragma unroll
    for (int r = 0; r < RQ; ++r) {
      const int ir = ty + r * TY, i = i0 + ir;
#pragma unroll
      for (int c = 0; c < CK; ++c) {
        const int jc = tx + c * kTX, j = k0 + jc;
        const bool visible = i < a.Tq && j < a.Tk && !(a.causal && j > i);
        const A p = visible ? exp_acc(s[r][c] * a.scale - lse[r]) : A(0);
        const A mult = (a.dropout && visible) ? dropout_mult(a, base, bh, i, j) : A(1);
        sdS[ir * LDS + jc] = p * (dz[r][c] * mult - di[r]);
      }
    }
    // sdS is complete before the product reads whole rows of it.
    __syncthreads();
    tile_nn<RQ, CD, BK, LDS, LDD, TY>(sdS, sK, ty, tx, dq);  // dQ += dS K (scaled at the end)
  }

#pragma unroll
  for (int r = 0; r < RQ; ++r) {
    const int i = i0 + ty + r * TY;
    if (i >= a.Tq) continue;
#pragma unroll
    for (int e = 0; e < CD; ++e) {
      const int d = tx + e * kTX;
      if (d < a.dact) a.dq[(row0 + i) * a.dact + d] = convert<T>(dq[r][e] * a.scale);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Tensor-core path (bf16 and f16 inputs)
//
// The same three-stage algorithm with every tile product on mma.sync.m16n8k16 (16-bit operands,
// f32 accumulators). A block is kTcWarps = 4 warps; each warp owns 16 rows of the block's
// 64-row tile (queries in the forward and the dQ kernel, keys in the dK/dV kernel) and the
// full width of every product on them, so softmax statistics and the score -> operand
// conversion stay in the warp's registers.
//
// Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type"),
// g = lane / 4 (groupID), t = lane % 4 (threadID_in_group); a 32-bit register holds two 16-bit
// elements, the lower column (or k) index in the low half:
//   A 16x16 (row major): a0 = (g, 2t..2t+1)  a1 = (g+8, 2t..)  a2 = (g, 2t+8..)  a3 = (g+8, 2t+8..)
//   B 16x8  (k x n):     b0 = (k 2t..2t+1, n g)             b1 = (k 2t+8..2t+9, n g)
//   C 16x8  (f32):       c0, c1 = (g, 2t), (g, 2t+1)       c2, c3 = (g+8, 2t), (g+8, 2t+1)
// So the C tiles of columns [16k, 16k+8) and [16k+8, 16k+16), rounded in pairs, are exactly the
// A fragment of the 16-wide k-step k: scores become the A operand of the next product without
// leaving registers (FlashAttention-2's trick).
//
// Operands come from shared memory through ldmatrix.x4 (four 8x8 matrices of 16-bit elements;
// lanes 8m..8m+7 give the row addresses of matrix m, and lane L receives in register m the pair
// (row L/4, columns 2(L%4)..+1) of matrix m, or with .trans the pair (rows 2(L%4)..+1, column
// L/4)). Tiles are row-major [rows][D + 8]: the 8-element pad makes the row pitch an odd number
// of 16-byte units, so the 8 rows of one 8x8 matrix fall in 8 different 16-byte bank groups and
// every ldmatrix phase is conflict-free. The three operand shapes:
//   A (rows x k) from X[row][k]:                  ldsm_x4       at ldsm_a_offset
//   B with B[k][n] = Y[n][k] (Y rows are n):      ldsm_x4       at ldsm_bt_offset
//   B with B[k][n] = Y[k][n] (Y rows are k):      ldsm_x4_trans at ldsm_a_offset
// (the last: for P V, dS K, Z^T dO, dS^T Q, whose B operand is stored with k along rows).
//
// Tiles stream in with cp.async (16-byte chunks, double-buffered: the next tile's copies are in
// flight while the current one is multiplied) when every row is 16-byte aligned and contiguous;
// otherwise with element loads (any strides, head dims below the compiled one zero-padded).
//
// Exponentials are exp2 of scores pre-multiplied by scale * log2(e) (one FFMA and one MUFU per
// score); the running max m is kept in those units and lse is stored in natural-log units as
// the FMA kernels do. P (and dS) are rounded to the input type for their products, as every
// tensor-core attention does; the normaliser l sums the unrounded f32 P. Dropout multiplies
// exactly as in the FMA kernels (dropout_mult, same element index, same keep test).
//
// Memory traffic is the FMA kernels': the forward reads each K/V tile once per 64 queries, the
// dK/dV kernel reads Q and dO once per 64 keys, the dQ kernel K and V once per 64 queries.

constexpr int kTcWarps = 4;
constexpr int kTcThreads = 32 * kTcWarps;
constexpr int kTcRows = 16 * kTcWarps;  // rows owned per block: 16 per warp
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

template <class T>
constexpr bool kTcType = std::is_same_v<T, bf16_t> || std::is_same_v<T, f16_t>;

// Row pitch (elements) of a shared tile of head dim D: see the ldmatrix note above.
template <int D>
constexpr int tc_ld() {
  return D + 8;
}

// c += a * (b0, b1): one m16n8k16 product, f32 accumulate.
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1, bf16_t) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1, f16_t) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <class T>
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  mma16816(c, a, b0, b1, T{});
}

// volatile + "memory": the compiler must not move these shared-memory reads across the
// __syncthreads that publish a tile, nor merge reads of a buffer that was refilled in between.
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* p) {
  const auto s = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s)
               : "memory");
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], const void* p) {
  const auto s = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s)
               : "memory");
}
// This lane's row address, as (row, column) offsets from the 16x16 block's corner, for:
//  - an A fragment (matrices m = lane/8: rows +8 for m = 1, 3 -> a1, a3; columns +8 for m = 2, 3
//    -> a2, a3), and equally for a .trans B fragment of B[k][n] = Y[k][n] (matrices: k +8 for
//    m = 1, 3 -> b1; n +8 for m = 2, 3 -> the second n-tile): registers b0, b1 of n-tile 0, then
//    b0, b1 of n-tile 1;
//  - ldsm_bt_offset: a B fragment of B[k][n] = Y[n][k] (matrices: k +8 for m = 1, 3 -> b1;
//    n +8 for m = 2, 3 -> the second n-tile): the same register order.
__device__ __forceinline__ int ldsm_a_offset(int lane, int ld) {
  return ((lane & 7) + ((lane >> 3) & 1) * 8) * ld + (lane >> 4) * 8;
}
__device__ __forceinline__ int ldsm_bt_offset(int lane, int ld) {
  return ((lane & 7) + (lane >> 4) * 8) * ld + ((lane >> 3) & 1) * 8;
}

// Two f32 values rounded to the 16-bit type in one register, lo in the low half.
__device__ __forceinline__ uint32_t pack2(float lo, float hi, bf16_t) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ __forceinline__ uint32_t pack2(float lo, float hi, f16_t) {
  const __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
// The A fragment of k-step kk from the C tiles 2kk and 2kk+1 (see the layout note above).
template <class T, int N>
__device__ __forceinline__ void c_to_a(uint32_t (&a)[4], const float (&c)[N][4], int kk) {
  a[0] = pack2(c[2 * kk][0], c[2 * kk][1], T{});
  a[1] = pack2(c[2 * kk][2], c[2 * kk][3], T{});
  a[2] = pack2(c[2 * kk + 1][0], c[2 * kk + 1][1], T{});
  a[3] = pack2(c[2 * kk + 1][2], c[2 * kk + 1][3], T{});
}

__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  const auto s = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// True when every row of the operand is D contiguous, 16-byte aligned elements, so tiles can
// be copied in 16-byte chunks.
template <class T>
bool tc_chunkable(const Strided<T>& s, int D, int dact) {
  constexpr int64_t E = 16 / sizeof(T);
  return dact == D && s.sd == 1 && s.st % E == 0 && s.sh % E == 0 && s.sb % E == 0 &&
         reinterpret_cast<uintptr_t>(s.p) % 16 == 0;
}

// Rows [row0, row0 + ROWS) of one head into dst[ROWS][tc_ld<D>()]. Rows at or past n and
// columns at or past dact are zero (padded keys must not put NaN into 0 * V; padded columns add
// nothing to dot products). With `chunks` the copies are cp.async and land only once the
// caller has committed and waited for them; the zero rows are plain stores.
template <int ROWS, int D, class T>
__device__ __forceinline__ void tc_load_rows(T* dst, const Strided<T>& s, int b, int h, int row0, int n, int dact,
                                             bool chunks) {
  constexpr int LD = tc_ld<D>();
  const T* src = s.head(b, h);
  if (chunks) {
    constexpr int CPR = D * static_cast<int>(sizeof(T)) / 16;  // 16-byte chunks per row
    constexpr int E = 16 / static_cast<int>(sizeof(T));
    for (int idx = threadIdx.x; idx < ROWS * CPR; idx += kTcThreads) {
      const int r = idx / CPR, c = idx % CPR, t = row0 + r;
      T* d = dst + r * LD + c * E;
      if (t < n)
        cp_async16(d, src + static_cast<int64_t>(t) * s.st + c * E);
      else
        *reinterpret_cast<uint4*>(d) = make_uint4(0u, 0u, 0u, 0u);
    }
  } else {
    for (int idx = threadIdx.x; idx < ROWS * D; idx += kTcThreads) {
      const int r = idx / D, d = idx % D, t = row0 + r;
      T val = convert<T>(0.0f);
      if (t < n && d < dact) val = src[static_cast<int64_t>(t) * s.st + static_cast<int64_t>(d) * s.sd];
      dst[r * LD + d] = val;
    }
  }
}

// c (16 x 8*NT per warp) += X Y^T over the D columns: X the warp's 16 rows of a shared tile,
// Y the tile whose rows are c's columns (both [rows][tc_ld<D>()], the A fragments reloaded per
// 16-column step rather than held in registers). c[n] holds columns [8n, 8n + 8); the 16-column
// groups from ng on are skipped (left as they are).
template <class T, int D, int NT>
__device__ __forceinline__ void tc_xyt(float (&c)[NT][4], const T* X, const T* Y, int lane, int ng) {
  constexpr int LD = tc_ld<D>();
#pragma unroll
  for (int kd = 0; kd < D / 16; ++kd) {
    uint32_t a[4];
    ldsm_x4(a, X + ldsm_a_offset(lane, LD) + kd * 16);
#pragma unroll
    for (int nn = 0; nn < NT / 2; ++nn) {
      if (nn >= ng) break;
      uint32_t bf[4];
      ldsm_x4(bf, Y + nn * 16 * LD + ldsm_bt_offset(lane, LD) + kd * 16);
      mma<T>(c[2 * nn], a, bf[0], bf[1]);
      mma<T>(c[2 * nn + 1], a, bf[2], bf[3]);
    }
  }
}

// acc (16 x D per warp) += P Y: P the warp's 16 x 8*NT C tiles in registers (rounded to T as A
// fragments), Y [8*NT][tc_ld<D>()] in shared memory with the reduction index along its rows
// (.trans fragments). The 16-row groups of Y from kg on are skipped (P is zero there).
template <class T, int D, int NT>
__device__ __forceinline__ void tc_py(float (&acc)[D / 8][4], const float (&p)[NT][4], const T* Y, int lane, int kg) {
  constexpr int LD = tc_ld<D>();
#pragma unroll
  for (int kk = 0; kk < NT / 2; ++kk) {
    if (kk >= kg) break;
    uint32_t a[4];
    c_to_a<T>(a, p, kk);
#pragma unroll
    for (int dd = 0; dd < D / 16; ++dd) {
      uint32_t bf[4];
      ldsm_x4_trans(bf, Y + kk * 16 * LD + ldsm_a_offset(lane, LD) + dd * 16);
      mma<T>(acc[2 * dd], a, bf[0], bf[1]);
      mma<T>(acc[2 * dd + 1], a, bf[2], bf[3]);
    }
  }
}

template <int D, int BK>
constexpr size_t tc_forward_smem() {
  return static_cast<size_t>(kTcRows + 4 * BK) * tc_ld<D>() * 2;
}

// Forward: one block per (b, h, 64 queries); K and V tiles of BK keys double-buffered.
template <class T, int D, int BK, bool DROPOUT>
__global__ void __launch_bounds__(kTcThreads, 1) attention_forward_tc_kernel(const Args<T> a) {
  const uint64_t base = drop_base(a);
  static_assert(kTcType<T> && D % 16 == 0 && BK % 16 == 0);
  constexpr int BQ = kTcRows, LD = tc_ld<D>(), NT = BK / 8, ND = D / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);  // [BQ][LD]
  T* sK = sQ + BQ * LD;                    // [2][BK][LD]
  T* sV = sK + 2 * BK * LD;                // [2][BK][LD]

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t4 = lane % 4;
  const int nqt = (a.Tq + BQ - 1) / BQ;
  const int bh = blockIdx.x % a.BH;
  const int qt = nqt - 1 - static_cast<int>(blockIdx.x / a.BH);  // heavy causal tiles first
  const int b = bh / a.H, h = bh % a.H;
  const int i0 = qt * BQ;
  const int wr = warp * 16;  // this warp's first row in the tile
  const int kend = a.causal ? min(a.Tk, i0 + BQ) : a.Tk;
  const int ntiles = (kend + BK - 1) / BK;  // >= 1: Tk >= 1 and i0 + BQ >= 1
  // Keys this warp can see end before min(Tk, its last query + 1) (all of Tk without causal).
  const int wend = a.causal ? min(a.Tk, i0 + wr + 16) : a.Tk;

  tc_load_rows<BQ, D>(sQ, a.q, b, h, i0, a.Tq, a.dact, a.chunks);
  tc_load_rows<BK, D>(sK, a.k, b, h, 0, a.Tk, a.dact, a.chunks);
  tc_load_rows<BK, D>(sV, a.v, b, h, 0, a.Tk, a.dact, a.chunks);
  cp_async_commit();

  const float sl2 = a.scale * kLog2e;  // scores in log2 units: exp(x * scale) = exp2(x * sl2)
  // Rows g and g + 8 of the warp's 16: running max (log2 units) and running sum.
  float m[2] = {neg_inf<float>(), neg_inf<float>()}, l[2] = {0.0f, 0.0f};
  float o[ND][4];
#pragma unroll
  for (int n = 0; n < ND; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;

  for (int kt = 0; kt < ntiles; ++kt) {
    const int k0 = kt * BK, buf = kt & 1;
    if (kt + 1 < ntiles) {
      // Buffer buf ^ 1 was last read in iteration kt - 1, which ended with __syncthreads.
      tc_load_rows<BK, D>(sK + (buf ^ 1) * BK * LD, a.k, b, h, k0 + BK, a.Tk, a.dact, a.chunks);
      tc_load_rows<BK, D>(sV + (buf ^ 1) * BK * LD, a.v, b, h, k0 + BK, a.Tk, a.dact, a.chunks);
    }
    // Always commit (an empty group when nothing was issued) so that "all but the newest group"
    // is always tile kt's group (and Q's, in the first).
    cp_async_commit();
    cp_async_wait<1>();
    // Every thread's copies and zero stores of tile kt (and of sQ) are visible to all.
    __syncthreads();
    const T* kS = sK + buf * BK * LD;
    const T* vS = sV + buf * BK * LD;
    // 16-key groups holding a key this warp can see; the later ones are fully masked for it.
    const int ng = min(NT / 2, (wend - k0 + 15) / 16);

    // S = Q K^T (16 x BK per warp).
    float s[NT][4];
#pragma unroll
    for (int n = 0; n < NT; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
    tc_xyt<T, D>(s, sQ + wr * LD, kS, lane, ng);

    // Online softmax on rows g (e = 0, 1) and g + 8 (e = 2, 3); a row's 4 owners are the lanes
    // 4g..4g+3, hence the xor-1 and xor-2 shuffles.
    float mx[2] = {neg_inf<float>(), neg_inf<float>()};
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = i0 + wr + g + 8 * (e >> 1), j = k0 + n * 8 + 2 * t4 + (e & 1);
        const bool visible = j < a.Tk && !(a.causal && j > i);
        s[n][e] = visible ? s[n][e] * sl2 : neg_inf<float>();
        mx[e >> 1] = fmaxf(mx[e >> 1], s[n][e]);
      }
    float shift[2], alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      const float m_new = fmaxf(m[r], mx[r]);
      // A row with no visible key yet keeps m = -inf: shift by 0 so exp2(-inf) = 0, not NaN.
      shift[r] = m_new == neg_inf<float>() ? 0.0f : m_new;
      alpha[r] = exp2f(m[r] - shift[r]);
      m[r] = m_new;
    }
    float sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1;
        float p = exp2f(s[n][e] - shift[r]);
        sum[r] += p;  // the normaliser uses the undropped probabilities (PyTorch's semantics)
        const int i = i0 + wr + g + 8 * r;
        if (DROPOUT && p != 0.0f && i < a.Tq) p *= dropout_mult(a, base, bh, i, k0 + n * 8 + 2 * t4 + (e & 1));
        s[n][e] = p;
      }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 1);
      sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 2);
      l[r] = l[r] * alpha[r] + sum[r];
    }
#pragma unroll
    for (int n = 0; n < ND; ++n) {
      o[n][0] *= alpha[0];
      o[n][1] *= alpha[0];
      o[n][2] *= alpha[1];
      o[n][3] *= alpha[1];
    }
    // O += P V: the key groups past ng have P = 0 for every row of this warp.
    tc_py<T, D>(o, s, vS, lane, ng);
    // Every warp is done with buffer buf before iteration kt + 1 refills it with tile kt + 2.
    __syncthreads();
  }
  // Nothing may be in flight at exit (the dK/dV kernel runs no iteration when no query sees its
  // keys; elsewhere the last group is empty).
  cp_async_wait<0>();

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = i0 + wr + g + 8 * r;
    if (i >= a.Tq) continue;
    const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
    const int64_t row = static_cast<int64_t>(bh) * a.Tq + i;
#pragma unroll
    for (int n = 0; n < ND; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int d = n * 8 + 2 * t4 + e;
        if (d >= a.dact) continue;
        const float val = o[n][2 * r + e] * inv;
        a.out[row * a.dact + d] = convert<T>(val);
        if (a.out32) a.out32[row * a.dact + d] = val;
      }
    // m is in log2 units: lse = ln(2) * m + ln(l).
    if (t4 == 0) a.lse[row] = l[r] > 0.0f ? m[r] * kLn2 + logf(l[r]) : neg_inf<float>();
  }
}

template <int D, int BQ>
constexpr size_t tc_backward_kv_smem() {
  return static_cast<size_t>(2 * kTcRows + 4 * BQ) * tc_ld<D>() * 2 + static_cast<size_t>(4 * BQ) * sizeof(float);
}

// dK and dV of one (b, h, 64 keys), each warp 16 keys, looping over query tiles of BQ
// (double-buffered Q, dO). Scores are computed transposed (S^T = K Q^T, rows are keys) so that
// Z^T and dS^T are the A operands of dV += Z^T dO and dK += dS^T Q straight from registers.
template <class T, int D, int BQ, bool DROPOUT>
__global__ void __launch_bounds__(kTcThreads, 1) attention_backward_kv_tc_kernel(const Args<T> a) {
  const uint64_t base = drop_base(a);
  static_assert(kTcType<T> && D % 16 == 0 && BQ % 16 == 0);
  constexpr int BK = kTcRows, LD = tc_ld<D>(), NT = BQ / 8, ND = D / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sK = reinterpret_cast<T*>(smem_raw);                   // [BK][LD]
  T* sV = sK + BK * LD;                                     // [BK][LD]
  T* sQ = sV + BK * LD;                                     // [2][BQ][LD]
  T* sdO = sQ + 2 * BQ * LD;                                // [2][BQ][LD]
  float* sL = reinterpret_cast<float*>(sdO + 2 * BQ * LD);  // [2][BQ]: lse * log2(e)
  float* sDi = sL + 2 * BQ;                                 // [2][BQ]: Di

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t4 = lane % 4;
  const int bh = blockIdx.x % a.BH;
  const int kt = static_cast<int>(blockIdx.x / a.BH);  // causal: the first key tiles are the heaviest
  const int b = bh / a.H, h = bh % a.H;
  const int j0 = kt * BK;
  const int wr = warp * 16;
  const int64_t row0 = static_cast<int64_t>(bh) * a.Tq;
  const float sl2 = a.scale * kLog2e;

  // Query tile i0's Q and dO (cp.async or element loads) and lse, Di (element loads) into buf.
  auto load_q_tile = [&](int i0, int buf) {
    tc_load_rows<BQ, D>(sQ + buf * BQ * LD, a.q, b, h, i0, a.Tq, a.dact, a.chunks);
    tc_load_rows<BQ, D>(sdO + buf * BQ * LD, a.dout, b, h, i0, a.Tq, a.dact, a.chunks);
    for (int t = threadIdx.x; t < BQ; t += kTcThreads) {
      const bool in = i0 + t < a.Tq;
      sL[buf * BQ + t] = in ? a.lse[row0 + i0 + t] * kLog2e : 0.0f;
      sDi[buf * BQ + t] = in ? a.delta[row0 + i0 + t] : 0.0f;
    }
  };

  // Queries before j0 see none of these keys: start at the query tile holding row j0.
  const int qstart = a.causal ? (j0 / BQ) * BQ : 0;
  tc_load_rows<BK, D>(sK, a.k, b, h, j0, a.Tk, a.dact, a.chunks);
  tc_load_rows<BK, D>(sV, a.v, b, h, j0, a.Tk, a.dact, a.chunks);
  if (qstart < a.Tq) load_q_tile(qstart, 0);
  cp_async_commit();

  float dk[ND][4], dv[ND][4];
#pragma unroll
  for (int n = 0; n < ND; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[n][e] = dv[n][e] = 0.0f;

  int it = 0;
  for (int i0 = qstart; i0 < a.Tq; i0 += BQ, ++it) {
    const int buf = it & 1;
    // Buffer buf ^ 1 was last read in the previous iteration, which ended with __syncthreads.
    if (i0 + BQ < a.Tq) load_q_tile(i0 + BQ, buf ^ 1);
    cp_async_commit();  // possibly empty: keeps "all but the newest group" = this tile's
    cp_async_wait<1>();
    // This tile's (and, first, sK's and sV's) copies and stores are visible to every thread.
    __syncthreads();
    const T* qS = sQ + buf * BQ * LD;
    const T* doS = sdO + buf * BQ * LD;
    const float* lS = sL + buf * BQ;
    const float* diS = sDi + buf * BQ;

    // S^T = K Q^T and dZ^T = V dO^T (16 keys x BQ queries per warp).
    float st[NT][4], dzt[NT][4];
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) st[n][e] = dzt[n][e] = 0.0f;
    tc_xyt<T, D>(st, sK + wr * LD, qS, lane, NT / 2);
    tc_xyt<T, D>(dzt, sV + wr * LD, doS, lane, NT / 2);

    // Rows are keys j (g, g + 8), columns queries i: Z^T = P^T * M and dS^T = P^T * (dZ^T * M - Di).
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int ic = n * 8 + 2 * t4 + (e & 1), i = i0 + ic;
        const int j = j0 + wr + g + 8 * (e >> 1);
        const bool visible = i < a.Tq && j < a.Tk && !(a.causal && j > i);
        const float p = visible ? exp2f(fmaf(st[n][e], sl2, -lS[ic])) : 0.0f;
        const float mult = (DROPOUT && visible) ? dropout_mult(a, base, bh, i, j) : 1.0f;
        st[n][e] = p * mult;
        dzt[n][e] = p * (dzt[n][e] * mult - diS[ic]);
      }
    tc_py<T, D>(dv, st, doS, lane, NT / 2);  // dV += Z^T dO
    tc_py<T, D>(dk, dzt, qS, lane, NT / 2);  // dK += dS^T Q (scaled at the end)
    // Every warp is done with buffer buf before the next iteration refills it.
    __syncthreads();
  }
  // Nothing may be in flight at exit (the dK/dV kernel runs no iteration when no query sees its
  // keys; elsewhere the last group is empty).
  cp_async_wait<0>();

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int j = j0 + wr + g + 8 * r;
    if (j >= a.Tk) continue;
    const int64_t row = static_cast<int64_t>(bh) * a.Tk + j;
#pragma unroll
    for (int n = 0; n < ND; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int d = n * 8 + 2 * t4 + e;
        if (d >= a.dact) continue;
        a.dk[row * a.dact + d] = convert<T>(dk[n][2 * r + e] * a.scale);
        a.dv[row * a.dact + d] = convert<T>(dv[n][2 * r + e]);
      }
  }
}

template <int D, int BK>
constexpr size_t tc_backward_q_smem() {
  return static_cast<size_t>(2 * kTcRows + 4 * BK) * tc_ld<D>() * 2;
}

// dQ of one (b, h, 64 queries), each warp 16 queries, looping over key tiles of BK
// (double-buffered K, V).
template <class T, int D, int BK, bool DROPOUT>
__global__ void __launch_bounds__(kTcThreads, 1) attention_backward_q_tc_kernel(const Args<T> a) {
  const uint64_t base = drop_base(a);
  static_assert(kTcType<T> && D % 16 == 0 && BK % 16 == 0);
  constexpr int BQ = kTcRows, LD = tc_ld<D>(), NT = BK / 8, ND = D / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);  // [BQ][LD]
  T* sdO = sQ + BQ * LD;                   // [BQ][LD]
  T* sK = sdO + BQ * LD;                   // [2][BK][LD]
  T* sV = sK + 2 * BK * LD;                // [2][BK][LD]

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t4 = lane % 4;
  const int nqt = (a.Tq + BQ - 1) / BQ;
  const int bh = blockIdx.x % a.BH;
  const int qt = nqt - 1 - static_cast<int>(blockIdx.x / a.BH);  // heavy causal tiles first
  const int b = bh / a.H, h = bh % a.H;
  const int i0 = qt * BQ;
  const int wr = warp * 16;
  const int64_t row0 = static_cast<int64_t>(bh) * a.Tq;
  const float sl2 = a.scale * kLog2e;
  const int kend = a.causal ? min(a.Tk, i0 + BQ) : a.Tk;
  const int ntiles = (kend + BK - 1) / BK;  // >= 1
  const int wend = a.causal ? min(a.Tk, i0 + wr + 16) : a.Tk;

  tc_load_rows<BQ, D>(sQ, a.q, b, h, i0, a.Tq, a.dact, a.chunks);
  tc_load_rows<BQ, D>(sdO, a.dout, b, h, i0, a.Tq, a.dact, a.chunks);
  tc_load_rows<BK, D>(sK, a.k, b, h, 0, a.Tk, a.dact, a.chunks);
  tc_load_rows<BK, D>(sV, a.v, b, h, 0, a.Tk, a.dact, a.chunks);
  cp_async_commit();

  // Rows g and g + 8 of the warp: lse (log2 units) and Di.
  float lse2[2], di[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = i0 + wr + g + 8 * r;
    lse2[r] = i < a.Tq ? a.lse[row0 + i] * kLog2e : 0.0f;
    di[r] = i < a.Tq ? a.delta[row0 + i] : 0.0f;
  }
  float dq[ND][4];
#pragma unroll
  for (int n = 0; n < ND; ++n) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;

  for (int kt = 0; kt < ntiles; ++kt) {
    const int k0 = kt * BK, buf = kt & 1;
    if (kt + 1 < ntiles) {
      // Buffer buf ^ 1 was last read in iteration kt - 1, which ended with __syncthreads.
      tc_load_rows<BK, D>(sK + (buf ^ 1) * BK * LD, a.k, b, h, k0 + BK, a.Tk, a.dact, a.chunks);
      tc_load_rows<BK, D>(sV + (buf ^ 1) * BK * LD, a.v, b, h, k0 + BK, a.Tk, a.dact, a.chunks);
    }
    cp_async_commit();  // possibly empty: keeps "all but the newest group" = tile kt's
    cp_async_wait<1>();
    // Tile kt's (and, first, sQ's and sdO's) copies and stores are visible to every thread.
    __syncthreads();
    const T* kS = sK + buf * BK * LD;
    const T* vS = sV + buf * BK * LD;
    // 16-key groups holding a key this warp can see; the later ones have P = dS = 0.
    const int ng = min(NT / 2, (wend - k0 + 15) / 16);

    // S = Q K^T and dZ = dO V^T (16 queries x BK keys per warp).
    float s[NT][4], dz[NT][4];
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] = dz[n][e] = 0.0f;
    tc_xyt<T, D>(s, sQ + wr * LD, kS, lane, ng);
    tc_xyt<T, D>(dz, sdO + wr * LD, vS, lane, ng);

    // dS = P * (dZ * M - Di), into s.
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1;
        const int i = i0 + wr + g + 8 * r, j = k0 + n * 8 + 2 * t4 + (e & 1);
        const bool visible = i < a.Tq && j < a.Tk && !(a.causal && j > i);
        const float p = visible ? exp2f(fmaf(s[n][e], sl2, -lse2[r])) : 0.0f;
        const float mult = (DROPOUT && visible) ? dropout_mult(a, base, bh, i, j) : 1.0f;
        s[n][e] = p * (dz[n][e] * mult - di[r]);
      }
    tc_py<T, D>(dq, s, kS, lane, ng);  // dQ += dS K (scaled at the end)
    // Every warp is done with buffer buf before iteration kt + 1 refills it with tile kt + 2.
    __syncthreads();
  }
  // Nothing may be in flight at exit (the dK/dV kernel runs no iteration when no query sees its
  // keys; elsewhere the last group is empty).
  cp_async_wait<0>();

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = i0 + wr + g + 8 * r;
    if (i >= a.Tq) continue;
#pragma unroll
    for (int n = 0; n < ND; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int d = n * 8 + 2 * t4 + e;
        if (d < a.dact) a.dq[(row0 + i) * a.dact + d] = convert<T>(dq[n][2 * r + e] * a.scale);
      }
  }
}

// Tensor-core tile sizes: the forward's and dQ kernel's key tile, the dK/dV kernel's query
// tile. The dK/dV kernel holds dK and dV (D / 2 registers each per thread) and S^T, dZ^T (BQ / 2
// each) across its score loop, and dropout adds the Philox state there: its query tile shrinks
// with D and under dropout so that everything stays in registers without spilling.
template <int D, bool DROPOUT>
struct TcTiles {
  static constexpr int fwd_bk = 64;
  static constexpr int kv_bq = (D >= 128 ? 32 : 64) / (DROPOUT ? 2 : 1);
  static constexpr int q_bk = 64;
};

// ---------------------------------------------------------------------------------------------
// Host side

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

template <class Kernel, class T>
void launch(Kernel kernel, int64_t blocks, int threads, size_t smem, cudaStream_t stream, const Args<T>& args,
            const char* name) {
  FT_CHECK(blocks <= INT32_MAX, name, ": ", blocks, " thread blocks exceed the grid limit");
  // Above 48 KiB a kernel must opt in to its dynamic shared memory.
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)), name);
  kernel<<<static_cast<unsigned>(blocks), threads, smem, stream>>>(args);
  check_launch(name);
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
  return a;
}

// The tensor-core launches of one call (a.chunks set by the caller).
template <class T, int D, bool DROPOUT>
void tc_forward(const Args<T>& a, int64_t BH, cudaStream_t stream, const char* name) {
  constexpr int kBK = TcTiles<D, DROPOUT>::fwd_bk;
  constexpr size_t smem = tc_forward_smem<D, kBK>();
  static_assert(smem <= kMaxSmem);
  const int64_t nqt = (a.Tq + kTcRows - 1) / kTcRows;
  launch(attention_forward_tc_kernel<T, D, kBK, DROPOUT>, nqt * BH, kTcThreads, smem, stream, a, name);
}
template <class T, int D, bool DROPOUT>
void tc_backward(const Args<T>& a, int64_t BH, cudaStream_t stream, const char* name) {
  using Tc = TcTiles<D, DROPOUT>;
  constexpr size_t kv_smem = tc_backward_kv_smem<D, Tc::kv_bq>();
  constexpr size_t q_smem = tc_backward_q_smem<D, Tc::q_bk>();
  static_assert(kv_smem <= kMaxSmem && q_smem <= kMaxSmem);
  const int64_t nkt = (a.Tk + kTcRows - 1) / kTcRows;
  launch(attention_backward_kv_tc_kernel<T, D, Tc::kv_bq, DROPOUT>, nkt * BH, kTcThreads, kv_smem, stream, a, name);
  const int64_t nqt = (a.Tq + kTcRows - 1) / kTcRows;
  launch(attention_backward_q_tc_kernel<T, D, Tc::q_bk, DROPOUT>, nqt * BH, kTcThreads, q_smem, stream, a, name);
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
    using Tl = Tiles<A, kD>;
    constexpr size_t smem = forward_smem<A, kD, Tl::fwd_bq, Tl::fwd_bk>();
    static_assert(smem <= kMaxSmem);
    const int64_t nqt = (Tq + Tl::fwd_bq - 1) / Tl::fwd_bq;
    launch(attention_forward_kernel<T, kD, Tl::fwd_bq, Tl::fwd_bk, Tl::fwd_ty>, nqt * BH, Tl::fwd_ty * kTX, smem,
           stream, a, kName);
  });
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
    using Tl = Tiles<A, kD>;
    constexpr size_t kv_smem = backward_kv_smem<A, kD, Tl::kv_bk, Tl::kv_bq>();
    constexpr size_t q_smem = backward_q_smem<A, kD, Tl::q_bq, Tl::q_bk>();
    static_assert(kv_smem <= kMaxSmem && q_smem <= kMaxSmem);
    const int64_t nkt = (Tk + Tl::kv_bk - 1) / Tl::kv_bk;
    launch(attention_backward_kv_kernel<T, kD, Tl::kv_bk, Tl::kv_bq, Tl::kv_ty>, nkt * BH, Tl::kv_ty * kTX, kv_smem,
           stream, a, kName);
    const int64_t nqt = (Tq + Tl::q_bq - 1) / Tl::q_bq;
    launch(attention_backward_q_kernel<T, kD, Tl::q_bq, Tl::q_bk, Tl::q_ty>, nqt * BH, Tl::q_ty * kTX, q_smem, stream,
           a, kName);
  });
}

}  // namespace

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p, const Tensor& out,
                       const Tensor& lse, const Tensor& out_f32) {
  FT_CUDA_DISPATCH_FLOATING(q.dtype(), "attention_forward",
                            [&] { forward_typed<scalar_t>(q, k, v, p, out, lse, out_f32); });
}

void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                        const Tensor& dout, const AttentionParams& p, const Tensor& dq, const Tensor& dk,
                        const Tensor& dv) {
  FT_CUDA_DISPATCH_FLOATING(q.dtype(), "attention_backward",
                            [&] { backward_typed<scalar_t>(q, k, v, out, lse, dout, p, dq, dk, dv); });
}

}  // namespace ft::cuda
