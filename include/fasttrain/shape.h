// Shapes and strides: a small inline array (no heap traffic per tensor). Rank is limited to
// kMaxDims, which covers every layer the engine has (attention uses 4, conv 4, bmm 3).
#pragma once
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "fasttrain/error.h"

namespace ft {

inline constexpr int kMaxDims = 8;

class Dims {
 public:
  Dims() = default;
  Dims(std::initializer_list<int64_t> v) { assign(v.begin(), v.end()); }
  Dims(const std::vector<int64_t>& v) { assign(v.begin(), v.end()); }
  template <class It>
  Dims(It b, It e) {
    assign(b, e);
  }
  static Dims filled(int n, int64_t value) {
    Dims d;
    d.resize(n, value);
    return d;
  }

  int size() const { return n_; }
  bool empty() const { return n_ == 0; }
  int64_t& operator[](int i) { return d_[i]; }
  int64_t operator[](int i) const { return d_[i]; }
  int64_t* begin() { return d_; }
  int64_t* end() { return d_ + n_; }
  const int64_t* begin() const { return d_; }
  const int64_t* end() const { return d_ + n_; }
  const int64_t* data() const { return d_; }
  int64_t back() const { return d_[n_ - 1]; }
  void push_back(int64_t v) {
    FT_CHECK(n_ < kMaxDims, "tensors have at most ", kMaxDims, " dimensions");
    d_[n_++] = v;
  }
  void insert(int pos, int64_t v) {
    FT_CHECK(n_ < kMaxDims, "tensors have at most ", kMaxDims, " dimensions");
    for (int i = n_; i > pos; --i) d_[i] = d_[i - 1];
    d_[pos] = v;
    ++n_;
  }
  void erase(int pos) {
    for (int i = pos; i + 1 < n_; ++i) d_[i] = d_[i + 1];
    --n_;
  }
  void resize(int n, int64_t value = 0) {
    FT_CHECK(n >= 0 && n <= kMaxDims, "tensors have at most ", kMaxDims, " dimensions, asked for ", n);
    for (int i = n_; i < n; ++i) d_[i] = value;
    n_ = n;
  }
  std::vector<int64_t> vec() const { return std::vector<int64_t>(begin(), end()); }
  int64_t numel() const {
    int64_t p = 1;
    for (int i = 0; i < n_; ++i) p *= d_[i];
    return p;
  }
  bool operator==(const Dims& o) const {
    if (n_ != o.n_) return false;
    for (int i = 0; i < n_; ++i)
      if (d_[i] != o.d_[i]) return false;
    return true;
  }
  std::string str() const;  // "[2, 3, 4]"

 private:
  template <class It>
  void assign(It b, It e) {
    n_ = 0;
    for (; b != e; ++b) push_back(static_cast<int64_t>(*b));
  }
  int64_t d_[kMaxDims] = {};
  int n_ = 0;
};

using Shape = Dims;
using Strides = Dims;

// Row-major (C order) strides for `shape`, in elements.
Strides contiguous_strides(const Shape& shape);
// Broadcast two shapes with NumPy rules; `what` names the op in the error.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* what);
// Normalises a possibly negative dimension index for a tensor of rank `ndim`.
int wrap_dim(int64_t dim, int ndim, const char* what);

}  // namespace ft
