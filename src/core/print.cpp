// PyTorch-style printing: values with 4 decimals (scientific when the range demands it),
// summarised with "..." past 1000 elements, then dtype, device and requires_grad.
#include <cmath>
#include <iomanip>
#include <ostream>
#include <sstream>

#include "fasttrain/tensor.h"

namespace ft {
namespace {

struct Formatter {
  bool floating;
  bool scientific;
  std::string operator()(double v) const {
    std::ostringstream os;
    if (!floating) {
      os << static_cast<int64_t>(v);
    } else if (std::isnan(v)) {
      os << "nan";
    } else if (std::isinf(v)) {
      os << (v > 0 ? "inf" : "-inf");
    } else if (scientific) {
      os << std::scientific << std::setprecision(4) << v;
    } else {
      os << std::fixed << std::setprecision(4) << v;
    }
    return os.str();
  }
};

void print_dim(std::ostream& os, const std::vector<double>& v, const Shape& shape, int d, int64_t offset,
               const Strides& st, bool summarise, const Formatter& fmt, int indent) {
  const int64_t n = shape[d];
  const int edge = 3;
  os << "[";
  for (int64_t i = 0; i < n; ++i) {
    if (summarise && n > 2 * edge && i == edge) {
      os << (d + 1 == shape.size() ? "..., " : "...,\n" + std::string(indent + 1, ' '));
      i = n - edge - 1;
      continue;
    }
    if (d + 1 == shape.size()) {
      os << fmt(v[offset + i * st[d]]);
      if (i + 1 < n) os << ", ";
    } else {
      print_dim(os, v, shape, d + 1, offset + i * st[d], st, summarise, fmt, indent + 1);
      if (i + 1 < n) os << "," << std::string(shape.size() - d - 1, '\n') << std::string(indent + 1, ' ');
    }
  }
  os << "]";
}

}  // namespace

std::ostream& operator<<(std::ostream& os, const Tensor& t) {
  if (!t.defined()) return os << "tensor(undefined)";
  std::vector<double> v = t.to_vector();
  Formatter fmt{is_floating(t.dtype()), false};
  double maxabs = 0, minabs = INFINITY;
  for (double x : v)
    if (std::isfinite(x) && x != 0) {
      maxabs = std::max(maxabs, std::fabs(x));
      minabs = std::min(minabs, std::fabs(x));
    }
  if (fmt.floating && maxabs > 0 && (maxabs >= 1e8 || minabs < 1e-4)) fmt.scientific = true;
  os << "tensor(";
  if (t.dim() == 0) {
    os << fmt(v[0]);
  } else {
    print_dim(os, v, t.shape(), 0, 0, contiguous_strides(t.shape()), t.numel() > 1000, fmt, 7);
  }
  os << ", shape=" << t.shape().str() << ", dtype=" << dtype_name(t.dtype()) << ", device=" << t.device().str();
  if (t.requires_grad()) os << ", requires_grad=true";
  return os << ")";
}

std::string to_string(const Tensor& t) {
  std::ostringstream os;
  os << t;
  return os.str();
}

}  // namespace ft
