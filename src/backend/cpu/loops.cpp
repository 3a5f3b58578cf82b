#include "backend/cpu/loops.h"

#include <cstdlib>
#include <utility>

namespace ft::backend {

StridedLoop make_loop(const Tensor& out, std::initializer_list<const Tensor*> inputs) {
  StridedLoop L;
  L.nargs = 1 + static_cast<int>(inputs.size());
  FT_CHECK(L.nargs <= StridedLoop::kMaxArgs, "elementwise loop: too many operands");
  const Shape& shape = out.shape();
  const int nd = shape.size();
  L.numel = shape.numel();
  const Tensor* all[StridedLoop::kMaxArgs] = {&out};
  int k = 1;
  for (const Tensor* t : inputs) all[k++] = t;

  // Full-rank byte strides, zero on broadcast dimensions.
  int64_t st[StridedLoop::kMaxArgs][kMaxDims] = {};
  for (int a = 0; a < L.nargs; ++a) {
    const Tensor& t = *all[a];
    const int tnd = t.dim();
    FT_CHECK(tnd <= nd, "elementwise loop: operand of rank ", tnd, " does not broadcast to ", shape.str());
    size_t es = t.element_size();
    L.elem_size[a] = es;
    L.base[a] = static_cast<char*>(t.raw_data());
    for (int d = 0; d < nd; ++d) {
      int td = d - (nd - tnd);
      if (td < 0 || t.shape()[td] == 1) {
        FT_CHECK(td < 0 || t.shape()[td] == shape[d] || t.shape()[td] == 1, "broadcast mismatch");
        st[a][d] = 0;
      } else {
        FT_CHECK(t.shape()[td] == shape[d], "elementwise loop: operand shape ", t.shape().str(),
                 " does not broadcast to ", shape.str());
        st[a][d] = t.strides()[td] * static_cast<int64_t>(es);
      }
    }
  }
  // Drop size-1 dimensions and order the rest as the output lies in memory: strides decreasing
  // inward, so that a channels-last tensor loops over C innermost (and merges into one dense run)
  // instead of over W at a stride of C elements. Where the output does not decide (a zero stride,
  // or two equal), the next operand's strides do; where none does, the logical order stays. For
  // a row-major output this is the logical order. The elementwise ops only see pointers and
  // strides, and contributions to one element of scatter_add's accumulator differ only along its
  // zero-stride dimension, so they keep their order whatever the permutation.
  int order[kMaxDims];
  int m = 0;
  for (int d = 0; d < nd; ++d)
    if (shape[d] != 1) order[m++] = d;
  auto belongs_inside = [&](int outer, int inner) {  // true: `outer` should loop inside `inner`
    for (int a = 0; a < L.nargs; ++a) {
      const int64_t so = std::abs(st[a][outer]), si = std::abs(st[a][inner]);
      if (so == 0 || si == 0 || so == si) continue;
      return so < si;
    }
    return false;
  };
  for (int i = 1; i < m; ++i)
    for (int j = i; j > 0 && belongs_inside(order[j - 1], order[j]); --j) std::swap(order[j - 1], order[j]);
  for (int k = 0; k < m; ++k) {
    L.shape[k] = shape[order[k]];
    for (int a = 0; a < L.nargs; ++a) L.strides[a][k] = st[a][order[k]];
  }
  if (m == 0) {
    L.shape[0] = 1;
    for (int a = 0; a < L.nargs; ++a) L.strides[a][0] = 0;
    m = 1;
  }
  int w = 0;
  for (int d = 1; d < m; ++d) {
    bool mergeable = true;
    for (int a = 0; a < L.nargs; ++a)
      if (L.strides[a][w] != L.strides[a][d] * L.shape[d]) mergeable = false;
    if (mergeable) {
      L.shape[w] *= L.shape[d];
      for (int a = 0; a < L.nargs; ++a) L.strides[a][w] = L.strides[a][d];
    } else {
      ++w;
      L.shape[w] = L.shape[d];
      for (int a = 0; a < L.nargs; ++a) L.strides[a][w] = L.strides[a][d];
    }
  }
  L.ndim = w + 1;
  return L;
}

}  // namespace ft::backend
