#include <gtest/gtest.h>

#include "fasttrain/fasttrain.h"
#include "support/expect_error.h"
#include "support/gradcheck.h"
#include "support/parity.h"

using namespace ft;
using test::expect_error;
using test::ParityCase;

namespace {

const char* kDtypes[] = {"f32", "f64", "bf16", "f16"};

// Compares every output of a multi-output op and the gradients of the named float inputs.
void check_case(const ParityCase& c, const std::vector<Tensor>& outs,
                const std::vector<std::pair<std::string, Tensor>>& ins) {
  for (size_t i = 0; i < outs.size(); ++i) {
    EXPECT_EQ(outs[i].dtype(), c.dtype());
    c.expect_output(outs[i], static_cast<int>(i));
  }
  c.backward(outs);
  for (const auto& [name, t] : ins) c.expect_grad(name, t);
}

void cat_case(const std::string& name, int nin) {
  SCOPED_TRACE(name);
  FT_PARITY_CASE(c, name);
  std::vector<std::pair<std::string, Tensor>> ins;
  std::vector<Tensor> ts;
  for (int i = 0; i < nin; ++i) {
    std::string n(1, static_cast<char>('a' + i));
    ts.push_back(c.input(n, true));
    ins.emplace_back(n, ts.back());
  }
  check_case(c, {cat(ts, c.param<int64_t>("dim"))}, ins);
}

void stack_case(const std::string& name) {
  SCOPED_TRACE(name);
  FT_PARITY_CASE(c, name);
  Tensor a = c.input("a", true), b = c.input("b", true), d = c.input("c", true);
  check_case(c, {stack({a, b, d}, c.param<int64_t>("dim"))}, {{"a", a}, {"b", b}, {"c", d}});
}

void split_case(const std::string& name, int kind) {
  SCOPED_TRACE(name);
  FT_PARITY_CASE(c, name);
  Tensor x = c.input("x", true);
  const int64_t dim = c.param<int64_t>("dim");
  std::vector<Tensor> pieces = kind == 0   ? split(x, c.param<int64_t>("size"), dim)
                               : kind == 1 ? split(x, c.param<std::vector<int64_t>>("sizes"), dim)
                                           : chunk(x, c.param<int64_t>("chunks"), dim);
  check_case(c, pieces, {{"x", x}});
}

void index_select_case(const std::string& name) {
  SCOPED_TRACE(name);
  FT_PARITY_CASE(c, name);
  Tensor x = c.input("x", true);
  check_case(c, {index_select(x, c.param<int64_t>("dim"), c.input("index"))}, {{"x", x}});
}

void gather_case(const std::string& name) {
  SCOPED_TRACE(name);
  FT_PARITY_CASE(c, name);
  Tensor x = c.input("x", true);
  check_case(c, {gather(x, c.param<int64_t>("dim"), c.input("index"))}, {{"x", x}});
}

void embedding_case(const std::string& name) {
  SCOPED_TRACE(name);
  FT_PARITY_CASE(c, name);
  Tensor w = c.input("weight", true);
  std::optional<int64_t> pad;
  if (c.params().contains("padding_idx")) pad = c.param<int64_t>("padding_idx");
  check_case(c, {embedding(c.input("ids"), w, pad)}, {{"weight", w}});
}

}  // namespace

TEST(IndexingParity, CatStack) {
  for (const char* dt : kDtypes) {
    cat_case(std::string("cat_dim1_") + dt, 3);
    cat_case(std::string("cat_dim0_") + dt, 2);
    cat_case(std::string("cat_rows_") + dt, 2);
    stack_case(std::string("stack_") + dt);
  }
}

TEST(IndexingParity, SplitChunk) {
  for (const char* dt : kDtypes) {
    split_case(std::string("split_size_") + dt, 0);
    split_case(std::string("split_sizes_") + dt, 1);
    split_case(std::string("chunk_") + dt, 2);
  }
}

TEST(IndexingParity, IndexSelectGatherEmbedding) {
  for (const char* dt : kDtypes) {
    index_select_case(std::string("index_select_") + dt);
    index_select_case(std::string("index_select_dim0_") + dt);  // i32 index
    gather_case(std::string("gather_") + dt);
    gather_case(std::string("gather_dim0_") + dt);
    embedding_case(std::string("embedding_") + dt);
    embedding_case(std::string("embedding_pad_") + dt);  // i32 ids
  }
}

TEST(IndexingGradcheck, AllDifferentiableOps) {
  Generator g(4);
  auto r = [&](Shape s) { return randn(s, DType::F64, &g).requires_grad_(); };
  Tensor xt = r({4, 3}).t().detach().requires_grad_();  // non-contiguous [3, 4]
  EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return cat({in[0], in[1]}, -1); }, {xt, r({3, 2})});
  EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return cat({in[0], in[1], in[0]}, 0); }, {xt, r({1, 4})});
  EXPECT_GRADCHECK([](const std::vector<Tensor>& in) { return stack({in[0], in[1]}, 1); }, {xt, r({3, 4})});
  // split/chunk: pieces recombined in another order (and one piece unused: its gradient is zero).
  EXPECT_GRADCHECK(
      [](const std::vector<Tensor>& in) {
        auto p = split(in[0], 2, 1);
        return cat({p[1], mul(p[0], 3.0)}, 1);
      },
      {r({3, 5})});
  EXPECT_GRADCHECK(
      [](const std::vector<Tensor>& in) {
        auto p = split(in[0], std::vector<int64_t>{1, 2}, 0);
        return mul(p[1], p[1]);
      },
      {xt});
  EXPECT_GRADCHECK(
      [](const std::vector<Tensor>& in) {
        auto p = chunk(in[0], 2, -1);
        return sub(p[0], p[1]);
      },
      {xt});
  Tensor idx = from_vector({2, 0, 2, 3, 2}, {5}, DType::I64);
  EXPECT_GRADCHECK([idx](const std::vector<Tensor>& in) { return index_select(in[0], 1, idx); }, {xt});
  EXPECT_GRADCHECK([idx](const std::vector<Tensor>& in) { return index_select(in[0], 0, idx); }, {r({4, 2, 3})});
  Tensor gidx = from_vector({0, 2, 2, 1, 0, 0}, {3, 2}, DType::I64);
  EXPECT_GRADCHECK([gidx](const std::vector<Tensor>& in) { return gather(in[0], 0, gidx); }, {xt});
  EXPECT_GRADCHECK([gidx](const std::vector<Tensor>& in) { return gather(in[0], 1, gidx); }, {xt});
  Tensor ids = from_vector({1, 3, 3, 0, 1, 1}, {2, 3}, DType::I32);
  EXPECT_GRADCHECK([ids](const std::vector<Tensor>& in) { return embedding(ids, in[0]); }, {r({5, 3})});
  // Non-contiguous weight.
  EXPECT_GRADCHECK([ids](const std::vector<Tensor>& in) { return embedding(ids, in[0]); },
                   {r({3, 5}).t().detach().requires_grad_()});
}

TEST(Indexing, SplitAndChunkReturnViews) {
  Tensor x = arange(0, 12, 1, DType::F32).reshape({3, 4});
  auto p = split(x, 3, 1);
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0].shape(), Shape({3, 3}));
  EXPECT_EQ(p[1].shape(), Shape({3, 1}));
  EXPECT_EQ(p[1].storage().get(), x.storage().get());
  x.fill_(7);
  for (double v : p[1].to_vector()) EXPECT_EQ(v, 7.0);
  auto c = chunk(zeros({10}), 4);  // ceil(10 / 4) = 3: pieces 3, 3, 3, 1
  ASSERT_EQ(c.size(), 4u);
  EXPECT_EQ(c[3].numel(), 1);
  EXPECT_EQ(chunk(zeros({4}), 3).size(), 2u);  // pieces of 2: fewer than asked, as in PyTorch
}

TEST(Indexing, EmbeddingBackwardRepeatedIdsAndPadding) {
  // Many repeated ids across threads' row partitions, against a serial reference.
  Generator g(8);
  const int64_t V = 50, D = 33, N = 1000;
  Tensor ids = randint(0, V, {N}, DType::I64, &g);
  Tensor w = randn({V, D}, {}, &g).requires_grad_();
  Tensor gy = randn({N, D}, {}, &g);
  Tensor y = embedding(ids, w, 7);
  y.backward(gy);
  std::vector<double> want(V * D, 0.0), idv = ids.to_vector(), gv = gy.to_vector();
  for (int64_t j = 0; j < N; ++j)
    if (idv[j] != 7)
      for (int64_t k = 0; k < D; ++k) want[static_cast<int64_t>(idv[j]) * D + k] += gv[j * D + k];
  std::vector<double> got = w.grad().to_vector();
  for (int64_t i = 0; i < V * D; ++i) EXPECT_NEAR(got[i], want[i], 1e-4);
  // Forward still reads the padding row; negative padding_idx wraps.
  Tensor w2 = ones({4, 2}).requires_grad_();
  Tensor y2 = embedding(from_vector({3, 3, 1}, {3}, DType::I64), w2, -1);
  EXPECT_EQ(y2.to_vector(), (std::vector<double>(6, 1.0)));
  sum(y2).backward();
  EXPECT_EQ(w2.grad().to_vector(), (std::vector<double>{0, 0, 1, 1, 0, 0, 0, 0}));
}

TEST(Indexing, Errors) {
  expect_error([] { cat({}, 0); }, "cat: expected a non-empty list of tensors");
  expect_error(
      [] {
        cat({zeros({2, 3}), zeros({2, 3}, DType::F64)}, 0);
      },
      "cat: tensor 1 has dtype f64 but tensor 0 has f32");
  expect_error(
      [] {
        cat({zeros({2, 3}), zeros({3, 3})}, 1);
      },
      "cat: tensor 1 has shape [3, 3] but tensor 0 has [2, 3]; sizes must match except in dimension 1");
  expect_error([] { cat({zeros({2, 3}), zeros({3})}, 0); }, "cat: tensor 1 has 1 dimensions");
  expect_error([] { cat({zeros({2, 3})}, 2); }, "cat");
  expect_error(
      [] {
        stack({zeros({2, 3}), zeros({3, 2})}, 0);
      },
      "stack: tensor 1 has shape [3, 2] but tensor 0 has [2, 3]");
  expect_error([] { stack({}, 0); }, "stack: expected a non-empty list of tensors");
  expect_error([] { split(zeros({4}), 0); }, "split: split_size must be positive, found 0");
  expect_error(
      [] {
        split(zeros({4, 5}), std::vector<int64_t>{2, 2}, 1);
      },
      "split: sizes [2, 2] sum to 4 but dimension 1 has size 5");
  expect_error([] { chunk(zeros({4}), 0); }, "chunk: number of chunks must be positive, found 0");
  expect_error(
      [] {
        index_select(zeros({4, 3}), 0, zeros({2}));
      },
      "index_select: index must be an i64 or i32 tensor, found f32");
  expect_error(
      [] {
        index_select(zeros({4, 3}), 1, from_vector({0, 3}, {2}, DType::I64));
      },
      "index_select: index 3 is out of range for dimension 1 of size 3");
  expect_error([] { index_select(zeros({4, 3}), 0, zeros({2, 2}, DType::I64)); }, "index_select: index must be 1-d");
  expect_error([] { gather(zeros({4, 3}), 0, zeros({2}, DType::I64)); }, "gather: index has 1 dimensions");
  expect_error(
      [] {
        gather(zeros({4, 3}), 1, from_vector({-1}, {1, 1}, DType::I64));
      },
      "gather: index -1 is out of range for dimension 1 of size 3");
  expect_error(
      [] {
        gather(zeros({4, 3}), 0, zeros({2, 5}, DType::I64));
      },
      "gather: index shape [2, 5] is larger than input shape [4, 3] in dimension 1");
  expect_error(
      [] {
        embedding(from_vector({600}, {1}, DType::I64), zeros({512, 4}));
      },
      "embedding: id 600 is out of range for a vocabulary of 512");
  expect_error([] { embedding(zeros({2}), zeros({8, 4})); }, "embedding: ids must be an i64 or i32 tensor, found f32");
  expect_error([] { embedding(zeros({2}, DType::I64), zeros({8})); }, "embedding: weight must be 2-d");
  expect_error(
      [] {
        embedding(zeros({2}, DType::I64), zeros({8, 4}), 8);
      },
      "embedding: padding_idx 8 is out of range for a vocabulary of 8");
  expect_error([] { index_select(zeros({4, 3}), 2, zeros({1}, DType::I64)); }, "index_select");
}
