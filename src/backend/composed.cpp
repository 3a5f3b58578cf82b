#include "backend/composed.h"

#include "backend/kernels.h"

namespace ft::backend::composed {

void linear_gelu(const Tensor& x, const Tensor& w, const Tensor& b, math::UnaryOp gelu, const Tensor& pre,
                 const Tensor& y) {
  const Kernels& k = kernels(pre);
  k.matmul(x, w.t(), pre, false, b);
  k.unary(gelu, pre, y);
}

void matmul_gelu_backward(const Tensor& gy, const Tensor& w, const Tensor& pre, math::UnaryOp gelu, const Tensor& dpre,
                          const Tensor& db) {
  const Kernels& k = kernels(dpre);
  Tensor dh = empty(dpre.shape(), dpre.options());
  k.matmul(gy, w, dh, false, Tensor());
  k.unary_backward(gelu, dh, pre, pre, dpre);  // GELU's derivative reads its input (x) only
  if (db.defined()) k.sum(dpre, {true, false}, 1.0, db);
}

}  // namespace ft::backend::composed
