#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <vector>

#include "backend/cpu/block_transpose.h"
#include "backend/cpu/conv.h"
#include "backend/cpu/conv_weight_grad.h"
#include "backend/cpu/conv_winograd.h"
#include "backend/cpu/isa.h"
#include "backend/cpu/linalg.h"  // onednn_isa_has_avx512
#include "core/switches.h"
#include "fasttrain/fasttrain.h"
#include "support/cuda_compare.h"  // relative_error: by norms, as the CUDA tests compare
#include "support/expect_error.h"
#include "support/gradcheck.h"
#include "support/parity.h"

using namespace ft;
using test::ParityCase;

namespace {

Pair pair_param(const ParityCase& c, const char* key) {
  auto v = c.param<std::vector<int64_t>>(key);
  return {v.at(0), v.at(1)};
}

Tensor randn_like_shape(const Shape& s, DType dt, uint64_t seed) {
  manual_seed(seed);
  return randn(s, TensorOptions(dt));
}

// A 3x3 convolution with padding 1 on square HWxHW images (outputs of the same size at stride 1),
// NCHW or channels-last activations and weights.
cpu::ConvParams conv3x3(int64_t N, int64_t C, int64_t O, int64_t HW, int64_t stride = 1, bool channels_last = false) {
  cpu::ConvParams p;
  p.N = N, p.C = C, p.H = HW, p.W = HW, p.O = O, p.kH = 3, p.kW = 3;
  p.stride = {stride, stride}, p.padding = {1, 1};
  p.OH = p.OW = (HW - 1) / stride + 1;
  p.channels_last = p.weight_channels_last = channels_last;
  return p;
}

const char* kConfigs[] = {"basic",        "basic_cl",   "stride2",   "stride2_cl",   "dilation2", "dilation2_cl",
                          "groups2",      "groups2_cl", "depthwise", "depthwise_cl", "rect",      "rect_cl",
                          "pointwise_cl", "transposed", "cnn_cl",    "cnn",          "cnn_s1_cl"};

}  // namespace

TEST(ConvParity, AllConfigs) {
  for (const char* dt : {"f32", "f64", "bf16"}) {
    for (const char* cfg : kConfigs) {
      const std::string name = std::string("conv_") + cfg + "_" + dt;
      SCOPED_TRACE(name);
      ParityCase c(name);
      if (!c.available()) GTEST_SKIP() << c.skip_reason();
      Tensor x = c.input("x", true), w = c.input("w", true);
      Tensor b = c.has("b") ? c.input("b", true) : Tensor();
      Tensor y = conv2d(x, w, b, pair_param(c, "stride"), pair_param(c, "padding"), pair_param(c, "dilation"),
                        c.param<int64_t>("groups"));
      EXPECT_EQ(y.dtype(), c.dtype());
      if (c.param<bool>("channels_last")) {
        EXPECT_TRUE(x.is_channels_last() && !x.is_contiguous());
        EXPECT_TRUE(y.is_channels_last()) << "channels-last input must give a channels-last output";
      } else {
        EXPECT_TRUE(y.is_contiguous());
      }
      c.expect_output(y);
      c.backward({y});
      c.expect_grad("x", x);
      c.expect_grad("w", w);
      if (b.defined()) c.expect_grad("b", b);
      if (c.param<bool>("channels_last")) {
        // The input gradient is produced channels-last (read through autograd::grad, as .grad
        // accumulation in the engine copies non-contiguous gradients into NCHW).
        Tensor y2 = conv2d(x, w, b, pair_param(c, "stride"), pair_param(c, "padding"), pair_param(c, "dilation"),
                           c.param<int64_t>("groups"));
        Tensor gx = autograd::grad({y2}, {x}, {full_like(y2, 1.0)})[0];
        EXPECT_TRUE(gx.is_channels_last() && !gx.is_contiguous());
      }
    }
  }
}

TEST(ConvGradcheck, Configs) {
  struct Cfg {
    Shape xs, ws;
    Pair stride, padding, dilation;
    int64_t groups;
    bool bias, channels_last, transposed;
  };
  const Cfg cfgs[] = {
      {{2, 3, 5, 6}, {4, 3, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1, true, false, false},
      {{1, 4, 7, 6}, {2, 4, 3, 2}, {2, 1}, {1, 0}, {1, 1}, 1, true, false, false},
      {{1, 2, 7, 7}, {3, 2, 3, 3}, {1, 1}, {2, 1}, {2, 2}, 1, false, false, false},
      {{2, 4, 5, 5}, {6, 2, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 2, true, true, false},
      {{1, 3, 6, 5}, {3, 1, 3, 3}, {2, 2}, {1, 1}, {1, 1}, 3, true, false, true},
      {{2, 4, 6, 5}, {4, 4, 3, 3}, {1, 2}, {1, 1}, {2, 1}, 1, true, true, false},
  };
  uint64_t seed = 1;
  for (const Cfg& k : cfgs) {
    SCOPED_TRACE(k.xs.str() + " " + k.ws.str());
    Tensor x = randn_like_shape(k.xs, DType::F64, seed++);
    if (k.channels_last) x = x.contiguous_channels_last();
    if (k.transposed)
      x = randn_like_shape({k.xs[3], k.xs[2], k.xs[1], k.xs[0]}, DType::F64, seed++).permute({3, 2, 1, 0});
    Tensor w = randn_like_shape(k.ws, DType::F64, seed++);
    Tensor b = k.bias ? randn_like_shape({k.ws[0]}, DType::F64, seed++) : Tensor();
    x.requires_grad_();
    w.requires_grad_();
    std::vector<Tensor> inputs = {x, w};
    if (b.defined()) inputs.push_back(b.requires_grad_());
    EXPECT_GRADCHECK(
        [&](const std::vector<Tensor>& in) {
          return conv2d(in[0], in[1], in.size() > 2 ? in[2] : Tensor(), k.stride, k.padding, k.dilation, k.groups);
        },
        inputs);
  }
}

// The oneDNN path (f32 and bf16) against the im2col + GEMM reference, on cnn-mini-like shapes that
// pick oneDNN's fast kernels, in both memory formats and for every pass.
TEST(ConvKernels, OneDnnMatchesReference) {
  struct Cfg {
    int64_t C, O, HW, stride, groups;
  };
  // 7x7 maps leave one position past the last whole tile of block_transpose.h's transposes.
  for (const Cfg& k : {Cfg{16, 32, 12, 1, 1}, Cfg{32, 32, 8, 2, 1}, Cfg{16, 16, 9, 1, 16}, Cfg{8, 16, 10, 1, 2},
                       Cfg{16, 32, 7, 1, 1}}) {
    // Activations NCHW or NHWC; with NHWC, weights OIHW or (ungrouped) OHWI.
    for (int layout = 0; layout < (k.groups == 1 ? 3 : 2); ++layout) {
      const bool cl = layout > 0, wcl = layout == 2;
      for (DType dt : {DType::F32, DType::BF16}) {
        SCOPED_TRACE(std::to_string(k.C) + "->" + std::to_string(k.O) + " s" + std::to_string(k.stride) + " g" +
                     std::to_string(k.groups) + (cl ? " nhwc " : " nchw ") + (wcl ? "ohwi " : "oihw ") +
                     dtype_name(dt));
        cpu::ConvParams p = conv3x3(3, k.C, k.O, k.HW, k.stride, cl);
        p.groups = k.groups, p.weight_channels_last = wcl;
        auto fmt = [&](const Tensor& t) { return cl ? t.contiguous_channels_last() : t; };
        auto wfmt = [&](const Tensor& t) { return wcl ? t.contiguous_channels_last() : t; };
        Tensor x = fmt(randn_like_shape({p.N, p.C, p.H, p.W}, DType::F32, 11).to(dt));
        Tensor w = wfmt(randn_like_shape({p.O, p.C / p.groups, 3, 3}, DType::F32, 12).to(dt));
        Tensor b = randn_like_shape({p.O}, DType::F32, 13).to(dt);
        Tensor gy = fmt(randn_like_shape({p.N, p.O, p.OH, p.OW}, DType::F32, 14).to(dt));
        auto out = [&](const Shape& s) { return fmt(empty(s, TensorOptions(dt))); };
        Tensor y1 = out({p.N, p.O, p.OH, p.OW}), y2 = out({p.N, p.O, p.OH, p.OW});
        // The plain 3x3 convolutions must get oneDNN kernels (else this test would compare the
        // reference with itself); grouped ones may fall back (to the reference: the dispatch's other
        // kernels, conv_winograd.h's, have their own test).
        const bool must = k.groups == 1 && (dt == DType::F32 || cpu::onednn_isa_has_avx512());  // bf16 needs AVX-512
        bool used = cpu::onednn_conv2d_forward(p, x, w, b, y1);
        if (must) EXPECT_TRUE(used) << "oneDNN declined the forward";
        if (!used) cpu::conv2d_forward_reference(p, x, w, b, y1);
        cpu::conv2d_forward_reference(p, x, w, b, y2);
        test::Tolerance tol = dt == DType::F32 ? test::Tolerance{1e-4, 1e-4} : test::Tolerance{3e-2, 2e-2};
        EXPECT_EQ(test::compare(y1, y2, tol), "");
        Tensor gx1 = out(x.shape()), gx2 = out(x.shape());
        used = cpu::onednn_conv2d_backward_data(p, gy, w, gx1);
        if (must) EXPECT_TRUE(used) << "oneDNN declined backward-data";
        if (!used) cpu::conv2d_backward_data_reference(p, gy, w, gx1);
        cpu::conv2d_backward_data_reference(p, gy, w, gx2);
        EXPECT_EQ(test::compare(gx1, gx2, tol), "");
        Tensor gw1 = wfmt(empty(w.shape(), TensorOptions(dt))), gw2 = wfmt(empty(w.shape(), TensorOptions(dt)));
        Tensor gb1 = empty({p.O}, TensorOptions(dt)), gb2 = empty({p.O}, TensorOptions(dt));
        used = cpu::onednn_conv2d_backward_weight(p, gy, x, gw1, gb1);
        if (must) EXPECT_TRUE(used) << "oneDNN declined backward-weights";
        if (!used) cpu::conv2d_backward_weight_reference(p, gy, x, gw1, gb1);
        cpu::conv2d_backward_weight_reference(p, gy, x, gw2, gb2);
        test::Tolerance wtol = dt == DType::F32 ? test::Tolerance{1e-3, 1e-4} : test::Tolerance{0.1, 2e-2};
        EXPECT_EQ(test::compare(gw1, gw2, wtol), "");
        EXPECT_EQ(test::compare(gb1, gb2, wtol), "");
      }
    }
  }
}

// The NCHW <-> nChw16c transposes against the blocked layout's definition, on maps with and
// without positions past the last whole tile of 16 and with several images and channel blocks.
// Every element is distinct, so any misplaced one shows.
TEST(ConvKernels, BlockTransposesMatchTheBlockedLayout) {
  if (!cpu::block_transpose_available()) GTEST_SKIP() << "CPU lacks AVX-512";
  for (auto [N, C, S] : {std::array<int64_t, 3>{1, 16, 16}, {2, 32, 49}, {3, 48, 196}, {1, 16, 5}, {2, 64, 3136}}) {
    SCOPED_TRACE(std::to_string(N) + "x" + std::to_string(C) + "x" + std::to_string(S));
    const int64_t n = N * C * S;
    std::vector<uint16_t> plain(n), blocked(n), back(n);
    for (int64_t i = 0; i < n; ++i) plain[i] = uint16_t(i * 40503);  // odd factor: distinct below 65536
    cpu::nchw_to_blocked16(plain.data(), blocked.data(), N, C, S);
    int64_t wrong = 0;
    for (int64_t b = 0; b < N; ++b)
      for (int64_t c = 0; c < C; ++c)
        for (int64_t s = 0; s < S; ++s)
          wrong += plain[(b * C + c) * S + s] != blocked[((b * (C / 16) + c / 16) * S + s) * 16 + c % 16];
    EXPECT_EQ(wrong, 0);
    cpu::blocked16_to_nchw(blocked.data(), back.data(), N, C, S);
    EXPECT_TRUE(back == plain);
  }
  test::expect_error([] { cpu::nchw_to_blocked16(nullptr, nullptr, 1, 8, 4); },
                     "expected a multiple of 16 channels, found 8");
}

// Backward-weights reuses the gy that backward-data just reordered, but only for that same tensor
// unchanged: a gy changed in place in between, or another tensor, is reordered afresh.
TEST(ConvKernels, ReorderedGradientIsReusedOnlyWhenUnchanged) {
  const cpu::ConvParams p = conv3x3(2, 16, 32, 8);
  Tensor x = randn_like_shape({p.N, p.C, p.H, p.W}, DType::F32, 21);
  Tensor w = randn_like_shape({p.O, p.C, 3, 3}, DType::F32, 22);
  Tensor gy = randn_like_shape({p.N, p.O, p.OH, p.OW}, DType::F32, 23);
  Tensor other = randn_like_shape({p.N, p.O, p.OH, p.OW}, DType::F32, 24);
  Tensor gx = empty(x.shape());
  auto weight_grad = [&](const Tensor& g) {
    Tensor gw = empty(w.shape()), ref = empty(w.shape());
    EXPECT_TRUE(cpu::onednn_conv2d_backward_weight(p, g, x, gw, Tensor()));
    cpu::conv2d_backward_weight_reference(p, g, x, ref, Tensor());
    EXPECT_EQ(test::compare(gw, ref, test::Tolerance{1e-3, 1e-4}), "");
  };
  ASSERT_TRUE(cpu::onednn_conv2d_backward_data(p, gy, w, gx));
  weight_grad(gy);  // the reordered gy, reused
  ASSERT_TRUE(cpu::onednn_conv2d_backward_data(p, gy, w, gx));
  add_(gy, other);  // changed in place after backward-data reordered it
  weight_grad(gy);
  ASSERT_TRUE(cpu::onednn_conv2d_backward_data(p, gy, w, gx));
  weight_grad(other);  // another tensor
}

// The algorithm rule: Winograd for f32 3x3 stride-1 ungrouped convolutions with 16 or more
// channels each side and at least 8x8 outputs (FT_CONV_ALGO=auto), and for bf16 ones as below;
// direct otherwise; the setting forces either.
TEST(ConvKernels, AlgorithmRule) {
  const cpu::ConvParams p = conv3x3(2, 64, 64, 8);
  using A = cpu::ConvAlgorithm;
  constexpr auto Auto = switches::ConvAlgo::Auto, Direct = switches::ConvAlgo::Direct,
                 Winograd = switches::ConvAlgo::Winograd;
  EXPECT_EQ(cpu::choose_conv_algorithm(p, DType::F32, Auto), A::Winograd);
  EXPECT_EQ(cpu::choose_conv_algorithm(p, DType::F32, Direct), A::Direct);
  cpu::ConvParams q = p;
  q.C = 3;  // an RGB input layer
  EXPECT_EQ(cpu::choose_conv_algorithm(q, DType::F32, Auto), A::Direct);
  EXPECT_EQ(cpu::choose_conv_algorithm(q, DType::F32, Winograd), A::Winograd);
  q = p, q.stride = {2, 2}, q.OH = q.OW = 4;
  EXPECT_EQ(cpu::choose_conv_algorithm(q, DType::F32, Auto), A::Direct);
  q = p, q.kH = q.kW = 1, q.padding = {0, 0};
  EXPECT_EQ(cpu::choose_conv_algorithm(q, DType::F32, Auto), A::Direct);
  q = p, q.groups = 2;
  EXPECT_EQ(cpu::choose_conv_algorithm(q, DType::F32, Auto), A::Direct);
  q = p, q.dilation = {2, 2}, q.padding = {2, 2};
  EXPECT_EQ(cpu::choose_conv_algorithm(q, DType::F32, Auto), A::Direct);
  q = p, q.H = q.W = q.OH = q.OW = 7;  // ResNet's last stage
  EXPECT_EQ(cpu::choose_conv_algorithm(q, DType::F32, Auto), A::Direct);
  q.OW = q.W = 8;
  EXPECT_EQ(cpu::choose_conv_algorithm(q, DType::F32, Auto), A::Direct);
  q.OH = q.H = 8;
  EXPECT_EQ(cpu::choose_conv_algorithm(q, DType::F32, Auto), A::Winograd);

  // bf16: conv_winograd.h's kernel for 3x3 stride-1 padding-1 layers with channels in multiples of
  // 16 and C * O up to 256 * 256, unless oneDNN has AMX.
  EXPECT_EQ(cpu::choose_conv_algorithm(p, DType::BF16, Auto), A::Winograd);
  EXPECT_EQ(cpu::choose_conv_algorithm(p, DType::BF16, Auto, /*onednn_has_amx=*/true), A::Direct);
  EXPECT_EQ(cpu::choose_conv_algorithm(p, DType::BF16, Direct), A::Direct);
  EXPECT_EQ(cpu::choose_conv_algorithm(p, DType::F16, Auto), A::Direct);
  q = p, q.H = q.W = q.OH = q.OW = 7;  // any size
  EXPECT_EQ(cpu::choose_conv_algorithm(q, DType::BF16, Auto), A::Winograd);
  q = p, q.C = 48, q.O = 16;
  EXPECT_EQ(cpu::choose_conv_algorithm(q, DType::BF16, Auto), A::Winograd);
  q = p, q.C = 24;
  EXPECT_EQ(cpu::choose_conv_algorithm(q, DType::BF16, Auto), A::Direct);
  q = p, q.O = 40;
  EXPECT_EQ(cpu::choose_conv_algorithm(q, DType::BF16, Auto), A::Direct);
  q = p, q.padding = {0, 0}, q.OH = q.OW = 6;
  EXPECT_EQ(cpu::choose_conv_algorithm(q, DType::BF16, Auto), A::Direct);
  q = p, q.stride = {2, 2}, q.OH = q.OW = 4;
  EXPECT_EQ(cpu::choose_conv_algorithm(q, DType::BF16, Auto), A::Direct);
  q = p, q.C = q.O = 256;
  EXPECT_EQ(cpu::choose_conv_algorithm(q, DType::BF16, Auto), A::Winograd);
  q.C = 512;
  EXPECT_EQ(cpu::choose_conv_algorithm(q, DType::BF16, Auto), A::Direct);
}

TEST(ConvKernels, WeightGradRule) {
  using P = cpu::WeightGradPath;
  using S = switches::ConvWeightGrad;
  const cpu::ConvParams p = conv3x3(8, 32, 32, 16);  // 9 * 32 = 288 products per gradient element
  EXPECT_EQ(cpu::choose_weight_grad_path(p, S::Auto, false), P::Paired);
  EXPECT_EQ(cpu::choose_weight_grad_path(p, S::Auto, true), P::OneDnn);  // AMX
  EXPECT_EQ(cpu::choose_weight_grad_path(p, S::Onednn, false), P::OneDnn);
  // Winograd where the convolution's algorithm is; a setting still forces the others.
  using A = cpu::ConvAlgorithm;
  EXPECT_EQ(cpu::choose_weight_grad_path(p, S::Auto, false, A::Winograd), P::Winograd);
  EXPECT_EQ(cpu::choose_weight_grad_path(p, S::Auto, false, A::Direct), P::Paired);
  EXPECT_EQ(cpu::choose_weight_grad_path(p, S::Paired, false, A::Winograd), P::Paired);
  EXPECT_EQ(cpu::choose_weight_grad_path(p, S::Onednn, false, A::Winograd), P::OneDnn);
  cpu::ConvParams q = p;
  q.kH = q.kW = 1, q.padding = {0, 0}, q.C = 64, q.O = 256;  // ResNet's 1x1 expansion: 64 products
  EXPECT_EQ(cpu::choose_weight_grad_path(q, S::Auto, false), P::OneDnn);
  EXPECT_EQ(cpu::choose_weight_grad_path(q, S::Paired, true), P::Paired);
  q.C = 256;
  EXPECT_EQ(cpu::choose_weight_grad_path(q, S::Auto, false), P::OneDnn);
  q.C = 512;
  EXPECT_EQ(cpu::choose_weight_grad_path(q, S::Auto, false), P::Paired);
  // One matrix product for channels-last 1x1 stride-1 layers over at most 4096 positions.
  cpu::ConvParams m = q;
  m.N = 8, m.H = m.W = m.OH = m.OW = 14, m.C = 1024, m.O = 256, m.channels_last = true;  // 1568 positions
  EXPECT_TRUE(cpu::weight_grad_is_one_product(m));
  EXPECT_EQ(cpu::choose_weight_grad_path(m, S::Auto, false), P::Matmul);
  m.C = 64;  // few products per gradient element: still one product
  EXPECT_EQ(cpu::choose_weight_grad_path(m, S::Auto, false), P::Matmul);
  EXPECT_EQ(cpu::choose_weight_grad_path(m, S::Auto, true), P::OneDnn);  // AMX
  EXPECT_EQ(cpu::choose_weight_grad_path(m, S::Paired, false), P::Paired);
  EXPECT_EQ(cpu::choose_weight_grad_path(q, S::Matmul, false), P::Matmul);
  m.N = 16, m.H = m.W = m.OH = m.OW = 16;  // 4096 positions
  EXPECT_EQ(cpu::choose_weight_grad_path(m, S::Auto, false), P::Matmul);
  m.N = 17;  // 4352
  EXPECT_EQ(cpu::choose_weight_grad_path(m, S::Auto, false), P::OneDnn);
  m.N = 8;
  for (auto change : std::initializer_list<std::function<void(cpu::ConvParams&)>>{
           [](cpu::ConvParams& r) { r.channels_last = false; },
           [](cpu::ConvParams& r) {
             r.stride = {2, 2};
           },
           [](cpu::ConvParams& r) {
             r.padding = {1, 1};
           },
           [](cpu::ConvParams& r) { r.kW = 3; }, [](cpu::ConvParams& r) { r.groups = 2; },
           [](cpu::ConvParams& r) {
             r.dilation = {1, 2};
           }}) {
    cpu::ConvParams r = m;
    change(r);
    EXPECT_FALSE(cpu::weight_grad_is_one_product(r));
    EXPECT_NE(cpu::choose_weight_grad_path(r, S::Auto, false), P::Matmul);
  }
}

namespace {

using WeightGradKernel = bool (*)(const cpu::ConvParams&, const Tensor& gy, const Tensor& x, const Tensor& gw,
                                  const Tensor& gb);

// A bf16 weight-gradient kernel on layer p, with and without the bias gradient, against the
// reference's f32 sums of the same bf16 inputs (drawn from `seed` on): each element within the
// final rounding to bf16 (2^-9 relative, taken as 2^-8) plus f32 summation order. The outputs
// start as 7s, so an element the kernel leaves unwritten fails.
void expect_weight_grad_matches_reference(const cpu::ConvParams& p, WeightGradKernel kernel, uint64_t& seed) {
  auto act = [&](const Shape& s) {
    Tensor t = randn_like_shape(s, DType::F32, seed++).to(DType::BF16);
    return p.channels_last ? t.contiguous_channels_last() : t;
  };
  auto weight = [&](DType dt) {
    Tensor t = full({p.O, p.C, p.kH, p.kW}, 7.0, TensorOptions(dt));
    return p.weight_channels_last ? t.contiguous_channels_last() : t;
  };
  const Tensor x = act({p.N, p.C, p.H, p.W}), gy = act({p.N, p.O, p.OH, p.OW});
  Tensor gw = weight(DType::BF16), gb = full({p.O}, 7.0, TensorOptions(DType::BF16));
  ASSERT_TRUE(kernel(p, gy, x, gw, gb));
  Tensor gw_ref = weight(DType::F32), gb_ref = empty({p.O}, TensorOptions(DType::F32));
  cpu::conv2d_backward_weight_reference(p, gy, x, gw_ref, gb_ref);
  const double scale = std::sqrt(double(p.N * p.OH * p.OW));  // of a sum of that many products
  EXPECT_EQ(test::compare(gw, gw_ref, {1e-5 * scale, 1.0 / 256}), "");
  EXPECT_EQ(test::compare(gb, gb_ref, {1e-5 * scale, 1.0 / 256}), "");
  // Without the bias gradient, the same weight gradient.
  Tensor gw2 = weight(DType::BF16);
  ASSERT_TRUE(kernel(p, gy, x, gw2, Tensor()));
  EXPECT_EQ(test::compare(gw2, gw, {0, 0}), "");
}

}  // namespace

// The paired bf16 weight gradient (conv_weight_grad.h) against the reference's f32 sums of the same
// bf16 inputs: each element within the final rounding to bf16 (2^-9 relative, taken as 2^-8) plus
// f32 summation order. The shapes cover an odd batch (the last image paired with zeros), one image,
// strides 1 and 2, paddings 0-2, 1x1 / 3x3 / 5x3 kernels, rectangular maps, channel counts that
// leave partial register tiles (16 and 48 inputs; 16, 48 and 80 outputs), both activation layouts,
// both weight layouts, the bias gradient, and a layer large enough to be summed in several chunks.
TEST(ConvKernels, PairedWeightGradMatchesReference) {
  struct Cfg {
    int64_t N, C, O, H, W, kH, kW, stride, pad;
  };
  const Cfg cfgs[] = {{3, 32, 48, 9, 9, 3, 3, 1, 1},   {1, 16, 16, 5, 7, 3, 3, 1, 1},   {5, 48, 80, 10, 9, 3, 3, 2, 1},
                      {4, 64, 32, 6, 6, 1, 1, 1, 0},   {2, 16, 32, 12, 11, 5, 3, 2, 2}, {2, 32, 16, 7, 7, 3, 3, 1, 0},
                      {4, 16, 256, 16, 64, 3, 3, 1, 1}};  // 64 KiB of pairs per row: several chunks
  if (!cpu::paired_weight_grad_supported(conv3x3(2, 16, 16, 4))) GTEST_SKIP() << "CPU lacks AVX512-BF16";
  uint64_t seed = 60;
  for (const Cfg& k : cfgs) {
    for (int layout = 0; layout < 3; ++layout) {  // NCHW + OIHW, NHWC + OIHW, NHWC + OHWI
      cpu::ConvParams p;
      p.N = k.N, p.C = k.C, p.O = k.O, p.H = k.H, p.W = k.W, p.kH = k.kH, p.kW = k.kW;
      p.stride = {k.stride, k.stride}, p.padding = {k.pad, k.pad};
      p.OH = (k.H + 2 * k.pad - k.kH) / k.stride + 1;
      p.OW = (k.W + 2 * k.pad - k.kW) / k.stride + 1;
      p.channels_last = layout > 0, p.weight_channels_last = layout == 2;
      SCOPED_TRACE(std::to_string(k.N) + "x" + std::to_string(k.C) + "x" + std::to_string(k.H) + "x" +
                   std::to_string(k.W) + " -> " + std::to_string(k.O) + " k" + std::to_string(k.kH) + "x" +
                   std::to_string(k.kW) + " s" + std::to_string(k.stride) + " p" + std::to_string(k.pad) + " layout " +
                   std::to_string(layout));
      expect_weight_grad_matches_reference(p, cpu::paired_conv2d_backward_weight, seed);
    }
  }
  // Configurations the kernel does not take are declined, having written nothing.
  cpu::ConvParams q = conv3x3(2, 8, 16, 6, 1, true);  // 8 input channels
  Tensor x = zeros({2, 8, 6, 6}, TensorOptions(DType::BF16)).contiguous_channels_last();
  Tensor gy = zeros({2, 16, 6, 6}, TensorOptions(DType::BF16)).contiguous_channels_last();
  Tensor gw = full({16, 8, 3, 3}, 7.0, TensorOptions(DType::BF16));
  EXPECT_FALSE(cpu::paired_conv2d_backward_weight(q, gy, x, gw, Tensor()));
  EXPECT_EQ(max(gw).item<float>(), 7.0f);
  q = conv3x3(2, 16, 16, 6, 1, true), q.groups = 2;
  EXPECT_FALSE(cpu::paired_conv2d_backward_weight(q, gy, x, gw, Tensor()));
  q = conv3x3(2, 16, 16, 6, 1, true);
  EXPECT_FALSE(cpu::paired_conv2d_backward_weight(q, gy.to(DType::F32), x.to(DType::F32), gw.to(DType::F32), Tensor()));
}

// The weight gradient of a channels-last 1x1 stride-1 bf16 layer as one matrix product
// (matmul_conv2d_backward_weight) against the reference's f32 sums of the same bf16 inputs, as
// above: both weight layouts, a single position, and channel counts off any register tile.
TEST(ConvKernels, MatmulWeightGradMatchesReference) {
  struct Cfg {
    int64_t N, C, O, H, W;
    bool weight_channels_last;
  };
  uint64_t seed = 80;
  for (const Cfg& k : {Cfg{3, 32, 48, 5, 7, false}, Cfg{2, 24, 40, 6, 6, true}, Cfg{1, 16, 16, 1, 1, true},
                       Cfg{8, 256, 64, 7, 7, false}}) {
    cpu::ConvParams p;
    p.N = k.N, p.C = k.C, p.O = k.O, p.H = p.OH = k.H, p.W = p.OW = k.W, p.kH = p.kW = 1;
    p.stride = {1, 1}, p.padding = {0, 0}, p.channels_last = true, p.weight_channels_last = k.weight_channels_last;
    SCOPED_TRACE(std::to_string(k.N) + "x" + std::to_string(k.C) + "x" + std::to_string(k.H) + "x" +
                 std::to_string(k.W) + " -> " + std::to_string(k.O) + (k.weight_channels_last ? " OHWI" : " OIHW"));
    expect_weight_grad_matches_reference(p, cpu::matmul_conv2d_backward_weight, seed);
  }
  // Layers that are not one product, and other dtypes, are declined, having written nothing.
  cpu::ConvParams q;
  q.N = 2, q.C = 16, q.O = 16, q.H = q.W = q.OH = q.OW = 6, q.kH = q.kW = 1, q.stride = {1, 1}, q.padding = {0, 0};
  Tensor x = zeros({2, 16, 6, 6}, TensorOptions(DType::BF16)), gy = zeros({2, 16, 6, 6}, TensorOptions(DType::BF16));
  Tensor gw = full({16, 16, 1, 1}, 7.0, TensorOptions(DType::BF16));
  EXPECT_FALSE(cpu::matmul_conv2d_backward_weight(q, gy, x, gw, Tensor()));  // NCHW
  q.channels_last = true;
  x = x.contiguous_channels_last(), gy = gy.contiguous_channels_last();
  EXPECT_FALSE(cpu::matmul_conv2d_backward_weight(q, gy.to(DType::F32), x.to(DType::F32), gw.to(DType::F32), Tensor()));
  EXPECT_EQ(max(gw).item<float>(), 7.0f);
  EXPECT_TRUE(cpu::matmul_conv2d_backward_weight(q, gy, x, gw, Tensor()));
  EXPECT_EQ(max(abs(gw)).item<float>(), 0.0f);
}

// Every pass of an f32 convolution on the algorithm this process chose (ctest runs this suite under
// each FT_CONV_ALGO), against the f64 reference by norms: Winograd's transforms round differently
// from direct sums but stay within f32's accuracy. The implementation oneDNN reports is the chosen
// algorithm's, so the comparison is not of the direct kernel with itself.
TEST(ConvKernels, F32PassesAgreeWithF64OnTheChosenAlgorithm) {
  struct Cfg {
    int64_t N, C, O, HW;
    bool channels_last;
  };
  for (const Cfg& k : {Cfg{4, 64, 64, 16, false}, Cfg{2, 32, 48, 20, true}, Cfg{2, 128, 128, 7, false}}) {
    const cpu::ConvParams p = conv3x3(k.N, k.C, k.O, k.HW, 1, k.channels_last);
    SCOPED_TRACE(std::to_string(k.C) + "->" + std::to_string(k.O) + " " + std::to_string(k.HW) +
                 (k.channels_last ? " nhwc" : " nchw"));
    // oneDNN has Winograd kernels on AVX-512 only; below it (ctest's ONEDNN_MAX_CPU_ISA=AVX2 run)
    // the chosen Winograd falls back to direct.
    const bool wino =
        cpu::conv_algorithm(p, DType::F32) == cpu::ConvAlgorithm::Winograd && cpu::onednn_isa_has_avx512();
    const std::string impl = cpu::onednn_conv2d_forward_implementation(p, DType::F32, false);
    EXPECT_EQ(impl.find("wino") != std::string::npos, wino) << impl;
    auto fmt = [&](const Tensor& t) { return k.channels_last ? t.contiguous_channels_last() : t; };
    Tensor x = fmt(randn_like_shape({p.N, p.C, p.H, p.W}, DType::F32, 31));
    Tensor w = fmt(randn_like_shape({p.O, p.C, 3, 3}, DType::F32, 32));
    Tensor gy = fmt(randn_like_shape({p.N, p.O, p.OH, p.OW}, DType::F32, 33));
    auto f64 = [&](const Tensor& t) { return fmt(t.to(DType::F64)); };
    auto rel = [](const Tensor& got, const Tensor& want) {
      return ft::testing::relative_error(got.to(DType::F64).to_vector(), want.to_vector());
    };
    Tensor y = fmt(empty({p.N, p.O, p.OH, p.OW})), y64 = f64(empty({p.N, p.O, p.OH, p.OW}));
    ASSERT_TRUE(cpu::onednn_conv2d_forward(p, x, w, Tensor(), y));
    cpu::conv2d_forward_reference(p, f64(x), f64(w), Tensor(), y64);
    Tensor gx = fmt(empty(x.shape())), gx64 = f64(empty(x.shape()));
    ASSERT_TRUE(cpu::onednn_conv2d_backward_data(p, gy, w, gx));
    cpu::conv2d_backward_data_reference(p, f64(gy), f64(w), gx64);
    Tensor gw = fmt(empty(w.shape())), gw64 = f64(empty(w.shape()));
    ASSERT_TRUE(cpu::onednn_conv2d_backward_weight(p, gy, x, gw, Tensor()));
    cpu::conv2d_backward_weight_reference(p, f64(gy), f64(x), gw64, Tensor());
    const double ey = rel(y, y64), egx = rel(gx, gx64), egw = rel(gw, gw64);
    std::printf("%s %s: relative error y %.2e gx %.2e gw %.2e\n", impl.c_str(), wino ? "winograd" : "direct", ey, egx,
                egw);
    // Measured: Winograd 4e-7 to 1e-6, direct 1e-7 to 6e-7.
    EXPECT_LT(ey, 5e-6);
    EXPECT_LT(egx, 5e-6);
    EXPECT_LT(egw, 5e-6);
  }
}

// bf16 Winograd (conv_winograd.h): F(2x2, 3x3) for forward and backward-data, F(3x3, 2x2) for the
// weight gradient, against an f64 reference on the same bf16 inputs and beside the direct bf16
// kernels: odd and even sizes (partial tiles, odd tile counts), 16 and 32-channel blocks, one
// image or several, bias, both layouts (weights OIHW, or OHWI with channels-last).
TEST(ConvKernels, WinogradBf16AgreesWithF64BesideTheDirectKernels) {
  if (cpu::selected_cpu_isa() < cpu::CpuIsa::Avx512Bf16) GTEST_SKIP() << "the Winograd bf16 kernel needs AVX512-BF16";
  cpu::ConvParams huge = conv3x3(1, 16384, 16384, 4);  // 8 GiB of transformed filters
  EXPECT_FALSE(cpu::winograd_bf16_supported(huge));
  huge.C = 4096;
  EXPECT_TRUE(cpu::winograd_bf16_supported(huge));
  struct Cfg {
    int64_t N, C, O, H, W;
    bool channels_last, bias;
  };
  for (const Cfg& k :
       {Cfg{2, 32, 32, 8, 8, true, false}, Cfg{3, 16, 48, 7, 9, true, true}, Cfg{2, 48, 16, 9, 6, false, true},
        Cfg{1, 64, 32, 5, 5, false, false}, Cfg{4, 16, 16, 8, 8, false, true}, Cfg{1, 32, 64, 1, 3, true, false}}) {
    cpu::ConvParams p = conv3x3(k.N, k.C, k.O, k.H, 1, k.channels_last);
    p.W = p.OW = k.W;
    SCOPED_TRACE(std::to_string(k.N) + "x" + std::to_string(k.C) + "->" + std::to_string(k.O) + " " +
                 std::to_string(k.H) + "x" + std::to_string(k.W) + (k.channels_last ? " nhwc" : " nchw") +
                 (k.bias ? " bias" : ""));
    ASSERT_TRUE(cpu::winograd_bf16_supported(p));
    auto fmt = [&](const Tensor& t) { return k.channels_last ? t.contiguous_channels_last() : t; };
    Tensor x = fmt(randn_like_shape({p.N, p.C, p.H, p.W}, DType::F32, 41).to(DType::BF16));
    Tensor w = fmt(randn_like_shape({p.O, p.C, 3, 3}, DType::F32, 42).to(DType::BF16));
    Tensor b = k.bias ? randn_like_shape({p.O}, DType::F32, 43).to(DType::BF16) : Tensor();
    Tensor gy = fmt(randn_like_shape({p.N, p.O, p.OH, p.OW}, DType::F32, 44).to(DType::BF16));
    auto f64 = [&](const Tensor& t) { return t.dim() == 4 ? fmt(t.to(DType::F64)) : t.to(DType::F64); };
    auto rel = [](const Tensor& got, const Tensor& want) {
      return ft::testing::relative_error(got.to(DType::F64).to_vector(), want.to_vector());
    };
    auto bf16_out = [&](const Shape& s) { return fmt(empty(s, TensorOptions(DType::BF16))); };
    Tensor y64 = f64(empty({p.N, p.O, p.OH, p.OW})), gx64 = f64(empty(x.shape()));
    cpu::conv2d_forward_reference(p, f64(x), f64(w), k.bias ? f64(b) : Tensor(), y64);
    cpu::conv2d_backward_data_reference(p, f64(gy), f64(w), gx64);
    Tensor y = bf16_out(y64.shape()), gx = bf16_out(x.shape()), y_direct = bf16_out(y64.shape()),
           gx_direct = bf16_out(x.shape());
    ASSERT_TRUE(cpu::winograd_conv2d_forward(p, x, w, b, y));
    ASSERT_TRUE(cpu::winograd_conv2d_backward_data(p, gy, w, gx));
    // oneDNN's direct kernels, or (oneDNN lowered below AVX-512: ctest's ONEDNN_MAX_CPU_ISA=AVX2 run)
    // the reference path's f32 sums, rounded.
    if (!cpu::onednn_conv2d_forward(p, x, w, b, y_direct)) cpu::conv2d_forward_reference(p, x, w, b, y_direct);
    if (!cpu::onednn_conv2d_backward_data(p, gy, w, gx_direct))
      cpu::conv2d_backward_data_reference(p, gy, w, gx_direct);
    // Weight (OIHW, or OHWI with channels-last) and bias gradients.
    Tensor gw64 = f64(empty(w.shape())), gb64 = empty({p.O}, TensorOptions(DType::F64));
    cpu::conv2d_backward_weight_reference(p, f64(gy), f64(x), gw64, gb64);
    Tensor gw = bf16_out(w.shape()), gw_direct = bf16_out(w.shape());
    Tensor gb = empty({p.O}, TensorOptions(DType::BF16)), gb_direct = empty({p.O}, TensorOptions(DType::BF16));
    ASSERT_TRUE(cpu::winograd_conv2d_backward_weight(p, gy, x, gw, gb));
    if (!cpu::paired_conv2d_backward_weight(p, gy, x, gw_direct, gb_direct))
      cpu::conv2d_backward_weight_reference(p, gy, x, gw_direct, gb_direct);
    const double ey = rel(y, y64), egx = rel(gx, gx64), egw = rel(gw, gw64), ey_direct = rel(y_direct, y64),
                 egx_direct = rel(gx_direct, gx64), egw_direct = rel(gw_direct, gw64);
    std::printf("winograd bf16: relative error y %.2e gx %.2e gw %.2e; direct y %.2e gx %.2e gw %.2e\n", ey, egx, egw,
                ey_direct, egx_direct, egw_direct);
    // The direct sums' error is the output's rounding to bf16 (about 2e-3 by norms); Winograd adds
    // the rounding of the transformed tiles and filters (or gradients).
    EXPECT_LT(ey, 3 * ey_direct + 1e-3);
    EXPECT_LT(egx, 3 * egx_direct + 1e-3);
    EXPECT_LT(egw, 3 * egw_direct + 1e-3);
    EXPECT_LT(ey, 1e-2);
    EXPECT_LT(egx, 1e-2);
    EXPECT_LT(egw, 1e-2);
    EXPECT_LT(rel(gb, gb64), 5e-3);  // the bias gradient is a plain sum, rounded once
  }
}

// oneDNN's scratch memory (large for Winograd: transformed tiles and weights) comes from the
// caching allocator, so the memory statistics and profiles count it: the forward's peak exceeds its
// inputs and output by at least the scratchpad oneDNN asks for, and the scratch is free afterwards.
TEST(ConvKernels, ScratchMemoryIsCountedByTheAllocator) {
  const cpu::ConvParams p = conv3x3(4, 128, 128, 16);
  Tensor x = randn_like_shape({p.N, p.C, p.H, p.W}, DType::F32, 51);
  Tensor w = randn_like_shape({p.O, p.C, 3, 3}, DType::F32, 52);
  Tensor y = empty({p.N, p.O, p.OH, p.OW});
  ASSERT_TRUE(cpu::onednn_conv2d_forward(p, x, w, Tensor(), y));  // primitives made, caches warm
  const int64_t scratch = cpu::onednn_conv2d_forward_scratch_bytes(p, DType::F32, false);
  const std::string impl = cpu::onednn_conv2d_forward_implementation(p, DType::F32, false);
  if (impl.find("wino") != std::string::npos) EXPECT_GT(scratch, 1 << 20) << impl;
  Allocator& a = allocator_for(Device::cpu());
  const int64_t before = a.stats().allocated_bytes;
  a.reset_peak();
  ASSERT_TRUE(cpu::onednn_conv2d_forward(p, x, w, Tensor(), y));
  EXPECT_GE(a.stats().peak_allocated_bytes - before, scratch);
  EXPECT_EQ(a.stats().allocated_bytes, before);
}

// Every pass gives the same bits on 1, 2 and 3 threads, on each algorithm the process uses (ctest
// runs this under FT_CONV_ALGO=direct and winograd too): the Winograd and direct kernels of f32
// layers, a stride-2 layer, and bf16 in both layouts (whose weight gradients, on the Winograd,
// paired, oneDNN's or one matrix product as the rules and FT_CONV_WEIGHT_GRAD say, are summed in
// f32 and rounded).
TEST(ConvKernels, PassesDoNotDependOnTheThreadCount) {
  struct Cfg {
    int64_t C, O, HW, stride;
    DType dt;
    bool channels_last;
    int64_t k = 3;
  };
  const int threads = get_num_threads();
  for (const Cfg& k :
       {Cfg{32, 32, 16, 1, DType::F32, false}, Cfg{32, 64, 16, 1, DType::F32, true},
        Cfg{32, 64, 16, 2, DType::F32, false}, Cfg{32, 32, 16, 1, DType::BF16, true},
        Cfg{32, 48, 16, 2, DType::BF16, false},
        // Winograd, the weight gradient in 3 chunks of tiles (direct runs: paired, 2 chunks)
        Cfg{32, 256, 16, 1, DType::BF16, true}, Cfg{64, 64, 16, 1, DType::BF16, false},  // Winograd on nChw16c copies
        Cfg{256, 64, 16, 1, DType::BF16, true, 1}}) {                                    // 1x1: one matrix product
    cpu::ConvParams p = conv3x3(8, k.C, k.O, k.HW, k.stride, k.channels_last);
    if (k.k == 1) p.kH = p.kW = 1, p.padding = {0, 0};
    SCOPED_TRACE(std::to_string(k.C) + "->" + std::to_string(k.O) + " s" + std::to_string(k.stride) + " " +
                 dtype_name(k.dt) + (k.channels_last ? " nhwc " : " nchw ") +
                 cpu::onednn_conv2d_forward_implementation(p, k.dt, true));
    auto fmt = [&](const Tensor& t) { return k.channels_last ? t.contiguous_channels_last() : t; };
    Tensor x = fmt(randn_like_shape({p.N, p.C, p.H, p.W}, DType::F32, 41).to(k.dt));
    Tensor w = fmt(randn_like_shape({p.O, p.C, k.k, k.k}, DType::F32, 42).to(k.dt));
    Tensor b = randn_like_shape({p.O}, DType::F32, 43).to(k.dt);
    Tensor gy = fmt(randn_like_shape({p.N, p.O, p.OH, p.OW}, DType::F32, 44).to(k.dt));
    auto passes = [&](int n) {
      set_num_threads(n);
      Tensor y = fmt(empty(gy.shape(), TensorOptions(k.dt))), gx = fmt(empty(x.shape(), TensorOptions(k.dt)));
      Tensor gw = fmt(empty(w.shape(), TensorOptions(k.dt))), gb = empty(b.shape(), TensorOptions(k.dt));
      cpu::conv2d_forward(p, x, w, b, y);
      cpu::conv2d_backward_data(p, gy, w, gx);
      cpu::conv2d_backward_weight(p, gy, x, gw, gb);
      return std::vector<std::vector<double>>{y.to_vector(), gx.to_vector(), gw.to_vector(), gb.to_vector()};
    };
    const auto one = passes(1);
    for (int n : {2, 3}) {
      const auto many = passes(n);
      for (size_t i = 0; i < one.size(); ++i) EXPECT_EQ(one[i], many[i]) << "pass " << i << " on " << n << " threads";
    }
  }
  set_num_threads(threads);
}

// bf16 NCHW activations reach oneDNN's blocked layout through block_transpose.h's transposes where
// the CPU has AVX-512, through oneDNN's reorder below it: the same bits either way. The ISA switch
// lowers the level in-process to take the reorder (no process per setting).
TEST(ConvKernels, Bf16NchwTransposesGiveTheBitsOfOneDnnsReorder) {
  if (!cpu::block_transpose_available()) GTEST_SKIP() << "below AVX-512 oneDNN's reorder is the only path";
  const cpu::ConvParams p = conv3x3(4, 32, 48, 16);
  // The same kernels on both sides but for the reorders: direct convolutions, oneDNN's weight
  // gradient (the paired and Winograd kernels need AVX-512).
  switches::Scoped direct(switches::conv_algo, switches::ConvAlgo::Direct);
  switches::Scoped onednn(switches::conv_weight_grad, switches::ConvWeightGrad::Onednn);
  Tensor x = randn_like_shape({p.N, p.C, p.H, p.W}, DType::F32, 61).to(DType::BF16);
  Tensor w = randn_like_shape({p.O, p.C, 3, 3}, DType::F32, 62).to(DType::BF16);
  Tensor b = randn_like_shape({p.O}, DType::F32, 63).to(DType::BF16);
  Tensor gy = randn_like_shape({p.N, p.O, p.OH, p.OW}, DType::F32, 64).to(DType::BF16);
  auto passes = [&] {
    Tensor y = empty(gy.shape(), TensorOptions(DType::BF16)), gx = empty(x.shape(), TensorOptions(DType::BF16));
    Tensor gw = empty(w.shape(), TensorOptions(DType::BF16)), gb = empty(b.shape(), TensorOptions(DType::BF16));
    cpu::conv2d_forward(p, x, w, b, y);
    cpu::conv2d_backward_data(p, gy, w, gx);
    cpu::conv2d_backward_weight(p, gy, x, gw, gb);
    return std::vector<std::vector<double>>{y.to_vector(), gx.to_vector(), gw.to_vector(), gb.to_vector()};
  };
  const auto transposed = passes();
  std::vector<std::vector<double>> reordered;
  {
    switches::Scoped isa(switches::cpu_isa, cpu::CpuIsa::Avx2);
    ASSERT_FALSE(cpu::block_transpose_available());
    reordered = passes();
  }
  for (size_t i = 0; i < transposed.size(); ++i) EXPECT_EQ(transposed[i], reordered[i]) << "pass " << i;
  EXPECT_NE(transposed[0], std::vector<double>(transposed[0].size(), 0.0)) << "a convolution that computed nothing";
}

// f16 computes in f32 on the f16 values and rounds once: the same as an f32 conv of the rounded
// inputs, rounded.
TEST(ConvKernels, F16MatchesRoundedF32) {
  Tensor x = randn_like_shape({2, 4, 6, 6}, DType::F32, 21).to(DType::F16).contiguous_channels_last();
  Tensor w = randn_like_shape({8, 4, 3, 3}, DType::F32, 22).to(DType::F16);
  Tensor b = randn_like_shape({8}, DType::F32, 23).to(DType::F16);
  x.requires_grad_();
  w.requires_grad_();
  b.requires_grad_();
  Tensor y = conv2d(x, w, b, {1, 1}, {1, 1});
  EXPECT_EQ(y.dtype(), DType::F16);
  EXPECT_TRUE(y.is_channels_last());
  Tensor y32 = conv2d(x.detach().to(DType::F32), w.detach().to(DType::F32), b.detach().to(DType::F32), {1, 1}, {1, 1});
  EXPECT_EQ(test::compare(y, y32.to(DType::F16), {1e-3, 2e-3}), "");
  sum(y).backward();
  EXPECT_EQ(x.grad().dtype(), DType::F16);
  EXPECT_EQ(w.grad().shape(), w.shape());
  EXPECT_EQ(b.grad().shape(), b.shape());
}

// Only some inputs requiring grad: the backward computes just those.
TEST(ConvAutograd, PartialGradients) {
  Tensor x = randn_like_shape({2, 3, 5, 5}, DType::F64, 31);
  Tensor w = randn_like_shape({4, 3, 3, 3}, DType::F64, 32);
  Tensor b = randn_like_shape({4}, DType::F64, 33).requires_grad_();
  Tensor y = conv2d(x, w, b, {1, 1}, {1, 1});
  sum(y).backward();
  EXPECT_FALSE(x.grad().defined());
  EXPECT_FALSE(w.grad().defined());
  // d sum(y) / d b[o] = N * OH * OW
  for (double v : b.grad().to_vector()) EXPECT_DOUBLE_EQ(v, 2.0 * 5 * 5);
  x.requires_grad_();
  Tensor y2 = conv2d(x, w, Tensor(), {2, 2});
  EXPECT_TRUE(y2.requires_grad());
  sum(y2).backward();
  EXPECT_EQ(x.grad().shape(), x.shape());
}

TEST(ConvErrors, Messages) {
  Tensor x = zeros({2, 3, 8, 8}), w = zeros({8, 4, 3, 3});
  auto expect_error = [](const std::function<void()>& f, const std::string& what) {
    try {
      f();
      ADD_FAILURE() << "expected an error containing: " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  expect_error([&] { conv2d(x, w); }, "conv2d: input has 3 channels, weight expects 4 (weight [8, 4, 3, 3], groups 1)");
  expect_error(
      [&] {
        conv2d(zeros({3, 8, 8}), w);
      },
      "conv2d: expected a 4-d input [N, C, H, W], found shape [3, 8, 8]");
  expect_error([&] { conv2d(x, zeros({8, 3, 3})); }, "conv2d: expected a 4-d weight");
  expect_error(
      [&] {
        conv2d(zeros({2, 4, 8, 8}), zeros({6, 2, 3, 3}), Tensor(), {1, 1}, {0, 0}, {1, 1}, 3);
      },
      "groups 3 does not divide the input's 4 channels");
  expect_error(
      [&] {
        conv2d(zeros({2, 4, 8, 8}), zeros({5, 2, 3, 3}), Tensor(), {1, 1}, {0, 0}, {1, 1}, 2);
      },
      "groups 2 does not divide the weight's 5 output channels");
  expect_error(
      [&] {
        conv2d(zeros({2, 4, 8, 8}), zeros({4, 2, 3, 3}), Tensor(), {1, 1}, {0, 0}, {1, 1}, 0);
      },
      "groups must be positive, found 0");
  expect_error(
      [&] {
        conv2d(x, zeros({8, 3, 3, 3}), Tensor(), {0, 1});
      },
      "conv2d: stride must be positive, found [0, 1]");
  expect_error(
      [&] {
        conv2d(x, zeros({8, 3, 3, 3}), Tensor(), {1, 1}, {0, 0}, {1, -1});
      },
      "conv2d: dilation must be positive");
  expect_error([&] { conv2d(x, zeros({8, 3, 3, 3}), Tensor(), {1, 1}, {-1, 0}); }, "padding must be non-negative");
  expect_error(
      [&] {
        conv2d(zeros({1, 3, 4, 4}), zeros({8, 3, 5, 5}));
      },
      "conv2d: kernel 5x5 (dilated) is larger than the padded input 4x4");
  expect_error(
      [&] {
        conv2d(zeros({1, 3, 4, 4}), zeros({8, 3, 3, 3}), Tensor(), {1, 1}, {0, 0}, {2, 2});
      },
      "kernel 5x5 (dilated) is larger than the padded input 4x4");
  expect_error(
      [&] {
        conv2d(x, zeros({8, 3, 3, 3}, DType::F64));
      },
      "conv2d: input has dtype f32 but weight has dtype f64");
  expect_error([&] { conv2d(x, zeros({8, 3, 3, 3}), zeros({4})); }, "conv2d: expected bias of shape [8], found [4]");
  expect_error(
      [&] {
        conv2d(x, zeros({8, 3, 3, 3}), zeros({8}, DType::BF16));
      },
      "conv2d: input has dtype f32 but bias has dtype bf16");
  expect_error(
      [&] {
        conv2d(zeros({2, 3, 8, 8}, DType::I64), zeros({8, 3, 3, 3}, DType::I64));
      },
      "conv2d: input must be a floating-point tensor, found i64");
}

TEST(ConvLayout, ChannelsLastSurvivesAStepUnderBf16Autocast) {
  // conv -> BatchNorm -> ReLU -> residual add, channels-last, under bf16 autocast: every
  // activation and gradient stays NHWC (autocast's casts and the elementwise ops keep the memory
  // format), so oneDNN never reorders activations between layers, and the weight and its
  // gradient stay OHWI. Values equal the NCHW run's.
  Generator g(4);
  Tensor x0 = randn({2, 16, 6, 6}, DType::F32, &g);
  std::vector<double> outs[2], grads[2];
  for (int cl = 0; cl < 2; ++cl) {
    Generator gw(5);
    auto conv = std::make_shared<nn::Conv2d>(16, 16, 3, 1, 1, false, 1, 1, &gw);
    auto bn = std::make_shared<nn::BatchNorm2d>(16);
    Tensor x = cl ? x0.contiguous_channels_last() : x0;
    if (cl) {
      conv->to_channels_last();
      bn->to_channels_last();
    }
    Tensor y;
    {
      autocast::AutocastGuard guard(DType::BF16);
      Tensor c = conv->forward(x);
      Tensor r = relu(bn->forward(c));
      y = r + c;
      if (cl) {
        EXPECT_TRUE(c.is_channels_last() && !c.is_contiguous());
        EXPECT_TRUE(r.is_channels_last() && !r.is_contiguous());
        EXPECT_TRUE(y.is_channels_last() && !y.is_contiguous());
      }
    }
    sum(y.to(DType::F32)).backward();
    outs[cl] = y.to_vector();
    grads[cl] = conv->weight.grad().to_vector();
    // The channels-last weight's gradient comes out in its layout (no OIHW copy either way).
    if (cl) EXPECT_TRUE(conv->weight.grad().is_channels_last() && !conv->weight.grad().is_contiguous());
  }
  for (size_t i = 0; i < outs[0].size(); ++i) ASSERT_NEAR(outs[1][i], outs[0][i], 2e-2 * std::abs(outs[0][i]) + 2e-2);
  for (size_t i = 0; i < grads[0].size(); ++i)
    ASSERT_NEAR(grads[1][i], grads[0][i], 2e-2 * std::abs(grads[0][i]) + 5e-2);
}
