// CUDA-core FMA kernels of fused attention (the dispatcher is attention.cu): f32 and f64 inputs,
// and bf16/f16 under FT_CUDA_ATTENTION_FMA=1. They compute in plain f32 FMA (f64 for f64) from
// shared-memory tiles, every operand widened to the compute type on load.
//
// Forward, one block per (b, h, tile of BQ queries), K/V streamed in tiles of BK rows through
// shared memory, per query row a running max m and running sum l (online softmax):
//   S = scale * Q K_tile^T;  m' = max(m, rowmax S);  P = exp(S - m');
//   l = l * exp(m - m') + rowsum P;  O = O * exp(m - m') + dropout(P) V_tile;
// at the end O /= l, lse = m + log l.
// Backward, launches 2 and 3 of attention.cu's (P = exp(scale * Q K^T - lse) recomputed per
// tile, Z = P * M with M the dropout multipliers, dZ = dO V^T, dS = P * (dZ * M - Di)):
//   dK, dV per (b, h, key tile), over the query tiles that see it: dV = Z^T dO, dK = scale * dS^T Q;
//   dQ per (b, h, query tile), over the key tiles it sees: dQ = scale * dS K.
// A document mask narrows the tiles each loop walks and masks scores below each row's document
// start (attention.cuh).
//
// Each thread owns a register tile of rows ty + r*TY and columns tx + c*16, so a row's 16 owners
// are half a warp and row reductions are 4 shuffles. Tile products read 16-byte vectors along
// the reduction dimension of shared tiles padded by one vector per row.
#include <cstdint>

#include "backend/cuda/attention.cuh"
#include "backend/cuda/common.cuh"

namespace ft::cuda::attention {

namespace {

// Columns of a register tile are spread over 16 consecutive lanes (half a warp).
constexpr int kTX = 16;

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
  const int b = bh / a.H, h = bh % a.H, hk = h / a.group;
  const int i0 = qt * BQ;

  load_rows<BQ, D, NT>(sQ, LDD, a.q.head(b, h), a.q.st, a.q.sd, i0, a.Tq, a.dact);

  A m[RQ], l[RQ], o[RQ][CD];
  int rs[RQ];  // each row's first visible key (document mask; 0 without)
#pragma unroll
  for (int r = 0; r < RQ; ++r) {
    m[r] = neg_inf<A>();
    l[r] = A(0);
    rs[r] = doc_row_start(a, b, i0 + ty + r * TY);
#pragma unroll
    for (int e = 0; e < CD; ++e) o[r][e] = A(0);
  }

  // Keys from i0 + BQ on are above the diagonal for every query of the tile; under a document
  // mask, keys before the first row's document are in earlier documents for every row.
  const int kend = a.causal ? min(a.Tk, i0 + BQ) : a.Tk;
  for (int k0 = doc_first_key<BK>(a, b, i0); k0 < kend; k0 += BK) {
    // Every thread has finished reading the previous sK, sV and sP (and sQ is complete on the
    // first pass).
    __syncthreads();
    load_rows<BK, D, NT>(sK, LDD, a.k.head(b, hk), a.k.st, a.k.sd, k0, a.Tk, a.dact);
    load_rows<BK, D, NT>(sV, LDD, a.v.head(b, hk), a.v.st, a.v.sd, k0, a.Tk, a.dact);
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
        const bool visible = j < a.Tk && !(a.causal && j > i) && j >= rs[r];
        s[r][c] = visible ? s[r][c] * a.scale : neg_inf<A>();
        mx = fmax(mx, s[r][c]);
      }
      mx = row_max(mx);
      const A m_new = fmax(m[r], mx);
      // A row with no visible key yet keeps m = -inf; shifting by 0 then gives exp(-inf) = 0
      // everywhere instead of exp(-inf - -inf) = NaN. (Without a document mask key 0 is in the
      // first tile and visible to every row; with one, a row whose document starts in a later
      // tile sees nothing in the first.)
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

template <class A, int D, int BK, int BQ>
constexpr size_t backward_kv_smem() {
  constexpr int LDD = D + kVW<A>, LDS = BQ + kVW<A>;
  return (static_cast<size_t>(2 * BK + 2 * BQ) * LDD + static_cast<size_t>(2 * BK) * LDS + 3 * BQ) * sizeof(A);
}

// dK and dV of one (b, KV head, tile of BK keys): thread rows are keys, columns queries, so the
// score tile is computed transposed (S^T = K Q^T) and dV, dK accumulate in registers over all
// query tiles of every query head of the KV head's group, head after head.
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
  A* sZ = sdO + BQ * LDD;                       // [BK][LDS]: Z^T = (P * M)^T
  A* sdS = sZ + BK * LDS;                       // [BK][LDS]: dS^T
  A* sL = sdS + BK * LDS;                       // [BQ]: lse of the tile's queries
  A* sDi = sL + BQ;                             // [BQ]: Di of the tile's queries
  int* sSt = reinterpret_cast<int*>(sDi + BQ);  // [BQ]: each query's first visible key (document mask)

  const int tx = threadIdx.x % kTX, ty = threadIdx.x / kTX;
  const int bkv = blockIdx.x % a.BHkv;
  // Under causal masking the first key tiles are seen by the most queries: lowest indices first.
  const int kt = static_cast<int>(blockIdx.x / a.BHkv);
  const int b = bkv / a.Hkv, hk = bkv % a.Hkv;
  const int j0 = kt * BK;

  load_rows<BK, D, NT>(sK, LDD, a.k.head(b, hk), a.k.st, a.k.sd, j0, a.Tk, a.dact);
  load_rows<BK, D, NT>(sV, LDD, a.v.head(b, hk), a.v.st, a.v.sd, j0, a.Tk, a.dact);

  A dk[RK][CD], dv[RK][CD];
#pragma unroll
  for (int r = 0; r < RK; ++r)
#pragma unroll
    for (int e = 0; e < CD; ++e) dk[r][e] = dv[r][e] = A(0);

  // Queries before j0 see none of these keys: start at the query tile holding row j0. Under a
  // document mask, queries from the end of the last key's document on see none either.
  const int qstart = a.causal ? (j0 / BQ) * BQ : 0;
  const int qend = doc_query_end<BK>(a, b, j0);
  for (int h = hk * a.group; h < (hk + 1) * a.group; ++h) {
    const int bh = b * a.H + h;
    const int64_t row0 = static_cast<int64_t>(bh) * a.Tq;
    for (int i0 = qstart; i0 < qend; i0 += BQ) {
      // The previous pass's reads of sQ, sdO, sZ, sdS, sL, sDi are done before they are replaced.
      __syncthreads();
      load_rows<BQ, D, NT>(sQ, LDD, a.q.head(b, h), a.q.st, a.q.sd, i0, a.Tq, a.dact);
      load_rows<BQ, D, NT>(sdO, LDD, a.dout.head(b, h), a.dout.st, a.dout.sd, i0, a.Tq, a.dact);
      for (int t = threadIdx.x; t < BQ; t += NT) {
        const bool in = i0 + t < a.Tq;
        sL[t] = in ? a.lse[row0 + i0 + t] : A(0);
        sDi[t] = in ? a.delta[row0 + i0 + t] : A(0);
        sSt[t] = doc_row_start(a, b, i0 + t);
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
          const bool visible = i < a.Tq && j < a.Tk && !(a.causal && j > i) && j >= sSt[ic];
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
  }

#pragma unroll
  for (int r = 0; r < RK; ++r) {
    const int j = j0 + ty + r * TY;
    if (j >= a.Tk) continue;
    const int64_t row = static_cast<int64_t>(bkv) * a.Tk + j;
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
  return (static_cast<size_t>(2 * BQ + 2 * BK) * LDD + static_cast<size_t>(BQ) * LDS + BQ) * sizeof(A);
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
  // [BQ]: each query's first visible key (document mask; 0 without).
  int* sRs = reinterpret_cast<int*>(sdS + BQ * LDS);

  const int tx = threadIdx.x % kTX, ty = threadIdx.x / kTX;
  const int nqt = (a.Tq + BQ - 1) / BQ;
  const int bh = blockIdx.x % a.BH;
  const int qt = nqt - 1 - static_cast<int>(blockIdx.x / a.BH);  // heavy causal tiles first
  const int b = bh / a.H, h = bh % a.H, hk = h / a.group;
  const int i0 = qt * BQ;
  const int64_t row0 = static_cast<int64_t>(bh) * a.Tq;

  load_rows<BQ, D, NT>(sQ, LDD, a.q.head(b, h), a.q.st, a.q.sd, i0, a.Tq, a.dact);
  load_rows<BQ, D, NT>(sdO, LDD, a.dout.head(b, h), a.dout.st, a.dout.sd, i0, a.Tq, a.dact);
  for (int t = threadIdx.x; t < BQ; t += NT) sRs[t] = doc_row_start(a, b, i0 + t);

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
  // Under a document mask the walk skips the tiles before the first row's document. (Skipped
  // with `continue` from 0 rather than started at the first tile: with a variable start ptxas
  // spilled this kernel, which runs at 254 registers.)
  const int kfirst = doc_first_key<BK>(a, b, i0);
  for (int k0 = 0; k0 < kend; k0 += BK) {
    if (k0 < kfirst) continue;
    // The previous pass's reads of sK and sdS are done (and sQ, sdO, sRs are complete on the first).
    __syncthreads();
    load_rows<BK, D, NT>(sK, LDD, a.k.head(b, hk), a.k.st, a.k.sd, k0, a.Tk, a.dact);
    load_rows<BK, D, NT>(sV, LDD, a.v.head(b, hk), a.v.st, a.v.sd, k0, a.Tk, a.dact);
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
        const bool visible = i < a.Tq && j < a.Tk && !(a.causal && j > i) && j >= sRs[ir];
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

}  // namespace

template <class T, int D>
void fma_forward(const Args<T>& a, int64_t BH, cudaStream_t stream, const char* name) {
  using A = acc_t<T>;
  using Tl = Tiles<A, D>;
  constexpr size_t smem = forward_smem<A, D, Tl::fwd_bq, Tl::fwd_bk>();
  static_assert(smem <= kMaxSmem);
  const int64_t Tq = a.Tq;
  const int64_t nqt = (Tq + Tl::fwd_bq - 1) / Tl::fwd_bq;
  launch(attention_forward_kernel<T, D, Tl::fwd_bq, Tl::fwd_bk, Tl::fwd_ty>, nqt * BH, Tl::fwd_ty * kTX, smem, stream,
         a, name);
}

template <class T, int D>
void fma_backward(const Args<T>& a, int64_t BH, cudaStream_t stream, const char* name) {
  using A = acc_t<T>;
  using Tl = Tiles<A, D>;
  constexpr size_t kv_smem = backward_kv_smem<A, D, Tl::kv_bk, Tl::kv_bq>();
  constexpr size_t q_smem = backward_q_smem<A, D, Tl::q_bq, Tl::q_bk>();
  static_assert(kv_smem <= kMaxSmem && q_smem <= kMaxSmem);
  const int64_t Tq = a.Tq, Tk = a.Tk;
  const int64_t nkt = (Tk + Tl::kv_bk - 1) / Tl::kv_bk;
  launch(attention_backward_kv_kernel<T, D, Tl::kv_bk, Tl::kv_bq, Tl::kv_ty>, nkt * a.BHkv, Tl::kv_ty * kTX, kv_smem,
         stream, a, name);
  const int64_t nqt = (Tq + Tl::q_bq - 1) / Tl::q_bq;
  launch(attention_backward_q_kernel<T, D, Tl::q_bq, Tl::q_bk, Tl::q_ty>, nqt * BH, Tl::q_ty * kTX, q_smem, stream, a,
         name);
}

// The instances attention.cu calls: every floating type (bf16 and f16 under
// FT_CUDA_ATTENTION_FMA=1) at every compiled head dim.
#define FT_ATTENTION_FMA_INSTANCE(T, D)                                                \
  template void fma_forward<T, D>(const Args<T>&, int64_t, cudaStream_t, const char*); \
  template void fma_backward<T, D>(const Args<T>&, int64_t, cudaStream_t, const char*);
#define FT_ATTENTION_FMA_INSTANCES(T) \
  FT_ATTENTION_FMA_INSTANCE(T, 32) FT_ATTENTION_FMA_INSTANCE(T, 64) FT_ATTENTION_FMA_INSTANCE(T, 128)
FT_ATTENTION_FMA_INSTANCES(float)
FT_ATTENTION_FMA_INSTANCES(double)
FT_ATTENTION_FMA_INSTANCES(bf16_t)
FT_ATTENTION_FMA_INSTANCES(f16_t)
#undef FT_ATTENTION_FMA_INSTANCES
#undef FT_ATTENTION_FMA_INSTANCE

}  // namespace ft::cuda::attention
