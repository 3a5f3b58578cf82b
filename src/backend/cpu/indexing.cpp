#include "backend/cpu/indexing.h"

#include <algorithm>
#include <cstring>

#include "backend/cpu/copy.h"
#include "backend/cpu/dispatch.h"
#include "backend/cpu/loops.h"
#include "fasttrain/parallel.h"

namespace ft::cpu {

namespace {

int64_t prod(const Shape& s, int begin, int end) {
  int64_t p = 1;
  for (int d = begin; d < end; ++d) p *= s[d];
  return p;
}

Tensor dense(const Tensor& t) {
  if (t.is_contiguous()) return t;
  Tensor c = empty(t.shape(), t.options());
  copy(c, t);
  return c;
}

// The index as a dense i64 tensor (a no-op for the common dense i64 case).
Tensor dense_i64(const Tensor& index) {
  if (index.dtype() == DType::I64 && index.is_contiguous()) return index;
  Tensor c = empty(index.shape(), DType::I64);
  copy(c, index);
  return c;
}

// Copies one row of `bytes` bytes; fixed-size cases compile to a single load/store.
inline void copy_row(char* dst, const char* src, size_t bytes) {
  switch (bytes) {
    case 2: std::memcpy(dst, src, 2); return;
    case 4: std::memcpy(dst, src, 4); return;
    case 8: std::memcpy(dst, src, 8); return;
    default: std::memcpy(dst, src, bytes);
  }
}

}  // namespace

void cat(const std::vector<Tensor>& inputs, int dim, const Tensor& out) {
  if (out.numel() == 0) return;
  const Shape& s = out.shape();
  const int64_t outer = prod(s, 0, dim), inner = prod(s, dim + 1, s.size());
  const size_t es = out.element_size();
  bool all_dense = true;
  for (const Tensor& t : inputs) all_dense = all_dense && t.is_contiguous() && t.dtype() == out.dtype();
  // Few outer rows (cat along dim 0): each input is one long contiguous block of out, and the
  // per-input copy parallelises within it.
  if (!all_dense || outer < 4 * get_num_threads()) {
    int64_t off = 0;
    for (const Tensor& t : inputs) {
      const int64_t n = t.size(dim);
      if (n > 0) copy(out.detach().narrow(dim, off, n), t);
      off += n;
    }
    return;
  }
  const int64_t row = s[dim] * inner;  // elements per output row
  std::vector<const char*> src(inputs.size());
  std::vector<int64_t> width(inputs.size()), start(inputs.size());
  int64_t off = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    src[i] = static_cast<const char*>(inputs[i].raw_data());
    width[i] = inputs[i].size(dim) * inner;
    start[i] = off;
    off += width[i];
  }
  char* dst = static_cast<char*>(out.raw_data());
  parallel_for(0, outer, std::max<int64_t>(1, 16384 / std::max<int64_t>(row, 1)), [&](int64_t o0, int64_t o1) {
    for (int64_t o = o0; o < o1; ++o)
      for (size_t i = 0; i < inputs.size(); ++i)
        if (width[i]) std::memcpy(dst + (o * row + start[i]) * es, src[i] + o * width[i] * es, width[i] * es);
  });
}

void check_index_range(const Tensor& index, int64_t size, std::optional<int64_t> ignore,
                       const backend::IndexErrorText& error) {
  if (index.numel() == 0) return;
  Tensor idx = dense_i64(index);
  const int64_t* p = idx.data<int64_t>();
  for (int64_t i = 0, n = idx.numel(); i < n; ++i) {
    if (ignore && p[i] == *ignore) continue;
    if (p[i] < 0 || p[i] >= size) throw Error(error(p[i], i));
  }
}

void index_select(const Tensor& x_in, int dim, const Tensor& index, const Tensor& out) {
  if (out.numel() == 0) return;
  Tensor x = dense(x_in);
  Tensor idx = dense_i64(index);
  const int64_t* ip = idx.data<int64_t>();
  const Shape& s = x.shape();
  const int64_t outer = prod(s, 0, dim), V = s[dim], inner = prod(s, dim + 1, s.size());
  const int64_t n = idx.numel();
  const size_t es = x.element_size(), row_bytes = inner * es;
  const char* src = static_cast<const char*>(x.raw_data());
  char* dst = static_cast<char*>(out.raw_data());
  parallel_for(0, outer * n, std::max<int64_t>(1, 16384 / std::max<int64_t>(inner, 1)), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t o = r / n, j = r - o * n;
      copy_row(dst + r * row_bytes, src + (o * V + ip[j]) * row_bytes, row_bytes);
    }
  });
}

void index_add(const Tensor& acc, int dim, const Tensor& index, const Tensor& src_in, std::optional<int64_t> skip) {
  if (src_in.numel() == 0) return;
  Tensor src = dense(src_in);
  Tensor idx = dense_i64(index);
  const int64_t* ip = idx.data<int64_t>();
  const Shape& s = acc.shape();
  const int64_t outer = prod(s, 0, dim), V = s[dim], inner = prod(s, dim + 1, s.size());
  const int64_t n = idx.numel();
  const int64_t skip_v = skip ? *skip : -1;
  // Destination-row partitions per outer slice: enough tasks for every thread.
  const int threads = get_num_threads();
  const int64_t parts = outer >= threads ? 1 : std::max<int64_t>(1, std::min<int64_t>(V, threads));
  FT_CHECK(acc.dtype() == DType::F32 || acc.dtype() == DType::F64,
           "index_add: internal error, accumulator must be f32 or f64");
  auto body = [&](auto* out) {
    using Acc = std::remove_pointer_t<decltype(out)>;
    FT_DISPATCH_FLOATING(src.dtype(), "index_add", [&] {
      using Src = scalar_t;
      const Src* in = src.data<Src>();
      parallel_for(0, outer * parts, 1, [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) {
          const int64_t o = t / parts, p = t % parts;
          const int64_t v0 = V * p / parts, v1 = V * (p + 1) / parts;
          for (int64_t j = 0; j < n; ++j) {
            const int64_t v = ip[j];
            if (v < v0 || v >= v1 || v == skip_v) continue;
            Acc* d = out + (o * V + v) * inner;
            const Src* g = in + (o * n + j) * inner;
            for (int64_t k = 0; k < inner; ++k) d[k] += static_cast<Acc>(static_cast<compute_t<Src>>(g[k]));
          }
        }
      });
    });
  };
  if (acc.dtype() == DType::F32)
    body(acc.data<float>());
  else
    body(acc.data<double>());
}

void gather(const Tensor& x, int dim, const Tensor& index, const Tensor& out) {
  if (out.numel() == 0) return;
  // x restrided to index's shape with stride 0 along dim: operand k points at x[..., 0, ...] and
  // the index value selects the offset along dim.
  Strides st = x.strides();
  st[dim] = 0;
  Tensor xv = x.detach().as_strided(index.shape(), st, x.offset());
  const int64_t dim_bytes = x.stride(dim) * static_cast<int64_t>(x.element_size());
  const size_t es = x.element_size();
  FT_DISPATCH_INDEX(index.dtype(), "gather", [&] {
    using I = scalar_t;
    StridedLoop L = make_loop(out, {&xv, &index});
    run_loop(L, [&](char** p, const int64_t* s, int64_t n) {
      for (int64_t i = 0; i < n; ++i) {
        const int64_t v = *reinterpret_cast<const I*>(p[2] + i * s[2]);
        copy_row(p[0] + i * s[0], p[1] + i * s[1] + v * dim_bytes, es);
      }
    });
  });
}

void scatter_add(const Tensor& acc, int dim, const Tensor& index, const Tensor& src) {
  if (src.numel() == 0) return;
  Strides st = acc.strides();
  st[dim] = 0;
  // acc restrided to index's shape; operand 0 of the loop, written through the index offset.
  Tensor av = acc.detach().as_strided(index.shape(), st, acc.offset());
  const int64_t dim_elems = acc.stride(dim);
  FT_CHECK(acc.dtype() == DType::F32 || acc.dtype() == DType::F64,
           "scatter_add: internal error, accumulator must be f32 or f64");
  auto body = [&](auto* tag) {
    using Acc = std::remove_pointer_t<decltype(tag)>;
    FT_DISPATCH_FLOATING(src.dtype(), "scatter_add", [&] {
      using Src = scalar_t;
      FT_DISPATCH_INDEX(index.dtype(), "scatter_add", [&] {
        using I = scalar_t;
        StridedLoop L = make_loop(av, {&src, &index});
        // One chunk (grain above numel): the loop must not be split across threads.
        run_loop(
            L,
            [&](char** p, const int64_t* s, int64_t n) {
              for (int64_t i = 0; i < n; ++i) {
                const int64_t v = *reinterpret_cast<const I*>(p[2] + i * s[2]);
                Acc* d = reinterpret_cast<Acc*>(p[0] + i * s[0]) + v * dim_elems;
                *d += static_cast<Acc>(static_cast<compute_t<Src>>(*reinterpret_cast<const Src*>(p[1] + i * s[1])));
              }
            },
            L.numel + 1);
      });
    });
  };
  if (acc.dtype() == DType::F32)
    body(static_cast<float*>(nullptr));
  else
    body(static_cast<double*>(nullptr));
}

}  // namespace ft::cpu
