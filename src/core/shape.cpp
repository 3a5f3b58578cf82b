#include "fasttrain/shape.h"

#include <sstream>

namespace ft {

std::string Dims::str() const {
  std::ostringstream os;
  os << "[";
  for (int i = 0; i < n_; ++i) os << (i ? ", " : "") << d_[i];
  os << "]";
  return os.str();
}

Strides contiguous_strides(const Shape& shape) {
  Strides s = Strides::filled(shape.size(), 1);
  int64_t acc = 1;
  for (int i = shape.size() - 1; i >= 0; --i) {
    s[i] = acc;
    acc *= std::max<int64_t>(shape[i], 1);
  }
  return s;
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* what) {
  int n = std::max(a.size(), b.size());
  Shape out = Shape::filled(n, 1);
  for (int i = 0; i < n; ++i) {
    int ia = a.size() - n + i, ib = b.size() - n + i;
    int64_t sa = ia >= 0 ? a[ia] : 1, sb = ib >= 0 ? b[ib] : 1;
    FT_CHECK(sa == sb || sa == 1 || sb == 1, what, ": shapes ", a.str(), " and ", b.str(),
             " cannot be broadcast (dimension ", i, ": ", sa, " vs ", sb, ")");
    out[i] = sa == 1 ? sb : sa;
  }
  return out;
}

int wrap_dim(int64_t dim, int ndim, const char* what) {
  int64_t n = std::max(ndim, 1);
  FT_CHECK(dim >= -n && dim < n, what, ": dimension ", dim, " is out of range for a tensor of rank ", ndim,
           " (expected in [", -n, ", ", n - 1, "])");
  return static_cast<int>(dim < 0 ? dim + n : dim);
}

}  // namespace ft
