// How a strided tensor's trailing two dims read as a BLAS matrix, and where its batch matrices
// start: shared by the CPU GEMMs (OpenBLAS, oneDNN, the packed half GEMM) and cuBLASLt on CUDA.
// Row-major terms throughout; a column-major library reads the same memory as the transpose.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "fasttrain/tensor.h"

namespace ft::backend {

// How BLAS reads a [rows, cols] matrix with element strides (sr, sc): row-major with leading
// dimension ld (trans = false) or as the transpose of a row-major [cols, rows] matrix.
struct MatLayout {
  bool trans = false;
  int64_t ld = 1;
};

inline bool blas_layout(int64_t rows, int64_t cols, int64_t sr, int64_t sc, MatLayout& L) {
  const int64_t r1 = std::max<int64_t>(rows, 1), c1 = std::max<int64_t>(cols, 1);
  // The stride of a size-1 dim is never used, so it does not constrain the layout.
  if ((cols <= 1 || sc == 1) && (rows <= 1 || sr >= c1)) {
    L = {false, rows <= 1 ? c1 : sr};
    return true;
  }
  if ((rows <= 1 || sr == 1) && (cols <= 1 || sc >= r1)) {
    L = {true, cols <= 1 ? r1 : sc};
    return true;
  }
  return false;
}

inline bool matrix_layout(const Tensor& t, MatLayout& L) {
  const int d = t.dim();
  return blas_layout(t.size(d - 2), t.size(d - 1), t.stride(d - 2), t.stride(d - 1), L);
}

// Element offset of each batch matrix of t (batch dims = all but the last two), row-major order.
inline std::vector<int64_t> batch_offsets(const Tensor& t) {
  const int nbd = t.dim() - 2;
  int64_t nb = 1;
  for (int d = 0; d < nbd; ++d) nb *= t.size(d);
  std::vector<int64_t> off(nb);
  int64_t idx[kMaxDims] = {};
  int64_t cur = 0;
  for (int64_t i = 0; i < nb; ++i) {
    off[i] = cur;
    for (int d = nbd - 1; d >= 0; --d) {
      cur += t.stride(d);
      if (++idx[d] < t.size(d)) break;
      cur -= idx[d] * t.stride(d);
      idx[d] = 0;
    }
  }
  return off;
}

inline bool batch_aliases(const Tensor& t) {
  for (int d = 0; d + 2 < t.dim(); ++d)
    if (t.size(d) > 1 && t.stride(d) == 0) return true;
  return false;
}

// Offsets of t's batch matrices as i * stride for a flat batch index i, when that holds.
inline bool flat_batch_stride(const Tensor& t, int64_t& stride) {
  stride = 0;
  int64_t span = 1;
  bool first = true;
  for (int d = t.dim() - 3; d >= 0; --d) {
    const int64_t s = t.size(d);
    if (s == 1) continue;
    if (first) {
      stride = t.stride(d);
      first = false;
    } else if (t.stride(d) != stride * span) {
      return false;
    }
    span *= s;
  }
  return true;
}

}  // namespace ft::backend
