// Tiled attention kernels; the algorithm is described in attention.h. Implementation notes:
// - f32 tiles (also bf16/f16, widened) are multiplied with oneDNN's dnnl_sgemm, which picks its
//   AVX2/AVX-512 kernels from the CPU's feature bits. OpenBLAS picks kernels by CPU model and on
//   virtualised CPUs reporting a generic model falls back to SSE3 ("Prescott") kernels, far
//   slower (docs/PERF.md). f64 (used for checking) goes through cblas_dgemm. Inside the parallel_for both
//   run single-threaded on the calling pool thread (nested OpenMP regions are serialised, and
//   the tiles are below OpenBLAS's threading threshold), so threads never oversubscribe cores.
// - f32/f64 operands whose last dimension is dense are handed to the GEMM in place (any B/H/T
//   strides: the row stride becomes the leading dimension); other layouts and bf16/f16 are
//   packed tile by tile into a dense compute-type buffer (bf16/f16 widened to f32).
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

#include "backend/cpu/copy.h"
#include "backend/cpu/dispatch.h"
#include "backend/cpu/fast_exp.h"
#include "fasttrain/parallel.h"
#include "fasttrain/random.h"

namespace ft::cpu {

namespace {

// Flops below which a parallel_for chunk is not worth waking another thread for.
constexpr int64_t kMinChunkFlops = 1 << 18;

inline int64_t grain_for(int64_t flops_per_task) {
  return std::max<int64_t>(1, kMinChunkFlops / std::max<int64_t>(flops_per_task, 1));
}

// Backward splits each (b, h)'s key blocks into groups until there are this many tasks.
constexpr int64_t kMinBackwardTasks = 8;

int64_t g_block_q_override = 0;
int64_t g_block_k_override = 0;

struct Blocks {
  int64_t q, k;
};

Blocks choose_blocks(int64_t D) {
  // 64 x 64 tiles at D <= 64 are 16 KiB of f32 each: Q, K, V, S and the accumulator fit in L2
  // together. Wider heads shrink the key block to keep that footprint (and, for f64, to stay
  // under OpenBLAS's threading threshold of M*N*K = 64^3).
  Blocks b{64, 64};
  if (D > 64) b.k = std::max<int64_t>(8, (64 * 64 / D) / 8 * 8);
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
    for (int64_t r = 0; r < n; ++r) {
      const T* src = p + r * st;
      C* dst = scratch + r * D;
      if (sd == 1) {
        convert_run(src, dst, D);
      } else {
        for (int64_t d = 0; d < D; ++d) dst[d] = static_cast<C>(src[d * sd]);
      }
    }
    return scratch;
  }
};

// Causal task order for the forward: later query blocks see more keys, and parallel_for hands
// each thread one contiguous range, so pair cheap and expensive blocks (0, n-1, 1, n-2, ...).
inline int64_t zigzag(int64_t t, int64_t n) { return (t % 2 == 0) ? t / 2 : n - 1 - t / 2; }

template <class T>
void forward_typed(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p, const Tensor& out,
                   const Tensor& lse, const Tensor& out_f32) {
  using C = compute_t<T>;
  const int64_t B = q.size(0), H = q.size(1), Tq = q.size(2), Tk = k.size(2), D = q.size(3);
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
  const Blocks bl = choose_blocks(D);
  const int64_t bq = bl.q, bk = bl.k;
  const int64_t nqb = (Tq + bq - 1) / bq;
  const int64_t ntasks = B * H * nqb;
  const C scale = static_cast<C>(p.scale);
  const bool dropout = p.dropout_p > 0;
  const float keep_prob = static_cast<float>(1.0 - p.dropout_p);
  const C inv_keep = static_cast<C>(1.0 / (1.0 - p.dropout_p));
  constexpr C kNegInf = -std::numeric_limits<C>::infinity();

  // Two GEMMs of bq x Tk x D per task (half of Tk under causal masking, on average).
  const int64_t task_flops = 4 * bq * D * (p.causal ? (Tk + 1) / 2 : Tk);
  parallel_for(0, ntasks, grain_for(task_flops), [&](int64_t t0, int64_t t1) {
    std::vector<C> qbuf(bq * D), kbuf(bk * D), vbuf(bk * D), s(bq * bk), acc(bq * D), m(bq), l(bq), mult(bk);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t task = p.causal ? zigzag(t, ntasks) : t;
      const int64_t qb = task % nqb, bh = task / nqb, b = bh / H, h = bh % H;
      const int64_t i0 = qb * bq, nq = std::min(bq, Tq - i0);
      int64_t ldq, ldk, ldv;
      const C* Qp = Q.template rows<C>(b, h, i0, nq, qbuf.data(), ldq);
      std::fill(m.begin(), m.end(), kNegInf);
      std::fill(l.begin(), l.end(), C(0));
      std::fill(acc.begin(), acc.end(), C(0));
      // Keys past the last query of the block are masked for every row: skip those blocks.
      const int64_t kend = p.causal ? std::min(Tk, i0 + nq) : Tk;
      for (int64_t k0 = 0; k0 < kend; k0 += bk) {
        const int64_t nk = std::min(bk, kend - k0);
        const C* Kp = K.template rows<C>(b, h, k0, nk, kbuf.data(), ldk);
        const C* Vp = V.template rows<C>(b, h, k0, nk, vbuf.data(), ldv);
        gemm(false, true, nq, nk, D, scale, Qp, ldq, Kp, ldk, C(0), s.data(), bk);
        const bool crosses_diagonal = p.causal && k0 + nk - 1 > i0;
        for (int64_t r = 0; r < nq; ++r) {
          C* row = s.data() + r * bk;
          if (crosses_diagonal) {
            const int64_t valid = std::clamp<int64_t>(i0 + r - k0 + 1, 0, nk);
            for (int64_t j = valid; j < nk; ++j) row[j] = kNegInf;
          }
          // The first key block always holds key 0, visible to every row, so m is finite
          // from then on and exp(m - mx) never sees -inf - -inf.
          const C mx = std::max(m[r], row_max(row, nk));
          const C alpha = fast_exp(m[r] - mx);
          const C sum = exp_shift_sum(row, nk, mx);
          l[r] = l[r] * alpha + sum;
          m[r] = mx;
          if (dropout) {
            const uint64_t idx0 = static_cast<uint64_t>((bh * Tq + i0 + r) * Tk + k0);
            dropout_multipliers(p.seed, p.philox_base, idx0, nk, keep_prob, inv_keep, mult.data());
            for (int64_t j = 0; j < nk; ++j) row[j] *= mult[j];
          }
          if (alpha != C(1)) {
            C* a = acc.data() + r * D;
            for (int64_t d = 0; d < D; ++d) a[d] *= alpha;
          }
        }
        gemm(false, false, nq, D, nk, C(1), s.data(), bk, Vp, ldv, C(1), acc.data(), D);
      }
      for (int64_t r = 0; r < nq; ++r) {
        const C inv = l[r] > 0 ? C(1) / l[r] : C(0);
        const C* a = acc.data() + r * D;
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
  const int64_t BH = B * H;
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
  const Blocks bl = choose_blocks(D);
  const int64_t bq = bl.q, bk = bl.k;
  const int64_t nkb = (Tk + bk - 1) / bk;
  const C scale = static_cast<C>(p.scale);
  const bool dropout = p.dropout_p > 0;
  const float keep_prob = static_cast<float>(1.0 - p.dropout_p);
  const C inv_keep = static_cast<C>(1.0 / (1.0 - p.dropout_p));
  const DType cdt = std::is_same_v<C, double> ? DType::F64 : DType::F32;

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

  // Parallel over (b, h, group of key blocks): each task owns its dK/dV rows outright. dQ sums
  // over key blocks, so every group accumulates into its own dQ partial (groups > 1 only when
  // B*H is too small to keep the threads busy) and the partials are added in a fixed order
  // afterwards. The grouping depends on the shapes only, not on the thread count, so results
  // are bitwise identical for any number of threads.
  // Group 0 accumulates straight into dq when dq is in the compute type.
  const int64_t G = std::min(nkb, std::max<int64_t>(1, (kMinBackwardTasks + BH - 1) / BH));
  constexpr bool in_place = std::is_same_v<T, C>;
  const int64_t per_group = BH * Tq * D;
  const int64_t nbuf = in_place ? G - 1 : G;
  Tensor dq_partial = empty({nbuf * per_group}, TensorOptions(cdt));
  C* buf = dq_partial.data<C>();
  auto dq_group = [&](int64_t g) -> C* {
    if constexpr (in_place) return g == 0 ? reinterpret_cast<C*>(dQ) : buf + (g - 1) * per_group;
    return buf + g * per_group;
  };
  for (int64_t g = 0; g < G; ++g) {
    C* z = dq_group(g);
    parallel_for(0, per_group, 1 << 16, [&](int64_t a, int64_t e) { std::fill(z + a, z + e, C(0)); });
  }

  // Five GEMMs of Tq x (Tk / G) x D per task (half under causal masking).
  const int64_t task_flops = 10 * D * Tq * ((p.causal ? (Tk + 1) / 2 : Tk) + G - 1) / G;
  parallel_for(0, BH * G, grain_for(task_flops), [&](int64_t t0, int64_t t1) {
    std::vector<C> kbuf(bk * D), vbuf(bk * D), qbuf(bq * D), dobuf(bq * D), P(bq * bk), Z(dropout ? bq * bk : 0),
        dS(bq * bk), M(dropout ? bq * bk : 0), dKacc(bk * D), dVacc(bk * D);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t bh = t / G, g = t % G, b = bh / H, h = bh % H;
      C* dqg = dq_group(g) + bh * Tq * D;
      // Interleaved key blocks per group: under causal masking early key blocks have more
      // queries, and interleaving spreads them evenly across groups.
      for (int64_t kb = g; kb < nkb; kb += G) {
        const int64_t k0 = kb * bk, nk = std::min(bk, Tk - k0);
        int64_t ldk, ldv, ldq, lddo;
        const C* Kp = K.template rows<C>(b, h, k0, nk, kbuf.data(), ldk);
        const C* Vp = V.template rows<C>(b, h, k0, nk, vbuf.data(), ldv);
        std::fill(dKacc.begin(), dKacc.end(), C(0));
        std::fill(dVacc.begin(), dVacc.end(), C(0));
        // Query rows before k0 see none of these keys: start at the block holding row k0.
        const int64_t qstart = p.causal ? (k0 / bq) * bq : 0;
        for (int64_t i0 = qstart; i0 < Tq; i0 += bq) {
          const int64_t nq = std::min(bq, Tq - i0);
          const C* Qp = Q.template rows<C>(b, h, i0, nq, qbuf.data(), ldq);
          const C* dOp = dO.template rows<C>(b, h, i0, nq, dobuf.data(), lddo);
          gemm(false, true, nq, nk, D, scale, Qp, ldq, Kp, ldk, C(0), P.data(), bk);
          for (int64_t r = 0; r < nq; ++r) {
            C* row = P.data() + r * bk;
            const C li = L[bh * Tq + i0 + r];
            const int64_t valid = p.causal ? std::clamp<int64_t>(i0 + r - k0 + 1, 0, nk) : nk;
            for (int64_t j = 0; j < valid; ++j) row[j] = fast_exp(row[j] - li);
            for (int64_t j = valid; j < nk; ++j) row[j] = C(0);
            if (dropout) {
              C* mr = M.data() + r * bk;
              const uint64_t idx0 = static_cast<uint64_t>((bh * Tq + i0 + r) * Tk + k0);
              dropout_multipliers(p.seed, p.philox_base, idx0, nk, keep_prob, inv_keep, mr);
              C* zr = Z.data() + r * bk;
              for (int64_t j = 0; j < nk; ++j) zr[j] = row[j] * mr[j];
            }
          }
          const C* Zp = dropout ? Z.data() : P.data();
          // dV += Z^T dO
          gemm(true, false, nk, D, nq, C(1), Zp, bk, dOp, lddo, C(1), dVacc.data(), D);
          // dZ = dO V^T, then dS = P * (dZ * mask - Di)
          gemm(false, true, nq, nk, D, C(1), dOp, lddo, Vp, ldv, C(0), dS.data(), bk);
          for (int64_t r = 0; r < nq; ++r) {
            C* ds = dS.data() + r * bk;
            const C* pr = P.data() + r * bk;
            const C di = delta[bh * Tq + i0 + r];
            if (dropout) {
              const C* mr = M.data() + r * bk;
              for (int64_t j = 0; j < nk; ++j) ds[j] = pr[j] * (ds[j] * mr[j] - di);
            } else {
              for (int64_t j = 0; j < nk; ++j) ds[j] = pr[j] * (ds[j] - di);
            }
          }
          // dK += scale dS^T Q;  dQ += scale dS K
          gemm(true, false, nk, D, nq, scale, dS.data(), bk, Qp, ldq, C(1), dKacc.data(), D);
          gemm(false, false, nq, D, nk, scale, dS.data(), bk, Kp, ldk, C(1), dqg + i0 * D, D);
        }
        T* dk_out = dK + (bh * Tk + k0) * D;
        T* dv_out = dV + (bh * Tk + k0) * D;
        for (int64_t e = 0; e < nk * D; ++e) {
          dk_out[e] = static_cast<T>(dKacc[e]);
          dv_out[e] = static_cast<T>(dVacc[e]);
        }
      }
    }
  });

  if (!in_place || G > 1) {
    std::vector<const C*> parts(G);
    for (int64_t g = 0; g < G; ++g) parts[g] = dq_group(g);
    parallel_for(0, per_group, 1 << 14, [&](int64_t a, int64_t e) {
      for (int64_t i = a; i < e; ++i) {
        C s = parts[0][i];
        for (int64_t g = 1; g < G; ++g) s += parts[g][i];
        dQ[i] = static_cast<T>(s);
      }
    });
  }
}

}  // namespace

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p, const Tensor& out,
                       const Tensor& lse, const Tensor& out_f32) {
  FT_DISPATCH_FLOATING(q.dtype(), "scaled_dot_product_attention",
                       [&] { forward_typed<scalar_t>(q, k, v, p, out, lse, out_f32); });
}

void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                        const Tensor& dout, const AttentionParams& p, const Tensor& dq, const Tensor& dk,
                        const Tensor& dv) {
  FT_DISPATCH_FLOATING(q.dtype(), "scaled_dot_product_attention backward",
                       [&] { backward_typed<scalar_t>(q, k, v, out, lse, dout, p, dq, dk, dv); });
}

void set_attention_block_sizes_for_testing(int64_t block_q, int64_t block_k) {
  g_block_q_override = block_q;
  g_block_k_override = block_k;
}

}  // namespace ft::cpu
