// Tiled attention kernels; the algorithm is described in attention.h. Implementation notes:
// - f32 tiles (also bf16/f16, widened) are multiplied with oneDNN's dnnl_sgemm, which picks its
//   AVX2/AVX-512 kernels from the CPU's feature bits. OpenBLAS picks kernels by CPU model and on
//   virtualised CPUs reporting a generic model falls back to SSE3 ("Prescott") kernels, far
//   slower (docs/PERF.md). f64 (used for checking) goes through cblas_dgemm. Inside the parallel_for both
//   run single-threaded on the calling pool thread (nested OpenMP regions are serialised, and
//   the tiles are below OpenBLAS's threading threshold), so threads never oversubscribe cores.
// - On AVX-512 CPUs the f32 tile products (f32 inputs; on the bf16 path the ones that stay f32)
//   run on attention_tiles.h's register-blocked kernels instead: at these sizes a library GEMM
//   spends a large share of each call outside the multiply. Those kernels read their right operand
//   as dense rows, so Q K^T and dO V^T take K and V transposed into key blocks of [D, Bk]
//   (TransposedBlocks below), built once per (b, KV head) and thread, or task.
// - f32/f64 operands whose last dimension is dense are handed to the GEMM in place (any B/H/T
//   strides: the row stride becomes the leading dimension); other layouts and bf16/f16 are
//   packed tile by tile into a dense compute-type buffer (bf16/f16 widened to f32).
// - bf16, where the CPU multiplies bf16 faster than f32 (linalg.h's half_gemm_path() is onednn:
//   AVX512-BF16 or AMX) and has AVX512-BF16: the products of two bf16 tensors, Q K^T and dO V^T,
//   run on attention_tiles.h's vdpbf16ps kernel (bf16 products are exact in f32; the sums are
//   f32), with K and V in pair blocks (PairedBlocks below). Every product with a computed operand
//   (P V, dV += Z^T dO, dS^T Q, dS K) stays in f32 on widened tiles: the backward differences dO
//   V^T with Di = rowsum(dO * O), and rounding P (hence O) or dS to bf16 moved single dQ elements
//   by 20-30% in the parity case sdpa_causal_q_gt_k_bf16. Otherwise (f16, or bf16 where f32 FMA
//   is as fast) bf16 is widened and every product is f32.
// - exp is a branch-free polynomial (Cephes' expf, ~1 ulp) that the compiler vectorises; the
//   libm call would dominate the run time, since there is one exp per score but only 4*D flops.
#include "backend/cpu/attention.h"

#include <cblas.h>
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "backend/cpu/attention_tiles.h"
#include "backend/cpu/copy.h"
#include "backend/cpu/dispatch.h"
#include "backend/cpu/fast_exp.h"
#include "backend/cpu/isa.h"
#include "backend/cpu/linalg.h"
#include "fasttrain/parallel.h"
#include "fasttrain/random.h"

namespace ft::cpu {

namespace {

// Flops below which a parallel_for chunk is not worth waking another thread for.
constexpr int64_t kMinChunkFlops = 1 << 18;

inline int64_t grain_for(int64_t flops_per_task) {
  return std::max<int64_t>(1, kMinChunkFlops / std::max<int64_t>(flops_per_task, 1));
}

// Rows (or keys) per group of a tile that crosses the causal diagonal, on the AVX-512 path: each
// group is multiplied over only the part of the tile its rows see (forward_typed, backward_typed).
constexpr int64_t kDiagonalRows = 16;

// Backward splits each (b, h)'s key blocks into groups until there are this many tasks.
constexpr int64_t kMinBackwardTasks = 8;

int64_t g_block_q_override = 0;
int64_t g_block_k_override = 0;

struct Blocks {
  int64_t q, k;
};

enum class Pass { Forward, Backward };

Blocks choose_blocks(int64_t D, Pass pass) {
  // 64 x 64 tiles at D <= 64 are 16 KiB of f32 each: Q, K, V, S and the accumulator fit in L2
  // together. Wider heads shrink the key block to keep that footprint (and, for f64, to stay
  // under OpenBLAS's threading threshold of M*N*K = 64^3). The forward keeps fewer tiles alive
  // (no dS, dK, dV) and takes twice the keys per block: half the products and half the per-row
  // softmax bookkeeping per score (docs/PERF.md).
  Blocks b{64, pass == Pass::Forward ? 128 : 64};
  if (D > 64) b.k = std::max<int64_t>(8, (b.k * 64 / D) / 8 * 8);
  if (g_block_q_override > 0) b.q = g_block_q_override;
  if (g_block_k_override > 0) b.k = g_block_k_override;
  return b;
}

inline void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                 const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  const dnnl_status_t st = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  FT_CHECK(st == dnnl_success, "scaled_dot_product_attention: dnnl_sgemm failed with status ", static_cast<int>(st));
}
inline void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const double* A, int64_t lda,
                 const double* B, int64_t ldb, double beta, double* C, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B,
              ldb, beta, C, ldc);
}

// Whether bf16 attention multiplies its bf16 operands as they are (Q K^T and dO V^T, on
// attention_tiles.h's vdpbf16ps kernel: see the top of the file) rather than widened to f32:
// where linalg.h's half_gemm_path(), the one place that decides how bf16 is multiplied, says the
// CPU multiplies bf16 faster than f32, and the CPU has AVX512-BF16.
template <class T>
bool bf16_dot_products() {
  if constexpr (std::is_same_v<T, bf16>)
    return half_gemm_path() == HalfGemmPath::Onednn && selected_cpu_isa() >= CpuIsa::Avx512Bf16;
  return false;
}

// A bf16 operand's values as their bits, as attention_tiles::product_bf16 reads them (null for
// other types, which never reach it).
template <class T>
const uint16_t* bits_of(const T* p) {
  if constexpr (std::is_same_v<T, bf16>) return reinterpret_cast<const uint16_t*>(p);
  return nullptr;
}

// A tile of an operand in the compute type (c) and, where bf16 is multiplied as it is, in bf16
// (h), each with its leading dimension; a form not needed is null.
template <class T, class C>
struct Tile {
  const C* c = nullptr;
  int64_t ldc = 0;
  const T* h = nullptr;
  int64_t ldh = 0;
};

// out[M, N] (+)= alpha op(A) op(B) on the compute-type tiles.
template <class T, class C>
void tile_product(bool ta, bool tb, int64_t M, int64_t N, int64_t K, C alpha, const Tile<T, C>& a, const Tile<T, C>& b,
                  bool accumulate, C* out, int64_t ldo) {
  gemm(ta, tb, M, N, K, alpha, a.c, a.ldc, b.c, b.ldc, accumulate ? C(1) : C(0), out, ldo);
}

// Whether the f32 tile products run on attention_tiles.h (top of the file). Read per call: tests
// lower the selected level in-process to check the dnnl_sgemm path on the same machine.
template <class C>
bool avx512_tiles() {
  if constexpr (std::is_same_v<C, float>) return selected_cpu_isa() >= CpuIsa::Avx512;
  return false;
}

// C[M, N] (+)= alpha op(A) B on attention_tiles.h, op(A) = A (row stride lda) or A^T (`ta`: A is
// [K, M] with leading dimension lda); B dense rows [K, N] with ldb.
inline void avx512_product(bool ta, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                           const float* B, int64_t ldb, bool accumulate, float* C, int64_t ldc) {
  attention_tiles::product(M, N, K, alpha, A, ta ? 1 : lda, ta ? lda : 1, B, ldb, accumulate, C, ldc);
}

template <class C>
C row_max(const C* x, int64_t n) {
  C part[8];
  for (int j = 0; j < 8; ++j) part[j] = -std::numeric_limits<C>::infinity();
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int u = 0; u < 8; ++u) part[u] = x[j + u] > part[u] ? x[j + u] : part[u];
  C m = -std::numeric_limits<C>::infinity();
  for (int u = 0; u < 8; ++u) m = part[u] > m ? part[u] : m;
  for (; j < n; ++j) m = x[j] > m ? x[j] : m;
  return m;
}

// x[j] = exp(x[j] - shift); returns the sum.
template <class C>
C exp_shift_sum(C* x, int64_t n, C shift) {
  C part[8] = {};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int u = 0; u < 8; ++u) {
      x[j + u] = fast_exp(x[j + u] - shift);
      part[u] += x[j + u];
    }
  C s = 0;
  for (int u = 0; u < 8; ++u) s += part[u];
  for (; j < n; ++j) {
    x[j] = fast_exp(x[j] - shift);
    s += x[j];
  }
  return s;
}

// mult[j] = 1/(1-p) if element idx0 + j is kept, else 0 (see attention.h for the rule).
template <class C>
void dropout_multipliers(uint64_t key, uint64_t base, uint64_t idx0, int64_t n, float keep_prob, C inv_keep, C* mult) {
  uint64_t idx = idx0;
  int64_t j = 0;
  while (j < n) {
    const Philox4 w = philox4x32(key, base + idx / 4);
    for (unsigned lane = idx % 4; lane < 4 && j < n; ++lane, ++j, ++idx)
      mult[j] = uniform_from_word(w.v[lane]) < keep_prob ? inv_keep : C(0);
  }
}

// A [B, H, T, D] operand with arbitrary strides, read as row blocks of one (b, h).
template <class T>
struct Operand {
  const T* base;
  int64_t sb, sh, st, sd, D;
  explicit Operand(const Tensor& t)
      : base(static_cast<const T*>(t.raw_data())),
        sb(t.stride(0)),
        sh(t.stride(1)),
        st(t.stride(2)),
        sd(t.stride(3)),
        D(t.size(3)) {}

  const T* row(int64_t b, int64_t h, int64_t t) const { return base + b * sb + h * sh + t * st; }

  // Rows [t0, t0+n) as a dense-row matrix (leading dimension `ld`): in place when possible,
  // otherwise converted into `scratch` (n * D elements).
  template <class C>
  const C* rows(int64_t b, int64_t h, int64_t t0, int64_t n, C* scratch, int64_t& ld) const {
    const T* p = row(b, h, t0);
    if constexpr (std::is_same_v<T, C>) {
      if (sd == 1 && (st >= D || n == 1)) {
        ld = n == 1 ? D : st;
        return p;
      }
    }
    ld = D;
    convert_rows(b, h, t0, n, scratch);
    return scratch;
  }

  // Rows [t0, t0+n) converted into `dst` (n * D elements, dense rows).
  template <class C>
  void convert_rows(int64_t b, int64_t h, int64_t t0, int64_t n, C* dst) const {
    const T* p = row(b, h, t0);
    for (int64_t r = 0; r < n; ++r, dst += D) {
      const T* src = p + r * st;
      if (sd == 1) {
        convert_run(src, dst, D);
      } else {
        for (int64_t d = 0; d < D; ++d) dst[d] = static_cast<C>(src[d * sd]);
      }
    }
  }

  // Rows [t0, t0+n) as a Tile: in the compute type when `c`, in bf16 (T itself) when `h`.
  template <class C>
  Tile<T, C> tile(int64_t b, int64_t h, int64_t t0, int64_t n, bool c, bool h16, C* cbuf, T* hbuf) const {
    Tile<T, C> t;
    if (c) t.c = rows<C>(b, h, t0, n, cbuf, t.ldc);
    if (h16) t.h = rows<T>(b, h, t0, n, hbuf, t.ldh);
    return t;
  }
};

// A task's buffers, from the engine's caching allocator, which keeps freed blocks for the next
// call of the same size: made as std::vectors per call, the few hundred KiB a task needs at long
// contexts (TransposedBlocks, the backward's dK and dV sums) were mapped by malloc and unmapped on
// return every time, so every page faulted again and every munmap of a multi-threaded process
// interrupted the other cores to drop the pages from their TLBs. On the 2-core VM of docs/PERF.md
// that was about a tenth of smollm-135m's whole training step. Contents are unspecified (nothing
// reads a buffer before writing it), and the blocks count in the allocator's statistics and limit.
class TaskBuffers {
 public:
  template <class E>
  E* get(int64_t n) {
    if (n <= 0) return nullptr;
    held_.push_back(empty({n}, TensorOptions(dtype_of<E>::value)));
    return held_.back().template data<E>();
  }

 private:
  std::vector<Tensor> held_;
};

// The rows of one (b, h) of an operand in one form (the compute type, or bf16 itself), made once
// per (b, h) as they are first needed and then read as tiles: a task walks the same keys (the
// forward's K and V) or queries (the backward's Q and dO) once per block of the other side, and
// converting them per tile pair would repeat the conversion that many times. In place (no copy)
// when the operand already has dense rows of that type.
template <class T, class C>
class RowsOf {
 public:
  RowsOf(const Operand<T>& op, int64_t rows, TaskBuffers& buffers)
      : op_(op), in_place_(std::is_same_v<T, C> && op.sd == 1 && op.st >= op.D) {
    if (!in_place_) buf_ = buffers.get<C>(rows * op.D);
  }

  // Rows [t0, t0 + n) of (b, h) as a dense-row matrix; sets its leading dimension.
  const C* rows(int64_t b, int64_t h, int64_t t0, int64_t n, int64_t& ld) {
    if (in_place_) {
      ld = op_.st;
      return reinterpret_cast<const C*>(op_.row(b, h, t0));
    }
    if (b != b_ || h != h_) b_ = b, h_ = h, done_ = 0;
    if (done_ < t0 + n) {
      op_.template convert_rows<C>(b, h, done_, t0 + n - done_, buf_ + done_ * op_.D);
      done_ = t0 + n;
    }
    ld = op_.D;
    return buf_ + t0 * op_.D;
  }

 private:
  const Operand<T>& op_;
  bool in_place_;
  C* buf_ = nullptr;
  int64_t b_ = -1, h_ = -1, done_ = 0;
};

// The two forms of a block of K or V rows that attention_tiles.h reads as the right operand of
// Q K^T or dO V^T (KeyBlocks below). Each is `words` words per row of the block, written by
// fill(op, b, h, k0, nk, bk, dst) for rows [k0, k0 + nk) with leading dimension bk.
// Transposed: [D, bk] f32, row j's values down column j (attention_tiles::product).
struct Transposed {
  using Word = float;
  using Allocated = float;  // the tensor dtype TaskBuffers allocates the words as
  static int64_t words(int64_t D) { return D; }
  template <class T>
  static void fill(const Operand<T>& op, int64_t b, int64_t h, int64_t k0, int64_t nk, int64_t bk, float* dst) {
    const T* src = op.row(b, h, k0);
    // Row by row: each source row is read once, its D values scattered down one column.
    for (int64_t j = 0; j < nk; ++j) {
      const T* r = src + j * op.st;
      for (int64_t d = 0; d < op.D; ++d) dst[d * bk + j] = static_cast<float>(r[d * op.sd]);
    }
  }
};
// Paired (bf16 only): ceil(D / 2) pair rows of bk words, word j of pair row p holding row j's
// values 2p and 2p + 1 (attention_tiles::product_bf16).
struct Paired {
  using Word = uint32_t;
  using Allocated = int32_t;
  static int64_t words(int64_t D) { return (D + 1) / 2; }
  template <class T>
  static void fill(const Operand<T>& op, int64_t b, int64_t h, int64_t k0, int64_t nk, int64_t bk, uint32_t* dst) {
    if constexpr (std::is_same_v<T, bf16>) {
      for (int64_t j = 0; j < nk; ++j) {
        const bf16* r = op.row(b, h, k0 + j);
        for (int64_t p = 0; p < words(op.D); ++p) {
          const uint32_t hi = 2 * p + 1 < op.D ? r[(2 * p + 1) * op.sd].bits : 0u;
          dst[p * bk + j] = r[2 * p * op.sd].bits | hi << 16;
        }
      }
    } else {
      FT_FAIL("attention: bf16 pair blocks asked of an operand that is not bf16");
    }
  }
};

// One (b, h)'s rows of K or V in blocks of `bk` rows in one of the forms above: block kb holds rows
// [kb * bk, kb * bk + bk). Each block is made when first asked for and kept until another (b, h)
// is asked for: a task walks each key block once per query block (forward) or head (backward).
template <class T, class Form>
class KeyBlocks {
 public:
  using Word = typename Form::Word;
  KeyBlocks(const Operand<T>& op, int64_t T_, int64_t bk, bool used, TaskBuffers& buffers)
      : op_(op), T_(T_), bk_(bk), block_words_(bk * Form::words(op.D)) {
    if (!used) return;
    const int64_t nkb = (T_ + bk - 1) / bk;
    buf_ = reinterpret_cast<Word*>(buffers.get<typename Form::Allocated>(nkb * block_words_));
    made_.assign(static_cast<size_t>(nkb), false);
  }

  const Word* block(int64_t b, int64_t h, int64_t kb) {
    if (b != b_ || h != h_) {
      b_ = b, h_ = h;
      std::fill(made_.begin(), made_.end(), false);
    }
    Word* dst = buf_ + kb * block_words_;
    if (!made_[kb]) {
      const int64_t k0 = kb * bk_;
      Form::fill(op_, b, h, k0, std::min(bk_, T_ - k0), bk_, dst);
      made_[kb] = true;
    }
    return dst;
  }

 private:
  const Operand<T>& op_;
  int64_t T_, bk_, block_words_;
  Word* buf_ = nullptr;
  std::vector<bool> made_;
  int64_t b_ = -1, h_ = -1;
};
template <class T>
using TransposedBlocks = KeyBlocks<T, Transposed>;
template <class T>
using PairedBlocks = KeyBlocks<T, Paired>;

// Causal order of a (b, h)'s query blocks in the forward: later blocks see more keys, and
// parallel_for hands each thread one contiguous range, so pair cheap and expensive blocks (0,
// n-1, 1, n-2, ...) and a range's work grows evenly with its length.
inline int64_t zigzag(int64_t t, int64_t n) { return (t % 2 == 0) ? t / 2 : n - 1 - t / 2; }

template <class T>
void forward_typed(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p, const Tensor& out,
                   const Tensor& lse, const Tensor& out_f32) {
  using C = compute_t<T>;
  const int64_t B = q.size(0), H = q.size(1), Tq = q.size(2), Tk = k.size(2), D = q.size(3);
  const int64_t group = H / k.size(1);  // query heads per KV head (grouped-query attention)
  T* O = out.data<T>();
  C* L = lse.data<C>();
  float* O32 = out_f32.defined() ? out_f32.data<float>() : nullptr;
  if (Tq == 0 || D == 0) {  // D == 0: every score is 0, so the logsumexp is log(Tk)
    for (int64_t i = 0; i < B * H * Tq; ++i) L[i] = std::log(static_cast<C>(Tk));
    return;
  }
  if (Tk == 0) {  // softmax over nothing: the weighted sum is empty
    for (int64_t i = 0; i < out.numel(); ++i) O[i] = static_cast<T>(C(0));
    if (O32) std::fill(O32, O32 + out.numel(), 0.0f);
    for (int64_t i = 0; i < B * H * Tq; ++i) L[i] = -std::numeric_limits<C>::infinity();
    return;
  }
  const Operand<T> Q(q), K(k), V(v);
  const Blocks bl = choose_blocks(D, Pass::Forward);
  const int64_t bq = bl.q, bk = bl.k;
  const int64_t nqb = (Tq + bq - 1) / bq;
  const int64_t ntasks = B * H * nqb;
  const C scale = static_cast<C>(p.scale);
  const bool dropout = p.dropout_p > 0;
  const float keep_prob = static_cast<float>(1.0 - p.dropout_p);
  const C inv_keep = static_cast<C>(1.0 / (1.0 - p.dropout_p));
  constexpr C kNegInf = -std::numeric_limits<C>::infinity();
  // Document mask: the first key each query sees (attention.h).
  const int32_t* doc_start = p.doc_starts.defined() ? p.doc_starts.data<int32_t>() : nullptr;

  // Two GEMMs of bq x Tk x D per task (half of Tk under causal masking, on average), of fewer rows
  // when Tq is shorter than a block: a decoding step's single query row must not count as bq rows,
  // or its few heads go to other threads for microseconds of work (measured 2026-12-05, 2 threads
  // on a loaded 2-core machine: one row over 40 keys 3.5 us inline, about 5 ms split, waiting for
  // the second thread to be scheduled).
  const int64_t task_flops = 4 * std::min(bq, Tq) * D * (p.causal ? (Tk + 1) / 2 : Tk);
  const bool fast = avx512_tiles<C>();        // the f32 products on attention_tiles.h
  const bool dot16 = bf16_dot_products<T>();  // and Q K^T on its vdpbf16ps kernel (then fast too)
  parallel_for(0, ntasks, grain_for(task_flops), [&](int64_t t0, int64_t t1) {
    TaskBuffers buffers;
    C* const qbuf = buffers.get<C>(bq * D);
    C* const s = buffers.get<C>(bq * bk);
    C* const acc = buffers.get<C>(bq * D);
    C* const m = buffers.get<C>(bq);
    C* const l = buffers.get<C>(bq);
    C* const mult = buffers.get<C>(bk);
    float* const lanes = buffers.get<float>(fast ? bq * 16 : 0);  // online_softmax_tile's partial sums of l
    T* const q16 = buffers.get<T>(dot16 ? bq * D : 0);
    // K in the form Q K^T takes (transposed key blocks for attention_tiles.h, f32 or bf16 pairs),
    // V in the compute type (P V is f32 on every path).
    RowsOf<T, C> Kc(K, fast ? 0 : Tk, buffers), Vc(V, Tk, buffers);
    TransposedBlocks<T> KT(K, Tk, bk, fast && !dot16, buffers);
    PairedBlocks<T> KP(K, Tk, bk, dot16, buffers);
    for (int64_t t = t0; t < t1; ++t) {
      // (b, h)-major, so a thread's range meets each (b, h)'s keys and values in one run (and the query
      // heads sharing a KV head, which are neighbours, meet its keys and values in one run too).
      const int64_t bh = t / nqb, qb = p.causal ? zigzag(t % nqb, nqb) : t % nqb, b = bh / H, h = bh % H;
      const int64_t hk = h / group;  // the KV head query head h reads
      const int64_t i0 = qb * bq, nq = std::min(bq, Tq - i0);
      const Tile<T, C> Qt = Q.template tile<C>(b, h, i0, nq, !dot16, dot16, qbuf, q16);
      std::fill(m, m + bq, kNegInf);
      std::fill(l, l + bq, C(0));
      std::fill(acc, acc + bq * D, C(0));
      std::fill(lanes, lanes + (fast ? bq * 16 : 0), 0.0f);
      // Keys past the last query of the block are masked for every row: skip those blocks.
      const int64_t kend = p.causal ? std::min(Tk, i0 + nq) : Tk;
      // Document mask: the rows' first visible keys, non-decreasing, so keys before the first
      // row's are in earlier documents for every row: start at the key block holding it. (Blocks
      // stay aligned to multiples of bk, so a window of one document runs exactly the causal path.)
      const int32_t* rs = doc_start ? doc_start + b * Tq + i0 : nullptr;
      const int64_t kbegin = rs ? rs[0] / bk * bk : 0;
      for (int64_t k0 = kbegin; k0 < kend; k0 += bk) {
        const int64_t nk = std::min(bk, kend - k0);
        Tile<T, C> Kt, Vt;
        Vt.c = Vc.rows(b, hk, k0, nk, Vt.ldc);
        const bool crosses_diagonal = p.causal && k0 + nk - 1 > i0;
        // On the AVX-512 path a tile crossing the diagonal is multiplied in groups of rows, each
        // over the keys its last row sees (visible_keys), so the masked triangle is mostly not
        // computed: at T = 256 it was a fifth of the products. The columns left out are masked
        // below like the rest of the triangle.
        auto visible_keys = [&](int64_t r1) {
          return crosses_diagonal ? std::clamp<int64_t>(i0 + r1 - k0, 0, nk) : nk;
        };
        if constexpr (std::is_same_v<C, float>) {
          if (fast) {
            const float* kt = dot16 ? nullptr : KT.block(b, hk, k0 / bk);
            const uint32_t* kp = dot16 ? KP.block(b, hk, k0 / bk) : nullptr;
            for (int64_t r0 = 0; r0 < nq; r0 += kDiagonalRows) {
              const int64_t r1 = std::min(nq, r0 + kDiagonalRows), nc = visible_keys(r1);
              if (nc > 0 && dot16)
                attention_tiles::product_bf16(r1 - r0, nc, D, scale, bits_of(Qt.h + r0 * Qt.ldh), Qt.ldh, kp, bk, false,
                                              s + r0 * bk, bk);
              else if (nc > 0)
                avx512_product(false, r1 - r0, nc, D, scale, Qt.c + r0 * Qt.ldc, Qt.ldc, kt, bk, false, s + r0 * bk,
                               bk);
            }
          } else {
            Kt.c = Kc.rows(b, hk, k0, nk, Kt.ldc);
            tile_product(false, true, nq, nk, D, scale, Qt, Kt, false, s, bk);
          }
        } else {
          Kt.c = Kc.rows(b, hk, k0, nk, Kt.ldc);
          tile_product(false, true, nq, nk, D, scale, Qt, Kt, false, s, bk);
        }
        // Some row's document starts after k0 (the last row's start is the largest).
        const bool crosses_start = rs && rs[nq - 1] > k0;
        for (int64_t r = 0; r < nq; ++r) {
          C* row = s + r * bk;
          if (crosses_diagonal) {
            const int64_t valid = std::clamp<int64_t>(i0 + r - k0 + 1, 0, nk);
            for (int64_t j = valid; j < nk; ++j) row[j] = kNegInf;
          }
          if (crosses_start) {
            const int64_t first = std::clamp<int64_t>(rs[r] - k0, 0, nk);
            for (int64_t j = 0; j < first; ++j) row[j] = kNegInf;
          }
          if (fast) continue;  // masks only: the tile's softmax step follows, 16 rows at a time
          // Without a document mask the first key block holds key 0, visible to every row, so m
          // is finite from then on. With one, a row whose document starts in a later block sees
          // nothing here: it adds nothing (a zero row of P, alpha 1), and m stays -inf rather
          // than meeting exp(-inf - -inf). Every row sees itself, so l > 0 in the end.
          const C mx = std::max(m[r], row_max(row, nk));
          if (mx == kNegInf) {
            std::fill(row, row + nk, C(0));
            continue;
          }
          const C alpha = fast_exp(m[r] - mx);
          const C sum = exp_shift_sum(row, nk, mx);
          l[r] = l[r] * alpha + sum;
          m[r] = mx;
          if (dropout) {
            const uint64_t idx0 = static_cast<uint64_t>((bh * Tq + i0 + r) * Tk + k0);
            dropout_multipliers(p.philox.key, p.philox.base, idx0, nk, keep_prob, inv_keep, mult);
            for (int64_t j = 0; j < nk; ++j) row[j] *= mult[j];
          }
          if (alpha != C(1)) {
            C* a = acc + r * D;
            for (int64_t d = 0; d < D; ++d) a[d] *= alpha;
          }
        }
        // The tile's softmax step on AVX-512, 16 rows at a time (attention_tiles.h), then dropout.
        if constexpr (std::is_same_v<C, float>) {
          if (fast) {
            attention_tiles::online_softmax_tile(s, bk, nq, nk, m, lanes, acc, D);
            for (int64_t r = 0; dropout && r < nq; ++r) {
              const uint64_t idx0 = static_cast<uint64_t>((bh * Tq + i0 + r) * Tk + k0);
              dropout_multipliers(p.philox.key, p.philox.base, idx0, nk, keep_prob, inv_keep, mult);
              C* row = s + r * bk;
              for (int64_t j = 0; j < nk; ++j) row[j] *= mult[j];
            }
          }
        }
        if constexpr (std::is_same_v<C, float>) {
          if (fast) {
            for (int64_t r0 = 0; r0 < nq; r0 += kDiagonalRows) {
              const int64_t r1 = std::min(nq, r0 + kDiagonalRows), nc = visible_keys(r1);
              if (nc > 0)
                avx512_product(false, r1 - r0, D, nc, 1.0f, s + r0 * bk, bk, Vt.c, Vt.ldc, true, acc + r0 * D, D);
            }
            continue;
          }
        }
        tile_product(false, false, nq, D, nk, C(1), Tile<T, C>{s, bk}, Vt, true, acc, D);
      }
      if constexpr (std::is_same_v<C, float>) {
        if (fast)
          for (int64_t r = 0; r < nq; ++r) l[r] = attention_tiles::lanes_sum(lanes + r * 16);
      }
      for (int64_t r = 0; r < nq; ++r) {
        const C inv = l[r] > 0 ? C(1) / l[r] : C(0);
        const C* a = acc + r * D;
        T* o = O + (bh * Tq + i0 + r) * D;
        for (int64_t d = 0; d < D; ++d) o[d] = static_cast<T>(a[d] * inv);
        if (O32) {
          float* o32 = O32 + (bh * Tq + i0 + r) * D;
          for (int64_t d = 0; d < D; ++d) o32[d] = static_cast<float>(a[d] * inv);
        }
        L[bh * Tq + i0 + r] = l[r] > 0 ? m[r] + std::log(l[r]) : kNegInf;
      }
    }
  });
}

template <class T>
void backward_typed(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                    const Tensor& dout, const AttentionParams& p, const Tensor& dq, const Tensor& dk,
                    const Tensor& dv) {
  using C = compute_t<T>;
  const int64_t B = q.size(0), H = q.size(1), Tq = q.size(2), Tk = k.size(2), D = q.size(3);
  const int64_t BH = B * H, Hkv = k.size(1), BHkv = B * Hkv, group = H / Hkv;
  T* dQ = dq.data<T>();
  T* dK = dk.data<T>();
  T* dV = dv.data<T>();
  if (Tq == 0 || Tk == 0 || D == 0) {
    for (int64_t i = 0; i < dq.numel(); ++i) dQ[i] = static_cast<T>(C(0));
    for (int64_t i = 0; i < dk.numel(); ++i) dK[i] = static_cast<T>(C(0));
    for (int64_t i = 0; i < dv.numel(); ++i) dV[i] = static_cast<T>(C(0));
    return;
  }
  const Operand<T> Q(q), K(k), V(v), dO(dout);
  const C* L = lse.data<C>();
  const Blocks bl = choose_blocks(D, Pass::Backward);
  const int64_t bq = bl.q, bk = bl.k;
  const int64_t nkb = (Tk + bk - 1) / bk;
  const C scale = static_cast<C>(p.scale);
  const bool dropout = p.dropout_p > 0;
  const float keep_prob = static_cast<float>(1.0 - p.dropout_p);
  const C inv_keep = static_cast<C>(1.0 / (1.0 - p.dropout_p));
  const DType cdt = std::is_same_v<C, double> ? DType::F64 : DType::F32;
  // Document mask: each query's first visible key, each key's first query that no longer sees it.
  const int32_t* doc_start = p.doc_starts.defined() ? p.doc_starts.data<int32_t>() : nullptr;
  const int32_t* doc_end = p.doc_ends.defined() ? p.doc_ends.data<int32_t>() : nullptr;

  // Di = rowsum(dO * O) = rowsum(dP * P): the softmax backward's correction term, also with
  // dropout (sum_j dZ_ij Z_ij = dO_i . O_i where Z is the dropped P).
  Tensor delta_t = empty({BH * Tq}, TensorOptions(cdt));
  C* delta = delta_t.data<C>();
  auto row_dots = [&](const auto* O) {
    parallel_for(0, BH * Tq, grain_for(2 * D), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t bh = r / Tq, i = r % Tq;
        const T* g = dO.row(bh / H, bh % H, i);
        const auto* o = O + r * D;
        C s = 0;
        for (int64_t d = 0; d < D; ++d) s += static_cast<C>(g[d * dO.sd]) * static_cast<C>(o[d]);
        delta[r] = s;
      }
    });
  };
  if (out.dtype() == q.dtype()) {
    row_dots(out.data<T>());
  } else {
    FT_CHECK(out.dtype() == DType::F32, "attention_backward: out must be q's dtype or f32");
    row_dots(out.data<float>());
  }

  // Parallel over (b, KV head, group of key blocks): each task owns its dK/dV rows outright and
  // sums into them the query heads that share its KV head (grouped-query attention; one head
  // without), head after head in a fixed order, so no two tasks write one row. dQ sums over key
  // blocks, so every group accumulates into its own dQ partial (groups > 1 only when B*Hkv is too
  // small to keep the threads busy) and the partials are added in a fixed order afterwards. The
  // grouping depends on the shapes only, not on the thread count, so results are bitwise
  // identical for any number of threads.
  // Group 0 accumulates straight into dq when dq is in the compute type. With one group a task
  // owns its query heads' dq rows: it zeroes them itself, or (dq in bf16/f16) sums them in its own
  // compute-type rows and rounds them into dq at a head's end, with no pass over dq before or after.
  // The task count is also made a multiple of 4 where the key blocks allow, so that 2 or 4 threads
  // get equal shares of it (parallel_for hands each thread one contiguous range of tasks, and the
  // snake order below gives every group of a (b, KV head) the same work): smollm-135m's 3 KV heads
  // in 9 tasks left one of 2 threads a third more work than the other.
  int64_t G = std::max<int64_t>(1, (kMinBackwardTasks + BHkv - 1) / BHkv);
  if (G > 1)
    for (int64_t more = G; more < G + 4; ++more)
      if ((BHkv * more) % 4 == 0) {
        G = more;
        break;
      }
  G = std::min(G, nkb);
  // Key block kb belongs to group group_of(kb): in rounds of G blocks, dealt forwards in even rounds
  // and backwards in odd ones. Under causal masking early key blocks have more queries, and the
  // snake order gives every group nearly the same number of query rows (equal when nkb is a
  // multiple of 2 G).
  auto group_of = [G](int64_t kb) {
    const int64_t round = kb / G, pos = kb % G;
    return round % 2 == 0 ? pos : G - 1 - pos;
  };
  constexpr bool in_place = std::is_same_v<T, C>;
  const bool own_dq = !in_place && G == 1;
  const int64_t per_group = BH * Tq * D;
  const int64_t nbuf = G == 1 ? 0 : in_place ? G - 1 : G;
  Tensor dq_partial = empty({nbuf * per_group}, TensorOptions(cdt));
  C* buf = dq_partial.data<C>();
  auto dq_group = [&](int64_t g) -> C* {
    if constexpr (in_place) return g == 0 ? reinterpret_cast<C*>(dQ) : buf + (g - 1) * per_group;
    return buf + g * per_group;
  };

  // Five GEMMs of Tq x (Tk / G) x D per query head of a task (half under causal masking).
  const int64_t task_flops = group * 10 * D * Tq * ((p.causal ? (Tk + 1) / 2 : Tk) + G - 1) / G;
  const bool fast = avx512_tiles<C>();        // the f32 products on attention_tiles.h
  const bool dot16 = bf16_dot_products<T>();  // and Q K^T, dO V^T on its vdpbf16ps kernel (then fast too)
  parallel_for(0, BHkv * G, grain_for(task_flops), [&](int64_t t0, int64_t t1) {
    TaskBuffers buffers;
    C* const kbuf = buffers.get<C>(bk * D);
    C* const vbuf = buffers.get<C>(bk * D);
    C* const P = buffers.get<C>(bq * bk);
    C* const Z = buffers.get<C>(dropout ? bq * bk : 0);
    C* const dS = buffers.get<C>(bq * bk);
    C* const M = buffers.get<C>(dropout ? bq * bk : 0);
    C* const dKacc = buffers.get<C>(Tk * D);
    C* const dVacc = buffers.get<C>(Tk * D);
    C* const dq_own = buffers.get<C>(own_dq ? Tq * D : 0);
    // Q and dO in the compute type (dK += dS^T Q, dV += Z^T dO) and, where bf16 is multiplied as it
    // is, in bf16 (Q K^T, dO V^T).
    RowsOf<T, C> Qc(Q, Tq, buffers), dOc(dO, Tq, buffers);
    RowsOf<T, T> Q16(Q, dot16 ? Tq : 0, buffers), dO16(dO, dot16 ? Tq : 0, buffers);
    // K and V transposed for Q K^T and dO V^T on attention_tiles.h (f32, or bf16 pairs).
    TransposedBlocks<T> KT(K, Tk, bk, fast && !dot16, buffers), VT(V, Tk, bk, fast && !dot16, buffers);
    PairedBlocks<T> KP(K, Tk, bk, dot16, buffers), VP(V, Tk, bk, dot16, buffers);
    std::vector<int64_t> blocks;  // the key blocks of the task's group
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t bkv = t / G, g = t % G, b = bkv / Hkv, hk = bkv % Hkv;
      blocks.clear();
      for (int64_t kb = 0; kb < nkb; ++kb)
        if (group_of(kb) == g) blocks.push_back(kb);
      for (const int64_t kb : blocks) {
        const int64_t k0 = kb * bk, nk = std::min(bk, Tk - k0);
        std::fill(dKacc + k0 * D, dKacc + (k0 + nk) * D, C(0));
        std::fill(dVacc + k0 * D, dVacc + (k0 + nk) * D, C(0));
      }
      for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
        const int64_t bh = b * H + h;
        C* dqg = own_dq ? dq_own : dq_group(g) + bh * Tq * D;
        // Each task zeroes the dQ rows it sums into (its own rows, or its group's partial of this
        // head): every (group, head) pair is one task's, and zeroing them here, just before they
        // are summed into, keeps them in cache rather than a pass over all G partials first.
        std::fill(dqg, dqg + Tq * D, C(0));
        for (const int64_t kb : blocks) {
          const int64_t k0 = kb * bk, nk = std::min(bk, Tk - k0);
          // K in the compute type for dQ += dS K; V for dO V^T where it is not on attention_tiles.h.
          const Tile<T, C> Kt = K.template tile<C>(b, hk, k0, nk, true, false, kbuf, static_cast<T*>(nullptr));
          const Tile<T, C> Vt = V.template tile<C>(b, hk, k0, nk, !fast, false, vbuf, static_cast<T*>(nullptr));
          C* dKa = dKacc + k0 * D;
          C* dVa = dVacc + k0 * D;
          // Query rows before k0 see none of these keys: start at the block holding row k0.
          const int64_t qstart = p.causal ? (k0 / bq) * bq : 0;
          // Document mask: queries from the end of the last key's document on are in later
          // documents than every key of the block (ends never decrease): stop there.
          const int64_t qend = doc_end ? doc_end[b * Tk + k0 + nk - 1] : Tq;
          for (int64_t i0 = qstart; i0 < qend; i0 += bq) {
            const int64_t nq = std::min(bq, Tq - i0);
            Tile<T, C> Qt, dOt;
            Qt.c = Qc.rows(b, h, i0, nq, Qt.ldc);
            dOt.c = dOc.rows(b, h, i0, nq, dOt.ldc);
            if (dot16) {
              Qt.h = Q16.rows(b, h, i0, nq, Qt.ldh);
              dOt.h = dO16.rows(b, h, i0, nq, dOt.ldh);
            }
            // On attention_tiles.h a tile crossing the causal diagonal is multiplied in groups of 16 rows
            // (Q K^T, dO V^T, dS K: each over the keys its last row sees) or 16 keys (Z^T dO, dS^T Q:
            // each over the rows from the first that sees its first key), as in the forward.
            const bool diag = fast && p.causal && k0 + nk - 1 > i0;
            const int64_t step = diag ? kDiagonalRows : std::max(nq, nk);
            auto keys_seen = [&](int64_t r1) { return diag ? std::clamp<int64_t>(i0 + r1 - k0, 0, nk) : nk; };
            auto first_row = [&](int64_t c0) { return diag ? std::clamp<int64_t>(k0 + c0 - i0, 0, nq) : 0; };
            // C[rows, keys] = alpha A B^T in row groups, A the tile a of Q or dO, B^T the key block of K
            // or V (transposed, or bf16 pairs); columns past a group's keys are zeroed (dS reads them,
            // and the masked P there is zero).
            // (Generic, so that only the f32 compute type instantiates it.)
            auto row_groups = [&](float alpha, const auto& a, auto& bt, auto& bp, float* c) {
              const float* kt = dot16 ? nullptr : bt.block(b, hk, kb);
              const uint32_t* kp = dot16 ? bp.block(b, hk, kb) : nullptr;
              for (int64_t r0 = 0; r0 < nq; r0 += step) {
                const int64_t r1 = std::min(nq, r0 + step), nc = keys_seen(r1);
                if (nc > 0 && dot16)
                  attention_tiles::product_bf16(r1 - r0, nc, D, alpha, bits_of(a.h + r0 * a.ldh), a.ldh, kp, bk, false,
                                                c + r0 * bk, bk);
                else if (nc > 0)
                  avx512_product(false, r1 - r0, nc, D, alpha, a.c + r0 * a.ldc, a.ldc, kt, bk, false, c + r0 * bk, bk);
                for (int64_t r = r0; nc < nk && r < r1; ++r) std::fill(c + r * bk + nc, c + r * bk + nk, 0.0f);
              }
            };
            // acc[keys, D] += alpha A^T B (A [rows, keys] with leading dimension bk, B rows) in key groups.
            auto key_groups = [&](float alpha, const float* a, const float* b_rows, int64_t ldb, float* acc) {
              for (int64_t c0 = 0; c0 < nk; c0 += step) {
                const int64_t c1 = std::min(nk, c0 + step), rs = first_row(c0);
                if (rs < nq)
                  avx512_product(true, c1 - c0, D, nq - rs, alpha, a + rs * bk + c0, bk, b_rows + rs * ldb, ldb, true,
                                 acc + c0 * D, D);
              }
            };
            if constexpr (std::is_same_v<C, float>) {
              if (fast) row_groups(scale, Qt, KT, KP, P);
            }
            if (!fast) tile_product(false, true, nq, nk, D, scale, Qt, Kt, false, P, bk);
            for (int64_t r = 0; r < nq; ++r) {
              C* row = P + r * bk;
              const C li = L[bh * Tq + i0 + r];
              // Visible keys of the row: [first, valid) of the block (the document's start to the diagonal).
              const int64_t valid = p.causal ? std::clamp<int64_t>(i0 + r - k0 + 1, 0, nk) : nk;
              const int64_t first = doc_start ? std::clamp<int64_t>(doc_start[b * Tq + i0 + r] - k0, 0, valid) : 0;
              for (int64_t j = 0; j < first; ++j) row[j] = C(0);
              if constexpr (std::is_same_v<C, float>) {
                if (fast) attention_tiles::exp_affine_sum(row + first, valid - first, 1.0f, -li);
              }
              if (!std::is_same_v<C, float> || !fast)
                for (int64_t j = first; j < valid; ++j) row[j] = fast_exp(row[j] - li);
              for (int64_t j = valid; j < nk; ++j) row[j] = C(0);
              if (dropout) {
                C* mr = M + r * bk;
                const uint64_t idx0 = static_cast<uint64_t>((bh * Tq + i0 + r) * Tk + k0);
                dropout_multipliers(p.philox.key, p.philox.base, idx0, nk, keep_prob, inv_keep, mr);
                C* zr = Z + r * bk;
                for (int64_t j = 0; j < nk; ++j) zr[j] = row[j] * mr[j];
              }
            }
            const Tile<T, C> Zt{dropout ? Z : P, bk};
            // dV += Z^T dO; dZ = dO V^T, then dS = P * (dZ * mask - Di)
            if constexpr (std::is_same_v<C, float>) {
              if (fast) {
                key_groups(1.0f, Zt.c, dOt.c, dOt.ldc, dVa);
                row_groups(1.0f, dOt, VT, VP, dS);
              }
            }
            if (!fast) {
              tile_product(true, false, nk, D, nq, C(1), Zt, dOt, true, dVa, D);
              tile_product(false, true, nq, nk, D, C(1), dOt, Vt, false, dS, bk);
            }
            for (int64_t r = 0; r < nq; ++r) {
              C* ds = dS + r * bk;
              const C* pr = P + r * bk;
              const C di = delta[bh * Tq + i0 + r];
              if (dropout) {
                const C* mr = M + r * bk;
                for (int64_t j = 0; j < nk; ++j) ds[j] = pr[j] * (ds[j] * mr[j] - di);
              } else if (std::is_same_v<C, float> && fast) {
                if constexpr (std::is_same_v<C, float>) attention_tiles::softmax_grad_row(ds, pr, nk, di);
              } else {
                for (int64_t j = 0; j < nk; ++j) ds[j] = pr[j] * (ds[j] - di);
              }
            }
            // dK += scale dS^T Q;  dQ += scale dS K, in the compute type on both paths (top of file).
            if constexpr (std::is_same_v<C, float>) {
              if (fast) {
                key_groups(scale, dS, Qt.c, Qt.ldc, dKa);
                for (int64_t r0 = 0; r0 < nq; r0 += step) {
                  const int64_t r1 = std::min(nq, r0 + step), nc = keys_seen(r1);
                  if (nc > 0)
                    avx512_product(false, r1 - r0, D, nc, scale, dS + r0 * bk, bk, Kt.c, Kt.ldc, true,
                                   dqg + (i0 + r0) * D, D);
                }
                continue;
              }
            }
            gemm(true, false, nk, D, nq, scale, dS, bk, Qt.c, Qt.ldc, C(1), dKa, D);
            gemm(false, false, nq, D, nk, scale, dS, bk, Kt.c, Kt.ldc, C(1), dqg + i0 * D, D);
          }
        }
        if (own_dq) convert_run(dq_own, dQ + bh * Tq * D, Tq * D);
      }
      for (const int64_t kb : blocks) {
        const int64_t k0 = kb * bk, nk = std::min(bk, Tk - k0);
        convert_run(dKacc + k0 * D, dK + (bkv * Tk + k0) * D, nk * D);
        convert_run(dVacc + k0 * D, dV + (bkv * Tk + k0) * D, nk * D);
      }
    }
  });

  if (G > 1) {
    std::vector<const C*> parts(G);
    for (int64_t g = 0; g < G; ++g) parts[g] = dq_group(g);
    parallel_for(0, per_group, 1 << 14, [&](int64_t a, int64_t e) {
      // In runs, one partial after another into a small sum: the same additions in the same order
      // as a loop over the groups per element, but vectorised (that loop ran scalar).
      constexpr int64_t kRun = 1024;
      C sum[kRun];
      for (int64_t i0 = a; i0 < e; i0 += kRun) {
        const int64_t n = std::min(kRun, e - i0);
        std::copy(parts[0] + i0, parts[0] + i0 + n, sum);
        for (int64_t g = 1; g < G; ++g) {
          const C* part = parts[g] + i0;
          for (int64_t j = 0; j < n; ++j) sum[j] += part[j];
        }
        for (int64_t j = 0; j < n; ++j) dQ[i0 + j] = static_cast<T>(sum[j]);
      }
    });
  }
}

}  // namespace

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p, const Tensor& out,
                       const Tensor& lse, const Tensor& out_f32) {
  FT_CHECK(p.philox.device_base == nullptr,
           "attention: the CPU kernel got dropout counters relative to a device value");
  FT_DISPATCH_FLOATING(q.dtype(), "scaled_dot_product_attention",
                       [&] { forward_typed<scalar_t>(q, k, v, p, out, lse, out_f32); });
}

void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                        const Tensor& dout, const AttentionParams& p, const Tensor& dq, const Tensor& dk,
                        const Tensor& dv) {
  FT_DISPATCH_FLOATING(q.dtype(), "scaled_dot_product_attention backward",
                       [&] { backward_typed<scalar_t>(q, k, v, out, lse, dout, p, dq, dk, dv); });
}

void attention_document_bounds(const Tensor& doc_ids, const Tensor& starts, const Tensor& ends,
                               const IndexErrorText& decreasing) {
  const int64_t B = doc_ids.size(0), T = doc_ids.size(1);
  const int32_t* id = doc_ids.data<int32_t>();
  int32_t* st = starts.data<int32_t>();
  int32_t* en = ends.data<int32_t>();
  // Serial and O(B * T): a few microseconds beside the attention it bounds.
  for (int64_t b = 0; b < B; ++b) {
    const int32_t* row = id + b * T;
    for (int64_t i = 1; i < T; ++i)
      if (row[i] < row[i - 1]) throw Error(decreasing(int64_t{row[i]} - row[i - 1], b * T + i));
    // Runs of equal ids: forwards for the starts, backwards for the ends.
    for (int64_t i = 0; i < T; ++i)
      st[b * T + i] = static_cast<int32_t>(i > 0 && row[i] == row[i - 1] ? st[b * T + i - 1] : i);
    for (int64_t i = T - 1; i >= 0; --i)
      en[b * T + i] = static_cast<int32_t>(i + 1 < T && row[i] == row[i + 1] ? en[b * T + i + 1] : i + 1);
  }
}

void set_attention_block_sizes_for_testing(int64_t block_q, int64_t block_k) {
  g_block_q_override = block_q;
  g_block_k_override = block_k;
}

}  // namespace ft::cpu
