// Bad input gives one clear ft::Error naming the op — never a crash — for every op family:
// tensors on different devices, a device without kernels or without the device itself, and dtype
// mismatches.
#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <vector>

#include "fasttrain/fasttrain.h"
#include "support/expect_error.h"

using namespace ft;
using test::expect_error;

namespace {

// A tensor that claims to live on cuda:0 without any device memory (from_blob over a host
// buffer): enough to test device validation on machines without a GPU.
struct FakeCuda {
  std::vector<float> buf = std::vector<float>(4096, 0.0f);
  Tensor make(const Shape& s, DType dt = DType::F32) {
    return from_blob(buf.data(), s, TensorOptions(dt, Device::cuda(0)));
  }
};

}  // namespace

TEST(Errors, MixedDevicesAreRejectedByEveryOpFamily) {
  FakeCuda fake;
  Tensor a = randn({4, 4});
  Tensor g = fake.make({4, 4});
  Tensor ids = zeros({4}, DType::I64);
  Tensor img = randn({1, 4, 4, 4});
  Tensor q = randn({1, 1, 4, 4});
  const std::vector<std::pair<const char*, std::function<void()>>> calls = {
      {"add", [&] { add(a, g); }},
      {"mul", [&] { mul(a, g); }},
      {"where", [&] { where(gt(a, 0.0), a, g); }},
      {"matmul", [&] { matmul(a, g); }},
      {"linear", [&] { linear(a, g); }},
      {"cat",
       [&] {
         cat({a, g});
       }},
      {"index_select", [&] { index_select(g, 0, ids); }},
      {"embedding", [&] { embedding(ids, g); }},
      {"cross_entropy", [&] { cross_entropy(g, ids); }},
      {"layer_norm", [&] { layer_norm(a, {4}, fake.make({4})); }},
      {"batch_norm", [&] { batch_norm(a, Tensor(), Tensor(), fake.make({4}), Tensor(), true); }},
      {"conv2d",
       [&] {
         conv2d(img, fake.make({4, 4, 3, 3}));
       }},
      {"scaled_dot_product_attention",
       [&] {
         scaled_dot_product_attention(q, fake.make({1, 1, 4, 4}), q);
       }},
  };
  for (const auto& [name, call] : calls) {
    SCOPED_TRACE(name);
    EXPECT_THROW(call(), Error);
  }
  expect_error([&] { add(a, g); }, "add: expected all tensors on one device, found cpu and cuda:0");
}

// Where no GPU is present an op on a cuda:0 tensor stops before touching memory: at the missing
// kernel (a CPU-only build) or at the output's allocation (a CUDA build), and the error names the
// device either way. With a GPU present the fake tensor's host memory would reach real kernels.
TEST(Errors, OpsWithoutKernelsOrDeviceSaySo) {
  if (cuda_available()) GTEST_SKIP() << "a CUDA device is present: the fake cuda:0 tensor would reach its kernels";
  FakeCuda fake;
  Tensor g = fake.make({4, 4});
  const std::vector<std::pair<const char*, std::function<void()>>> calls = {
      {"exp", [&] { exp(g); }},
      {"sum", [&] { sum(g); }},
      {"softmax", [&] { softmax(g, -1); }},
      {"matmul", [&] { matmul(g, g); }},
      {"max_pool2d",
       [&] {
         max_pool2d(fake.make({1, 1, 4, 4}), {2, 2});
       }},
      {"dropout", [&] { dropout(g, 0.5); }},
      {"rms_norm", [&] { rms_norm(g, {4}); }},
  };
  for (const auto& [name, call] : calls) {
    SCOPED_TRACE(name);
    try {
      call();
      ADD_FAILURE() << name << " accepted a tensor on a device it has no kernel for";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("cuda:0"), std::string::npos) << e.what();
    }
  }
}

TEST(Errors, DtypeMismatchesAreNamed) {
  Tensor x = randn({4, 8});
  expect_error([&] { linear(x, randn({3, 8}, DType::BF16)); }, "linear");
  expect_error([&] { exp(zeros({2}, DType::I32)); }, "floating-point");
  expect_error([&] { softmax(zeros({2}, DType::I64), 0); }, "softmax");
  expect_error([&] { cross_entropy(x, zeros({4})); }, "cross_entropy");
  expect_error([&] { embedding(zeros({2}), x); }, "embedding");
  expect_error([&] { masked_fill(x, zeros({4, 8}), 1.0); }, "masked_fill: mask must be a bool tensor");
}
