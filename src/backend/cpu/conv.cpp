// Convolution dispatch and the im2col + GEMM reference path.
//
// Reference path, per image n and group g (K = C/g * kH * kW, P = OH * OW):
//   forward:  col[K, P] = im2col(x[n, g]);         y[n, g] [O/g, P] = w[g] [O/g, K] @ col (+ b)
//   data:     col[K, P] = w[g]^T @ gy[n, g];        gx[n, g] = col2im(col)
//   filter:   col[K, P] = im2col(x[n, g]);         gw[g] += gy[n, g] @ col^T;   gb[o] = sum gy[:, o]
// The GEMMs are OpenBLAS, over column blocks on the thread pool; im2col/col2im rows are dense runs over the output
// width. It computes in the compute type (f32 for bf16/f16 on converted copies, f64 for f64), in NCHW.
#include "backend/cpu/conv.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cstring>

#include "backend/cpu/copy.h"
#include "backend/cpu/linalg.h"
#include "fasttrain/parallel.h"

namespace ft::cpu {

namespace {

void blas_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
               const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B,
              ldb, beta, C, ldc);
}
void blas_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const double* A, int64_t lda,
               const double* B, int64_t ldb, double beta, double* C, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B,
              ldb, beta, C, ldc);
}

// Runs OpenBLAS on the calling thread only while it lives. The OpenMP build of OpenBLAS takes its
// thread count from the caller's OpenMP setting (omp_get_max_threads) on every call, and that
// setting belongs to the calling thread alone, so other threads are unaffected.
class OneBlasThread {
 public:
  OneBlasThread() : saved_(omp_get_max_threads()) { omp_set_num_threads(1); }
  ~OneBlasThread() { omp_set_num_threads(saved_); }
  OneBlasThread(const OneBlasThread&) = delete;
  OneBlasThread& operator=(const OneBlasThread&) = delete;

 private:
  int saved_;
};

// C[M, N] = alpha * op(A) @ op(B) + beta * C, as one-thread GEMMs over column blocks whose width
// depends on the shape only, the blocks spread over the thread pool. Why not one threaded BLAS
// call: how OpenBLAS splits a product among its threads may change how a result is summed (with
// its Haswell kernels, bf16 convolutions on 1 and 3 threads differed in the last bit), and the
// passes promise the same bits on any thread count.
template <class T>
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda, const T* B, int64_t ldb,
          T beta, T* C, int64_t ldc) {
  constexpr int64_t kBlock = 128;  // columns per block: a few of the kernels' panels wide
  const int64_t blocks = (N + kBlock - 1) / kBlock;
  parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    OneBlasThread one;
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t j0 = b * kBlock, n = std::min(kBlock, N - j0);
      blas_gemm(ta, tb, M, n, K, alpha, A, lda, tb ? B + j0 * ldb : B + j0, ldb, beta, C + j0, ldc);
    }
  });
}

DType compute_dtype(DType t) { return t == DType::F64 ? DType::F64 : DType::F32; }

// `t` as a dense NCHW tensor of dtype dt: itself when it already is one, else a converted copy.
Tensor dense_nchw(const Tensor& t, DType dt) {
  if (t.dtype() == dt && t.is_contiguous()) return t;
  Tensor out = empty(t.shape(), TensorOptions(dt));
  copy(out, t);
  return out;
}

// Where to compute an output: `dst` itself when dense NCHW of dtype dt, else a scratch tensor that
// finish() copies back.
Tensor output_buffer(const Tensor& dst, DType dt) {
  if (dst.dtype() == dt && dst.is_contiguous()) return dst;
  return empty(dst.shape(), TensorOptions(dt));
}
void finish(const Tensor& dst, const Tensor& buf) {
  if (!buf.same(dst)) copy(dst, buf);
}

// col[(c, kh, kw), (oh, ow)] = x[c, oh*sh - ph + kh*dh, ow*sw - pw + kw*dw] (0 outside the image).
template <class T>
void im2col(const T* x, const ConvParams& p, int64_t Cg, T* col) {
  const int64_t KK = p.kH * p.kW, P = p.OH * p.OW;
  parallel_for(0, Cg * KK, 4, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t c = r / KK, kh = (r % KK) / p.kW, kw = r % p.kW;
      const T* xc = x + c * p.H * p.W;
      T* out = col + r * P;
      for (int64_t oh = 0; oh < p.OH; ++oh) {
        const int64_t ih = oh * p.stride[0] - p.padding[0] + kh * p.dilation[0];
        T* row = out + oh * p.OW;
        if (ih < 0 || ih >= p.H) {
          std::fill(row, row + p.OW, T(0));
          continue;
        }
        const T* xr = xc + ih * p.W;
        for (int64_t ow = 0; ow < p.OW; ++ow) {
          const int64_t iw = ow * p.stride[1] - p.padding[1] + kw * p.dilation[1];
          row[ow] = (iw >= 0 && iw < p.W) ? xr[iw] : T(0);
        }
      }
    }
  });
}

// dx[c, ...] = sum of the col entries that im2col read from it. Parallel over channels so no two
// threads write the same element.
template <class T>
void col2im(const T* col, const ConvParams& p, int64_t Cg, T* dx) {
  const int64_t KK = p.kH * p.kW, P = p.OH * p.OW;
  parallel_for(0, Cg, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      T* xc = dx + c * p.H * p.W;
      std::fill(xc, xc + p.H * p.W, T(0));
      for (int64_t k = 0; k < KK; ++k) {
        const int64_t kh = k / p.kW, kw = k % p.kW;
        const T* in = col + (c * KK + k) * P;
        for (int64_t oh = 0; oh < p.OH; ++oh) {
          const int64_t ih = oh * p.stride[0] - p.padding[0] + kh * p.dilation[0];
          if (ih < 0 || ih >= p.H) continue;
          T* xr = xc + ih * p.W;
          const T* row = in + oh * p.OW;
          for (int64_t ow = 0; ow < p.OW; ++ow) {
            const int64_t iw = ow * p.stride[1] - p.padding[1] + kw * p.dilation[1];
            if (iw >= 0 && iw < p.W) xr[iw] += row[ow];
          }
        }
      }
    }
  });
}

template <class T>
void forward_ref(const ConvParams& p, const T* x, const T* w, const T* b, T* y) {
  const int64_t Cg = p.C / p.groups, Og = p.O / p.groups, K = Cg * p.kH * p.kW, P = p.OH * p.OW;
  std::vector<T> col(K * P);
  for (int64_t n = 0; n < p.N; ++n) {
    for (int64_t g = 0; g < p.groups; ++g) {
      im2col(x + (n * p.C + g * Cg) * p.H * p.W, p, Cg, col.data());
      T* yg = y + (n * p.O + g * Og) * P;
      gemm(false, false, Og, P, K, T(1), w + g * Og * K, K, col.data(), P, T(0), yg, P);
      if (b)
        for (int64_t o = 0; o < Og; ++o)
          for (int64_t i = 0; i < P; ++i) yg[o * P + i] += b[g * Og + o];
    }
  }
}

template <class T>
void backward_data_ref(const ConvParams& p, const T* gy, const T* w, T* gx) {
  const int64_t Cg = p.C / p.groups, Og = p.O / p.groups, K = Cg * p.kH * p.kW, P = p.OH * p.OW;
  std::vector<T> col(K * P);
  for (int64_t n = 0; n < p.N; ++n) {
    for (int64_t g = 0; g < p.groups; ++g) {
      gemm(true, false, K, P, Og, T(1), w + g * Og * K, K, gy + (n * p.O + g * Og) * P, P, T(0), col.data(), P);
      col2im(col.data(), p, Cg, gx + (n * p.C + g * Cg) * p.H * p.W);
    }
  }
}

template <class T>
void backward_weight_ref(const ConvParams& p, const T* gy, const T* x, T* gw, T* gb) {
  const int64_t Cg = p.C / p.groups, Og = p.O / p.groups, K = Cg * p.kH * p.kW, P = p.OH * p.OW;
  std::vector<T> col(K * P);
  for (int64_t n = 0; n < p.N; ++n) {
    for (int64_t g = 0; g < p.groups; ++g) {
      im2col(x + (n * p.C + g * Cg) * p.H * p.W, p, Cg, col.data());
      gemm(false, true, Og, K, P, T(1), gy + (n * p.O + g * Og) * P, P, col.data(), P, n == 0 ? T(0) : T(1),
           gw + g * Og * K, K);
    }
  }
  if (gb) {
    parallel_for(0, p.O, 1, [&](int64_t o0, int64_t o1) {
      for (int64_t o = o0; o < o1; ++o) {
        T total = 0;
        for (int64_t n = 0; n < p.N; ++n) {
          const T* row = gy + (n * p.O + o) * P;
          T part = 0;
          for (int64_t i = 0; i < P; ++i) part += row[i];
          total += part;
        }
        gb[o] = total;
      }
    });
  }
}

// f16 has no fast CPU convolution: run the f32 path on converted copies (same memory layout).
Tensor to_f32_like(const Tensor& t) {
  if (!t.defined()) return t;
  Tensor out = empty_strided(t.shape(), t.strides(), TensorOptions(DType::F32));
  copy(out, t);
  return out;
}
Tensor f32_buffer_like(const Tensor& t) {
  if (!t.defined()) return t;
  return empty_strided(t.shape(), t.strides(), TensorOptions(DType::F32));
}

}  // namespace

void conv2d_forward_reference(const ConvParams& p, const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y) {
  const DType dt = compute_dtype(x.dtype());
  Tensor xc = dense_nchw(x, dt), wc = dense_nchw(w, dt), bc = b.defined() ? dense_nchw(b, dt) : Tensor();
  Tensor yb = output_buffer(y, dt);
  if (dt == DType::F64)
    forward_ref<double>(p, xc.data<double>(), wc.data<double>(), bc.defined() ? bc.data<double>() : nullptr,
                        yb.data<double>());
  else
    forward_ref<float>(p, xc.data<float>(), wc.data<float>(), bc.defined() ? bc.data<float>() : nullptr,
                       yb.data<float>());
  finish(y, yb);
}

void conv2d_backward_data_reference(const ConvParams& p, const Tensor& gy, const Tensor& w, const Tensor& gx) {
  const DType dt = compute_dtype(gy.dtype());
  Tensor gyc = dense_nchw(gy, dt), wc = dense_nchw(w, dt);
  Tensor gxb = output_buffer(gx, dt);
  if (dt == DType::F64)
    backward_data_ref<double>(p, gyc.data<double>(), wc.data<double>(), gxb.data<double>());
  else
    backward_data_ref<float>(p, gyc.data<float>(), wc.data<float>(), gxb.data<float>());
  finish(gx, gxb);
}

void conv2d_backward_weight_reference(const ConvParams& p, const Tensor& gy, const Tensor& x, const Tensor& gw,
                                      const Tensor& gb) {
  const DType dt = compute_dtype(gy.dtype());
  Tensor gyc = dense_nchw(gy, dt), xc = dense_nchw(x, dt);
  Tensor gwb = output_buffer(gw, dt);
  Tensor gbb = gb.defined() ? output_buffer(gb, dt) : Tensor();
  if (dt == DType::F64)
    backward_weight_ref<double>(p, gyc.data<double>(), xc.data<double>(), gwb.data<double>(),
                                gbb.defined() ? gbb.data<double>() : nullptr);
  else
    backward_weight_ref<float>(p, gyc.data<float>(), xc.data<float>(), gwb.data<float>(),
                               gbb.defined() ? gbb.data<float>() : nullptr);
  finish(gw, gwb);
  if (gb.defined()) finish(gb, gbb);
}

void conv2d_forward(const ConvParams& p, const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y) {
  if (x.dtype() == DType::F16) {
    Tensor y32 = f32_buffer_like(y);
    conv2d_forward(p, to_f32_like(x), to_f32_like(w), to_f32_like(b), y32);
    copy(y, y32);
    return;
  }
  if (x.dtype() == DType::BF16 && conv_algorithm(p, x.dtype()) == ConvAlgorithm::Winograd &&
      winograd_conv2d_forward(p, x, w, b, y))
    return;
  if ((x.dtype() == DType::F32 || x.dtype() == DType::BF16) && onednn_conv2d_forward(p, x, w, b, y)) return;
  conv2d_forward_reference(p, x, w, b, y);
}

void conv2d_backward_data(const ConvParams& p, const Tensor& gy, const Tensor& w, const Tensor& gx) {
  if (gy.dtype() == DType::F16) {
    Tensor gx32 = f32_buffer_like(gx);
    conv2d_backward_data(p, to_f32_like(gy), to_f32_like(w), gx32);
    copy(gx, gx32);
    return;
  }
  if (gy.dtype() == DType::BF16 && conv_algorithm(p, gy.dtype()) == ConvAlgorithm::Winograd &&
      winograd_conv2d_backward_data(p, gy, w, gx))
    return;
  if ((gy.dtype() == DType::F32 || gy.dtype() == DType::BF16) && onednn_conv2d_backward_data(p, gy, w, gx)) return;
  conv2d_backward_data_reference(p, gy, w, gx);
}

bool matmul_conv2d_backward_weight(const ConvParams& p, const Tensor& gy, const Tensor& x, const Tensor& gw,
                                   const Tensor& gb) {
  if (gy.dtype() != DType::BF16 || !weight_grad_is_one_product(p)) return false;
  const int64_t M = p.N * p.OH * p.OW;
  // The activations as [positions, channels] row-major matrices (their channels-last memory), the
  // 1x1 weight as [O, C]: OIHW and OHWI are the same memory for it.
  auto rows = [M](const Tensor& t, int64_t channels) {
    return t.detach().as_strided({M, channels}, {channels, 1}, t.offset());
  };
  linear_weight_grad(rows(gy, p.O), rows(x, p.C), gw.detach().as_strided({p.O, p.C}, {p.C, 1}, gw.offset()), gb);
  return true;
}

void conv2d_backward_weight(const ConvParams& p, const Tensor& gy, const Tensor& x, const Tensor& gw,
                            const Tensor& gb) {
  if (gy.dtype() == DType::F16) {
    Tensor gw32 = f32_buffer_like(gw), gb32 = f32_buffer_like(gb);
    conv2d_backward_weight(p, to_f32_like(gy), to_f32_like(x), gw32, gb32);
    copy(gw, gw32);
    if (gb.defined()) copy(gb, gb32);
    return;
  }
  const WeightGradPath path = weight_grad_path(p);
  if (path == WeightGradPath::Winograd && winograd_conv2d_backward_weight(p, gy, x, gw, gb)) return;
  if (path == WeightGradPath::Paired && paired_conv2d_backward_weight(p, gy, x, gw, gb)) return;
  if (path == WeightGradPath::Matmul && matmul_conv2d_backward_weight(p, gy, x, gw, gb)) return;
  if ((gy.dtype() == DType::F32 || gy.dtype() == DType::BF16) && onednn_conv2d_backward_weight(p, gy, x, gw, gb))
    return;
  conv2d_backward_weight_reference(p, gy, x, gw, gb);
}

}  // namespace ft::cpu
