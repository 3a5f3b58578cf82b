// CUDA rotary embedding (src/backend/cuda/rotary.cu) against the CPU backend: every dtype, a
// contiguous input, q of a fused [B, T, 3, H, D] projection (strided rows), a non-dense head dim
// (copied first) and rows of the tables at an offset; forward and the gradient (the inverse
// rotation), compared by norm.
#include <gtest/gtest.h>

#include "fasttrain/fasttrain.h"
#include "support/cuda_compare.h"
#include "support/require_gpu.h"

using namespace ft;
using ft::testing::gpu;

namespace {

double tol(DType dt) { return dt == DType::F64 ? 1e-12 : dt == DType::F32 ? 1e-6 : 1e-2; }

}  // namespace

TEST(CudaRotary, ForwardAndBackwardMatchTheCpu) {
  REQUIRE_GPU();
  RopeScaling s;
  s.type = RopeScaling::Type::Llama3;
  s.original_max_position_embeddings = 64;
  Generator g(1);
  for (DType dt : {DType::F32, DType::F64, DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(dt));
    const DType tdt = dt == DType::F64 ? DType::F64 : DType::F32;
    RopeTables tab = rope_tables(40, 64, 500000.0, s, tdt);
    Tensor cg = gpu(tab.cos), sg = gpu(tab.sin);
    // q of a fused projection [B, T, 3, H, D]; positions 3..36 of the tables
    Tensor qkv = randn({2, 33, 3, 4, 64}, DType::F32, &g).to(dt), qkv_g = gpu(qkv);
    qkv.requires_grad_();
    qkv_g.requires_grad_();
    auto run = [](const Tensor& t, const Tensor& c, const Tensor& sn) {
      return rotary_embedding(t.select(2, 0), c.narrow(0, 3, 33), sn.narrow(0, 3, 33));
    };
    Tensor yc = run(qkv, tab.cos, tab.sin), yg = run(qkv_g, cg, sg);
    EXPECT_CLOSE_TO_CPU(yg, yc, tol(dt));
    Tensor gy = randn(yc.shape(), DType::F32, &g).to(dt);
    yc.backward(gy);
    yg.backward(gpu(gy));
    EXPECT_CLOSE_TO_CPU(qkv_g.grad(), qkv.grad(), tol(dt));
    // a head dim that is not dense: copied first on both devices
    Tensor xt = randn({64, 4, 40, 1}, DType::F32, &g).to(dt).permute({3, 2, 1, 0});
    EXPECT_CLOSE_TO_CPU(rotary_embedding(gpu(xt), cg, sg), rotary_embedding(xt, tab.cos, tab.sin), tol(dt));
  }
}
