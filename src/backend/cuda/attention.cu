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
// The arithmetic is plain f32 FMA (f64 for f64 inputs) from shared-memory tiles, every operand
// widened to the compute type on load; each thread owns a register tile of rows ty + r*TY and
// columns tx + c*16, so a row's 16 owners are half a warp and row reductions are 4 shuffles.
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
  uint64_t seed, base;
};

// Dropout multiplier of score element (bh, i, j): the CPU's rule, element index
// ((bh * Tq + i) * Tk + j) drawn from word idx % 4 of Philox counter block base + idx / 4.
template <class T>
__device__ __forceinline__ acc_t<T> dropout_mult(const Args<T>& a, int bh, int i, int j) {
  const uint64_t idx = (static_cast<uint64_t>(bh) * a.Tq + i) * a.Tk + j;
  const random_math::PhiloxBlock w = random_math::philox4x32(a.seed, a.base + idx / 4);
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
        if (a.dropout && p != A(0) && i < a.Tq) p *= dropout_mult(a, bh, i, k0 + tx + c * kTX);
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
        const A mult = (a.dropout && visible) ? dropout_mult(a, bh, i, j) : A(1);
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
        const A mult = (a.dropout && visible) ? dropout_mult(a, bh, i, j) : A(1);
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
  a.seed = p.seed;
  a.base = p.philox_base;
  return a;
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
