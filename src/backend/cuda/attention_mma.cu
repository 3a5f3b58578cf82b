// Tensor-core kernels of fused attention (the dispatcher is attention.cu): bf16 and f16 inputs,
// unless FT_CUDA_ATTENTION_FMA=1 sends them to attention_fma.cu. The same three-stage algorithm
// as the FMA kernels (see attention.cu) with every tile product on mma.sync.m16n8k16 (16-bit
// operands, f32 accumulators): S = Q K^T, O += P V in the forward; S^T = K Q^T, dZ^T = V dO^T,
// dV += Z^T dO, dK += dS^T Q in the dK/dV kernel; S = Q K^T, dZ = dO V^T, dQ += dS K in the dQ
// kernel. Softmax, lse, Di and dropout stay in f32; only P and dS are rounded to the input type
// to enter their products.
//
// A block is kTcWarps = 4 warps; each warp owns 16 rows of the block's 64-row tile (queries in
// the forward and the dQ kernel, keys in the dK/dV kernel) and the full width of every product
// on them, so softmax statistics and the score -> operand conversion stay in the warp's
// registers.
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
// A document mask (attention.cuh) moves where the forward's and dQ kernel's key walk starts and
// where the dK/dV kernel's query walk ends, and masks scores below each row's document start.
//
// Memory traffic is the FMA kernels': the forward reads each K/V tile once per 64 queries, the
// dK/dV kernel reads Q and dO once per 64 keys, the dQ kernel K and V once per 64 queries.
#include <cstdint>
#include <type_traits>

#include "backend/cuda/attention.cuh"
#include "backend/cuda/common.cuh"

namespace ft::cuda::attention {

namespace {

constexpr int kTcWarps = 4;
constexpr int kTcThreads = 32 * kTcWarps;
constexpr int kTcRows = 16 * kTcWarps;  // rows owned per block: 16 per warp
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

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
  const int b = bh / a.H, h = bh % a.H, hk = h / a.group;
  const int i0 = qt * BQ;
  const int wr = warp * 16;  // this warp's first row in the tile
  const int kend = a.causal ? min(a.Tk, i0 + BQ) : a.Tk;
  // Under a document mask the keys before the first row's document are in earlier documents for
  // every row: the walk starts at the tile holding that start (0 without a mask).
  const int kfirst = doc_first_key<BK>(a, b, i0);
  const int ntiles = (kend - kfirst + BK - 1) / BK;  // >= 1: kfirst <= i0 < kend (Tk >= 1)
  // Keys this warp can see end before min(Tk, its last query + 1) (all of Tk without causal).
  const int wend = a.causal ? min(a.Tk, i0 + wr + 16) : a.Tk;
  // First visible key of rows g and g + 8 (document mask; 0 without).
  const int rs[2] = {doc_row_start(a, b, i0 + wr + g), doc_row_start(a, b, i0 + wr + g + 8)};

  tc_load_rows<BQ, D>(sQ, a.q, b, h, i0, a.Tq, a.dact, a.chunks);
  tc_load_rows<BK, D>(sK, a.k, b, hk, kfirst, a.Tk, a.dact, a.chunks);
  tc_load_rows<BK, D>(sV, a.v, b, hk, kfirst, a.Tk, a.dact, a.chunks);
  cp_async_commit();

  const float sl2 = a.scale * kLog2e;  // scores in log2 units: exp(x * scale) = exp2(x * sl2)
  // Rows g and g + 8 of the warp's 16: running max (log2 units) and running sum.
  float m[2] = {neg_inf<float>(), neg_inf<float>()}, l[2] = {0.0f, 0.0f};
  float o[ND][4];
#pragma unroll
  for (int n = 0; n < ND; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;

  for (int kt = 0; kt < ntiles; ++kt) {
    const int k0 = kfirst + kt * BK, buf = kt & 1;
    if (kt + 1 < ntiles) {
      // Buffer buf ^ 1 was last read in iteration kt - 1, which ended with __syncthreads.
      tc_load_rows<BK, D>(sK + (buf ^ 1) * BK * LD, a.k, b, hk, k0 + BK, a.Tk, a.dact, a.chunks);
      tc_load_rows<BK, D>(sV + (buf ^ 1) * BK * LD, a.v, b, hk, k0 + BK, a.Tk, a.dact, a.chunks);
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
        const bool visible = j < a.Tk && !(a.causal && j > i) && j >= rs[e >> 1];
        s[n][e] = visible ? s[n][e] * sl2 : neg_inf<float>();
        mx[e >> 1] = fmaxf(mx[e >> 1], s[n][e]);
      }
    float shift[2], alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      const float m_new = fmaxf(m[r], mx[r]);
      // A row with no visible key yet keeps m = -inf (under a document mask, a row whose
      // document starts in a later tile): shift by 0 so exp2(-inf) = 0, not NaN.
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
  return static_cast<size_t>(2 * kTcRows + 4 * BQ) * tc_ld<D>() * 2 + static_cast<size_t>(4 * BQ) * sizeof(float) +
         static_cast<size_t>(2 * BQ) * sizeof(int);
}

// dK and dV of one (b, KV head, 64 keys), each warp 16 keys, looping over the query tiles of BQ
// of every query head in the KV head's group, head after head, as one sequence of tiles
// (double-buffered Q, dO: the next head's first tile loads while the last one is used). Scores are computed transposed
// (S^T = K Q^T, rows are keys) so that Z^T and dS^T are the A operands of dV += Z^T dO and dK += dS^T Q straight from
// registers.
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
  int* sSt = reinterpret_cast<int*>(sDi + 2 * BQ);          // [2][BQ]: first visible key (document mask)

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t4 = lane % 4;
  const int bkv = blockIdx.x % a.BHkv;
  const int kt = static_cast<int>(blockIdx.x / a.BHkv);  // causal: the first key tiles are the heaviest
  const int b = bkv / a.Hkv, hk = bkv % a.Hkv;
  const int j0 = kt * BK;
  const int wr = warp * 16;
  const float sl2 = a.scale * kLog2e;

  // Queries before j0 see none of these keys: start at the query tile holding row j0; under a
  // document mask, queries from the end of the last key's document on see none either. Step `it`
  // of the loop is query head hk * group + it / per_head, tile qstart + (it % per_head) * BQ.
  const int qstart = a.causal ? (j0 / BQ) * BQ : 0;
  const int qend = doc_query_end<BK>(a, b, j0);
  const int per_head = qstart < qend ? (qend - qstart + BQ - 1) / BQ : 0;
  const int steps = per_head * a.group;
  auto head_bh = [&](int it) { return b * a.H + hk * a.group + it / per_head; };
  auto tile_i0 = [&](int it) { return qstart + (it % per_head) * BQ; };

  // Step it's Q and dO (cp.async or element loads) and lse, Di (element loads) into buf.
  auto load_q_tile = [&](int it, int buf) {
    const int bh = head_bh(it), i0 = tile_i0(it), h = bh % a.H;
    const int64_t row0 = static_cast<int64_t>(bh) * a.Tq;
    tc_load_rows<BQ, D>(sQ + buf * BQ * LD, a.q, b, h, i0, a.Tq, a.dact, a.chunks);
    tc_load_rows<BQ, D>(sdO + buf * BQ * LD, a.dout, b, h, i0, a.Tq, a.dact, a.chunks);
    for (int t = threadIdx.x; t < BQ; t += kTcThreads) {
      const bool in = i0 + t < a.Tq;
      sL[buf * BQ + t] = in ? a.lse[row0 + i0 + t] * kLog2e : 0.0f;
      sDi[buf * BQ + t] = in ? a.delta[row0 + i0 + t] : 0.0f;
      sSt[buf * BQ + t] = doc_row_start(a, b, i0 + t);
    }
  };

  tc_load_rows<BK, D>(sK, a.k, b, hk, j0, a.Tk, a.dact, a.chunks);
  tc_load_rows<BK, D>(sV, a.v, b, hk, j0, a.Tk, a.dact, a.chunks);
  if (steps > 0) load_q_tile(0, 0);
  cp_async_commit();

  float dk[ND][4], dv[ND][4];
#pragma unroll
  for (int n = 0; n < ND; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[n][e] = dv[n][e] = 0.0f;

  for (int it = 0; it < steps; ++it) {
    const int buf = it & 1, bh = head_bh(it), i0 = tile_i0(it);
    // Buffer buf ^ 1 was last read in the previous iteration, which ended with __syncthreads.
    if (it + 1 < steps) load_q_tile(it + 1, buf ^ 1);
    cp_async_commit();  // possibly empty: keeps "all but the newest group" = this tile's
    cp_async_wait<1>();
    // This tile's (and, first, sK's and sV's) copies and stores are visible to every thread.
    __syncthreads();
    const T* qS = sQ + buf * BQ * LD;
    const T* doS = sdO + buf * BQ * LD;
    const float* lS = sL + buf * BQ;
    const float* diS = sDi + buf * BQ;
    const int* stS = sSt + buf * BQ;

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
        const bool visible = i < a.Tq && j < a.Tk && !(a.causal && j > i) && j >= stS[ic];
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
    const int64_t row = static_cast<int64_t>(bkv) * a.Tk + j;
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
  const int b = bh / a.H, h = bh % a.H, hk = h / a.group;
  const int i0 = qt * BQ;
  const int wr = warp * 16;
  const int64_t row0 = static_cast<int64_t>(bh) * a.Tq;
  const float sl2 = a.scale * kLog2e;
  const int kend = a.causal ? min(a.Tk, i0 + BQ) : a.Tk;
  const int kfirst = doc_first_key<BK>(a, b, i0);    // as in the forward
  const int ntiles = (kend - kfirst + BK - 1) / BK;  // >= 1
  const int wend = a.causal ? min(a.Tk, i0 + wr + 16) : a.Tk;
  const int rs[2] = {doc_row_start(a, b, i0 + wr + g), doc_row_start(a, b, i0 + wr + g + 8)};

  tc_load_rows<BQ, D>(sQ, a.q, b, h, i0, a.Tq, a.dact, a.chunks);
  tc_load_rows<BQ, D>(sdO, a.dout, b, h, i0, a.Tq, a.dact, a.chunks);
  tc_load_rows<BK, D>(sK, a.k, b, hk, kfirst, a.Tk, a.dact, a.chunks);
  tc_load_rows<BK, D>(sV, a.v, b, hk, kfirst, a.Tk, a.dact, a.chunks);
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
    const int k0 = kfirst + kt * BK, buf = kt & 1;
    if (kt + 1 < ntiles) {
      // Buffer buf ^ 1 was last read in iteration kt - 1, which ended with __syncthreads.
      tc_load_rows<BK, D>(sK + (buf ^ 1) * BK * LD, a.k, b, hk, k0 + BK, a.Tk, a.dact, a.chunks);
      tc_load_rows<BK, D>(sV + (buf ^ 1) * BK * LD, a.v, b, hk, k0 + BK, a.Tk, a.dact, a.chunks);
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
        const bool visible = i < a.Tq && j < a.Tk && !(a.causal && j > i) && j >= rs[r];
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

}  // namespace

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
  launch(attention_backward_kv_tc_kernel<T, D, Tc::kv_bq, DROPOUT>, nkt * a.BHkv, kTcThreads, kv_smem, stream, a, name);
  const int64_t nqt = (a.Tq + kTcRows - 1) / kTcRows;
  launch(attention_backward_q_tc_kernel<T, D, Tc::q_bk, DROPOUT>, nqt * BH, kTcThreads, q_smem, stream, a, name);
}

// The instances attention.cu calls: bf16 and f16 at every compiled head dim, with and without
// dropout.
#define FT_ATTENTION_TC_INSTANCE(T, D, DROPOUT)                                                \
  template void tc_forward<T, D, DROPOUT>(const Args<T>&, int64_t, cudaStream_t, const char*); \
  template void tc_backward<T, D, DROPOUT>(const Args<T>&, int64_t, cudaStream_t, const char*);
#define FT_ATTENTION_TC_INSTANCES(T, D) FT_ATTENTION_TC_INSTANCE(T, D, false) FT_ATTENTION_TC_INSTANCE(T, D, true)
FT_ATTENTION_TC_INSTANCES(bf16_t, 32)
FT_ATTENTION_TC_INSTANCES(bf16_t, 64)
FT_ATTENTION_TC_INSTANCES(bf16_t, 128)
FT_ATTENTION_TC_INSTANCES(f16_t, 32)
FT_ATTENTION_TC_INSTANCES(f16_t, 64)
FT_ATTENTION_TC_INSTANCES(f16_t, 128)
#undef FT_ATTENTION_TC_INSTANCES
#undef FT_ATTENTION_TC_INSTANCE

}  // namespace ft::cuda::attention
