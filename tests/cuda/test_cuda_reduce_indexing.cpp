// CUDA reductions and indexing (backend/cuda/reduce.cu, indexing.cu) against the CPU backend:
// sum / mean / var over any dims (keepdim, all dims, strided views, long and many short rows),
// max / argmax with ties and NaN, cat, index_select, gather and embedding, forward and backward
// through the public ops, plus the out-of-range errors (which must read as the CPU's). The same
// inputs run on both devices and are compared by norms (support/cuda_compare.h); integer results
// and indices must match exactly, and the embedding gradient must be bitwise reproducible.
// Upstream gradients are random, not ones, so a misrouted gradient cannot hide in a uniform sum.
// Skipped with a visible message where there is no GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "fasttrain/fasttrain.h"
#include "support/cuda_compare.h"
#include "support/expect_error.h"
#include "support/require_gpu.h"

using namespace ft;
using ft::test::error_of;
using ft::testing::backward_random;
using ft::testing::gpu;
using ft::testing::Leaf;
using ft::testing::leaf;
using ft::testing::rnd;
using ft::testing::tol;

namespace {

using Fn = std::function<Tensor(const Tensor&)>;

const DType kDtypes[] = {DType::F32, DType::BF16, DType::F16};

// Integers in [low, high) as dtype dt (few distinct values: many ties for max).
Tensor ints(int64_t low, int64_t high, const Shape& shape, DType dt, uint64_t seed) {
  Generator g(seed);
  return randint(low, high, shape, DType::I64, &g).to(dt).detach();
}

// Bit-for-bit equal values (integer results, indices, copies), same shape, dtype, and on the GPU.
void expect_exact(const Tensor& got, const Tensor& want) {
  ASSERT_TRUE(got.defined() && want.defined());
  EXPECT_TRUE(got.device().is_cuda()) << "result is on " << got.device().str();
  ASSERT_EQ(got.shape(), want.shape());
  ASSERT_EQ(got.dtype(), want.dtype());
  EXPECT_EQ(got.to(Device::cpu()).to_vector(), want.to_vector());
}

// f(view(x)) on both devices: forward, then the gradient of x for a random upstream gradient.
void check_fn(
    const std::string& what, const Tensor& value, const Fn& f, double tolerance, bool backward = true,
    const Fn& view = [](const Tensor& t) { return t; }) {
  SCOPED_TRACE(what);
  Leaf x = leaf(value, backward);
  Tensor yc = f(view(x.cpu)), yg = f(view(x.cuda));
  EXPECT_CLOSE_TO_CPU(yg, yc, tolerance);
  if (!backward) return;
  backward_random(yc, yg, 99);
  EXPECT_CLOSE_TO_CPU(x.cuda.grad(), x.cpu.grad(), tolerance);
}

// sum, mean and (with_var) var with corrections 1 and 0 over dims, each with and without keepdim.
void check_reductions(
    const std::string& what, const Tensor& value, const Dims& dims, double tolerance, bool backward = true,
    const Fn& view = [](const Tensor& t) { return t; }, bool with_var = true) {
  const std::string where = what + " dims " + dims.str();
  for (bool keep : {false, true}) {
    const std::string k = keep ? " keepdim" : "";
    check_fn(
        "sum " + where + k, value, [&](const Tensor& t) { return sum(t, dims, keep); }, tolerance, backward, view);
    check_fn(
        "mean " + where + k, value, [&](const Tensor& t) { return mean(t, dims, keep); }, tolerance, backward, view);
    if (!with_var) continue;
    check_fn(
        "var " + where + k, value, [&](const Tensor& t) { return var(t, dims, 1, keep); }, tolerance, backward, view);
    check_fn(
        "var(correction 0) " + where + k, value, [&](const Tensor& t) { return var(t, dims, 0, keep); }, tolerance,
        backward, view);
  }
}

// idx on t's device (the index of an op run on both devices).
Tensor on_device_of(const Tensor& idx, const Tensor& t) { return idx.to(t.device()); }

// An index check's error: at once on the CPU; on the GPU the check runs on the device and its
// error comes at the next host synchronisation, with the CPU's message and a note saying so.
void expect_same_error(const std::string& what, const std::function<void(Device)>& f, const std::string& fragment) {
  SCOPED_TRACE(what);
  const std::string want = error_of([&] { f(Device::cpu()); });
  const Device dev = Device::cuda(0);
  std::string got = error_of([&] { f(dev); });
  EXPECT_EQ(got, "(no error)") << "the GPU's check made the host wait for it";
  got = error_of([&] { synchronize(current_stream(dev)); });
  EXPECT_NE(want.find(fragment), std::string::npos) << want;
  EXPECT_EQ(got, want + " (checked on cuda:0 and reported at the first host synchronisation after it)");
  EXPECT_EQ(error_of([&] { synchronize(current_stream(dev)); }), "(no error)") << "an error is reported once";
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// sum / mean / var

TEST(CudaReduce, SumMeanVarOverDims) {
  REQUIRE_GPU();
  const std::vector<Dims> dim_sets = {{0}, {1}, {2}, {-1}, {0, 2}, {0, 1}, {1, 2}, {}};
  for (DType dt : kDtypes)
    for (const Dims& dims : dim_sets) check_reductions(dtype_name(dt), rnd({6, 7, 9}, dt, 1, 1.0, 0.5), dims, tol(dt));
  // Full reductions through the no-dims overloads, and a 0-d input.
  for (DType dt : kDtypes) {
    check_fn(
        std::string("sum() ") + dtype_name(dt), rnd({33, 65}, dt, 2, 1.0, 0.5), [](const Tensor& t) { return sum(t); },
        tol(dt));
    check_fn(
        std::string("mean() ") + dtype_name(dt), rnd({33, 65}, dt, 3, 1.0, 0.5),
        [](const Tensor& t) { return mean(t); }, tol(dt));
    check_fn(
        std::string("sum of 0-d ") + dtype_name(dt), rnd({}, dt, 4), [](const Tensor& t) { return sum(t); }, tol(dt));
  }
}

TEST(CudaReduce, SumMeanVarF64) {
  REQUIRE_GPU();
  for (const Dims& dims : std::vector<Dims>{{0}, {2}, {0, 2}, {}})
    check_reductions("f64", rnd({5, 8, 11}, DType::F64, 5, 1.0, 0.5), dims, 1e-10);
}

TEST(CudaReduce, StridedViews) {
  REQUIRE_GPU();
  const std::vector<Dims> dim_sets = {{0}, {1}, {2}, {0, 1}, {1, 2}, {}};
  for (DType dt : {DType::F32, DType::BF16}) {
    const std::string n = dtype_name(dt);
    for (const Dims& dims : dim_sets) {
      check_reductions(n + " permuted", rnd({8, 10, 12}, dt, 6, 1.0, 0.5), dims, tol(dt), true, [](const Tensor& t) {
        return t.permute({2, 0, 1});
      });
      check_reductions(n + " transposed", rnd({8, 10, 12}, dt, 7, 1.0, 0.5), dims, tol(dt), true,
                       [](const Tensor& t) { return t.transpose(0, 2); });
      check_reductions(n + " sliced", rnd({8, 10, 12}, dt, 8, 1.0, 0.5), dims, tol(dt), true,
                       [](const Tensor& t) { return t.slice(1, 1, 10, 3); });
      // Stride 0: a broadcast dim reduced or kept. No var: over copies of one value it is 0 up to
      // the rounding of the mean, and a relative comparison of rounding noise means nothing.
      check_reductions(
          n + " expanded", rnd({1, 10, 12}, dt, 9, 1.0, 0.5), dims, tol(dt), true,
          [](const Tensor& t) {
            return t.expand({8, 10, 12});
          },
          false);
    }
  }
}

// Long reductions: one or a few outputs over ~1M elements (the split into partial results), along
// rows and along columns. Shifted values keep the sums away from zero, so relative errors mean
// something.
TEST(CudaReduce, LargeReductions) {
  REQUIRE_GPU();
  const int64_t M = int64_t(1) << 20;
  for (DType dt : kDtypes) {
    const std::string n = dtype_name(dt);
    const Tensor flat = rnd({M}, dt, 10, 1.0, 1.0);
    check_fn(
        "sum 1M " + n, flat, [](const Tensor& t) { return sum(t); }, tol(dt));
    check_fn(
        "mean 1M " + n, flat, [](const Tensor& t) { return mean(t); }, tol(dt), false);
    check_fn(
        "var 1M " + n, flat, [](const Tensor& t) { return var(t, {0}); }, tol(dt), false);
    const Tensor square = rnd({1024, 1024}, dt, 11, 1.0, 1.0);
    for (const Dims& dims : std::vector<Dims>{{0}, {1}, {}})
      check_fn(
          "sum 1024x1024 " + n + " " + dims.str(), square, [&](const Tensor& t) { return sum(t, dims); }, tol(dt));
    check_fn(
        "var 1024x1024 dim 0 " + n, square, [](const Tensor& t) { return var(t, {0}); }, tol(dt), false);
    const Tensor wide = rnd({3, M / 2}, dt, 12, 1.0, 1.0);
    check_fn(
        "sum 3 long rows " + n, wide, [](const Tensor& t) { return sum(t, {1}); }, tol(dt));
    check_fn(
        "var 3 long rows " + n, wide, [](const Tensor& t) { return var(t, {1}); }, tol(dt), false);
    const Tensor tall = rnd({M / 2, 3}, dt, 13, 1.0, 1.0);
    check_fn(
        "sum 3 long columns " + n, tall, [](const Tensor& t) { return sum(t, {0}); }, tol(dt));
    check_fn(
        "var 3 long columns " + n, tall, [](const Tensor& t) { return var(t, {0}); }, tol(dt), false);
    check_fn(
        "mean 3 long columns, transposed " + n, tall, [](const Tensor& t) { return mean(t.t(), {1}); }, tol(dt), false);
  }
}

TEST(CudaReduce, ManySmallRows) {
  REQUIRE_GPU();
  for (DType dt : kDtypes) {
    const std::string n = dtype_name(dt);
    check_reductions(n + " [100000, 3]", rnd({100000, 3}, dt, 14, 1.0, 0.5), {1}, tol(dt));
    check_reductions(n + " [65536, 17]", rnd({65536, 17}, dt, 15, 1.0, 0.5), {1}, tol(dt), false);
    check_reductions(n + " [20000, 5, 3]", rnd({20000, 5, 3}, dt, 16, 1.0, 0.5), {1}, tol(dt), false);
    // Only size-1 dims reduced: nothing to combine.
    check_fn(
        "sum over a size-1 dim " + n, rnd({5000, 1, 7}, dt, 17), [](const Tensor& t) { return sum(t, {1}); }, tol(dt));
  }
}

TEST(CudaReduce, EmptyReductions) {
  REQUIRE_GPU();
  const Tensor none = rnd({4, 0, 3}, DType::F32, 18);
  check_fn(
      "sum over 0 elements", none, [](const Tensor& t) { return sum(t, {1}); }, 1e-5, false);
  check_fn(
      "mean over 0 elements", none, [](const Tensor& t) { return mean(t, {1}); }, 1e-5, false);
  check_fn(
      "var over 0 elements (NaN)", none, [](const Tensor& t) { return var(t, {1}); }, 1e-5, false);
  check_fn(
      "sum to an empty output", rnd({0, 5}, DType::F32, 19), [](const Tensor& t) { return sum(t, {1}); }, 1e-5, false);
}

TEST(CudaReduce, IntegerSumsAreExact) {
  REQUIRE_GPU();
  const Shape s{37, 53};
  const std::vector<std::pair<DType, std::pair<int64_t, int64_t>>> cases = {
      {DType::I64, {-1000000, 1000000}}, {DType::I32, {-1000, 1000}}, {DType::U8, {0, 256}}, {DType::Bool, {0, 2}}};
  for (const auto& [dt, range] : cases) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor x = ints(range.first, range.second, s, dt, 20);
    for (const Dims& dims : std::vector<Dims>{{0}, {1}, {}}) expect_exact(sum(gpu(x), dims), sum(x, dims));
    expect_exact(sum(gpu(x).t(), {1}), sum(x.t(), {1}));
  }
  const Tensor big = ints(-50, 50, {int64_t(1) << 20}, DType::I32, 21);
  expect_exact(sum(gpu(big)), sum(big));
}

// ---------------------------------------------------------------------------------------------
// max / argmax

namespace {

// max(x, dim) values and indices, argmax(x, dim), and the gradient through the values.
void check_max_dim(const std::string& what, const Tensor& value, int64_t dim, bool keep) {
  SCOPED_TRACE(what + " dim " + std::to_string(dim) + (keep ? " keepdim" : ""));
  const bool floating = is_floating(value.dtype());
  Leaf x = leaf(value, floating);
  ValuesIndices rc = max(x.cpu, dim, keep), rg = max(x.cuda, dim, keep);
  if (floating)
    EXPECT_CLOSE_TO_CPU(rg.values, rc.values, tol(value.dtype()));
  else
    expect_exact(rg.values, rc.values);
  expect_exact(rg.indices, rc.indices);
  expect_exact(argmax(x.cuda.detach(), dim, keep), argmax(x.cpu.detach(), dim, keep));
  if (!floating) return;
  backward_random(rc.values, rg.values, 23);
  // Routing only: every gradient element is a copy of an upstream one, or zero.
  expect_exact(x.cuda.grad(), x.cpu.grad());
}

void check_max_all(const std::string& what, const Tensor& value, bool backward = true) {
  SCOPED_TRACE(what + " (all)");
  Leaf x = leaf(value, backward);
  Tensor vc = max(x.cpu), vg = max(x.cuda);
  EXPECT_CLOSE_TO_CPU(vg, vc, tol(value.dtype()));
  expect_exact(argmax(x.cuda.detach()), argmax(x.cpu.detach()));
  if (!backward) return;
  backward_random(vc, vg, 24);
  EXPECT_CLOSE_TO_CPU(x.cuda.grad(), x.cpu.grad(), tol(value.dtype()));
}

}  // namespace

TEST(CudaReduce, MaxWithTies) {
  REQUIRE_GPU();
  for (DType dt : {DType::F32, DType::BF16, DType::F16, DType::F64}) {
    const std::string n = dtype_name(dt);
    // Four distinct values over thousands of elements: every row has ties.
    const Tensor x = ints(0, 4, {13, 17, 19}, dt, 25);
    for (int64_t dim : {0, 1, 2, -1})
      for (bool keep : {false, true}) check_max_dim(n, x, dim, keep);
    check_max_dim(n + " transposed input", x.transpose(0, 2), 1, false);
    check_max_all(n, x);
    check_max_dim(n + " 0-d", rnd({}, dt, 26), 0, false);
  }
}

TEST(CudaReduce, MaxLargeAndLongColumns) {
  REQUIRE_GPU();
  // 1000 values over 1M elements: the maximum repeats ~1000 times; the first one must win across
  // the split's partial results.
  const Tensor flat = ints(0, 1000, {int64_t(1) << 20}, DType::F32, 27);
  check_max_all("1M f32", flat, false);
  check_max_dim("long columns f32", ints(0, 50, {4096, 600}, DType::F32, 28), 0, false);
  check_max_dim("long rows bf16", ints(0, 50, {600, 5000}, DType::BF16, 29), 1, false);
  check_max_dim("many short rows f32", ints(0, 3, {100000, 5}, DType::F32, 30), 1, false);
}

TEST(CudaReduce, MaxPropagatesNaN) {
  REQUIRE_GPU();
  std::vector<double> v = rnd({9, 40}, DType::F32, 31).to_vector();
  v[3 * 40 + 7] = NAN;
  v[3 * 40 + 20] = NAN;  // the first NaN of a row is the one reported
  v[5 * 40 + 39] = NAN;
  v[8 * 40 + 0] = NAN;
  const Tensor x = from_vector(v, {9, 40});
  for (int64_t dim : {0, 1}) {
    SCOPED_TRACE("dim " + std::to_string(dim));
    ValuesIndices rc = max(x, dim), rg = max(gpu(x), dim);
    EXPECT_CLOSE_TO_CPU(rg.values, rc.values, 1e-5);
    expect_exact(rg.indices, rc.indices);
  }
  EXPECT_CLOSE_TO_CPU(max(gpu(x)), max(x), 1e-5);
  expect_exact(argmax(gpu(x)), argmax(x));
}

TEST(CudaReduce, MaxIntegers) {
  REQUIRE_GPU();
  for (DType dt : {DType::I32, DType::I64, DType::U8}) {
    const Tensor x = ints(0, 7, {31, 29}, dt, 32);
    for (int64_t dim : {0, 1}) check_max_dim(dtype_name(dt), x, dim, false);
    expect_exact(max(gpu(x)), max(x));
    expect_exact(argmax(gpu(x)), argmax(x));
  }
}

// ---------------------------------------------------------------------------------------------
// cat

TEST(CudaIndexing, CatAlongEachDim) {
  REQUIRE_GPU();
  for (DType dt : {DType::F32, DType::BF16, DType::F16, DType::F64}) {
    for (int64_t d : {0, 1, 2}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " dim " + std::to_string(d));
      // Pieces of 1, 3, 0 and 2 along d (odd widths: narrow copy units), one of them strided.
      std::vector<Leaf> leaves;
      std::vector<Tensor> in_c, in_g;
      int64_t seed = 40;
      for (int64_t n : {1, 3, 0, 2}) {
        Shape s{4, 5, 3};
        s[d] = n;
        leaves.push_back(leaf(rnd(s, dt, seed++)));
      }
      Shape st{3, 5, 4};  // transposed (0, 2) below: the strided piece
      st[2 - d] = 2;
      leaves.push_back(leaf(rnd(st, dt, seed++)));
      for (size_t i = 0; i < leaves.size(); ++i) {
        const bool strided = i + 1 == leaves.size();
        in_c.push_back(strided ? leaves[i].cpu.transpose(0, 2) : leaves[i].cpu);
        in_g.push_back(strided ? leaves[i].cuda.transpose(0, 2) : leaves[i].cuda);
      }
      Tensor yc = cat(in_c, d), yg = cat(in_g, d);
      expect_exact(yg, yc);
      backward_random(yc, yg, 41);
      for (const Leaf& l : leaves)
        if (l.cpu.numel() > 0) expect_exact(l.cuda.grad(), l.cpu.grad());
    }
  }
  const Tensor a = ints(-9, 9, {3, 2}, DType::I64, 42), b = ints(-9, 9, {3, 5}, DType::I64, 43);
  expect_exact(cat({gpu(a), gpu(b)}, 1), cat({a, b}, 1));
  const Tensor s = ints(-9, 9, {4, 6}, DType::I32, 44);
  expect_exact(stack({gpu(s), gpu(s)}, 1), stack({s, s}, 1));
}

// split / chunk backward joins the pieces' gradients with the cat kernel.
TEST(CudaIndexing, SplitBackwardUsesCat) {
  REQUIRE_GPU();
  for (DType dt : kDtypes) {
    SCOPED_TRACE(dtype_name(dt));
    Leaf x = leaf(rnd({6, 10, 5}, dt, 45));
    auto loss = [&](const Tensor& t, Device dev) {
      std::vector<Tensor> parts = split(t, std::vector<int64_t>{3, 1, 6}, 1);
      Tensor total;
      for (size_t i = 0; i < parts.size(); ++i) {
        Tensor w = rnd(parts[i].shape(), dt, 46 + i).to(dev);
        Tensor term = sum(mul(parts[i], w));
        total = total.defined() ? add(total, term) : term;
      }
      return total;
    };
    loss(x.cpu, Device::cpu()).backward();
    loss(x.cuda, Device::cuda(0)).backward();
    EXPECT_CLOSE_TO_CPU(x.cuda.grad(), x.cpu.grad(), tol(dt));
  }
}

// ---------------------------------------------------------------------------------------------
// index_select / gather / embedding

TEST(CudaIndexing, IndexSelect) {
  REQUIRE_GPU();
  for (DType dt : kDtypes) {
    for (DType it : {DType::I64, DType::I32}) {
      for (int64_t d : {0, 1, 2}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " index " + dtype_name(it) + " dim " + std::to_string(d));
        const Shape s{5, 6, 7};
        // Repeated indices: the backward adds several rows into one.
        const Tensor idx = ints(0, s[d], {11}, it, 50 + d);
        check_fn(
            "contiguous", rnd(s, dt, 51), [&](const Tensor& t) { return index_select(t, d, on_device_of(idx, t)); },
            tol(dt));
        check_fn(
            "strided input", rnd({7, 6, 5}, dt, 52),
            [&](const Tensor& t) { return index_select(t, d, on_device_of(idx, t)); }, tol(dt), true,
            [](const Tensor& t) { return t.transpose(0, 2); });
        check_fn(
            "strided index", rnd(s, dt, 53),
            [&](const Tensor& t) { return index_select(t, d, on_device_of(idx, t).slice(0, 0, 11, 2)); }, tol(dt));
        check_fn(
            "0-d index", rnd(s, dt, 54),
            [&](const Tensor& t) { return index_select(t, d, on_device_of(idx, t).select(0, 3)); }, tol(dt));
      }
    }
  }
}

TEST(CudaIndexing, Gather) {
  REQUIRE_GPU();
  const Shape s{6, 7, 8};
  for (DType dt : kDtypes) {
    for (DType it : {DType::I64, DType::I32}) {
      for (int64_t d : {0, 1, 2}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " index " + dtype_name(it) + " dim " + std::to_string(d));
        // Smaller than x in the other dims, longer along d, values repeating along d.
        Shape is{4, 5, 6};
        is[d] = 12;
        const Tensor idx = ints(0, s[d], is, it, 60 + d);
        check_fn(
            "contiguous", rnd(s, dt, 61), [&](const Tensor& t) { return gather(t, d, on_device_of(idx, t)); }, tol(dt));
        check_fn(
            "strided input", rnd({8, 7, 6}, dt, 62),
            [&](const Tensor& t) { return gather(t, d, on_device_of(idx, t)); }, tol(dt), true,
            [](const Tensor& t) { return t.transpose(0, 2); });
        // Every other entry of an index twice as long in a dim other than d.
        const int e = (d + 1) % 3;
        Shape wide = is;
        wide[e] *= 2;
        const Tensor idx_wide = ints(0, s[d], wide, it, 63 + d);
        check_fn(
            "strided index", rnd(s, dt, 64),
            [&](const Tensor& t) { return gather(t, d, on_device_of(idx_wide, t).slice(e, 0, wide[e], 2)); }, tol(dt));
      }
    }
  }
  // The classic use: one pick per row (gather of log-probabilities by target).
  const Tensor logp = rnd({300, 50}, DType::F32, 64);
  const Tensor target = ints(0, 50, {300, 1}, DType::I64, 65);
  check_fn(
      "pick per row", logp, [&](const Tensor& t) { return gather(t, 1, on_device_of(target, t)); }, 1e-5);
}

namespace {

// embedding(ids, w, pad) on both devices: forward, backward, and a second GPU backward with the
// same upstream gradient that must reproduce the first bit for bit.
void check_embedding(const std::string& what, DType dt, int64_t V, int64_t D, const Tensor& ids,
                     std::optional<int64_t> pad) {
  SCOPED_TRACE(what + " " + dtype_name(dt));
  const Tensor w = rnd({V, D}, dt, 70);
  Leaf l = leaf(w);
  Tensor yc = embedding(ids, l.cpu, pad), yg = embedding(gpu(ids), l.cuda, pad);
  expect_exact(yg, yc);
  const Tensor gy = rnd(yc.shape(), dt, 71);
  yc.backward(gy);
  yg.backward(gpu(gy));
  EXPECT_CLOSE_TO_CPU(l.cuda.grad(), l.cpu.grad(), tol(dt));
  Tensor again = gpu(w).requires_grad_();
  embedding(gpu(ids), again, pad).backward(gpu(gy));
  EXPECT_EQ(again.grad().to(Device::cpu()).to_vector(), l.cuda.grad().to(Device::cpu()).to_vector())
      << "embedding backward is not deterministic";
}

}  // namespace

TEST(CudaIndexing, EmbeddingBackwardRepeatedIdsIsDeterministic) {
  REQUIRE_GPU();
  for (DType dt : kDtypes) {
    // Many repeats of 50 ids, a padding row, a row width that is no power of two.
    check_embedding("V 50 D 33 padding 7", dt, 50, 33, ints(0, 50, {1000}, DType::I64, 72), 7);
    // Language-model shape: [batch, time] i32 ids drawn from 20 tokens (runs of hundreds).
    check_embedding("V 1000 D 768 i32 ids", dt, 1000, 768, ints(0, 20, {8, 512}, DType::I32, 73), std::nullopt);
    // One column: a thread per run.
    check_embedding("D 1", dt, 9, 1, ints(0, 9, {333}, DType::I64, 74), 0);
  }
}

TEST(CudaIndexing, EmbeddingModule) {
  REQUIRE_GPU();
  Generator g1(75), g2(75);
  nn::Embedding ec(100, 64, &g1), eg(100, 64, &g2);
  eg.to(Device::cuda(0));
  const Tensor ids = ints(0, 100, {4, 37}, DType::I64, 76);
  Tensor yc = ec.forward(ids), yg = eg.forward(gpu(ids));
  expect_exact(yg, yc);
  backward_random(yc, yg, 77);
  EXPECT_CLOSE_TO_CPU(eg.weight.grad(), ec.weight.grad(), 1e-5);
}

// ---------------------------------------------------------------------------------------------
// index validation

TEST(CudaIndexing, OutOfRangeErrorsMatchCpu) {
  REQUIRE_GPU();
  expect_same_error(
      "index_select",
      [](Device dev) {
        index_select(zeros({4, 3}).to(dev), 1, from_vector({0, 3, 5}, {3}, DType::I64).to(dev));
      },
      "index_select: index 3 is out of range for dimension 1 of size 3");
  expect_same_error(
      "index_select i32",
      [](Device dev) {
        index_select(zeros({4, 3}).to(dev), 0, from_vector({1, 2, 4}, {3}, DType::I32).to(dev));
      },
      "index_select: index 4 is out of range for dimension 0 of size 4");
  expect_same_error(
      "gather",
      [](Device dev) {
        gather(zeros({4, 3}).to(dev), 1, from_vector({2, -1}, {2, 1}, DType::I64).to(dev));
      },
      "gather: index -1 is out of range for dimension 1 of size 3");
  expect_same_error(
      "embedding",
      [](Device dev) {
        embedding(from_vector({1, 600, 700}, {3}, DType::I64).to(dev), zeros({512, 4}).to(dev));
      },
      "embedding: id 600 is out of range for a vocabulary of 512");
  // A long index with two bad entries far apart: the first in order is reported.
  std::vector<double> v = ints(0, 100, {int64_t(1) << 20}, DType::I64, 80).to_vector();
  v[777777] = 100;
  v[999999] = -5;
  const Tensor long_index = from_vector(v, {int64_t(v.size())}, DType::I64);
  expect_same_error(
      "long index",
      [&](Device dev) {
        index_select(zeros({100, 2}).to(dev), 0, long_index.to(dev));
      },
      "index_select: index 100 is out of range for dimension 0 of size 100");
  // In range: no error, and the result matches.
  const Tensor fine = ints(0, 100, {5000}, DType::I64, 81);
  const Tensor table = rnd({100, 2}, DType::F32, 82);
  expect_exact(index_select(gpu(table), 0, gpu(fine)), index_select(table, 0, fine));
}

TEST(CudaIndexing, ClassTargetsCheckedAndCounted) {
  REQUIRE_GPU();
  const Tensor logits = rnd({6, 5}, DType::F32, 83);
  expect_same_error(
      "bad target",
      [&](Device dev) {
        cross_entropy(logits.to(dev), from_vector({0, 4, -100, 5, 7, 1}, {6}, DType::I64).to(dev));
      },
      "target 5 at position 3 is out of range for 5 classes");
  expect_same_error(
      "bad i32 target",
      [&](Device dev) {
        cross_entropy(logits.to(dev), from_vector({0, -3, 1, 2, 3, 4}, {6}, DType::I32).to(dev));
      },
      "target -3 at position 1 is out of range for 5 classes");
  // The mean divides by the count of targets that are not ignored.
  const Tensor target = from_vector({0, -100, 4, -100, 2, 3}, {6}, DType::I64);
  check_fn(
      "cross_entropy with ignored targets", logits,
      [&](const Tensor& t) { return cross_entropy(t, on_device_of(target, t)); }, 1e-5);
  const Tensor i32_target = from_vector({1, 1, 7, 7, 7, 0}, {6}, DType::I32);
  check_fn(
      "cross_entropy ignore_index 7, i32 targets", logits,
      [&](const Tensor& t) { return cross_entropy(t, on_device_of(i32_target, t), 7); }, 1e-5);
}
