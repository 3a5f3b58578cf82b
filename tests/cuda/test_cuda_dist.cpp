// Data parallelism's communicators on a GPU: NCCL at world size 1 (dist/nccl.h: every collective
// on device tensors, its ordering after the caller's stream, groups, CPU tensors through the host
// communicator, the refusals) and DDP's buckets on the GPU under it; the host-staging wrapper
// (dist/host_staging.h) moving device tensors through host copies to a pretend two-rank
// communicator. The two-rank jobs on one GPU (the staged path against one process) are
// scripts/gpu-check.sh's, as they need mpirun.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "dist/host_staging.h"
#include "dist/nccl.h"
#include "fasttrain/ddp.h"
#include "fasttrain/fasttrain.h"
#include "support/expect_error.h"
#include "support/pretend_communicator.h"
#include "support/require_gpu.h"

namespace ft {
namespace {

#define REQUIRE_NCCL() \
  REQUIRE_GPU();       \
  if (!dist::nccl_compiled()) GTEST_SKIP() << "this build has no NCCL: NCCL test skipped"

const Device kGpu = Device::cuda(0);

Tensor on_gpu(std::vector<double> v, DType dtype = DType::F32) {
  const auto n = static_cast<int64_t>(v.size());
  return from_vector(v, {n}, dtype).to(kGpu);
}
std::vector<double> host_values(const Tensor& t) { return t.to(Device::cpu()).to_vector(); }

TEST(NcclWorldOfOne, CollectivesOnDeviceTensors) {
  REQUIRE_NCCL();
  const auto comm = dist::make_nccl_communicator(dist::single_process(), kGpu);
  EXPECT_EQ(comm->backend(), "nccl");
  EXPECT_EQ(comm->world_size(), 1);
  EXPECT_EQ(comm->buffer_device(kGpu), kGpu);  // DDP's buckets on the GPU
  EXPECT_EQ(comm->buffer_device(Device::cpu()), Device::cpu());
  for (dist::ReduceOp op : {dist::ReduceOp::Sum, dist::ReduceOp::Avg, dist::ReduceOp::Max}) {
    Tensor t = on_gpu({1, -2, 3.5});
    comm->all_reduce_async(t, op)->wait();
    EXPECT_EQ(host_values(t), (std::vector<double>{1, -2, 3.5}));
  }
  // A collective waits for what the caller's stream queued before it: the product below is still
  // running on the device when the all-reduce is issued.
  Tensor big = mul(ones({1 << 22}, TensorOptions(DType::F32, kGpu)), 3.0);
  comm->all_reduce_async(big, dist::ReduceOp::Sum)->wait();
  EXPECT_EQ(sum(big).item<double>(), 3.0 * (1 << 22));
  Tensor b = on_gpu({4, 5});
  comm->broadcast(b, 0);
  EXPECT_EQ(host_values(b), (std::vector<double>{4, 5}));
  Tensor gathered = zeros({3}, TensorOptions(DType::I64, kGpu));
  comm->all_gather(on_gpu({7, 8, 9}, DType::I64), gathered);
  EXPECT_EQ(host_values(gathered), (std::vector<double>{7, 8, 9}));
  Tensor part = zeros({2}, TensorOptions(DType::F32, kGpu));
  comm->reduce_scatter(on_gpu({1, 2}), part, dist::ReduceOp::Sum);
  EXPECT_EQ(host_values(part), (std::vector<double>{1, 2}));
  comm->barrier();
  EXPECT_GT(comm->bytes_issued(), 0);
  // CPU tensors take the host communicator; a group made by split() works the same.
  Tensor host = from_vector({1.0, 2.0}, {2}, DType::F32);
  comm->all_reduce(host, dist::ReduceOp::Sum);
  EXPECT_EQ(host.to_vector(), (std::vector<double>{1, 2}));
  const auto group = comm->split(0, 0, "data");
  EXPECT_EQ(group->name(), "data");
  EXPECT_EQ(group->backend(), "nccl");
  Tensor g = on_gpu({6});
  group->all_reduce(g, dist::ReduceOp::Avg);
  EXPECT_EQ(host_values(g), (std::vector<double>{6}));
  // Refusals: a reduction of bf16, one tensor on each side, a strided view.
  test::expect_error([&] { comm->all_reduce(on_gpu({1}, DType::BF16), dist::ReduceOp::Sum); },
                     "expected an f32, f64, i32 or i64 tensor to reduce, found bf16");
  test::expect_error(
      [&] { comm->all_gather(from_vector({1.0}, {1}, DType::F32), zeros({1}, TensorOptions(DType::F32, kGpu))); },
      "expected both tensors on the CPU or both on cuda:0");
  test::expect_error(
      [&] {
        comm->all_reduce(zeros({4, 4}, TensorOptions(DType::F32, kGpu)).t(), dist::ReduceOp::Sum);
      },
      "expected a contiguous tensor");
}

struct TwoLayers : nn::Module {
  explicit TwoLayers(Generator* gen) {
    a = register_module("a", std::make_shared<nn::Linear>(8, 16, true, gen));
    b = register_module("b", std::make_shared<nn::Linear>(16, 4, true, gen));
  }
  std::string type_name() const override { return "TwoLayers"; }
  std::shared_ptr<nn::Linear> a, b;
};

// DDP on NCCL keeps its buckets on the GPU; at world size 1 the gradients come back as backward
// made them, bit for bit.
TEST(NcclWorldOfOne, DdpBucketsOnTheGpuLeaveGradientsAsTheyWere) {
  REQUIRE_NCCL();
  Generator gen(5);
  TwoLayers m(&gen);
  m.to(kGpu);
  const Tensor x = randn({4, 8}, {}, &gen).to(kGpu);
  auto loss = [&] { return sum(square(m.b->forward(m.a->forward(x)))); };
  loss().backward();
  std::vector<std::vector<double>> expected;
  for (const Tensor& p : m.parameters()) expected.push_back(host_values(p.grad()));
  m.zero_grad();
  dist::DataParallel ddp(m, dist::make_nccl_communicator(dist::single_process(), kGpu), {64, 64});
  EXPECT_EQ(ddp.bucket_sizes().size(), 4u);  // 64-byte caps: a bucket per parameter
  ddp.before_backward(true);
  loss().backward();
  ddp.after_backward(true);
  ddp.finish();
  const std::vector<Tensor> params = m.parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(params[i].grad().device(), kGpu) << "parameter " << i;
    EXPECT_EQ(host_values(params[i].grad()), expected[i]) << "parameter " << i;
  }
}

// Two pretend ranks holding the same values: an all-reduce doubles, a gather repeats. It checks
// that the staging wrapper hands it host tensors only.
class DoublingCommunicator : public test::PretendTwoRanks {
 public:
  std::string backend() const override { return "doubling"; }
  dist::WorkPtr broadcast_async(const Tensor& t, int) override { return done(t); }
  dist::WorkPtr all_reduce_async(const Tensor& t, dist::ReduceOp) override {
    done(t);
    t.detach().copy_(mul(t, 2.0));
    return done(t);
  }
  dist::WorkPtr reduce_scatter_async(const Tensor& input, const Tensor& output, dist::ReduceOp) override {
    done(input);
    output.detach().copy_(mul(input.narrow(0, 0, output.numel()), 2.0));
    return done(output);
  }
  dist::WorkPtr all_gather_async(const Tensor& input, const Tensor& output) override {
    done(input);
    output.detach().copy_(cat({input, input}, 0));
    return done(output);
  }
  dist::WorkPtr barrier_async() override { return done(Tensor()); }
  dist::WorkPtr send_async(const Tensor& t, int) override { return done(t); }
  dist::WorkPtr recv_async(const Tensor& t, int) override {
    t.detach().fill_(5);
    return done(t);
  }

 private:
  struct Done : dist::Work {
    void wait() override {}
    bool done() const override { return true; }
  };
  static dist::WorkPtr done(const Tensor& t) {
    EXPECT_TRUE(!t.defined() || t.device().is_cpu()) << "the inner communicator got a tensor on " << t.device().str();
    return std::make_shared<Done>();
  }
};

TEST(HostStaging, DeviceTensorsTravelThroughHostCopies) {
  REQUIRE_GPU();
  const auto staged = dist::with_host_staging(std::make_shared<DoublingCommunicator>());
  Tensor t = mul(on_gpu({1, 2, 3}), 1.0);  // queued on the device just before
  staged->all_reduce(t, dist::ReduceOp::Sum);
  EXPECT_EQ(t.device(), kGpu);
  EXPECT_EQ(host_values(t), (std::vector<double>{2, 4, 6}));
  Tensor part = zeros({2}, TensorOptions(DType::F32, kGpu));
  staged->reduce_scatter(on_gpu({1, 2, 3, 4}), part, dist::ReduceOp::Sum);
  EXPECT_EQ(host_values(part), (std::vector<double>{2, 4}));
  Tensor whole = zeros({4}, TensorOptions(DType::F32, kGpu));
  staged->all_gather(on_gpu({8, 9}), whole);
  EXPECT_EQ(host_values(whole), (std::vector<double>{8, 9, 8, 9}));
  Tensor received = zeros({3}, TensorOptions(DType::F32, kGpu));
  staged->recv(received, 1);
  EXPECT_EQ(host_values(received), (std::vector<double>{5, 5, 5}));
  Tensor kept = on_gpu({4, 4});
  staged->broadcast(kept, 0);  // the root's own values come back unchanged
  EXPECT_EQ(host_values(kept), (std::vector<double>{4, 4}));
  test::expect_error(
      [&] {
        staged->all_reduce(zeros({4, 4}, TensorOptions(DType::F32, kGpu)).t(), dist::ReduceOp::Sum);
      },
      "expected a contiguous tensor, found a strided view of shape [4, 4] on cuda:0");
}

}  // namespace
}  // namespace ft
