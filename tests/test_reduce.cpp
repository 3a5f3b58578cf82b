// Reductions: sum, mean, var, max, argmax. Parity with PyTorch (tests/parity/cases_reduce.py),
// gradient checks in f64, errors and options.
#include <gtest/gtest.h>

#include <cmath>

#include "backend/cpu/reduce.h"
#include "fasttrain/fasttrain.h"
#include "support/gradcheck.h"
#include "support/parity.h"

using namespace ft;
using test::ParityCase;

namespace {

const char* kDtypes[] = {"f32", "f64", "bf16", "f16"};
const char* kDimSets[] = {"lead", "lead2", "trail", "mid", "all", "mixed", "neg", "bcast", "long"};
const char* kMaxDimSets[] = {"last", "first", "mid", "strided", "ties", "ties0"};

Dims param_dims(const ParityCase& c) { return Dims(c.param<std::vector<int64_t>>("dims")); }

Tensor rnd(Shape s, Generator& g) { return randn(s, DType::F64, &g).requires_grad_(); }

}  // namespace

TEST(ReduceParity, SumMeanVar) {
  for (const char* dt : kDtypes) {
    for (const char* tag : kDimSets) {
      for (const char* op : {"sum", "mean", "var"}) {
        std::string name = std::string(op) + "_" + dt + "_" + tag;
        SCOPED_TRACE(name);
        FT_PARITY_CASE(c, name);
        Tensor x = c.input("x", true);
        Dims dims = param_dims(c);
        bool keepdim = c.param<bool>("keepdim");
        Tensor y;
        if (std::string(op) == "sum")
          y = sum(x, dims, keepdim);
        else if (std::string(op) == "mean")
          y = mean(x, dims, keepdim);
        else
          y = var(x, dims, c.param<int64_t>("correction"), keepdim);
        EXPECT_EQ(y.dtype(), c.dtype());
        c.expect_output(y);
        c.backward({y});
        c.expect_grad("x", x);
      }
    }
  }
}

TEST(ReduceParity, MaxAndArgmax) {
  for (const char* dt : kDtypes) {
    SCOPED_TRACE(dt);
    for (const char* kind : {"max_all_", "max_all_ties_"}) {
      FT_PARITY_CASE(c, std::string(kind) + dt);
      Tensor x = c.input("x", true);
      Tensor y = max(x);
      EXPECT_EQ(y.dim(), 0);
      c.expect_output(y);
      c.backward({y});
      c.expect_grad("x", x);
    }
    for (const char* tag : kMaxDimSets) {
      SCOPED_TRACE(tag);
      {
        FT_PARITY_CASE(c, std::string("max_dim_") + dt + "_" + tag);
        Tensor x = c.input("x", true);
        ValuesIndices r = max(x, c.param<int64_t>("dim"), c.param<bool>("keepdim"));
        EXPECT_EQ(r.indices.dtype(), DType::I64);
        c.expect_output(r.values, 0);
        c.expect_output(r.indices, 1);
        c.backward({r.values, r.indices});
        c.expect_grad("x", x);
      }
      {
        FT_PARITY_CASE(c, std::string("argmax_") + dt + "_" + tag);
        Tensor i = argmax(c.input("x"), c.param<int64_t>("dim"), c.param<bool>("keepdim"));
        EXPECT_EQ(i.dtype(), DType::I64);
        c.expect_output(i);
      }
    }
    FT_PARITY_CASE(c, std::string("argmax_flat_") + dt);
    c.expect_output(argmax(c.input("x")));
  }
}

TEST(ReduceGradcheck, SumMeanOverDimSets) {
  Generator g(3);
  const std::vector<std::pair<Dims, bool>> sets = {{{0}, false},       {{0, 1}, true},  {{2}, false}, {{1}, true},
                                                   {{0, 1, 2}, false}, {{-1, 0}, true}, {{}, false}};
  for (const auto& [dims, keepdim] : sets) {
    SCOPED_TRACE(dims.str());
    Dims d = dims;
    bool k = keepdim;
    EXPECT_GRADCHECK([d, k](const std::vector<Tensor>& in) { return sum(in[0], d, k); }, {rnd({2, 3, 4}, g)});
    EXPECT_GRADCHECK([d, k](const std::vector<Tensor>& in) { return mean(in[0], d, k); }, {rnd({2, 3, 4}, g)});
    // non-contiguous input
    Tensor xt = rnd({4, 3, 2}, g).permute({2, 1, 0}).detach().requires_grad_();
    EXPECT_GRADCHECK([d, k](const std::vector<Tensor>& in) { return mean(in[0], d, k); }, {xt});
  }
}

TEST(ReduceGradcheck, VarMaxArgmax) {
  Generator g(5);
  for (int64_t corr : {0, 1, 2}) {
    EXPECT_GRADCHECK([corr](const std::vector<Tensor>& in) { return var(in[0], {1}, corr, false); }, {rnd({3, 5}, g)});
  }
  EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return var(in[0], {0, 2}, 1, true); }, {rnd({3, 4, 5}, g)});
  EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return var(in[0], {0}); }, {rnd({6, 4}, g)});  // leading
  Tensor xt = rnd({5, 4}, g).t().detach().requires_grad_();
  EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return var(in[0], {-1}); }, {xt});
  EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return max(in[0]); }, {rnd({4, 5}, g)});
  EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return max(in[0]); }, {xt});
  for (int64_t dim : {0, 1, -1}) {
    EXPECT_GRADCHECK([dim](const std::vector<Tensor>& in) { return max(in[0], dim, false).values; },
                     {rnd({3, 4, 5}, g)});
  }
  EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return max(in[0], 0, true).values; }, {xt});
}

TEST(Reduce, MaxTiesAndNaN) {
  Tensor x = from_vector({1, 3, 3, 2, 3, 0}, {6}).requires_grad_();
  Tensor m = max(x);
  EXPECT_EQ(m.item<double>(), 3);
  m.backward();
  std::vector<double> gx = x.grad().to_vector(), want = {0, 1.0 / 3, 1.0 / 3, 0, 1.0 / 3, 0};
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(gx[i], want[i], 1e-7);
  Tensor x2 = from_vector({1, 3, 3, 2, 3, 0}, {2, 3}).requires_grad_();
  ValuesIndices r = max(x2, 1);
  EXPECT_EQ(r.indices.to_vector(), (std::vector<double>{1, 1}));
  r.values.backward(ones({2}));
  EXPECT_EQ(x2.grad().to_vector(), (std::vector<double>{0, 1, 0, 0, 1, 0}));
  EXPECT_EQ(argmax(x2).item<int64_t>(), 1);
  // NaN is the max and its first position the argmax, as in PyTorch
  Tensor n = from_vector({1, NAN, 5, NAN}, {4});
  EXPECT_TRUE(std::isnan(max(n).item<double>()));
  EXPECT_EQ(argmax(n).item<int64_t>(), 1);
  // [[1, NaN], [5, NaN]]: column 0 plain, column 1 all NaN (first one wins)
  EXPECT_EQ(argmax(n.reshape({2, 2}), 0).to_vector(), (std::vector<double>{1, 0}));
  EXPECT_EQ(argmax(from_vector({1, 2, NAN, NAN}, {2, 2}), 0).to_vector(), (std::vector<double>{1, 1}));
  EXPECT_EQ(argmax(from_vector({1, NAN, 2, 3}, {2, 2}), 1).to_vector(), (std::vector<double>{1, 1}));
  // all -inf still has a max
  EXPECT_EQ(argmax(full({3}, -INFINITY)).item<int64_t>(), 0);
}

TEST(Reduce, LargeAndIntegerInputs) {
  // long enough for max_all to split across chunks; the max sits near the end, ties after it
  Tensor x = arange(0, 300000, 1, DType::F32);
  Tensor y = where(gt(x, 250000.0), full({}, 1.0), div(x, 300000.0));
  EXPECT_EQ(argmax(y).item<int64_t>(), 250001);
  EXPECT_EQ(max(y).item<double>(), 1.0);
  Tensor i = from_vector({4, -2, 9, 9}, {2, 2}, DType::I64);
  EXPECT_EQ(max(i).item<int64_t>(), 9);
  EXPECT_EQ(max(i).dtype(), DType::I64);
  EXPECT_EQ(argmax(i, 1).to_vector(), (std::vector<double>{0, 0}));
  // 0-d input: its own max along dim 0
  Tensor s = scalar_tensor(2.5);
  EXPECT_EQ(argmax(s, 0).item<int64_t>(), 0);
  EXPECT_EQ(max(s, -1).values.item<double>(), 2.5);
  // sum/mean over an empty dims list reduce everything (PyTorch 1.13)
  Tensor a = from_vector({1, 2, 3, 4}, {2, 2});
  EXPECT_EQ(sum(a, {}).item<double>(), 10);
  EXPECT_EQ(var(a, {}, 0).item<double>(), 1.25);
  // var with too few elements: 0/0 = NaN, as in PyTorch
  EXPECT_TRUE(std::isnan(var(ones({1, 3}), {0}).to_vector()[0]));
}

// Sums over leading dims (bias gradients) of many rows: blocks of rows are summed in the compute
// type and combined in double. Against the f64 sum of the same values, within f32's rounding of
// a 256-row block; the same bits on 1, 2 and 3 threads (threads split the columns).
TEST(Reduce, LeadingSumsOfManyRowsAreAccurateAndThreadIndependent) {
  Generator g(7);
  const int threads = get_num_threads();
  for (DType dt : {DType::F32, DType::BF16, DType::F16, DType::F64}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor x = add(randn({1000, 3, 300}, DType::F32, &g), 2.0).to(dt);  // offset: sums far from 0
    // The kernel's double sums (the op rounds them to x's dtype), against the f64 values summed
    // over a trailing dim, which takes the row loop (the f64 column loop shares the code checked).
    auto column_sums = [&](const Tensor& t) {
      Tensor out = empty({3, 300}, DType::F64);
      cpu::sum(t, {true, false, false}, 1.0, out);
      return out;
    };
    Tensor want = empty({3, 300}, DType::F64);
    cpu::sum(x.to(DType::F64).permute({1, 2, 0}).contiguous(), {false, false, true}, 1.0, want);
    std::vector<std::vector<double>> got;
    for (int n : {1, 2, 3}) {
      set_num_threads(n);
      got.push_back(column_sums(x).to_vector());
    }
    set_num_threads(threads);
    EXPECT_EQ(got[0], got[1]);
    EXPECT_EQ(got[0], got[2]);
    const std::vector<double> w = want.to_vector();
    for (size_t i = 0; i < w.size(); ++i) ASSERT_NEAR(got[0][i], w[i], 1e-6 * std::abs(w[i])) << "column " << i;
  }
}

TEST(Reduce, Errors) {
  auto expect_msg = [](auto fn, const std::string& needle) {
    try {
      fn();
      ADD_FAILURE() << "no error; expected: " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_msg([] { var(zeros({2, 3}, DType::I64), {0}); }, "var: input must be a floating-point tensor, found i64");
  expect_msg([] { var(zeros({2, 3}), {0}, -1); }, "var: correction must be >= 0, found -1");
  expect_msg([] { var(zeros({2, 3}), {2}); }, "var: dimension 2 is out of range for a tensor of rank 2");
  expect_msg([] { var(zeros({2, 3}), {1, -1}); }, "var: dimension 1 appears more than once");
  expect_msg([] { max(zeros({0, 3})); }, "max: cannot take the max of an empty tensor");
  expect_msg([] { max(zeros({0, 3}), 0); }, "max: cannot reduce over dimension 0 of size 0");
  expect_msg([] { argmax(zeros({2, 3}), 3); }, "argmax: dimension 3 is out of range");
  expect_msg([] { argmax(zeros({0})); }, "argmax: cannot take the argmax of an empty tensor");
}
