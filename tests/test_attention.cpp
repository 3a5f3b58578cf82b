// scaled_dot_product_attention: PyTorch parity (hand-written reference, since PyTorch 1.13 has
// no F.scaled_dot_product_attention), f64 gradient checks with tiles smaller than T, dropout
// reproducibility, memory that does not grow with T^2, grouped-query attention (k and v with fewer
// heads than q), the document mask of packed windows (DocumentMask: parity with an explicit
// boolean mask, gradients, tile skipping, one document = causal) and argument validation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <random>
#include <set>

#include "backend/cpu/attention.h"
#include "backend/cpu/attention_tiles.h"
#include "backend/cpu/isa.h"
#include "core/switches.h"
#include "fasttrain/fasttrain.h"
#include "ops/mask_parts.h"
#include "support/expect_error.h"
#include "support/gradcheck.h"
#include "support/parity.h"

using namespace ft;
using test::ParityCase;

namespace {

// Tiles smaller than the sequence, so multiple query and key blocks, partial last blocks and
// the causal block skip are all exercised at gradcheck sizes.
struct SmallBlocks {
  SmallBlocks(int64_t bq, int64_t bk) { cpu::set_attention_block_sizes_for_testing(bq, bk); }
  ~SmallBlocks() { cpu::set_attention_block_sizes_for_testing(0, 0); }
};

struct Threads {
  int saved = get_num_threads();
  explicit Threads(int n) { set_num_threads(n); }
  ~Threads() { set_num_threads(saved); }
};

Tensor randn64(const Shape& s, uint64_t seed, double amp = 1.0) {
  Generator g(seed);
  return mul(randn(s, DType::F64, &g), amp);
}

// Dense f64 reference with an explicit dropout mask rebuilt from the documented Philox rule:
// element (b, h, i, j) is kept iff uniform_from_word(philox_word(seed, base, flat)) < 1 - p.
// k and v may have fewer heads (Hkv) than q: query head h uses KV head h / (H / Hkv).
struct Reference {
  std::vector<double> out, dq, dk, dv;
};

// docs, when given, holds doc_ids [B, T] (flat): key j is then also masked for query i when their
// documents differ (the document mask).
Reference reference(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& gout, bool causal, double p,
                    double scale, uint64_t seed, uint64_t base, const std::vector<double>* docs = nullptr) {
  const int64_t B = q.size(0), H = q.size(1), Tq = q.size(2), Tk = k.size(2), D = q.size(3);
  const int64_t Hkv = k.size(1), group = H / Hkv;
  std::vector<double> Q = q.contiguous().to_vector(), K = k.contiguous().to_vector(), V = v.contiguous().to_vector(),
                      G = gout.contiguous().to_vector();
  Reference r;
  r.out.assign(Q.size(), 0);
  r.dq.assign(Q.size(), 0);
  r.dk.assign(K.size(), 0);
  r.dv.assign(V.size(), 0);
  std::vector<double> P(Tk), M(Tk), Z(Tk), dP(Tk);
  for (int64_t bh = 0; bh < B * H; ++bh) {
    const int64_t bkv = (bh / H) * Hkv + (bh % H) / group;
    const double* q0 = &Q[bh * Tq * D];
    const double* k0 = &K[bkv * Tk * D];
    const double* v0 = &V[bkv * Tk * D];
    const double* g0 = &G[bh * Tq * D];
    for (int64_t i = 0; i < Tq; ++i) {
      double mx = -INFINITY;
      for (int64_t j = 0; j < Tk; ++j) {
        double s = 0;
        for (int64_t d = 0; d < D; ++d) s += q0[i * D + d] * k0[j * D + d];
        const int64_t b = bh / H;
        const bool other_doc = docs && (*docs)[b * Tq + i] != (*docs)[b * Tk + j];
        P[j] = (causal && j > i) || other_doc ? -INFINITY : s * scale;
        mx = std::max(mx, P[j]);
      }
      double l = 0;
      for (int64_t j = 0; j < Tk; ++j) l += (P[j] = std::exp(P[j] - mx));
      for (int64_t j = 0; j < Tk; ++j) {
        P[j] /= l;
        const uint64_t flat = static_cast<uint64_t>((bh * Tq + i) * Tk + j);
        const bool keep = p == 0 || uniform_from_word(philox_word(seed, base, flat)) < static_cast<float>(1 - p);
        M[j] = keep ? 1.0 / (1 - p) : 0.0;
        Z[j] = P[j] * M[j];
      }
      for (int64_t j = 0; j < Tk; ++j)
        for (int64_t d = 0; d < D; ++d) {
          r.out[(bh * Tq + i) * D + d] += Z[j] * v0[j * D + d];
          r.dv[(bkv * Tk + j) * D + d] += Z[j] * g0[i * D + d];
        }
      // dP = (dO V^T) * mask; dS = P * (dP - sum_j dP P)
      double dot = 0;
      for (int64_t j = 0; j < Tk; ++j) {
        double s = 0;
        for (int64_t d = 0; d < D; ++d) s += g0[i * D + d] * v0[j * D + d];
        dP[j] = s * M[j];
        dot += dP[j] * P[j];
      }
      for (int64_t j = 0; j < Tk; ++j) {
        const double ds = P[j] * (dP[j] - dot) * scale;
        for (int64_t d = 0; d < D; ++d) {
          r.dq[(bh * Tq + i) * D + d] += ds * k0[j * D + d];
          r.dk[(bkv * Tk + j) * D + d] += ds * q0[i * D + d];
        }
      }
    }
  }
  return r;
}

void expect_near_vec(const std::vector<double>& a, const std::vector<double>& b, double tol, const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::fabs(a[i] - b[i]) > worst) worst = std::fabs(a[i] - b[i]), at = i;
  EXPECT_LE(worst, tol) << what << ": element " << at << " is " << a[at] << ", expected " << b[at];
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  std::vector<double> x = a.to_vector(), y = b.to_vector();
  return x == y;
}

}  // namespace

// --- parity with PyTorch -------------------------------------------------------------------

TEST(AttentionParity, AllCases) {
  const std::vector<std::string> configs = {
      "self", "causal", "long", "cross",     "cross_causal",      "causal_q_gt_k", "transposed", "bthd",
      "qkv",  "mqa",    "gqa",  "gqa_cross", "gqa_causal_q_gt_k", "gqa_kv1",       "gqa_bthd"};
  const std::set<std::string> f16_configs = {"self", "cross_causal", "bthd", "gqa", "gqa_bthd"};
  for (const char* dt : {"f32", "f64", "bf16", "f16"}) {
    for (const std::string& cfg : configs) {
      if (std::string(dt) == "f16" && !f16_configs.count(cfg)) continue;
      const std::string name = "sdpa_" + cfg + "_" + dt;
      SCOPED_TRACE(name);
      FT_PARITY_CASE(c, name);
      const bool causal = c.param<bool>("causal");
      const double s = c.param<double>("scale");
      const std::optional<double> scale = s > 0 ? std::optional<double>(s) : std::nullopt;
      const std::string layout = c.param<std::string>("layout");
      Tensor y;
      if (layout == "qkv") {
        Tensor qkv = c.input("qkv", true);  // [B, T, 3, H, D]
        auto part = [&](int i) { return qkv.select(2, i).permute({0, 2, 1, 3}); };
        y = scaled_dot_product_attention(part(0), part(1), part(2), causal, 0.0, scale);
        c.expect_output(y);
        c.backward({y});
        c.expect_grad("qkv", qkv);
        continue;
      }
      Tensor q = c.input("q", true), k = c.input("k", true), v = c.input("v", true);
      if (layout == "mqa") {  // k, v broadcast over heads (zero stride)
        const int64_t H = q.size(1);
        y = scaled_dot_product_attention(q, k.expand({-1, H, -1, -1}), v.expand({-1, H, -1, -1}), causal, 0.0, scale);
      } else if (layout == "bthd") {
        y = scaled_dot_product_attention(q.permute({0, 2, 1, 3}), k.permute({0, 2, 1, 3}), v.permute({0, 2, 1, 3}),
                                         causal, 0.0, scale);
      } else {
        if (layout == "transposed") EXPECT_FALSE(q.is_contiguous());
        y = scaled_dot_product_attention(q, k, v, causal, 0.0, scale);
      }
      EXPECT_EQ(y.dtype(), c.dtype());
      EXPECT_TRUE(y.is_contiguous());
      c.expect_output(y);
      c.backward({y});
      c.expect_grad("q", q);
      c.expect_grad("k", k);
      c.expect_grad("v", v);
    }
  }
}

// --- gradient checks (f64, finite differences) -------------------------------------------

TEST(AttentionGrad, NonCausalMultiTile) {
  SmallBlocks blocks(3, 4);
  Tensor q = randn64({1, 2, 7, 5}, 1).requires_grad_(), k = randn64({1, 2, 9, 5}, 2).requires_grad_(),
         v = randn64({1, 2, 9, 5}, 3).requires_grad_();
  EXPECT_GRADCHECK([](const std::vector<Tensor>& x) { return scaled_dot_product_attention(x[0], x[1], x[2]); },
                   {q, k, v});
}

TEST(AttentionGrad, CausalMultiTileWithBlockSkip) {
  SmallBlocks blocks(3, 2);  // key blocks wholly above the diagonal are skipped
  for (auto [tq, tk] : {std::pair<int64_t, int64_t>{8, 8}, {6, 9}, {9, 5}}) {
    SCOPED_TRACE(std::to_string(tq) + "x" + std::to_string(tk));
    Tensor q = randn64({2, 1, tq, 4}, 4, 1.5).requires_grad_(), k = randn64({2, 1, tk, 4}, 5, 1.5).requires_grad_(),
           v = randn64({2, 1, tk, 4}, 6).requires_grad_();
    EXPECT_GRADCHECK(
        [](const std::vector<Tensor>& x) { return scaled_dot_product_attention(x[0], x[1], x[2], true, 0.0, 0.7); },
        {q, k, v});
  }
}

TEST(AttentionGrad, NonContiguousInputs) {
  SmallBlocks blocks(4, 3);
  // [B, T, H, D] storage permuted to [B, H, T, D]; v additionally has a non-dense head dim.
  Tensor qs = randn64({2, 6, 2, 4}, 7).requires_grad_(), ks = randn64({2, 7, 2, 4}, 8).requires_grad_();
  Tensor vs = randn64({4, 7, 2, 2}, 9).requires_grad_();  // [D, T, H, B]
  EXPECT_GRADCHECK(
      [](const std::vector<Tensor>& x) {
        Tensor q = x[0].permute({0, 2, 1, 3}), k = x[1].permute({0, 2, 1, 3}), v = x[2].permute({3, 2, 1, 0});
        return scaled_dot_product_attention(q, k, v, true);
      },
      {qs, ks, vs});
}

TEST(AttentionGrad, Dropout) {
  SmallBlocks blocks(3, 4);
  Tensor q = randn64({1, 2, 6, 4}, 10).requires_grad_(), k = randn64({1, 2, 7, 4}, 11).requires_grad_(),
         v = randn64({1, 2, 7, 4}, 12).requires_grad_();
  // A fresh generator per call: every evaluation draws the same mask.
  for (bool causal : {false, true}) {
    EXPECT_GRADCHECK(
        [causal](const std::vector<Tensor>& x) {
          Generator g(99);
          return scaled_dot_product_attention(x[0], x[1], x[2], causal, 0.4, std::nullopt, &g);
        },
        {q, k, v});
  }
}

// --- dropout ------------------------------------------------------------------------------

TEST(AttentionDropout, MatchesExplicitPhiloxMaskForwardAndBackward) {
  SmallBlocks blocks(5, 6);  // tiling must not change which elements are dropped
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "full");
    Tensor q = randn64({2, 2, 11, 8}, 20).requires_grad_(), k = randn64({2, 2, 13, 8}, 21).requires_grad_(),
           v = randn64({2, 2, 13, 8}, 22).requires_grad_();
    Generator g(2024);
    g.reserve(5);  // a non-zero base offset
    const uint64_t base = g.state().offset;
    const double p = 0.3, scale = 0.4;
    Tensor y = scaled_dot_product_attention(q, k, v, causal, p, scale, &g);
    EXPECT_EQ(g.state().offset, base + (2 * 2 * 11 * 13 + 3) / 4);
    Tensor gout = randn64(y.shape(), 23);
    std::vector<Tensor> grads = autograd::grad({y}, {q, k, v}, {gout});
    Reference r = reference(q, k, v, gout, causal, p, scale, 2024, base);
    expect_near_vec(y.to_vector(), r.out, 1e-12, "out");
    expect_near_vec(grads[0].to_vector(), r.dq, 1e-12, "dq");
    expect_near_vec(grads[1].to_vector(), r.dk, 1e-12, "dk");
    expect_near_vec(grads[2].to_vector(), r.dv, 1e-12, "dv");
  }
}

TEST(AttentionDropout, APartOfALayersHeadsDrawsItsPartOfTheWholeMask) {
  // Tensor parallelism's split attention: heads [2, 4) of 6 (grouped-query: their KV head 1 of 3)
  // with ops::AttentionHeads{2, 6} give heads 2 and 3 of the whole layer's output and gradients, and
  // advance the generator by the whole mask, as one process does.
  SmallBlocks blocks(5, 6);
  Tensor q = randn64({2, 6, 12, 8}, 40), k = randn64({2, 3, 12, 8}, 41), v = randn64({2, 3, 12, 8}, 42);
  Tensor gout = randn64({2, 6, 12, 8}, 43);
  Generator whole_gen(9), part_gen(9);
  Tensor qw = q.clone().requires_grad_(), kw = k.clone().requires_grad_(), vw = v.clone().requires_grad_();
  Tensor y = scaled_dot_product_attention(qw, kw, vw, true, 0.3, std::nullopt, &whole_gen);
  const std::vector<Tensor> g = autograd::grad({y}, {qw, kw, vw}, {gout});
  Tensor qp = q.narrow(1, 2, 2).contiguous().requires_grad_(), kp = k.narrow(1, 1, 1).contiguous().requires_grad_(),
         vp = v.narrow(1, 1, 1).contiguous().requires_grad_();
  Tensor yp = ops::attention_of_heads(qp, kp, vp, true, nullptr, 0.3, {2, 6}, &part_gen);
  const std::vector<Tensor> gp = autograd::grad({yp}, {qp, kp, vp}, {gout.narrow(1, 2, 2).contiguous()});
  EXPECT_EQ(part_gen.state().offset, whole_gen.state().offset);
  expect_near_vec(yp.to_vector(), y.narrow(1, 2, 2).contiguous().to_vector(), 1e-12, "out");
  expect_near_vec(gp[0].to_vector(), g[0].narrow(1, 2, 2).contiguous().to_vector(), 1e-12, "dq");
  // KV head 1 serves query heads 2 and 3 only: its whole-layer gradient is theirs alone.
  expect_near_vec(gp[1].to_vector(), g[1].narrow(1, 1, 1).contiguous().to_vector(), 1e-12, "dk");
  expect_near_vec(gp[2].to_vector(), g[2].narrow(1, 1, 1).contiguous().to_vector(), 1e-12, "dv");
  // Without the window the part draws a mask of its own: different numbers.
  Generator plain_gen(9);
  Tensor yo = scaled_dot_product_attention(q.narrow(1, 2, 2).contiguous(), k.narrow(1, 1, 1).contiguous(),
                                           v.narrow(1, 1, 1).contiguous(), true, 0.3, std::nullopt, &plain_gen);
  EXPECT_FALSE(bitwise_equal(yo, yp));
  EXPECT_THROW(ops::attention_of_heads(qp, kp, vp, true, nullptr, 0.3, {5, 6}, &part_gen), Error);
  // 11 x 11 scores per head: the part's first element would fall inside a counter block.
  const Tensor q11 = randn64({2, 2, 11, 8}, 44), kv11 = randn64({2, 1, 11, 8}, 45);
  EXPECT_THROW(ops::attention_of_heads(q11, kv11, kv11, true, nullptr, 0.3, {2, 6}, &part_gen), Error);
}

TEST(AttentionDropout, SameResultOnOneAndTwoThreads) {
  // Sizes large enough that both passes really split across two threads (the parallel grain is
  // work-based); B*Hkv = 1 also makes the backward split each head's keys into dQ groups. With
  // grouped-query heads (Hkv < H) dK/dV sum a group's query heads inside one task, in a fixed
  // order, in f32 and bf16.
  for (auto [B, H, Hkv, dt] : {std::tuple<int64_t, int64_t, int64_t, DType>{1, 1, 1, DType::F32},
                               {2, 4, 4, DType::F32},
                               {1, 4, 1, DType::F32},
                               {2, 8, 2, DType::BF16}}) {
    Generator init(5);
    Tensor q = randn({B, H, 150, 32}, {}, &init).to(dt).requires_grad_(),
           k = randn({B, Hkv, 140, 32}, {}, &init).to(dt).requires_grad_(),
           v = randn({B, Hkv, 140, 32}, {}, &init).to(dt).requires_grad_();
    Tensor gout = randn({B, H, 150, 32}, {}, &init).to(dt);
    std::vector<Tensor> res[2];
    for (int n : {1, 2}) {
      Threads t(n);
      Generator g(77);
      Tensor y = scaled_dot_product_attention(q, k, v, true, 0.2, std::nullopt, &g);
      res[n - 1] = autograd::grad({y}, {q, k, v}, {gout});
      res[n - 1].push_back(y);
    }
    for (int i = 0; i < 4; ++i) EXPECT_TRUE(bitwise_equal(res[0][i], res[1][i])) << "result " << i;
  }
}

// Tensor parallelism gives each rank some of the heads (and their key/value heads): a head's
// output and gradients must not depend on which other heads share the call, or a split model
// drifts from the whole one. The first half of the heads alone against the same heads of the
// whole call, bit for bit, causal, grouped-query, at head sizes that take the tile kernels'
// ragged paths. (Not where B x KV heads is below 8: the backward then also splits each head's key
// blocks into groups, as many as keep the threads busy, and sums their dQ partials; the count
// depends on B x KV heads, so a head's dQ rounds differently in a call of fewer heads.)
TEST(Attention, AHeadsResultDoesNotDependOnTheOtherHeadsInTheCall) {
  for (auto [B, H, Hkv, T, D] : {std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>{8, 4, 2, 16, 8},
                                 {8, 8, 2, 70, 32},
                                 {2, 8, 8, 130, 64}}) {
    SCOPED_TRACE(testing::Message() << "B " << B << " H " << H << " Hkv " << Hkv << " T " << T << " D " << D);
    Generator init(3);
    // [B, T, heads, D] projections viewed as [B, heads, T, D], as the models hand them over.
    const Tensor q = randn({B, T, H, D}, {}, &init), k = randn({B, T, Hkv, D}, {}, &init),
                 v = randn({B, T, Hkv, D}, {}, &init), gout = randn({B, T, H, D}, {}, &init);
    auto run = [&](int64_t heads, int64_t kv_heads) {
      Tensor qs = q.narrow(2, 0, heads).contiguous().requires_grad_(),
             ks = k.narrow(2, 0, kv_heads).contiguous().requires_grad_(),
             vs = v.narrow(2, 0, kv_heads).contiguous().requires_grad_();
      Tensor y = scaled_dot_product_attention(qs.transpose(1, 2), ks.transpose(1, 2), vs.transpose(1, 2), true);
      // The output's gradient arrives as the output projection's backward leaves it: [B, T, heads, D].
      std::vector<Tensor> out =
          autograd::grad({y}, {qs, ks, vs}, {gout.narrow(2, 0, heads).contiguous().transpose(1, 2)});
      out[0] = out[0].transpose(1, 2), out[1] = out[1].transpose(1, 2), out[2] = out[2].transpose(1, 2);
      out.insert(out.begin(), y);
      return out;
    };
    const std::vector<Tensor> whole = run(H, Hkv), half = run(H / 2, Hkv / 2);
    const char* names[] = {"output", "dq", "dk", "dv"};
    for (int i = 0; i < 4; ++i) {
      const int64_t n = half[i].size(1);
      EXPECT_TRUE(bitwise_equal(whole[i].narrow(1, 0, n).contiguous(), half[i])) << names[i];
    }
  }
}

// bf16 attention on whichever tile path this process takes (FT_BF16_GEMM: the vdpbf16ps products
// where oneDNN's bf16 path is chosen and the CPU has AVX512-BF16, widened f32 otherwise; ctest runs
// this suite under both): the result does not depend on the thread count, and forward and
// gradients stay within bf16 rounding of the f64 computation on the same (rounded) inputs, with
// ragged tiles and q, k, v strided views of one qkv tensor.
TEST(Attention, Bf16TilesAreThreadIndependentAndCloseToF64) {
  Generator init(9);
  Tensor qkv = randn({2, 150, 3, 4, 64}, {}, &init).to(DType::BF16).requires_grad_();
  Tensor gout = randn({2, 4, 150, 64}, {}, &init).to(DType::BF16);
  auto run = [&](const Tensor& x, const Tensor& g) {
    auto part = [&](int i) { return x.select(2, i).permute({0, 2, 1, 3}); };
    Tensor y = scaled_dot_product_attention(part(0), part(1), part(2), true);
    std::vector<Tensor> out = autograd::grad({y}, {x}, {g});
    out.push_back(y);
    return out;
  };
  std::vector<Tensor> res[2];
  for (int n : {1, 2}) {
    Threads t(n);
    res[n - 1] = run(qkv, gout);
  }
  for (int i = 0; i < 2; ++i) EXPECT_TRUE(bitwise_equal(res[0][i], res[1][i])) << "result " << i;
  Tensor q64 = qkv.detach().to(DType::F64).requires_grad_();
  const std::vector<Tensor> want = run(q64, gout.to(DType::F64));
  for (int i = 0; i < 2; ++i) {
    const std::vector<double> got = res[1][i].to_vector(), ref = want[i].to_vector();
    double err = 0, norm = 0;
    for (size_t j = 0; j < ref.size(); ++j) {
      err += (got[j] - ref[j]) * (got[j] - ref[j]);
      norm += ref[j] * ref[j];
    }
    EXPECT_LT(std::sqrt(err / norm), 1e-2) << (i == 0 ? "grad of qkv" : "output");
  }
}

TEST(AttentionDropout, PreservesMeanAndAdvancesGenerator) {
  // With v = 1 every undropped output is exactly 1; dropout rescales kept weights by 1/(1-p), so
  // the mean stays 1 in expectation (std of this mean is ~0.003 here).
  Tensor q = randn64({1, 4, 128, 16}, 30), k = randn64({1, 4, 128, 16}, 31);
  Tensor v = ones({1, 4, 128, 16}, DType::F64);
  Generator g(3);
  Tensor y1 = scaled_dot_product_attention(q, k, v, false, 0.3, std::nullopt, &g);
  EXPECT_NEAR(mean(y1).item<double>(), 1.0, 0.02);
  Tensor y0 = scaled_dot_product_attention(q, k, v, false, 0.0);
  EXPECT_NEAR(mean(y0).item<double>(), 1.0, 1e-12);
  Tensor y2 = scaled_dot_product_attention(q, k, v, false, 0.3, std::nullopt, &g);
  EXPECT_FALSE(bitwise_equal(y1, y2)) << "a second call must draw a fresh mask";
  // f32 path: same mean property, and the dropped output differs from the undropped one.
  Tensor y3 =
      scaled_dot_product_attention(q.to(DType::F32), k.to(DType::F32), v.to(DType::F32), false, 0.3, std::nullopt, &g);
  EXPECT_NEAR(mean(y3).item<double>(), 1.0, 0.02);
}

// --- options, layouts, tiling -------------------------------------------------------------

TEST(Attention, DefaultScaleAndTilingInvariance) {
  Tensor q = randn64({2, 3, 33, 8}, 40), k = randn64({2, 3, 45, 8}, 41), v = randn64({2, 3, 45, 8}, 42);
  Tensor gout = randn64({2, 3, 33, 8}, 43);
  for (bool causal : {false, true}) {
    Tensor a = scaled_dot_product_attention(q, k, v, causal);
    Tensor b = scaled_dot_product_attention(q, k, v, causal, 0.0, 1.0 / std::sqrt(8.0));
    EXPECT_TRUE(bitwise_equal(a, b));
    Reference r = reference(q, k, v, gout, causal, 0.0, 1.0 / std::sqrt(8.0), 0, 0);
    expect_near_vec(a.to_vector(), r.out, 1e-12, "default tiles");
    SmallBlocks blocks(7, 5);
    expect_near_vec(scaled_dot_product_attention(q, k, v, causal).to_vector(), r.out, 1e-12, "7x5 tiles");
  }
}

namespace {

// The fused kernel's oracle composed of simple ops, materialising the [Tq, Tk] scores:
// softmax(Q K^T * scale, keys j > query i masked when causal) V. Forward and backward, f64,
// with tiles smaller than the sequences.
// K and V with fewer heads than Q are repeated over each group of query heads (index_select,
// whose backward sums the group's gradients).
Tensor repeat_kv(const Tensor& t, int64_t heads) {
  const int64_t group = heads / t.size(1);
  std::vector<double> idx;
  for (int64_t h = 0; h < heads; ++h) idx.push_back(static_cast<double>(h / group));
  return index_select(t, 1, from_vector(idx, {heads}, DType::I64));
}

Tensor composed_attention(const Tensor& q, const Tensor& k_in, const Tensor& v_in, bool causal, double scale) {
  const Tensor k = repeat_kv(k_in, q.size(1)), v = repeat_kv(v_in, q.size(1));
  Tensor scores = mul(matmul(q, k.transpose(-2, -1)), scale);
  if (causal) {
    const int64_t Tq = q.size(-2), Tk = k.size(-2);
    Tensor above = gt(arange(0, Tk, 1, DType::I64).reshape({1, Tk}), arange(0, Tq, 1, DType::I64).reshape({Tq, 1}));
    scores = masked_fill(scores, above, -INFINITY);
  }
  return matmul(softmax(scores, -1), v);
}

}  // namespace

// Also grouped-query (6 query heads on 2 KV heads) and multi-query heads: the reference repeats
// K and V over each group.
TEST(Attention, MatchesComposedMatmulSoftmax) {
  SmallBlocks blocks(3, 4);
  for (bool causal : {false, true}) {
    for (auto [tq, tk, H, Hkv] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{7, 9, 2, 2},
                                  {9, 5, 2, 2},
                                  {8, 8, 2, 2},
                                  {7, 9, 6, 2},
                                  {9, 5, 3, 1}}) {
      SCOPED_TRACE(std::to_string(tq) + "x" + std::to_string(tk) + " H=" + std::to_string(H) +
                   " Hkv=" + std::to_string(Hkv) + (causal ? " causal" : ""));
      Tensor q = randn64({2, H, tq, 5}, 70, 1.5).requires_grad_(),
             k = randn64({2, Hkv, tk, 5}, 71, 1.5).requires_grad_(), v = randn64({2, Hkv, tk, 5}, 72).requires_grad_();
      EXPECT_MATCHES_REFERENCE(
          [causal](const std::vector<Tensor>& x) {
            return scaled_dot_product_attention(x[0], x[1], x[2], causal, 0.0, 0.6);
          },
          [causal](const std::vector<Tensor>& x) { return composed_attention(x[0], x[1], x[2], causal, 0.6); },
          {q, k, v});
    }
  }
}

TEST(Attention, F32MatchesF64AcrossTiles) {
  // The f32 path uses a polynomial exp; check it against f64 on a long, multi-tile sequence.
  Tensor q = randn64({1, 2, 200, 64}, 50, 1.5), k = randn64({1, 2, 200, 64}, 51, 1.5), v = randn64({1, 2, 200, 64}, 52);
  for (bool causal : {false, true}) {
    Tensor y64 = scaled_dot_product_attention(q, k, v, causal);
    Tensor y32 = scaled_dot_product_attention(q.to(DType::F32), k.to(DType::F32), v.to(DType::F32), causal);
    expect_near_vec(y32.to_vector(), y64.to_vector(), 2e-5, "f32 vs f64");
  }
}

TEST(Attention, WideHeadsAndEmptySequences) {
  // D = 128 takes the narrower key block.
  Tensor q = randn64({1, 1, 20, 128}, 60), k = randn64({1, 1, 70, 128}, 61), v = randn64({1, 1, 70, 128}, 62);
  Tensor gout = randn64({1, 1, 20, 128}, 63);
  Reference r = reference(q, k, v, gout, false, 0.0, 1.0 / std::sqrt(128.0), 0, 0);
  expect_near_vec(scaled_dot_product_attention(q, k, v).to_vector(), r.out, 1e-12, "D=128");
  // No queries: an empty output of the right shape.
  Tensor e = scaled_dot_product_attention(zeros({2, 2, 0, 4}), zeros({2, 2, 3, 4}), zeros({2, 2, 3, 4}));
  EXPECT_EQ(e.shape(), Shape({2, 2, 0, 4}));
}

// --- memory -------------------------------------------------------------------------------

// The kernels take the outputs, the logsumexp (forward) or Di and up to 7 dQ partials of
// key-block groups (backward), and O(T * D) per task thread (transposed key blocks, the backward's
// dK and dV sums): at a fixed thread count, doubling T at most doubles the extra memory, where a
// materialised score matrix would quadruple it. One thread: with two, the peak depends on whether
// the threads' buffers happen to be alive at the same moment (a short call may end on one thread
// before the other starts).
TEST(Attention, MemoryDoesNotScaleWithTSquared) {
  Threads threads(1);
  const int64_t D = 64;
  Allocator& alloc = allocator_for(Device::cpu());
  auto extra = [&](int64_t T, bool backward) {
    Generator g(1);
    Tensor q = randn({1, 1, T, D}, {}, &g), k = randn({1, 1, T, D}, {}, &g), v = randn({1, 1, T, D}, {}, &g);
    if (!backward) {
      autograd::NoGradGuard ng;
      const int64_t before = alloc.stats().allocated_bytes;
      alloc.reset_peak();
      Tensor y = scaled_dot_product_attention(q, k, v, true);
      return alloc.stats().peak_allocated_bytes - before;
    }
    Tensor qr = q.detach().requires_grad_(), kr = k.detach().requires_grad_(), vr = v.detach().requires_grad_();
    Tensor y = scaled_dot_product_attention(qr, kr, vr, true);
    Tensor gout = ones_like(y);
    const int64_t before = alloc.stats().allocated_bytes;
    alloc.reset_peak();
    std::vector<Tensor> grads = autograd::grad({y}, {qr, kr, vr}, {gout});
    return alloc.stats().peak_allocated_bytes - before;
  };
  for (const bool backward : {false, true}) {
    const int64_t at_1k = extra(1024, backward), at_2k = extra(2048, backward);
    const int64_t scores_2k = 2048 * 2048 * 4;  // what a materialised f32 score matrix would take at T = 2048
    EXPECT_GT(at_1k, 1024 * D * 4) << (backward ? "backward" : "forward");  // at least the output
    EXPECT_LE(at_2k, 2 * at_1k + 4096) << (backward ? "backward" : "forward");
    // Measured: 1.1 MiB forward (a fifteenth of the score matrix), 7.1 MiB backward.
    EXPECT_LT(at_2k, backward ? scores_2k / 2 : scores_2k / 8) << (backward ? "backward" : "forward");
  }
}

// --- validation ---------------------------------------------------------------------------

using test::error_of;

TEST(Attention, ValidatesArguments) {
  Tensor q = zeros({2, 4, 5, 64}), k = zeros({2, 4, 6, 64}), v = zeros({2, 4, 6, 64});
  auto sdpa = [](const Tensor& a, const Tensor& b, const Tensor& c) { scaled_dot_product_attention(a, b, c); };
  EXPECT_EQ(error_of([&] {
              sdpa(q, zeros({2, 4, 6, 32}), v);
            }),
            "scaled_dot_product_attention: q has head dim 64, k has 32");
  EXPECT_EQ(error_of([&] {
              sdpa(q, k, zeros({2, 4, 6, 16}));
            }),
            "scaled_dot_product_attention: q has head dim 64, v has 16");
  EXPECT_EQ(error_of([&] {
              sdpa(q, zeros({3, 4, 6, 64}), v);
            }),
            "scaled_dot_product_attention: q has batch size 2, k has 3");
  EXPECT_EQ(error_of([&] {
              sdpa(q, k, zeros({2, 2, 6, 64}));
            }),
            "scaled_dot_product_attention: k has 4 heads, v has 2 (expected the same number of key/value heads)");
  EXPECT_EQ(error_of([&] {
              sdpa(q, zeros({2, 3, 6, 64}), zeros({2, 3, 6, 64}));
            }),
            "scaled_dot_product_attention: q has 4 heads, not a multiple of k and v's 3 (grouped-query attention: "
            "each key/value head serves H / Hkv query heads)");
  EXPECT_EQ(error_of([&] {
              sdpa(q, k, zeros({2, 4, 7, 64}));
            }),
            "scaled_dot_product_attention: k has 6 keys, v has 7 values (expected the same sequence length)");
  EXPECT_EQ(error_of([&] {
              sdpa(zeros({4, 5, 64}), k, v);
            }),
            "scaled_dot_product_attention: q must have 4 dimensions [B, H, T, D], found 3 (shape [4, 5, 64])");
  EXPECT_EQ(error_of([&] { sdpa(q, k.to(DType::BF16), v); }),
            "scaled_dot_product_attention: q, k and v must have one dtype, found q f32, k bf16, v f32");
  EXPECT_EQ(error_of([&] { sdpa(q.to(DType::I64), k, v); }),
            "scaled_dot_product_attention: q must be a floating-point tensor, found i64");
  EXPECT_EQ(error_of([&] { scaled_dot_product_attention(q, k, v, false, 1.0); }),
            "scaled_dot_product_attention: dropout_p must be in [0, 1), found 1");
  EXPECT_EQ(error_of([&] { scaled_dot_product_attention(q, k, v, false, -0.1); }),
            "scaled_dot_product_attention: dropout_p must be in [0, 1), found -0.1");
  EXPECT_EQ(error_of([&] { scaled_dot_product_attention(q, k, v, false, 0.0, INFINITY); }),
            "scaled_dot_product_attention: scale must be finite, found inf");
}

// --- grouped-query attention -------------------------------------------------------------------

TEST(AttentionGqa, GradcheckMultiTile) {
  SmallBlocks blocks(3, 4);
  for (bool causal : {false, true})
    for (auto [H, Hkv] : {std::pair<int64_t, int64_t>{4, 2}, {3, 1}}) {
      SCOPED_TRACE(std::to_string(H) + "/" + std::to_string(Hkv) + (causal ? " causal" : ""));
      Tensor q = randn64({2, H, 7, 4}, 80, 1.5).requires_grad_(), k = randn64({2, Hkv, 9, 4}, 81, 1.5).requires_grad_(),
             v = randn64({2, Hkv, 9, 4}, 82).requires_grad_();
      EXPECT_GRADCHECK(
          [causal](const std::vector<Tensor>& x) {
            return scaled_dot_product_attention(x[0], x[1], x[2], causal, 0.0, 0.7);
          },
          {q, k, v});
    }
}

TEST(AttentionGqa, GradcheckWithDropout) {
  SmallBlocks blocks(3, 4);
  Tensor q = randn64({1, 4, 6, 4}, 83).requires_grad_(), k = randn64({1, 2, 7, 4}, 84).requires_grad_(),
         v = randn64({1, 2, 7, 4}, 85).requires_grad_();
  EXPECT_GRADCHECK(
      [](const std::vector<Tensor>& x) {
        Generator g(99);
        return scaled_dot_product_attention(x[0], x[1], x[2], true, 0.4, std::nullopt, &g);
      },
      {q, k, v});
}

// With dropout, against the dense reference whose mask is rebuilt from the Philox rule (element
// index of the query head), tiles smaller than the sequences and Tq != Tk.
TEST(AttentionGqa, MatchesExplicitDropoutMask) {
  SmallBlocks blocks(3, 4);
  for (bool causal : {false, true})
    for (auto [tq, tk] : {std::pair<int64_t, int64_t>{7, 9}, {9, 5}}) {
      SCOPED_TRACE(std::to_string(tq) + "x" + std::to_string(tk) + (causal ? " causal" : ""));
      Tensor q = randn64({2, 6, tq, 5}, 86, 1.5).requires_grad_(), k = randn64({2, 2, tk, 5}, 87, 1.5).requires_grad_(),
             v = randn64({2, 2, tk, 5}, 88).requires_grad_();
      Generator g(31);
      const uint64_t base = g.state().offset;
      Tensor y = scaled_dot_product_attention(q, k, v, causal, 0.3, 0.6, &g);
      Tensor gout = randn64(y.shape(), 89);
      std::vector<Tensor> grads = autograd::grad({y}, {q, k, v}, {gout});
      Reference r = reference(q, k, v, gout, causal, 0.3, 0.6, 31, base);
      expect_near_vec(y.to_vector(), r.out, 1e-12, "out");
      expect_near_vec(grads[0].to_vector(), r.dq, 1e-12, "dq");
      expect_near_vec(grads[1].to_vector(), r.dk, 1e-12, "dk");
      expect_near_vec(grads[2].to_vector(), r.dv, 1e-12, "dv");
    }
}

// --- document mask (DocumentMask: causal within the documents packed into a window) ----------

namespace {

// [B, T] i32 document ids from each row's document lengths (ids 0, 1, ... in order).
Tensor doc_ids_of(const std::vector<std::vector<int64_t>>& lengths) {
  std::vector<double> ids;
  int64_t T = -1;
  for (const auto& row : lengths) {
    int64_t n = 0;
    for (size_t d = 0; d < row.size(); ++d)
      for (int64_t t = 0; t < row[d]; ++t, ++n) ids.push_back(static_cast<double>(d));
    EXPECT_TRUE(T < 0 || n == T) << "rows of different lengths";
    T = n;
  }
  return from_vector(ids, {static_cast<int64_t>(lengths.size()), T}, DType::I32);
}

// The oracle composed of simple ops: scores masked where j > i or the documents differ, the
// [B, H, T, T] mask the fused kernel never forms.
Tensor composed_doc_attention(const Tensor& q, const Tensor& k_in, const Tensor& v_in, const Tensor& docs,
                              double scale) {
  const Tensor k = repeat_kv(k_in, q.size(1)), v = repeat_kv(v_in, q.size(1));
  const int64_t B = docs.size(0), T = docs.size(1);
  Tensor scores = mul(matmul(q, k.transpose(-2, -1)), scale);
  Tensor above = gt(arange(0, T, 1, DType::I64).reshape({1, T}), arange(0, T, 1, DType::I64).reshape({T, 1}));
  scores = masked_fill(scores, above, -INFINITY);
  scores = masked_fill(scores, ne(docs.reshape({B, 1, T, 1}), docs.reshape({B, 1, 1, T})), -INFINITY);
  return matmul(softmax(scores, -1), v);
}

std::vector<Tensor> forward_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& gout,
                                     const std::function<Tensor(const Tensor&, const Tensor&, const Tensor&)>& f) {
  Tensor ql = q.detach().requires_grad_(), kl = k.detach().requires_grad_(), vl = v.detach().requires_grad_();
  Tensor y = f(ql, kl, vl);
  std::vector<Tensor> r = autograd::grad({y}, {ql, kl, vl}, {gout});
  r.insert(r.begin(), y);
  return r;
}

}  // namespace

// PyTorch 1.13 with an explicit boolean mask (causal & same document): values and gradients, f32,
// f64, bf16 and f16, multi-head, grouped-query and multi-query heads, as GPT's fused qkv views
// and as Llama's [B, T, H, D] projections; documents of different lengths per row, boundaries
// inside and at the edges of the kernel's tiles, a row of a single document, one-token documents.
TEST(AttentionParity, DocumentMaskCases) {
  const std::vector<std::string> configs = {"doc", "doc_gqa", "doc_bthd", "doc_qkv"};
  for (const char* dt : {"f32", "f64", "bf16", "f16"}) {
    for (const std::string& cfg : configs) {
      if (std::string(dt) == "f16" && cfg != "doc_gqa") continue;
      const std::string name = "sdpa_" + cfg + "_" + dt;
      SCOPED_TRACE(name);
      FT_PARITY_CASE(c, name);
      const Tensor docs = c.input("doc_ids");
      ASSERT_EQ(docs.dtype(), DType::I32);
      const std::string layout = c.param<std::string>("layout");
      auto bhtd = [](const Tensor& t) { return t.permute({0, 2, 1, 3}); };
      if (layout == "qkv") {
        Tensor qkv = c.input("qkv", true);  // [B, T, 3, H, D]
        auto part = [&](int i) { return bhtd(qkv.select(2, i)); };
        Tensor y = scaled_dot_product_attention(part(0), part(1), part(2), DocumentMask{docs});
        c.expect_output(y);
        c.backward({y});
        c.expect_grad("qkv", qkv);
        continue;
      }
      Tensor q = c.input("q", true), k = c.input("k", true), v = c.input("v", true);
      Tensor y = layout == "bthd" ? scaled_dot_product_attention(bhtd(q), bhtd(k), bhtd(v), DocumentMask{docs})
                                  : scaled_dot_product_attention(q, k, v, DocumentMask{docs});
      EXPECT_EQ(y.dtype(), c.dtype());
      c.expect_output(y);
      c.backward({y});
      c.expect_grad("q", q);
      c.expect_grad("k", k);
      c.expect_grad("v", v);
    }
  }
}

// f64 finite differences with tiles of 3 queries and 4 keys: documents of 1 to 5 tokens put
// boundaries inside tiles and on their edges, so the forward starts key walks past whole tiles and
// the backward ends query walks early; multi-head, grouped-query and multi-query heads.
TEST(AttentionDocumentMask, GradcheckMultiTileWithTileSkips) {
  SmallBlocks blocks(3, 4);
  const Tensor docs = doc_ids_of({{1, 3, 4, 5}, {8, 1, 4}});  // T = 13
  for (auto [H, Hkv] : {std::pair<int64_t, int64_t>{2, 2}, {4, 2}, {3, 1}}) {
    SCOPED_TRACE(std::to_string(H) + "/" + std::to_string(Hkv));
    Tensor q = randn64({2, H, 13, 4}, 90, 1.5).requires_grad_(), k = randn64({2, Hkv, 13, 4}, 91, 1.5).requires_grad_(),
           v = randn64({2, Hkv, 13, 4}, 92).requires_grad_();
    EXPECT_GRADCHECK(
        [&](const std::vector<Tensor>& x) {
          return scaled_dot_product_attention(x[0], x[1], x[2], DocumentMask{docs}, 0.0, 0.7);
        },
        {q, k, v});
  }
}

// Against the composed masked softmax (forward and backward, f64) over block sizes that put the
// same boundaries inside tiles, on tile edges and in single-row tiles, and with the default tiles
// (one 64 x 128 tile: no skipping, every mask applied inside the tile).
TEST(AttentionDocumentMask, MatchesComposedMaskAcrossTilings) {
  const Tensor docs = doc_ids_of({{4, 4, 1, 7, 2}, {2, 10, 6}, {18}});  // T = 18
  for (auto [bq, bk] : {std::pair<int64_t, int64_t>{0, 0}, {4, 4}, {3, 5}, {1, 2}, {8, 3}}) {
    for (auto [H, Hkv] : {std::pair<int64_t, int64_t>{2, 2}, {6, 2}}) {
      SCOPED_TRACE("blocks " + std::to_string(bq) + "x" + std::to_string(bk) + " H=" + std::to_string(H) +
                   " Hkv=" + std::to_string(Hkv));
      SmallBlocks blocks(bq, bk);
      Tensor q = randn64({3, H, 18, 5}, 93, 1.5).requires_grad_(),
             k = randn64({3, Hkv, 18, 5}, 94, 1.5).requires_grad_(), v = randn64({3, Hkv, 18, 5}, 95).requires_grad_();
      EXPECT_MATCHES_REFERENCE(
          [&](const std::vector<Tensor>& x) {
            return scaled_dot_product_attention(x[0], x[1], x[2], DocumentMask{docs}, 0.0, 0.6);
          },
          [&](const std::vector<Tensor>& x) { return composed_doc_attention(x[0], x[1], x[2], docs, 0.6); }, {q, k, v});
    }
  }
}

// A window holding one document (a single id, whatever its value: the document may have begun in
// an earlier window) is plain causal attention, bit for bit: the document's start is key 0 and
// its end is T, so every kernel walks exactly the causal tiles. f32, f64 and bf16, default and
// small tiles, grouped-query heads, dropout with the same counters.
TEST(AttentionDocumentMask, OneDocumentIsCausalBitwise) {
  for (DType dt : {DType::F32, DType::F64, DType::BF16})
    for (int64_t bq : {int64_t{0}, int64_t{5}})
      for (int32_t id : {0, 7}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " blocks " + std::to_string(bq) + " id " + std::to_string(id));
        SmallBlocks blocks(bq, bq > 0 ? 3 : 0);
        Generator init(12);
        Tensor q = randn({2, 4, 70, 16}, {}, &init).to(dt), k = randn({2, 2, 70, 16}, {}, &init).to(dt),
               v = randn({2, 2, 70, 16}, {}, &init).to(dt), gout = randn({2, 4, 70, 16}, {}, &init).to(dt);
        const Tensor docs = full({2, 70}, id, DType::I32);
        for (double p : {0.0, 0.25}) {
          const auto causal = forward_backward(q, k, v, gout, [&](const Tensor& a, const Tensor& b, const Tensor& c) {
            Generator g(5);
            return scaled_dot_product_attention(a, b, c, true, p, std::nullopt, &g);
          });
          const auto masked = forward_backward(q, k, v, gout, [&](const Tensor& a, const Tensor& b, const Tensor& c) {
            Generator g(5);
            return scaled_dot_product_attention(a, b, c, DocumentMask{docs}, p, std::nullopt, &g);
          });
          for (int i = 0; i < 4; ++i) EXPECT_TRUE(bitwise_equal(causal[i], masked[i])) << "result " << i << " p " << p;
        }
      }
}

// The skipped tiles are really skipped: NaN keys and values in the first document poison every
// tile that reads them (0 * NaN), so the later document's outputs and gradients are finite only
// if no tile of it reads the first document's keys, forward and backward. They then equal
// attention over the later document alone (its rows start on a tile edge here, so the tiles are
// the same ones).
TEST(AttentionDocumentMask, TilesOfEarlierDocumentsAreSkipped) {
  SmallBlocks blocks(4, 4);
  const int64_t T = 20, first = 8;  // document 0: rows [0, 8); document 1: rows [8, 20)
  for (auto [H, Hkv] : {std::pair<int64_t, int64_t>{2, 2}, {4, 1}}) {
    SCOPED_TRACE(std::to_string(H) + "/" + std::to_string(Hkv));
    Tensor q = randn64({1, H, T, 8}, 96), gout = randn64({1, H, T, 8}, 99);
    Tensor k = randn64({1, Hkv, T, 8}, 97), v = randn64({1, Hkv, T, 8}, 98);
    const Tensor nan_rows = lt(arange(0, T, 1, DType::I64).reshape({1, 1, T, 1}), int64_t{first});
    k = masked_fill(k, nan_rows, NAN);
    v = masked_fill(v, nan_rows, NAN);
    const Tensor docs = doc_ids_of({{first, T - first}});
    const auto got = forward_backward(q, k, v, gout, [&](const Tensor& a, const Tensor& b, const Tensor& c) {
      return scaled_dot_product_attention(a, b, c, DocumentMask{docs});
    });
    auto later = [&](const Tensor& t) { return t.narrow(2, first, T - first).contiguous(); };
    const auto alone = forward_backward(
        later(q), later(k), later(v), later(gout),
        [](const Tensor& a, const Tensor& b, const Tensor& c) { return scaled_dot_product_attention(a, b, c, true); });
    const char* names[] = {"out", "dq", "dk", "dv"};
    for (int i = 0; i < 4; ++i) {
      const std::vector<double> g = later(got[i]).to_vector();
      for (double x : g) ASSERT_TRUE(std::isfinite(x)) << names[i] << ": a skipped tile was read";
      expect_near_vec(g, alone[i].to_vector(), 1e-12, names[i]);
    }
  }
}

// Dropout under the mask against the dense reference rebuilt from the Philox rule (the element
// index is the full window's, masked or not), and bitwise independence of the thread count.
TEST(AttentionDocumentMask, DropoutAndThreads) {
  SmallBlocks blocks(3, 4);
  const Tensor docs = doc_ids_of({{2, 5, 3}, {6, 4}});
  const std::vector<double> ids = docs.to_vector();
  Tensor q = randn64({2, 4, 10, 5}, 100, 1.5).requires_grad_(), k = randn64({2, 2, 10, 5}, 101, 1.5).requires_grad_(),
         v = randn64({2, 2, 10, 5}, 102).requires_grad_();
  Generator g(41);
  const uint64_t base = g.state().offset;
  Tensor y = scaled_dot_product_attention(q, k, v, DocumentMask{docs}, 0.3, 0.6, &g);
  Tensor gout = randn64(y.shape(), 103);
  std::vector<Tensor> grads = autograd::grad({y}, {q, k, v}, {gout});
  Reference r = reference(q, k, v, gout, true, 0.3, 0.6, 41, base, &ids);
  expect_near_vec(y.to_vector(), r.out, 1e-12, "out");
  expect_near_vec(grads[0].to_vector(), r.dq, 1e-12, "dq");
  expect_near_vec(grads[1].to_vector(), r.dk, 1e-12, "dk");
  expect_near_vec(grads[2].to_vector(), r.dv, 1e-12, "dv");

  // f32 and bf16 at a size the pool splits (several tasks per thread), 1 and 2 threads.
  for (DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    Generator init(8);
    Tensor q2 = randn({2, 8, 150, 32}, {}, &init).to(dt), k2 = randn({2, 2, 150, 32}, {}, &init).to(dt),
           v2 = randn({2, 2, 150, 32}, {}, &init).to(dt), g2 = randn({2, 8, 150, 32}, {}, &init).to(dt);
    const Tensor docs2 = doc_ids_of({{30, 64, 56}, {1, 99, 50}});
    std::vector<Tensor> res[2];
    for (int n : {1, 2}) {
      Threads t(n);
      res[n - 1] = forward_backward(q2, k2, v2, g2, [&](const Tensor& a, const Tensor& b, const Tensor& c) {
        Generator gd(77);
        return scaled_dot_product_attention(a, b, c, DocumentMask{docs2}, 0.1, std::nullopt, &gd);
      });
    }
    for (int i = 0; i < 4; ++i) EXPECT_TRUE(bitwise_equal(res[0][i], res[1][i])) << "result " << i;
  }
}

TEST(AttentionDocumentMask, IdsOfEitherIntegerTypeAndBadIdsRefused) {
  Tensor q = randn64({2, 2, 6, 4}, 104), k = randn64({2, 2, 6, 4}, 105), v = randn64({2, 2, 6, 4}, 106);
  const Tensor docs = doc_ids_of({{2, 4}, {3, 3}});
  EXPECT_TRUE(bitwise_equal(scaled_dot_product_attention(q, k, v, DocumentMask{docs}),
                            scaled_dot_product_attention(q, k, v, DocumentMask{docs.to(DType::I64)})));
  auto masked = [&](const Tensor& qq, const Tensor& kk, const Tensor& ids) {
    scaled_dot_product_attention(qq, kk, kk, DocumentMask{ids});
  };
  EXPECT_EQ(error_of([&] { masked(q, k, docs.to(DType::F32)); }),
            "scaled_dot_product_attention: doc_ids must be an i32 or i64 tensor, found f32");
  EXPECT_EQ(error_of([&] {
              masked(q, k, zeros({2, 7}, DType::I32));
            }),
            "scaled_dot_product_attention: doc_ids must be [B, T] = [2, 6], found shape [2, 7]");
  EXPECT_EQ(error_of([&] { masked(q, k, zeros({12}, DType::I32)); }),
            "scaled_dot_product_attention: doc_ids must be [B, T] = [2, 6], found shape [12]");
  EXPECT_EQ(error_of([&] {
              masked(q, randn64({2, 2, 7, 4}, 107), zeros({2, 6}, DType::I32));
            }),
            "scaled_dot_product_attention: a document mask needs self-attention (as many keys as queries), found 6 "
            "queries and 7 keys");
  EXPECT_EQ(error_of([&] { masked(q, k, Tensor()); }),
            "scaled_dot_product_attention: the document mask's doc_ids must be a defined tensor");
  // Documents are runs of equal ids: an id below its predecessor is refused, naming both.
  const Tensor back = from_vector({0, 0, 1, 1, 2, 2, 0, 1, 2, 1, 1, 3}, {2, 6}, DType::I32);
  EXPECT_EQ(error_of([&] { masked(q, k, back); }),
            "scaled_dot_product_attention: doc_ids must not decrease along T (each document a run of equal ids), "
            "found doc_ids[1, 3] 1 below doc_ids[1, 2]");
}

// --- the f32 kernels' two paths ----------------------------------------------------------------

// f32 attention multiplies its tiles on attention_tiles.h's AVX-512 kernels where the CPU has
// AVX-512 and on dnnl_sgemm otherwise (FASTTRAIN_CPU_ISA lowered to avx2 here). Both, forward
// and backward, stay within f32 rounding of the f64 computation on the same inputs: head sizes
// of one, partial and several 16-lane vectors (5, 16, 24, 32, 64, 80), sequence lengths that
// leave partial tiles and register blocks, default and small tiles (odd sizes put every
// remainder of the 6/8/12/16-row register blocks in play), query heads per KV head 1, 3 and 4,
// the document mask and dropout. And each path gives the same bits on one and two threads.
TEST(AttentionF32Paths, Avx512AndGenericTilesMatchF64) {
  const Tensor docs = doc_ids_of({{30, 17, 50, 3}, {100}});  // B = 2, T = 100
  struct Case {
    int64_t H, Hkv, Tq, Tk, D, bq, bk;
    bool causal, doc;
    double p;
  };
  const std::vector<Case> cases = {
      {2, 2, 100, 100, 64, 0, 0, true, false, 0.0},   {3, 1, 100, 100, 64, 0, 0, true, true, 0.0},
      {8, 2, 100, 100, 32, 0, 0, true, false, 0.2},   {4, 1, 37, 83, 80, 0, 0, false, false, 0.0},
      {6, 2, 100, 100, 24, 13, 29, true, true, 0.1},  {3, 3, 61, 45, 5, 7, 11, false, false, 0.0},
      {4, 4, 100, 100, 16, 17, 20, true, false, 0.0}, {9, 3, 100, 100, 64, 64, 64, true, false, 0.0},
  };
  // A level above the detected one is refused, so the dnnl_sgemm run asks for at most what the CPU has.
  const std::vector<cpu::CpuIsa> levels = {std::min(cpu::CpuIsa::Avx2, cpu::detected_cpu_isa()),
                                           cpu::detected_cpu_isa()};
  for (const Case& c : cases) {
    SCOPED_TRACE("H=" + std::to_string(c.H) + " Hkv=" + std::to_string(c.Hkv) + " " + std::to_string(c.Tq) + "x" +
                 std::to_string(c.Tk) + " D=" + std::to_string(c.D) + " blocks " + std::to_string(c.bq) + "x" +
                 std::to_string(c.bk) + (c.causal ? " causal" : "") + (c.doc ? " docs" : "") +
                 " p=" + std::to_string(c.p));
    SmallBlocks blocks(c.bq, c.bk);
    Generator init(31);
    Tensor q = randn({2, c.H, c.Tq, c.D}, {}, &init), k = randn({2, c.Hkv, c.Tk, c.D}, {}, &init),
           v = randn({2, c.Hkv, c.Tk, c.D}, {}, &init), gout = randn({2, c.H, c.Tq, c.D}, {}, &init);
    auto attend = [&](const Tensor& a, const Tensor& b, const Tensor& d) {
      Generator g(8);
      if (c.doc) return scaled_dot_product_attention(a, b, d, DocumentMask{docs}, c.p, std::nullopt, &g);
      return scaled_dot_product_attention(a, b, d, c.causal, c.p, std::nullopt, &g);
    };
    const std::vector<Tensor> want =
        forward_backward(q.to(DType::F64), k.to(DType::F64), v.to(DType::F64), gout.to(DType::F64), attend);
    for (cpu::CpuIsa isa : levels) {
      SCOPED_TRACE(cpu::cpu_isa_name(isa));
      switches::Scoped level(switches::cpu_isa, isa);
      std::vector<Tensor> got[2];
      for (int n : {1, 2}) {
        Threads t(n);
        got[n - 1] = forward_backward(q, k, v, gout, attend);
      }
      for (int i = 0; i < 4; ++i) {
        SCOPED_TRACE(i == 0 ? "out" : i == 1 ? "dq" : i == 2 ? "dk" : "dv");
        EXPECT_TRUE(bitwise_equal(got[0][i], got[1][i])) << "one and two threads differ";
        const std::vector<double> a = got[0][i].to_vector(), b = want[i].to_vector();
        double err = 0, norm = 0;
        for (size_t j = 0; j < a.size(); ++j) {
          err = std::max(err, std::fabs(a[j] - b[j]));
          norm = std::max(norm, std::fabs(b[j]));
        }
        EXPECT_LE(err, 2e-5 * std::max(norm, 1.0));
      }
    }
  }
}

// The AVX-512 tile product alone against a plain loop, on buffers of exactly the size each
// operand needs (so a read or write past an operand shows under the sanitizer builds): every
// remainder of the register blocks (M, N, K from 1 to 80), A read directly and transposed,
// padded leading dimensions, overwriting and accumulating.
TEST(AttentionTiles, ProductMatchesPlainLoops) {
  if (cpu::detected_cpu_isa() < cpu::CpuIsa::Avx512) GTEST_SKIP() << "the tile kernels need AVX-512";
  std::mt19937 gen(3);
  std::uniform_int_distribution<int> dim(1, 80);
  std::normal_distribution<float> normal;
  for (int it = 0; it < 400; ++it) {
    const int64_t M = dim(gen), N = dim(gen), K = dim(gen);
    const bool ta = it % 2, accumulate = (it / 2) % 2;
    const int64_t lda = (ta ? M : K) + it % 3, ldb = N + it % 4, ldc = N + it % 2;
    const size_t na = static_cast<size_t>(ta ? (K - 1) * lda + M : (M - 1) * lda + K);
    const size_t nb = static_cast<size_t>((K - 1) * ldb + N), nc = static_cast<size_t>((M - 1) * ldc + N);
    std::unique_ptr<float[]> a(new float[na]), b(new float[nb]), c(new float[nc]);
    for (size_t i = 0; i < na; ++i) a[i] = normal(gen);
    for (size_t i = 0; i < nb; ++i) b[i] = normal(gen);
    for (size_t i = 0; i < nc; ++i) c[i] = normal(gen);
    std::vector<double> want(static_cast<size_t>(M * N));
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double sum = 0;
        for (int64_t k = 0; k < K; ++k) sum += double{ta ? a[k * lda + m] : a[m * lda + k]} * b[k * ldb + n];
        want[m * N + n] = 0.7 * sum + (accumulate ? c[m * ldc + n] : 0.0);
      }
    cpu::attention_tiles::product(M, N, K, 0.7f, a.get(), ta ? 1 : lda, ta ? lda : 1, b.get(), ldb, accumulate, c.get(),
                                  ldc);
    double worst = 0;
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) worst = std::max(worst, std::fabs(c[m * ldc + n] - want[m * N + n]));
    ASSERT_LE(worst, 1e-5 * (1 + std::sqrt(static_cast<double>(K)))) << M << "x" << N << "x" << K << " ta " << ta;
  }
}

// The vdpbf16ps tile product alone against a plain loop over the same bf16 values, on buffers of
// exactly the size each operand needs: every remainder of the register blocks, odd depths (the
// last pair half empty, A's rows ending at their last value), padded leading dimensions,
// overwriting and accumulating. The products of bf16 values are exact in f32, so only the f32
// sums' rounding separates the two.
TEST(AttentionTiles, Bf16ProductMatchesPlainLoops) {
  if (cpu::detected_cpu_isa() < cpu::CpuIsa::Avx512Bf16) GTEST_SKIP() << "the bf16 tile kernel needs AVX512-BF16";
  std::mt19937 gen(5);
  std::uniform_int_distribution<int> dim(1, 80);
  std::normal_distribution<float> normal;
  for (int it = 0; it < 400; ++it) {
    const int64_t M = dim(gen), N = dim(gen), K = dim(gen), pairs = (K + 1) / 2;
    const bool accumulate = it % 2;
    const int64_t lda = K + it % 3, ldb = N + it % 4, ldc = N + (it / 2) % 2;
    const size_t na = static_cast<size_t>((M - 1) * lda + K), nb = static_cast<size_t>((pairs - 1) * ldb + N),
                 nc = static_cast<size_t>((M - 1) * ldc + N);
    std::unique_ptr<uint16_t[]> a(new uint16_t[na]);
    std::unique_ptr<uint32_t[]> b(new uint32_t[nb]);
    std::unique_ptr<float[]> c(new float[nc]);
    std::vector<float> bvals(static_cast<size_t>(K * N));  // B[k][n], as the kernel sees it
    for (size_t i = 0; i < na; ++i) a[i] = bf16::from_float(normal(gen));
    for (float& x : bvals) x = bf16(normal(gen));
    for (int64_t p = 0; p < pairs; ++p)
      for (int64_t n = 0; n < N; ++n) {
        const uint32_t lo = bf16(bvals[2 * p * N + n]).bits;
        const uint32_t hi = 2 * p + 1 < K ? bf16(bvals[(2 * p + 1) * N + n]).bits : 0u;
        b[p * ldb + n] = lo | hi << 16;
      }
    for (size_t i = 0; i < nc; ++i) c[i] = normal(gen);
    std::vector<double> want(static_cast<size_t>(M * N));
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double sum = 0;
        for (int64_t k = 0; k < K; ++k) sum += double{bf16::to_float(a[m * lda + k])} * bvals[k * N + n];
        want[m * N + n] = 0.7 * sum + (accumulate ? c[m * ldc + n] : 0.0);
      }
    cpu::attention_tiles::product_bf16(M, N, K, 0.7f, a.get(), lda, b.get(), ldb, accumulate, c.get(), ldc);
    double worst = 0;
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) worst = std::max(worst, std::fabs(c[m * ldc + n] - want[m * N + n]));
    ASSERT_LE(worst, 1e-5 * (1 + std::sqrt(static_cast<double>(K)))) << M << "x" << N << "x" << K;
  }
}
