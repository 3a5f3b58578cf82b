// Joining, splitting and gathering: validation, output allocation and gradients. split/chunk
// return views (slices sharing storage, as in PyTorch) tied to one multi-output node whose
// backward joins the pieces' gradients with one cat; cat's backward hands out slices of the
// gradient. Gathers scatter-add their gradient into a zeroed f32/f64 buffer (f32 for the 16-bit
// dtypes, so repeated indices do not round at every addition).
#include "fasttrain/ops/indexing.h"

#include "backend/kernels.h"
#include "ops/common.h"

namespace ft {

using backend::kernels;

namespace {

void check_index(const Tensor& index, const char* op) {
  FT_CHECK(index.defined(), op, ": index must be defined");
  FT_CHECK(index.dtype() == DType::I64 || index.dtype() == DType::I32, op,
           ": index must be an i64 or i32 tensor, found ", dtype_name(index.dtype()));
}

// Every index in [0, size) of dimension d (raised at once on the CPU; on a GPU at the next host
// synchronisation, see IndexErrorText).
void check_range(const Tensor& index, int64_t size, int d, const char* op) {
  kernels(index).check_index_range(index, size, std::nullopt, [op, d, size](int64_t v, int64_t) {
    return detail::concat(op, ": index ", v, " is out of range for dimension ", d, " of size ", size);
  });
}

DType acc_dtype(DType t) { return t == DType::F64 ? DType::F64 : DType::F32; }

// Gradient buffer for a scatter-add: zeros in the accumulation dtype.
Tensor zero_acc(const Shape& shape, DType dt, Device device) {
  return zeros(shape, TensorOptions(acc_dtype(dt), device));
}
Tensor from_acc(const Tensor& acc, DType dt) { return acc.dtype() == dt ? acc : acc.to(dt); }

std::vector<Tensor> split_impl(const Tensor& x, const std::vector<int64_t>& sizes, int d, const char* op) {
  std::vector<Tensor> pieces;
  Tensor base = x.detach();
  int64_t off = 0;
  for (int64_t n : sizes) {
    pieces.push_back(base.slice(d, off, off + n));
    off += n;
  }
  if (autograd::any_requires_grad({&x})) {
    std::vector<Tensor*> outs;
    for (Tensor& p : pieces) outs.push_back(&p);
    const Shape shape = x.shape();
    autograd::record_function("SplitBackward", {&x}, outs, [shape, d](std::vector<Tensor>& g) {
      Tensor gx = empty(shape, g[0].options());
      kernels(gx).cat(g, d, gx);
      return std::vector<Tensor>{gx};
    });
  }
  return pieces;
}

}  // namespace

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  FT_CHECK(!tensors.empty(), "cat: expected a non-empty list of tensors");
  const Tensor& first = tensors[0];
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    FT_CHECK(t.defined(), "cat: tensor ", i, " is undefined");
    FT_CHECK(t.dtype() == first.dtype(), "cat: tensor ", i, " has dtype ", dtype_name(t.dtype()), " but tensor 0 has ",
             dtype_name(first.dtype()));
    FT_CHECK(t.device() == first.device(), "cat: tensor ", i, " is on ", t.device().str(), " but tensor 0 is on ",
             first.device().str());
    FT_CHECK(t.dim() == first.dim(), "cat: tensor ", i, " has ", t.dim(), " dimensions (shape ", t.shape().str(),
             ") but tensor 0 has ", first.dim(), " (shape ", first.shape().str(), ")");
  }
  FT_CHECK(first.dim() > 0, "cat: zero-dimensional tensors cannot be concatenated");
  const int d = wrap_dim(dim, first.dim(), "cat");
  Shape shape = first.shape();
  shape[d] = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    for (int k = 0; k < t.dim(); ++k)
      FT_CHECK(k == d || t.size(k) == first.size(k), "cat: tensor ", i, " has shape ", t.shape().str(),
               " but tensor 0 has ", first.shape().str(), "; sizes must match except in dimension ", d);
    shape[d] += t.size(d);
  }
  Tensor out = empty(shape, first.options());
  kernels(out).cat(tensors, d, out);
  if (autograd::any_requires_grad(tensors)) {
    std::vector<int64_t> sizes;
    for (const Tensor& t : tensors) sizes.push_back(t.size(d));
    std::vector<const Tensor*> ins;
    for (const Tensor& t : tensors) ins.push_back(&t);
    autograd::record_function("CatBackward", ins, {&out}, [sizes, d](std::vector<Tensor>& g) {
      std::vector<Tensor> gs;
      int64_t off = 0;
      for (int64_t n : sizes) {
        gs.push_back(g[0].slice(d, off, off + n));
        off += n;
      }
      return gs;
    });
  }
  return out;
}

Tensor stack(const std::vector<Tensor>& tensors, int64_t dim) {
  FT_CHECK(!tensors.empty(), "stack: expected a non-empty list of tensors");
  for (size_t i = 0; i < tensors.size(); ++i) {
    FT_CHECK(tensors[i].defined(), "stack: tensor ", i, " is undefined");
    FT_CHECK(tensors[i].shape() == tensors[0].shape(), "stack: tensor ", i, " has shape ", tensors[i].shape().str(),
             " but tensor 0 has ", tensors[0].shape().str(), "; all tensors must have the same shape");
  }
  const int d = wrap_dim(dim, tensors[0].dim() + 1, "stack");
  std::vector<Tensor> us;
  for (const Tensor& t : tensors) us.push_back(t.unsqueeze(d));
  return cat(us, d);
}

std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim) {
  FT_CHECK(x.defined(), "split: input is undefined");
  FT_CHECK(x.dim() > 0, "split: cannot split a zero-dimensional tensor");
  const int d = wrap_dim(dim, x.dim(), "split");
  const int64_t n = x.size(d);
  FT_CHECK(split_size > 0 || (split_size == 0 && n == 0), "split: split_size must be positive, found ", split_size);
  std::vector<int64_t> sizes;
  if (n == 0) sizes.push_back(0);
  for (int64_t off = 0; off < n; off += split_size) sizes.push_back(std::min(split_size, n - off));
  return split_impl(x, sizes, d, "split");
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  FT_CHECK(x.defined(), "split: input is undefined");
  FT_CHECK(x.dim() > 0, "split: cannot split a zero-dimensional tensor");
  const int d = wrap_dim(dim, x.dim(), "split");
  FT_CHECK(!sizes.empty(), "split: expected a non-empty list of sizes");
  int64_t total = 0;
  for (int64_t s : sizes) {
    FT_CHECK(s >= 0, "split: sizes must be non-negative, found ", Dims(sizes).str());
    total += s;
  }
  FT_CHECK(total == x.size(d), "split: sizes ", Dims(sizes).str(), " sum to ", total, " but dimension ", d,
           " has size ", x.size(d));
  return split_impl(x, sizes, d, "split");
}

std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim) {
  FT_CHECK(x.defined(), "chunk: input is undefined");
  FT_CHECK(chunks > 0, "chunk: number of chunks must be positive, found ", chunks);
  FT_CHECK(x.dim() > 0, "chunk: cannot chunk a zero-dimensional tensor");
  const int d = wrap_dim(dim, x.dim(), "chunk");
  const int64_t n = x.size(d);
  // PyTorch's rule: pieces of ceil(n / chunks), so fewer than `chunks` pieces may come back.
  const int64_t size = std::max<int64_t>(1, (n + chunks - 1) / chunks);
  std::vector<int64_t> sizes;
  if (n == 0) sizes.push_back(0);
  for (int64_t off = 0; off < n; off += size) sizes.push_back(std::min(size, n - off));
  return split_impl(x, sizes, d, "chunk");
}

Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index) {
  FT_CHECK(x.defined(), "index_select: input is undefined");
  check_index(index, "index_select");
  ops::common_device({&x, &index}, "index_select");
  FT_CHECK(index.dim() <= 1, "index_select: index must be 1-d, found shape ", index.shape().str());
  FT_CHECK(x.dim() > 0, "index_select: input must have at least 1 dimension");
  const int d = wrap_dim(dim, x.dim(), "index_select");
  check_range(index, x.size(d), d, "index_select");
  Shape shape = x.shape();
  shape[d] = index.numel();
  Tensor out = empty(shape, x.options());
  kernels(x).index_select(x, d, index, out);
  if (autograd::any_requires_grad({&x})) {
    const Shape xs = x.shape();
    const DType dt = x.dtype();
    autograd::SavedTensor idx(index.detach());
    autograd::record_function("IndexSelectBackward", {&x}, {&out}, [xs, dt, idx, d](std::vector<Tensor>& g) {
      Tensor acc = zero_acc(xs, dt, g[0].device());
      kernels(acc).index_add(acc, d, idx.get("IndexSelectBackward"), g[0], std::nullopt);
      return std::vector<Tensor>{from_acc(acc, dt)};
    });
  }
  return out;
}

Tensor gather(const Tensor& x, int64_t dim, const Tensor& index) {
  FT_CHECK(x.defined(), "gather: input is undefined");
  check_index(index, "gather");
  ops::common_device({&x, &index}, "gather");
  FT_CHECK(index.dim() == x.dim(), "gather: index has ", index.dim(), " dimensions (shape ", index.shape().str(),
           ") but input has ", x.dim(), " (shape ", x.shape().str(), ")");
  const int d = wrap_dim(dim, std::max(x.dim(), 1), "gather");
  FT_CHECK(x.dim() > 0, "gather: input must have at least 1 dimension");
  for (int k = 0; k < x.dim(); ++k)
    FT_CHECK(k == d || index.size(k) <= x.size(k), "gather: index shape ", index.shape().str(),
             " is larger than input shape ", x.shape().str(), " in dimension ", k);
  check_range(index, x.size(d), d, "gather");
  Tensor out = empty(index.shape(), x.options());
  kernels(x).gather(x, d, index, out);
  if (autograd::any_requires_grad({&x})) {
    const Shape xs = x.shape();
    const DType dt = x.dtype();
    autograd::SavedTensor idx(index.detach());
    autograd::record_function("GatherBackward", {&x}, {&out}, [xs, dt, idx, d](std::vector<Tensor>& g) {
      Tensor acc = zero_acc(xs, dt, g[0].device());
      kernels(acc).scatter_add(acc, d, idx.get("GatherBackward"), g[0]);
      return std::vector<Tensor>{from_acc(acc, dt)};
    });
  }
  return out;
}

void check_index_range(const Tensor& index, int64_t size,
                       const std::function<std::string(int64_t value, int64_t position)>& message) {
  check_index(index, "check_index_range");
  kernels(index).check_index_range(index, size, std::nullopt, message);
}

Tensor embedding(const Tensor& ids, const Tensor& weight, std::optional<int64_t> padding_idx) {
  FT_CHECK(ids.defined() && weight.defined(), "embedding: ids and weight must be defined");
  FT_CHECK(ids.dtype() == DType::I64 || ids.dtype() == DType::I32,
           "embedding: ids must be an i64 or i32 tensor, found ", dtype_name(ids.dtype()));
  ops::common_device({&ids, &weight}, "embedding");
  FT_CHECK(weight.dim() == 2, "embedding: weight must be 2-d [vocabulary, dim], found shape ", weight.shape().str());
  ops::check_floating(weight, "embedding", "weight");
  const int64_t V = weight.size(0), D = weight.size(1);
  std::optional<int64_t> pad;
  if (padding_idx) {
    FT_CHECK(*padding_idx >= -V && *padding_idx < V, "embedding: padding_idx ", *padding_idx,
             " is out of range for a vocabulary of ", V);
    pad = *padding_idx < 0 ? *padding_idx + V : *padding_idx;
  }
  kernels(ids).check_index_range(ids, V, std::nullopt, [V](int64_t id, int64_t) {
    return detail::concat("embedding: id ", id, " is out of range for a vocabulary of ", V);
  });
  Tensor flat = ids.detach().reshape({ids.numel()});
  Shape shape = ids.shape();
  shape.push_back(D);
  Tensor out2 = empty({ids.numel(), D}, weight.options());
  kernels(weight).index_select(weight, 0, flat, out2);
  Tensor out = out2.view(shape);
  if (autograd::any_requires_grad({&weight})) {
    const DType dt = weight.dtype();
    const int64_t n = flat.numel();
    autograd::SavedTensor sids(flat);
    autograd::record_function("EmbeddingBackward", {&weight}, {&out}, [sids, n, V, D, dt, pad](std::vector<Tensor>& g) {
      Tensor acc = zero_acc({V, D}, dt, g[0].device());
      kernels(acc).index_add(acc, 0, sids.get("EmbeddingBackward"), g[0].reshape({n, D}), pad);
      return std::vector<Tensor>{from_acc(acc, dt)};
    });
  }
  return out;
}

}  // namespace ft
