// CUDA scaled_dot_product_attention (src/backend/cuda/attention.cu, dispatching to
// attention_mma.cu and attention_fma.cu) against the CPU backend: the output and, through
// autograd, dq/dk/dv on the same random inputs, over causal and full masks, sequence lengths that
// are and are not multiples of the tiles (1, 17, 64, 257, 1024), every compiled head dim (32, 64,
// 128) and one padded into a wider kernel, f32/bf16/f16 (and f64), cross attention, strided and
// broadcast operands, non-default scales and dropout (the same Philox mask on both devices);
// bf16/f16 exercise the tensor-core kernels; grouped-query shapes (Hkv < H key/value heads)
// on both kernel families, whose dK/dV sum a group's query heads; the document mask of packed
// windows (documents of varied lengths, boundaries inside and on tile edges, GQA, dropout, both
// kernel families), a one-document window equal to causal bit for bit, and decreasing ids refused;
// cuDNN's fused attention (FT_CUDA_ATTENTION=cudnn and auto) on the same comparisons, what it
// leaves to the engine, and a forward on one implementation with the backward on the other.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>

#include "backend/cuda/attention_cudnn.h"
#include "core/switches.h"
#include "fasttrain/fasttrain.h"
#include "support/cuda_compare.h"
#include "support/require_gpu.h"

using namespace ft;
using ft::testing::gpu;

namespace {

struct Case {
  int64_t B = 2, H = 3, Tq = 17, Tk = 17, D = 64;
  bool causal = false;
  DType dtype = DType::F32;
  std::optional<double> scale;
  double dropout = 0.0;
  int64_t Hkv = 0;  // key/value heads (grouped-query attention); 0: H
  // > 0: a document mask (Tq == Tk) with documents of about this many tokens, varied per row.
  int64_t doc_len = 0;
  int64_t kv_heads() const { return Hkv > 0 ? Hkv : H; }
};

// [B, T] i32 document ids: row b's documents are doc_len tokens give or take, varied by row and
// document (so boundaries fall inside tiles and, for some, on their edges), the first of row 0
// a single token.
Tensor doc_ids_for(const Case& c) {
  std::vector<double> ids;
  for (int64_t b = 0; b < c.B; ++b) {
    int64_t id = 0, left = b == 0 ? 1 : c.doc_len;
    for (int64_t t = 0; t < c.Tq; ++t, --left) {
      if (left == 0) left = std::max<int64_t>(1, c.doc_len + ((id * 37 + b * 11) % c.doc_len) - c.doc_len / 2), ++id;
      ids.push_back(static_cast<double>(id));
    }
  }
  return from_vector(ids, {c.B, c.Tq}, DType::I32);
}

std::string describe(const Case& c) {
  return "B=" + std::to_string(c.B) + " H=" + std::to_string(c.H) + " Hkv=" + std::to_string(c.kv_heads()) +
         " Tq=" + std::to_string(c.Tq) + " Tk=" + std::to_string(c.Tk) + " D=" + std::to_string(c.D) +
         (c.causal ? " causal" : " full") + " " + dtype_name(c.dtype) +
         (c.scale ? " scale=" + std::to_string(*c.scale) : "") +
         (c.dropout > 0 ? " dropout=" + std::to_string(c.dropout) : "") +
         (c.doc_len > 0 ? " documents of ~" + std::to_string(c.doc_len) : "");
}

// The tolerances by norm: f32 1e-5, bf16/f16 1e-2; f64 is exact up to summation order.
double tolerance(DType dt) {
  if (dt == DType::F64) return 1e-10;
  if (dt == DType::F32) return 1e-5;
  return 1e-2;
}

Tensor random(const Shape& s, DType dt, Generator& g) { return randn(s, DType::F32, &g).to(dt); }

// Runs attention forward and backward on the CPU operands (q, k, v, upstream gradient gout) and
// on their GPU counterparts (same values, possibly other views), and compares out, dq, dk, dv.
void compare(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& gout, const Tensor& gq, const Tensor& gk,
             const Tensor& gv, const Tensor& ggout, const Case& c) {
  const double tol = tolerance(c.dtype);
  auto run = [&](const Tensor& qi, const Tensor& ki, const Tensor& vi, const Tensor& gi) {
    Tensor ql = qi.detach(), kl = ki.detach(), vl = vi.detach();
    ql.requires_grad_();
    kl.requires_grad_();
    vl.requires_grad_();
    Generator g(1234);  // the same seed and counter base on both devices: the same dropout mask
    Tensor y = c.doc_len > 0 ? scaled_dot_product_attention(ql, kl, vl, DocumentMask{doc_ids_for(c).to(qi.device())},
                                                            c.dropout, c.scale, &g)
                             : scaled_dot_product_attention(ql, kl, vl, c.causal, c.dropout, c.scale, &g);
    std::vector<Tensor> grads = autograd::grad({y}, {ql, kl, vl}, {gi});
    grads.insert(grads.begin(), y);
    return grads;
  };
  const std::vector<Tensor> want = run(q, k, v, gout);
  const std::vector<Tensor> got = run(gq, gk, gv, ggout);
  // Every query sees exactly one key: the softmax is constant 1, so dq and dk are exactly 0 and
  // both devices return only the rounding residue of dP - Di (~1e-7), whose ratio means nothing.
  const bool one_key = c.Tk == 1 || (c.causal && c.Tq == 1);
  const char* names[] = {"out", "dq", "dk", "dv"};
  for (int i = 0; i < 4; ++i) {
    SCOPED_TRACE(names[i]);
    if (one_key && (i == 1 || i == 2)) {
      ASSERT_TRUE(got[i].device().is_cuda());
      double worst = 0;
      for (double x : got[i].to(Device::cpu()).to_vector()) worst = std::max(worst, std::fabs(x));
      EXPECT_LT(worst, 1e-4);
      continue;
    }
    EXPECT_CLOSE_TO_CPU(got[i], want[i], tol);
  }
}

void compare(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& gout, const Case& c) {
  compare(q, k, v, gout, gpu(q), gpu(k), gpu(v), gpu(gout), c);
}

void check(const Case& c, uint64_t seed = 1) {
  SCOPED_TRACE(describe(c));
  Generator g(seed);
  Tensor q = random({c.B, c.H, c.Tq, c.D}, c.dtype, g);
  Tensor k = random({c.B, c.kv_heads(), c.Tk, c.D}, c.dtype, g);
  Tensor v = random({c.B, c.kv_heads(), c.Tk, c.D}, c.dtype, g);
  Tensor gout = random({c.B, c.H, c.Tq, c.D}, c.dtype, g);
  compare(q, k, v, gout, c);
}

// [B, T, heads, D] storage seen as [B, heads, T, D] (a projection's output split into heads), the
// view taken on each device so that the kernels see its strides.
struct HeadsView {
  Tensor cpu, cuda;
};
HeadsView heads_view(int64_t B, int64_t T, int64_t heads, int64_t D, DType dt, Generator& g) {
  const Tensor s = random({B, T, heads, D}, dt, g);
  return {s.permute({0, 2, 1, 3}), gpu(s).permute({0, 2, 1, 3})};
}

// Causal attention's backward twice on the same GPU operands: the gradients are bit-identical. On
// the engine's kernels unless `any_path` (cuDNN's backward accumulates dQ with atomics, so a
// GPU check that runs this suite under FT_CUDA_ATTENTION=cudnn keeps these cases on the engine).
void expect_deterministic_backward(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in, const Tensor& gout,
                                   bool any_path = false) {
  std::optional<switches::Scoped<switches::CudaAttention>> engine;
  if (!any_path) engine.emplace(switches::cuda_attention, switches::CudaAttention::Engine);
  Tensor q = q_in.detach().requires_grad_(), k = k_in.detach().requires_grad_(), v = v_in.detach().requires_grad_();
  std::vector<Tensor> r[2];
  for (int i = 0; i < 2; ++i) {
    Tensor y = scaled_dot_product_attention(q, k, v, true);
    r[i] = autograd::grad({y}, {q, k, v}, {gout});
  }
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(r[0][i].to(Device::cpu()).to_vector(), r[1][i].to(Device::cpu()).to_vector()) << "gradient " << i;
}

}  // namespace

TEST(CudaAttention, F32AllHeadDimsAndLengths) {
  REQUIRE_GPU();
  // 17 and 257 are not multiples of any tile (32 or 64); 64 is exactly one or two tiles.
  for (int64_t D : {32, 64, 128})
    for (int64_t T : {1, 17, 64, 257})
      for (bool causal : {false, true}) check({.B = 2, .H = 3, .Tq = T, .Tk = T, .D = D, .causal = causal});
}

TEST(CudaAttention, F32LongSequences) {
  REQUIRE_GPU();
  for (bool causal : {false, true}) {
    check({.B = 1, .H = 4, .Tq = 1024, .Tk = 1024, .D = 64, .causal = causal});
    check({.B = 2, .H = 1, .Tq = 1024, .Tk = 1024, .D = 128, .causal = causal});
  }
}

TEST(CudaAttention, HalfPrecisionTypes) {
  REQUIRE_GPU();
  for (DType dt : {DType::BF16, DType::F16})
    for (int64_t D : {32, 64, 128})
      for (int64_t T : {17, 257})
        for (bool causal : {false, true})
          check({.B = 2, .H = 2, .Tq = T, .Tk = T, .D = D, .causal = causal, .dtype = dt});
  check({.B = 1, .H = 4, .Tq = 1024, .Tk = 1024, .D = 64, .causal = true, .dtype = DType::BF16});
  // Without autograd the forward gets no f32 copy of the output to fill.
  autograd::NoGradGuard no_grad;
  Generator g(11);
  Tensor q = random({2, 2, 70, 64}, DType::BF16, g), k = random({2, 2, 70, 64}, DType::BF16, g),
         v = random({2, 2, 70, 64}, DType::BF16, g);
  EXPECT_CLOSE_TO_CPU(scaled_dot_product_attention(gpu(q), gpu(k), gpu(v), true),
                      scaled_dot_product_attention(q, k, v, true), 1e-2);
}

TEST(CudaAttention, F64) {
  REQUIRE_GPU();
  for (int64_t D : {32, 64, 128})
    for (bool causal : {false, true})
      check({.B = 1, .H = 2, .Tq = 45, .Tk = 45, .D = D, .causal = causal, .dtype = DType::F64});
}

TEST(CudaAttention, CrossAttentionLengths) {
  REQUIRE_GPU();
  // Causal with Tq > Tk: the last queries see every key; Tq < Tk: the last keys are seen by none.
  for (auto [tq, tk] : {std::pair<int64_t, int64_t>{70, 130}, {130, 70}, {1, 100}, {100, 1}})
    for (bool causal : {false, true}) check({.B = 2, .H = 2, .Tq = tq, .Tk = tk, .D = 64, .causal = causal});
}

TEST(CudaAttention, NonDefaultScale) {
  REQUIRE_GPU();
  for (bool causal : {false, true}) {
    check({.B = 2, .H = 2, .Tq = 100, .Tk = 100, .D = 64, .causal = causal, .scale = 0.37});
    check({.B = 1, .H = 3, .Tq = 65, .Tk = 65, .D = 32, .causal = causal, .scale = 1.0});
    check({.B = 1, .H = 2, .Tq = 65, .Tk = 65, .D = 128, .causal = causal, .dtype = DType::BF16, .scale = 0.05});
  }
}

TEST(CudaAttention, HeadDimsBetweenCompiledOnes) {
  REQUIRE_GPU();
  // Run on the next compiled head dim with zero-padded columns.
  for (int64_t D : {8, 40, 80, 100})
    for (bool causal : {false, true}) check({.B = 2, .H = 2, .Tq = 33, .Tk = 33, .D = D, .causal = causal});
}

TEST(CudaAttention, StridedAndBroadcastOperands) {
  REQUIRE_GPU();
  const int64_t B = 2, H = 3, T = 77, D = 64;
  for (bool causal : {false, true}) {
    const Case c{.B = B, .H = H, .Tq = T, .Tk = T, .D = D, .causal = causal};
    SCOPED_TRACE(describe(c));
    Generator g(5);
    // The views are taken on each device, so the kernels see the strides (a copy to the GPU of a
    // view could come out dense).
    Tensor qs = random({B, T, H, D}, DType::F32, g), ks = random({B, T, H, D}, DType::F32, g),
           vs = random({B, T, H, D}, DType::F32, g), gs = random({B, T, H, D}, DType::F32, g);
    // [B, T, H, D] storage seen as [B, H, T, D], as a fused QKV projection gives; a strided gout.
    auto bhtd = [](const Tensor& t) { return t.permute({0, 2, 1, 3}); };
    compare(bhtd(qs), bhtd(ks), bhtd(vs), bhtd(gs), bhtd(gpu(qs)), bhtd(gpu(ks)), bhtd(gpu(vs)), bhtd(gpu(gs)), c);
    // One key/value head broadcast over all query heads (zero head stride); v with a non-unit
    // stride along D.
    Tensor k1 = random({B, 1, T, D}, DType::F32, g), v1 = random({B, 1, D, T}, DType::F32, g);
    auto bcast = [&](const Tensor& t) { return t.expand({-1, H, -1, -1}); };
    auto bcast_t = [&](const Tensor& t) { return t.transpose(2, 3).expand({-1, H, -1, -1}); };
    compare(bhtd(qs), bcast(k1), bcast_t(v1), bhtd(gs), bhtd(gpu(qs)), bcast(gpu(k1)), bcast_t(gpu(v1)), bhtd(gpu(gs)),
            c);
  }
}

TEST(CudaAttention, DropoutMatchesCpuMask) {
  REQUIRE_GPU();
  for (bool causal : {false, true}) {
    check({.B = 2, .H = 2, .Tq = 77, .Tk = 77, .D = 64, .causal = causal, .dropout = 0.2});
    check({.B = 1, .H = 2, .Tq = 50, .Tk = 90, .D = 32, .causal = causal, .dropout = 0.5});
    check({.B = 1, .H = 2, .Tq = 130, .Tk = 130, .D = 128, .causal = causal, .dtype = DType::BF16, .dropout = 0.1});
  }
}

// bf16 and f16 run on the tensor-core kernels (64-row tiles, 16 rows per warp, 64-key tiles):
// lengths around and across those tiles, cross attention, every compiled head dim and padded
// ones, the cp.async path ([B, T, H, D] views: rows strided, 16-byte chunks) and the element-load
// path (a transposed operand), dropout, and a deterministic backward.
TEST(CudaAttention, TensorCorePath) {
  REQUIRE_GPU();
  for (bool causal : {false, true}) {
    for (DType dt : {DType::BF16, DType::F16}) {
      check({.B = 1, .H = 2, .Tq = 100, .Tk = 100, .D = 128, .causal = causal, .dtype = dt});
      check({.B = 1, .H = 2, .Tq = 65, .Tk = 65, .D = 32, .causal = causal, .dtype = dt});
    }
    for (int64_t D : {32, 64, 128})
      for (auto [tq, tk] : {std::pair<int64_t, int64_t>{70, 130}, {130, 70}, {1, 100}, {100, 1}, {64, 128}})
        check({.B = 1, .H = 2, .Tq = tq, .Tk = tk, .D = D, .causal = causal, .dtype = DType::BF16});
    check({.B = 1, .H = 2, .Tq = 33, .Tk = 33, .D = 80, .causal = causal, .dtype = DType::BF16});
    check({.B = 1, .H = 2, .Tq = 200, .Tk = 200, .D = 64, .causal = causal, .dtype = DType::BF16, .dropout = 0.2});
    check({.B = 1, .H = 2, .Tq = 90, .Tk = 150, .D = 128, .causal = causal, .dtype = DType::F16, .dropout = 0.3});

    const int64_t B = 2, H = 3, T = 150, D = 64;
    const Case c{.B = B, .H = H, .Tq = T, .Tk = T, .D = D, .causal = causal, .dtype = DType::BF16};
    SCOPED_TRACE(describe(c));
    Generator g(6);
    Tensor qs = random({B, T, H, D}, DType::BF16, g), ks = random({B, T, H, D}, DType::BF16, g),
           vs = random({B, T, H, D}, DType::BF16, g), gs = random({B, T, H, D}, DType::BF16, g);
    auto bhtd = [](const Tensor& t) { return t.permute({0, 2, 1, 3}); };
    compare(bhtd(qs), bhtd(ks), bhtd(vs), bhtd(gs), bhtd(gpu(qs)), bhtd(gpu(ks)), bhtd(gpu(vs)), bhtd(gpu(gs)), c);
    Tensor vt = random({B, H, D, T}, DType::BF16, g);
    auto tr = [](const Tensor& t) { return t.transpose(2, 3); };
    compare(bhtd(qs), bhtd(ks), tr(vt), bhtd(gs), bhtd(gpu(qs)), bhtd(gpu(ks)), tr(gpu(vt)), bhtd(gpu(gs)), c);
  }
  Generator g(10);
  Tensor q = gpu(random({2, 4, 300, 128}, DType::BF16, g)).requires_grad_();
  Tensor k = gpu(random({2, 4, 300, 128}, DType::BF16, g)).requires_grad_();
  Tensor v = gpu(random({2, 4, 300, 128}, DType::BF16, g)).requires_grad_();
  Tensor gout = gpu(random({2, 4, 300, 128}, DType::BF16, g));
  expect_deterministic_backward(q, k, v, gout);
}

TEST(CudaAttention, BackwardIsDeterministic) {
  REQUIRE_GPU();
  Generator g(9);
  Tensor q = gpu(randn({2, 4, 300, 64}, {}, &g)).requires_grad_();
  Tensor k = gpu(randn({2, 4, 300, 64}, {}, &g)).requires_grad_();
  Tensor v = gpu(randn({2, 4, 300, 64}, {}, &g)).requires_grad_();
  Tensor gout = gpu(randn({2, 4, 300, 64}, {}, &g));
  expect_deterministic_backward(q, k, v, gout);
}

// Grouped-query and multi-query attention: dk and dv sum over the query heads of each KV head.
// Every dtype on the default kernels (bf16/f16: tensor cores; f32/f64: FMA), bf16 again on the
// FMA kernels, causal and full, Tq != Tk, lengths across tiles, dropout, [B, T, H, D] views.
TEST(CudaAttention, GroupedQueryHeads) {
  REQUIRE_GPU();
  for (bool fma : {false, true}) {
    switches::Scoped path(switches::cuda_attention_fma, fma);
    for (DType dt : {DType::F32, DType::F64, DType::BF16, DType::F16}) {
      if (fma && dt != DType::BF16) continue;
      for (bool causal : {false, true})
        for (auto [H, Hkv] : {std::pair<int64_t, int64_t>{6, 2}, {4, 1}}) {
          check({.B = 2, .H = H, .Tq = 77, .Tk = 77, .D = 64, .causal = causal, .dtype = dt, .Hkv = Hkv});
          check({.B = 1, .H = H, .Tq = 50, .Tk = 130, .D = 32, .causal = causal, .dtype = dt, .Hkv = Hkv});
          check({.B = 1, .H = H, .Tq = 130, .Tk = 70, .D = 128, .causal = causal, .dtype = dt, .Hkv = Hkv});
          check(
              {.B = 1, .H = H, .Tq = 90, .Tk = 90, .D = 64, .causal = causal, .dtype = dt, .dropout = 0.2, .Hkv = Hkv});
        }
    }
  }
  const int64_t B = 2, H = 8, Hkv = 2, T = 150, D = 64;
  const Case c{.B = B, .H = H, .Tq = T, .Tk = T, .D = D, .causal = true, .dtype = DType::BF16, .Hkv = Hkv};
  SCOPED_TRACE(describe(c));
  Generator g(7);
  const HeadsView q = heads_view(B, T, H, D, c.dtype, g), k = heads_view(B, T, Hkv, D, c.dtype, g),
                  v = heads_view(B, T, Hkv, D, c.dtype, g), gout = heads_view(B, T, H, D, c.dtype, g);
  compare(q.cpu, k.cpu, v.cpu, gout.cpu, q.cuda, k.cuda, v.cuda, gout.cuda, c);
  // deterministic: the group's sum is one block's, in a fixed order
  expect_deterministic_backward(q.cuda, k.cuda, v.cuda, gout.cuda);
}

// The document mask on both kernel families (tensor cores for bf16/f16 unless switched to FMA;
// FMA for f32/f64): documents shorter than, around and longer than the 64-row tiles, GQA and MQA,
// dropout, [B, T, H, D] views.
TEST(CudaAttention, DocumentMask) {
  REQUIRE_GPU();
  for (bool fma : {false, true}) {
    switches::Scoped path(switches::cuda_attention_fma, fma);
    for (DType dt : {DType::F32, DType::F64, DType::BF16, DType::F16}) {
      if (fma && dt != DType::BF16) continue;
      for (int64_t doc : {5, 40, 64, 150})
        for (auto [H, Hkv] : {std::pair<int64_t, int64_t>{4, 4}, {8, 2}, {4, 1}}) {
          check(
              {.B = 3, .H = H, .Tq = 300, .Tk = 300, .D = 64, .causal = true, .dtype = dt, .Hkv = Hkv, .doc_len = doc});
        }
      check({.B = 2, .H = 2, .Tq = 257, .Tk = 257, .D = 32, .causal = true, .dtype = dt, .doc_len = 20});
      check({.B = 2, .H = 2, .Tq = 130, .Tk = 130, .D = 128, .causal = true, .dtype = dt, .doc_len = 70});
      check({.B = 2,
             .H = 4,
             .Tq = 200,
             .Tk = 200,
             .D = 64,
             .causal = true,
             .dtype = dt,
             .dropout = 0.2,
             .Hkv = 2,
             .doc_len = 50});
    }
  }
  const Case c{
      .B = 2, .H = 8, .Tq = 256, .Tk = 256, .D = 32, .causal = true, .dtype = DType::BF16, .Hkv = 2, .doc_len = 128};
  SCOPED_TRACE(describe(c));
  Generator g(8);
  const HeadsView q = heads_view(c.B, c.Tq, c.H, c.D, c.dtype, g), k = heads_view(c.B, c.Tq, 2, c.D, c.dtype, g),
                  v = heads_view(c.B, c.Tq, 2, c.D, c.dtype, g), gout = heads_view(c.B, c.Tq, c.H, c.D, c.dtype, g);
  compare(q.cpu, k.cpu, v.cpu, gout.cpu, q.cuda, k.cuda, v.cuda, gout.cuda, c);
}

// One document per window walks the causal tiles with the same arithmetic: bitwise equal to
// causal attention on each kernel family. Decreasing ids are refused at the next synchronisation.
TEST(CudaAttention, DocumentMaskOfOneDocumentIsCausalAndBadIdsAreRefused) {
  REQUIRE_GPU();
  // Both on the engine's kernels (a document mask never goes to cuDNN).
  switches::Scoped engine(switches::cuda_attention, switches::CudaAttention::Engine);
  for (DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    Generator g(12);
    Tensor q = gpu(random({2, 4, 150, 64}, dt, g)).requires_grad_(),
           k = gpu(random({2, 2, 150, 64}, dt, g)).requires_grad_(),
           v = gpu(random({2, 2, 150, 64}, dt, g)).requires_grad_();
    Tensor gout = gpu(random({2, 4, 150, 64}, dt, g));
    const Tensor docs = gpu(full({2, 150}, 3, DType::I32));
    Tensor a = scaled_dot_product_attention(q, k, v, true);
    Tensor b = scaled_dot_product_attention(q, k, v, DocumentMask{docs});
    std::vector<Tensor> ga = autograd::grad({a}, {q, k, v}, {gout}), gb = autograd::grad({b}, {q, k, v}, {gout});
    EXPECT_EQ(a.to(Device::cpu()).to_vector(), b.to(Device::cpu()).to_vector());
    for (int i = 0; i < 3; ++i)
      EXPECT_EQ(ga[i].to(Device::cpu()).to_vector(), gb[i].to(Device::cpu()).to_vector()) << "gradient " << i;
  }
  Tensor q = gpu(zeros({2, 1, 6, 32}));
  const Tensor back = gpu(from_vector({0, 0, 1, 1, 2, 2, 0, 1, 2, 1, 1, 3}, {2, 6}, DType::I32));
  try {
    Tensor y = scaled_dot_product_attention(q, q, q, DocumentMask{back});
    y.to(Device::cpu());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("doc_ids must not decrease along T (each document a run of equal ids), "
                                         "found doc_ids[1, 3] 1 below doc_ids[1, 2]"),
              std::string::npos)
        << e.what();
  }
}

TEST(CudaAttention, EmptySequences) {
  REQUIRE_GPU();
  // No keys: the output is 0 and every gradient 0; no queries: an empty output, dk = dv = 0.
  for (auto [tq, tk] : {std::pair<int64_t, int64_t>{5, 0}, {0, 5}}) {
    SCOPED_TRACE(std::to_string(tq) + "x" + std::to_string(tk));
    Generator g(3);
    Tensor q = randn({1, 2, tq, 32}, {}, &g), k = randn({1, 2, tk, 32}, {}, &g), v = randn({1, 2, tk, 32}, {}, &g);
    Tensor gout = randn({1, 2, tq, 32}, {}, &g);
    compare(q, k, v, gout, {.B = 1, .H = 2, .Tq = tq, .Tk = tk, .D = 32});
  }
}

TEST(CudaAttention, HeadDimAbove128IsRefused) {
  REQUIRE_GPU();
  Tensor q = gpu(zeros({1, 1, 4, 160}));
  try {
    scaled_dot_product_attention(q, q, q);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("head dim 160 is not supported on CUDA"), std::string::npos) << e.what();
  }
}

// --- cuDNN's fused attention (attention_cudnn.cpp) ---------------------------------------------

namespace {

using cuda::attention_cudnn::run_counts;
using cuda::attention_cudnn::RunCounts;

// check() with the calls' cuDNN runs counted: the forward ran on cuDNN, and the backward too when
// this cuDNN takes its key count.
void check_on_cudnn(const Case& c) {
  SCOPED_TRACE("cuDNN");
  const RunCounts before = run_counts();
  check(c);
  const RunCounts after = run_counts();
  EXPECT_EQ(after.forward, before.forward + 1) << describe(c);
  if (cuda::attention_cudnn::backward_supported(c.Tk)) EXPECT_EQ(after.backward, before.backward + 1) << describe(c);
}

}  // namespace

// FT_CUDA_ATTENTION=cudnn: bf16 and f16, every compiled head dim, causal and full, lengths in
// whole 128-key tiles and not, cross attention both ways, GQA and MQA, a non-default scale, and
// [B, T, H, D] views (strided rows), each against the CPU; the run counts show cuDNN ran them.
TEST(CudaAttention, CudnnFusedAttentionMatchesCpu) {
  REQUIRE_GPU();
  switches::Scoped path(switches::cuda_attention, switches::CudaAttention::Cudnn);
  for (bool causal : {false, true}) {
    for (DType dt : {DType::BF16, DType::F16})
      for (int64_t D : {32, 64, 128})
        check_on_cudnn({.B = 2, .H = 4, .Tq = 256, .Tk = 256, .D = D, .causal = causal, .dtype = dt});
    check_on_cudnn({.B = 1, .H = 4, .Tq = 1024, .Tk = 1024, .D = 64, .causal = causal, .dtype = DType::BF16});
    check_on_cudnn({.B = 2, .H = 2, .Tq = 100, .Tk = 100, .D = 64, .causal = causal, .dtype = DType::BF16});
    check_on_cudnn({.B = 1, .H = 2, .Tq = 77, .Tk = 77, .D = 40, .causal = causal, .dtype = DType::F16});
    for (auto [tq, tk] : {std::pair<int64_t, int64_t>{128, 256}, {256, 128}, {70, 130}})
      check_on_cudnn({.B = 1, .H = 2, .Tq = tq, .Tk = tk, .D = 64, .causal = causal, .dtype = DType::BF16});
    for (auto [H, Hkv] : {std::pair<int64_t, int64_t>{8, 2}, {4, 1}})
      check_on_cudnn(
          {.B = 2, .H = H, .Tq = 256, .Tk = 256, .D = 64, .causal = causal, .dtype = DType::BF16, .Hkv = Hkv});
    check_on_cudnn(
        {.B = 1, .H = 2, .Tq = 128, .Tk = 128, .D = 128, .causal = causal, .dtype = DType::BF16, .scale = 0.05});

    const Case c{.B = 2, .H = 8, .Tq = 256, .Tk = 256, .D = 64, .causal = causal, .dtype = DType::BF16, .Hkv = 2};
    SCOPED_TRACE(describe(c) + " as [B, T, H, D] views");
    Generator g(13);
    const HeadsView q = heads_view(c.B, c.Tq, c.H, c.D, c.dtype, g), k = heads_view(c.B, c.Tk, 2, c.D, c.dtype, g),
                    v = heads_view(c.B, c.Tk, 2, c.D, c.dtype, g), gout = heads_view(c.B, c.Tq, c.H, c.D, c.dtype, g);
    const RunCounts before = run_counts();
    compare(q.cpu, k.cpu, v.cpu, gout.cpu, q.cuda, k.cuda, v.cuda, gout.cuda, c);
    EXPECT_EQ(run_counts().forward, before.forward + 1);
    EXPECT_EQ(run_counts().backward, before.backward + 1);
  }
}

// What cuDNN's path does not take stays on the engine's kernels under =cudnn, with the same
// results: dropout (the engine's Philox mask), f32, a head dim not a multiple of 8, a document
// mask, a broadcast (zero-stride) KV head.
TEST(CudaAttention, CudnnLeavesWhatItDoesNotTakeToTheEngine) {
  REQUIRE_GPU();
  switches::Scoped path(switches::cuda_attention, switches::CudaAttention::Cudnn);
  const RunCounts before = run_counts();
  check({.B = 1, .H = 2, .Tq = 128, .Tk = 128, .D = 64, .causal = true, .dtype = DType::BF16, .dropout = 0.2});
  check({.B = 1, .H = 2, .Tq = 128, .Tk = 128, .D = 64, .causal = true, .dtype = DType::F32});
  check({.B = 1, .H = 2, .Tq = 128, .Tk = 128, .D = 36, .causal = true, .dtype = DType::BF16});
  check({.B = 2, .H = 4, .Tq = 256, .Tk = 256, .D = 64, .causal = true, .dtype = DType::BF16, .Hkv = 2, .doc_len = 50});
  Generator g(14);
  Tensor q = random({1, 4, 128, 64}, DType::BF16, g), k1 = random({1, 1, 128, 64}, DType::BF16, g),
         v = random({1, 4, 128, 64}, DType::BF16, g), gout = random({1, 4, 128, 64}, DType::BF16, g);
  auto bcast = [](const Tensor& t) { return t.expand({-1, 4, -1, -1}); };
  compare(q, bcast(k1), v, gout, gpu(q), bcast(gpu(k1)), gpu(v), gpu(gout),
          {.B = 1, .H = 4, .Tq = 128, .Tk = 128, .D = 64, .dtype = DType::BF16});
  EXPECT_EQ(run_counts().forward, before.forward);
  EXPECT_EQ(run_counts().backward, before.backward);
}

// Under deterministic_algorithms() (the Trainer's default) the backward runs cuDNN's
// deterministic graph: right against the CPU, and bit-for-bit repeatable.
TEST(CudaAttention, CudnnDeterministicBackward) {
  REQUIRE_GPU();
  switches::Scoped path(switches::cuda_attention, switches::CudaAttention::Cudnn);
  DeterministicAlgorithmsGuard deterministic(true);
  check_on_cudnn({.B = 2, .H = 8, .Tq = 256, .Tk = 256, .D = 64, .causal = true, .dtype = DType::BF16, .Hkv = 2});
  Generator g(17);
  const RunCounts before = run_counts();
  Tensor q = gpu(random({2, 4, 384, 64}, DType::BF16, g)), k = gpu(random({2, 4, 384, 64}, DType::BF16, g)),
         v = gpu(random({2, 4, 384, 64}, DType::BF16, g)), gout = gpu(random({2, 4, 384, 64}, DType::BF16, g));
  expect_deterministic_backward(q, k, v, gout, /*any_path=*/true);
  EXPECT_EQ(run_counts().backward, before.backward + 2);
}

// A forward on one implementation and the backward on the other agree with the CPU: both write
// the same lse (max + log sum of the scaled scores), so autograd may cross between them.
TEST(CudaAttention, CudnnAndEngineShareTheSoftmaxStatistics) {
  REQUIRE_GPU();
  const Case c{.B = 2, .H = 4, .Tq = 256, .Tk = 256, .D = 64, .causal = true, .dtype = DType::BF16, .Hkv = 2};
  Generator g(15);
  Tensor q = random({c.B, c.H, c.Tq, c.D}, c.dtype, g), k = random({c.B, 2, c.Tk, c.D}, c.dtype, g),
         v = random({c.B, 2, c.Tk, c.D}, c.dtype, g), gout = random({c.B, c.H, c.Tq, c.D}, c.dtype, g);
  auto grads = [&](const Tensor& qi, const Tensor& ki, const Tensor& vi, const Tensor& gi, switches::CudaAttention fwd,
                   switches::CudaAttention bwd) {
    Tensor ql = qi.detach().requires_grad_(), kl = ki.detach().requires_grad_(), vl = vi.detach().requires_grad_();
    Tensor y;
    {
      switches::Scoped path(switches::cuda_attention, fwd);
      y = scaled_dot_product_attention(ql, kl, vl, true);
    }
    switches::Scoped path(switches::cuda_attention, bwd);
    std::vector<Tensor> r = autograd::grad({y}, {ql, kl, vl}, {gi});
    r.insert(r.begin(), y);
    return r;
  };
  using switches::CudaAttention;
  const std::vector<Tensor> want = grads(q, k, v, gout, CudaAttention::Engine, CudaAttention::Engine);
  for (auto [fwd, bwd] :
       {std::pair{CudaAttention::Cudnn, CudaAttention::Engine}, {CudaAttention::Engine, CudaAttention::Cudnn}}) {
    SCOPED_TRACE(fwd == CudaAttention::Cudnn ? "forward on cuDNN, backward on the engine"
                                             : "forward on the engine, backward on cuDNN");
    const RunCounts before = run_counts();
    const std::vector<Tensor> got = grads(gpu(q), gpu(k), gpu(v), gpu(gout), fwd, bwd);
    EXPECT_EQ(run_counts().forward + run_counts().backward, before.forward + before.backward + 1);
    const char* names[] = {"out", "dq", "dk", "dv"};
    for (int i = 0; i < 4; ++i) {
      SCOPED_TRACE(names[i]);
      EXPECT_CLOSE_TO_CPU(got[i], want[i], tolerance(c.dtype));
    }
  }
}

// FT_CUDA_ATTENTION=auto: the first call of a problem times both implementations (three runs of
// cuDNN's among them) and every later call takes the one it kept: the same results each time,
// right against the CPU, and either one cuDNN run per call or none.
TEST(CudaAttention, CudnnAutoChoosesOncePerProblem) {
  REQUIRE_GPU();
  switches::Scoped path(switches::cuda_attention, switches::CudaAttention::Auto);
  autograd::NoGradGuard no_grad;
  Generator g(16);
  Tensor q = random({2, 4, 384, 64}, DType::BF16, g), k = random({2, 4, 384, 64}, DType::BF16, g),
         v = random({2, 4, 384, 64}, DType::BF16, g);
  const Tensor want = scaled_dot_product_attention(q, k, v, true);
  const Tensor gq = gpu(q), gk = gpu(k), gv = gpu(v);
  RunCounts before = run_counts();
  EXPECT_CLOSE_TO_CPU(scaled_dot_product_attention(gq, gk, gv, true), want, 1e-2);
  EXPECT_EQ(run_counts().forward, before.forward + 3) << "the first call times cuDNN three times";
  before = run_counts();
  const Tensor second = scaled_dot_product_attention(gq, gk, gv, true);
  const int64_t per_call = run_counts().forward - before.forward;
  EXPECT_TRUE(per_call == 0 || per_call == 1) << per_call;
  EXPECT_CLOSE_TO_CPU(second, want, 1e-2);
  before = run_counts();
  const Tensor third = scaled_dot_product_attention(gq, gk, gv, true);
  EXPECT_EQ(run_counts().forward - before.forward, per_call) << "the choice is kept";
  EXPECT_EQ(second.to(Device::cpu()).to_vector(), third.to(Device::cpu()).to_vector());
}
