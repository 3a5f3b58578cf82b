// FP8 (fasttrain/fp8.h) on the CPU: the two formats' conversions against PyTorch's float8 types
// (vectors in tests/data/fp8_reference.json, made by gen_fp8_reference.py with PyTorch 2.6), the
// quantize kernel (codes, transposed codes, amax), the delayed scales' update against the recipe's
// formula, the FP8 product against f64 products of the decoded values, fp8_linear's output and
// gradients against the composition of quantize, dequantize and f64 products (quantizing is
// piecewise constant, so its gradient is the straight-through one: finite differences do not
// apply), and nn::Linear's FP8 region.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

#include "backend/fp8_math.h"
#include "fasttrain/fasttrain.h"
#include "fasttrain/train.h"
#include "support/expect_error.h"

using namespace ft;

namespace {

nlohmann::json reference() {
  std::ifstream f(std::string(FT_TESTS_DIR) + "/data/fp8_reference.json");
  std::stringstream ss;
  ss << f.rdbuf();
  return nlohmann::json::parse(ss.str());
}

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint32_t to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

Fp8Format format_named(const std::string& name) { return name == "e4m3" ? Fp8Format::E4M3 : Fp8Format::E5M2; }

float scalar(const Tensor& t) { return t.to(DType::F32).contiguous().data<float>()[0]; }

Tensor f32_scalar(float v) { return full({1}, v, DType::F32); }

// decode(code) as f64, times `scale_inv`: what a quantized tensor stands for.
Tensor dequantized64(const Tensor& codes, Fp8Format f, double scale_inv) {
  Tensor out = empty(codes.shape(), DType::F64);
  const uint8_t* c = static_cast<const uint8_t*>(codes.raw_data());
  double* o = out.data<double>();
  for (int64_t i = 0; i < codes.numel(); ++i) o[i] = math::fp8_decode(c[i], f) * scale_inv;
  return out;
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  return max(abs(sub(a.to(DType::F64), b.to(DType::F64)))).item<double>();
}

double max_abs(const Tensor& a) { return max(abs(a.to(DType::F64))).item<double>(); }

}  // namespace

TEST(Fp8, EveryCodeDecodesAsPyTorchDoes) {
  const nlohmann::json ref = reference();
  for (const char* name : {"e4m3", "e5m2"}) {
    const Fp8Format f = format_named(name);
    const auto& table = ref.at("decode").at(name);
    ASSERT_EQ(table.size(), 256u);
    for (int code = 0; code < 256; ++code) {
      const float want = from_bits(table[code].get<uint32_t>()), got = math::fp8_decode(static_cast<uint8_t>(code), f);
      if (std::isnan(want))
        EXPECT_TRUE(std::isnan(got)) << name << " code " << code;
      else
        EXPECT_EQ(to_bits(got), to_bits(want)) << name << " code " << code << ": " << got << " vs " << want;
    }
  }
}

TEST(Fp8, EncodingRoundsToNearestEvenAndSaturatesAsPyTorchsClampedCast) {
  const nlohmann::json ref = reference();
  for (const char* name : {"e4m3", "e5m2"}) {
    const Fp8Format f = format_named(name);
    int checked = 0, wrong = 0;
    for (const auto& row : ref.at("encode").at(name)) {
      const float x = from_bits(row[0].get<uint32_t>());
      const int want = row[1].get<int>(), got = math::fp8_encode(x, f);
      ++checked;
      if (got != want && ++wrong <= 10) ADD_FAILURE() << name << " " << x << ": code " << got << ", PyTorch " << want;
    }
    EXPECT_GT(checked, 4000) << name;
    EXPECT_EQ(wrong, 0) << name;
  }
  // NaN stays NaN in both formats (the reference leaves NaN out: PyTorch's NaN codes differ by format).
  EXPECT_TRUE(std::isnan(math::fp8_decode(math::fp8_encode(NAN, Fp8Format::E4M3), Fp8Format::E4M3)));
  EXPECT_TRUE(std::isnan(math::fp8_decode(math::fp8_encode(NAN, Fp8Format::E5M2), Fp8Format::E5M2)));
}

TEST(Fp8, QuantizeWritesCodesTheirTransposeAndTheRunningAmax) {
  Generator g(3);
  for (DType dt : {DType::F32, DType::BF16}) {
    Tensor x = mul(randn({37, 48}, DType::F32, &g), 3.0).to(dt);
    const Tensor scale = f32_scalar(200.0f), amax = f32_scalar(0.5f);
    const Fp8Codes q = fp8_quantize(x, Fp8Format::E4M3, scale, amax, /*with_transposed=*/true);
    ASSERT_EQ(q.codes.shape(), (Shape{37, 48}));
    ASSERT_EQ(q.transposed.shape(), (Shape{48, 37}));
    const Tensor x32 = x.to(DType::F32).contiguous();
    const float* xs = x32.data<float>();
    const uint8_t* c = static_cast<const uint8_t*>(q.codes.raw_data());
    const uint8_t* ct = static_cast<const uint8_t*>(q.transposed.raw_data());
    int saturated = 0;
    for (int64_t r = 0; r < 37; ++r)
      for (int64_t k = 0; k < 48; ++k) {
        const uint8_t want = math::fp8_encode(xs[r * 48 + k] * 200.0f, Fp8Format::E4M3);
        ASSERT_EQ(c[r * 48 + k], want) << r << "," << k;
        ASSERT_EQ(ct[k * 37 + r], want) << r << "," << k;
        saturated += (want & 0x7f) == 0x7e;
      }
    EXPECT_GT(saturated, 0) << "the scale was chosen so that some values saturate to 448 (|x| > 2.24)";
    EXPECT_EQ(scalar(amax), max_abs(x32)) << dtype_name(dt);
    // A later call keeps the larger amax; a NaN takes it over.
    fp8_quantize(mul(x, 0.1), Fp8Format::E4M3, scale, amax);
    EXPECT_EQ(scalar(amax), max_abs(x32));
    Tensor with_nan = x.clone();
    with_nan.narrow(0, 5, 1).narrow(1, 7, 1).fill_(NAN);
    fp8_quantize(with_nan, Fp8Format::E4M3, scale, amax);
    EXPECT_TRUE(std::isnan(scalar(amax)));
  }
  // Rows with a stride (a view) quantize as their dense copy does.
  Tensor wide = randn({10, 64}, DType::F32, &g);
  Tensor view = wide.narrow(1, 8, 32);
  const Fp8Codes a = fp8_quantize(view, Fp8Format::E5M2, f32_scalar(1), f32_scalar(0));
  const Fp8Codes b = fp8_quantize(view.contiguous(), Fp8Format::E5M2, f32_scalar(1), f32_scalar(0));
  EXPECT_EQ(std::memcmp(a.codes.raw_data(), b.codes.raw_data(), 320), 0);
}

TEST(Fp8, ScalesFollowTheDelayedScalingRecipe) {
  for (Fp8AmaxAlgo algo : {Fp8AmaxAlgo::Max, Fp8AmaxAlgo::MostRecent}) {
    Fp8Recipe recipe;
    recipe.amax_history_len = 2;
    recipe.amax_algo = algo;
    recipe.margin = 1;
    Fp8LinearState st(recipe, Device::cpu());
    EXPECT_EQ(scalar(st.scale_of(Fp8Role::Input)), 1.0f);  // before any step
    const bool max = algo == Fp8AmaxAlgo::Max;
    // Per step: the input role's amax, then its scale: 448 / reference amax / 2^margin, the
    // reference being the max of the last two steps or the newest; 0 keeps the scale.
    const float amaxes[] = {2, 8, 4, 0};
    const float want_input[] = {448.0f / 2 / 2, 448.0f / 8 / 2, max ? 448.0f / 8 / 2 : 448.0f / 4 / 2,
                                max ? 448.0f / 4 / 2 : 448.0f / 4 / 2};
    for (int step = 0; step < 4; ++step) {
      st.amax_of(Fp8Role::Input).fill_(amaxes[step]);
      st.amax_of(Fp8Role::GradOutput).fill_(amaxes[step] * 1000);
      st.update_scales(recipe);
      EXPECT_EQ(scalar(st.scale_of(Fp8Role::Input)), want_input[step]) << "step " << step << " max " << max;
      EXPECT_EQ(scalar(st.scale_inv_of(Fp8Role::Input)), 1.0f / want_input[step]);
      EXPECT_EQ(scalar(st.amax_of(Fp8Role::Input)), 0.0f) << "the step's amax restarts";
      // The gradient row is E5M2: 57344 over its amax.
      EXPECT_FLOAT_EQ(scalar(st.scale_of(Fp8Role::GradOutput)), want_input[step] / 448.0f * 57344.0f / 1000.0f);
      // The weight role saw nothing: its scale stays 1.
      EXPECT_EQ(scalar(st.scale_of(Fp8Role::Weight)), 1.0f);
    }
    // The history, newest first: steps 4 and 3.
    const Tensor h = st.amax_history.narrow(0, 0, 1).contiguous();
    EXPECT_EQ(h.data<float>()[0], 0.0f);
    EXPECT_EQ(h.data<float>()[1], 4.0f);
    // An overflowed step (inf) keeps the scale.
    const float before = scalar(st.scale_of(Fp8Role::Input));
    st.amax_of(Fp8Role::Input).fill_(INFINITY);
    st.update_scales(recipe);
    EXPECT_EQ(scalar(st.scale_of(Fp8Role::Input)), before) << "an infinite amax keeps the scale";
  }
  test::expect_error([] { check_fp8_recipe(Fp8Recipe{0, 0, Fp8AmaxAlgo::Max}); }, "amax_history_len must be 1..4096");
  test::expect_error([] { check_fp8_recipe(Fp8Recipe{-1, 16, Fp8AmaxAlgo::Max}); }, "margin must be 0..64");
}

TEST(Fp8, ProductEqualsTheF64ProductOfTheDecodedValues) {
  Generator g(5);
  const int64_t M = 19, N = 32, K = 48;
  for (DType out : {DType::F32, DType::BF16}) {
    for (Fp8Format fa : {Fp8Format::E4M3, Fp8Format::E5M2}) {
      const Fp8Codes a = fp8_quantize(randn({M, K}, DType::F32, &g), fa, f32_scalar(8), f32_scalar(0));
      const Fp8Codes b = fp8_quantize(randn({N, K}, DType::F32, &g), Fp8Format::E4M3, f32_scalar(32), f32_scalar(0));
      const Tensor bias = randn({N}, DType::F32, &g).to(out);
      const Tensor y =
          fp8_matmul(a.codes, fa, f32_scalar(0.125f), b.codes, Fp8Format::E4M3, f32_scalar(1.0f / 32), bias, out);
      ASSERT_EQ(y.dtype(), out);
      const Tensor want =
          add(matmul(dequantized64(a.codes, fa, 0.125), dequantized64(b.codes, Fp8Format::E4M3, 1.0 / 32).t()),
              bias.to(DType::F64));
      const double tol = out == DType::F32 ? 1e-5 : 8e-3;  // f32 sums; bf16's one rounding
      EXPECT_LT(max_abs_diff(y, want), tol * max_abs(want)) << dtype_name(out) << " " << fp8_format_name(fa);
    }
  }
  // Against the product of the unquantized operands: each FP8 value is within half a unit in the
  // last place of its input (2^-4 relative in E4M3's range, 2^-3 in E5M2's), so each output is
  // within (ea + eb + ea eb) sum_k |x||w| of the exact product. (tests/cuda checks the GPU's too.)
  for (Fp8Format fa : {Fp8Format::E4M3, Fp8Format::E5M2}) {
    const Tensor x = randn({M, K}, DType::F32, &g), w = mul(randn({N, K}, DType::F32, &g), 0.05);
    const float sa = fa == Fp8Format::E4M3 ? 64.0f : 4096.0f, sb = 2048.0f;
    const Tensor y = fp8_matmul(fp8_quantize(x, fa, f32_scalar(sa), f32_scalar(0)).codes, fa, f32_scalar(1 / sa),
                                fp8_quantize(w, Fp8Format::E4M3, f32_scalar(sb), f32_scalar(0)).codes, Fp8Format::E4M3,
                                f32_scalar(1 / sb), Tensor(), DType::F32);
    const double ea = fa == Fp8Format::E4M3 ? 0.0625 : 0.125, eb = 0.0625;
    const Tensor exact = matmul(x.to(DType::F64), w.to(DType::F64).t());
    const Tensor bound = mul(matmul(abs(x).to(DType::F64), abs(w).to(DType::F64).t()), ea + eb + ea * eb);
    const Tensor err = abs(sub(y.to(DType::F64), exact));
    EXPECT_LE(max(sub(err, bound)).item<double>(), 1e-6) << fp8_format_name(fa);
    EXPECT_GT(max(err).item<double>(), 0.0) << "quantizing changed the product";
  }
  const Tensor c = empty({4, 16}, DType::U8);
  test::expect_error(
      [&] { fp8_matmul(c, Fp8Format::E5M2, f32_scalar(1), c, Fp8Format::E5M2, f32_scalar(1), Tensor(), DType::F32); },
      "at most one operand may be e5m2");
  test::expect_error(
      [&] {
        fp8_matmul(c, Fp8Format::E4M3, f32_scalar(1), empty({4, 32}, DType::U8), Fp8Format::E4M3, f32_scalar(1),
                   Tensor(), DType::F32);
      },
      "must share K");
  test::expect_error(
      [&] { fp8_matmul(c, Fp8Format::E4M3, f32_scalar(1), c, Fp8Format::E4M3, f32_scalar(1), Tensor(), DType::F64); },
      "must be f32 or bf16");
}

TEST(Fp8, LinearAndItsGradientsAreTheQuantizedComposition) {
  Generator g(11);
  Fp8Recipe recipe;
  Fp8LinearState st(recipe, Device::cpu());
  // Scales as three earlier steps might have left them (delayed: not from this step's tensors).
  const float sx = 16, sw = 256, sg = 4096;
  st.scale.copy_(from_vector({sx, sw, sg}, {3}, DType::F32));
  st.scale_inv.copy_(from_vector({1 / sx, 1 / sw, 1 / sg}, {3}, DType::F32));
  Tensor x = randn({2, 5, 32}, DType::F32, &g).requires_grad_();
  Tensor w = mul(randn({48, 32}, DType::F32, &g), 0.1).detach().requires_grad_();
  Tensor b = randn({48}, DType::F32, &g).requires_grad_();
  Tensor y = fp8_linear(x, w, b, st);
  ASSERT_EQ(y.shape(), (Shape{2, 5, 48}));
  ASSERT_EQ(y.dtype(), DType::F32);
  const Tensor r = mul(randn({2, 5, 48}, DType::F32, &g), 1e-3);  // dL/dy
  sum(mul(y, r)).backward();

  auto q64 = [](const Tensor& t, Fp8Format f, float s) {  // quantize, then the values stood for
    return dequantized64(fp8_quantize(t.detach().reshape({-1, t.size(-1)}), f, f32_scalar(s), f32_scalar(0)).codes, f,
                         1.0 / s);
  };
  const Tensor xq = q64(x, Fp8Format::E4M3, sx), wq = q64(w, Fp8Format::E4M3, sw), gq = q64(r, Fp8Format::E5M2, sg);
  const Tensor y_want = add(matmul(xq, wq.t()), b.detach().to(DType::F64)).reshape({2, 5, 48});
  EXPECT_LT(max_abs_diff(y, y_want), 1e-5 * max_abs(y_want));
  const Tensor gx_want = matmul(gq, wq).reshape({2, 5, 32});
  const Tensor gw_want = matmul(gq.t(), xq);
  const Tensor gb_want = sum(r.to(DType::F64).reshape({10, 48}), {0});
  EXPECT_LT(max_abs_diff(x.grad(), gx_want), 1e-5 * max_abs(gx_want));
  EXPECT_LT(max_abs_diff(w.grad(), gw_want), 1e-5 * max_abs(gw_want));
  EXPECT_LT(max_abs_diff(b.grad(), gb_want), 1e-6 * max_abs(gb_want)) << "the bias gradient is not quantized";
  // The step's amaxes, recorded for the next scales.
  EXPECT_EQ(scalar(st.amax_of(Fp8Role::Input)), max_abs(x));
  EXPECT_EQ(scalar(st.amax_of(Fp8Role::Weight)), max_abs(w));
  EXPECT_EQ(scalar(st.amax_of(Fp8Role::GradOutput)), max_abs(r));
  // Under autocast the output is bf16 and the gradients keep their inputs' dtypes.
  {
    autocast::AutocastGuard amp(DType::BF16);
    x.set_grad(Tensor());
    Tensor y16 = fp8_linear(x, w, b, st);
    EXPECT_EQ(y16.dtype(), DType::BF16);
    sum(mul(y16, r.to(DType::BF16))).backward();
    EXPECT_EQ(x.grad().dtype(), DType::F32);
    EXPECT_EQ(w.grad().dtype(), DType::F32);
  }
  test::expect_error([&] { fp8_linear(randn({4, 24}), randn({48, 24}), Tensor(), st); }, "multiples of 16");
  test::expect_error(
      [&] {
        fp8_linear(randn({4, 32}, DType::F64), randn({48, 32}, DType::F64), Tensor(), st);
      },
      "must be f32 or bf16");
}

TEST(Fp8, LinearLayersRunFp8OnlyInsideTheRegionAndWhereTheyMay) {
  Generator g(2);
  nn::Linear a(64, 32, true, &g), head(64, 32, false, &g), odd(64, 30, true, &g);
  head.fp8 = false;
  const Tensor x = randn({8, 64}, DType::F32, &g);
  const Tensor plain = a(x);
  EXPECT_EQ(a.fp8_state, nullptr);
  Fp8Recipe recipe;
  recipe.amax_history_len = 4;
  {
    Fp8Autocast fp8(recipe);
    ASSERT_NE(fp8_autocast_recipe(), nullptr);
    const Tensor y = a(x);
    ASSERT_NE(a.fp8_state, nullptr);
    EXPECT_EQ(a.fp8_state->amax_history.size(1), 4);
    // Scale 1 on the first step: x (|x| < 5) in E4M3 differs from f32 by at most 1/16 relative.
    const double err = max_abs_diff(y, plain);
    EXPECT_GT(err, 0.0) << "the product ran in FP8";
    EXPECT_LT(err, 0.2 * max_abs(plain));
    head(x);
    odd(x);
    EXPECT_EQ(head.fp8_state, nullptr) << "fp8 off";
    EXPECT_EQ(odd.fp8_state, nullptr) << "30 outputs: not a multiple of 16";
    {
      Fp8Autocast off(recipe, /*enabled=*/false);
      EXPECT_EQ(fp8_autocast_recipe(), nullptr) << "a disabled region turns FP8 off inside it";
    }
    EXPECT_NE(fp8_autocast_recipe(), nullptr);
  }
  EXPECT_EQ(fp8_autocast_recipe(), nullptr);
  nn::Sequential model;
  model.push_back(std::make_shared<nn::Linear>(64, 32, true, &g));
  {
    Fp8Autocast fp8(recipe);
    model.forward(x);
  }
  const auto states = fp8_states(model);
  ASSERT_EQ(states.size(), 1u);
  EXPECT_EQ(states[0].first, "0");
  fp8_update_scales(model, recipe);
  EXPECT_FLOAT_EQ(scalar(states[0].second->scale_of(Fp8Role::Input)), static_cast<float>(448.0 / max_abs(x)));
}

TEST(Fp8, TheTrainerRefusesWhatFp8MixedIsNotBuiltFor) {
  train::TrainerConfig c = train::TrainerConfig::defaults_for("char");
  EXPECT_EQ(train::precision_from_name("fp8"), train::Precision::FP8Mixed);
  EXPECT_EQ(std::string(train::precision_name(train::Precision::FP8Mixed)), "fp8-mixed");
  c.precision.mode = train::Precision::FP8Mixed;
  c.validate();
  c.dist.tp = 2;
  test::expect_error([&] { c.validate(); }, "fp8-mixed is not built for tensor or pipeline parallelism");
  c.dist.tp = 1;
  c.precision.fp8_amax_history = 0;
  test::expect_error([&] { c.validate(); }, "option fp8_amax_history: expected 1 to 4096 steps, found 0");
  c.precision.fp8_amax_history = 16;
  c.precision.fp8_margin = -1;
  test::expect_error([&] { c.validate(); }, "option fp8_margin: expected 0 to 64, found -1");
}

// A checkpoint's FP8 scales load back into a fresh model (states made for layers that have not
// run), and a file from another recipe or model is refused with the key named.
TEST(Fp8, StatesSaveAndLoadByLayerName) {
  Generator g(4);
  Fp8Recipe recipe;
  recipe.amax_history_len = 8;
  auto make = [&] {
    auto m = std::make_shared<nn::Sequential>();
    m->push_back(std::make_shared<nn::Linear>(32, 16, true, &g));
    m->push_back(std::make_shared<nn::Linear>(16, 48, true, &g));
    return m;
  };
  auto a = make();
  {
    Fp8Autocast fp8(recipe);
    a->forward(randn({4, 32}, DType::F32, &g));
  }
  fp8_update_scales(*a, recipe);
  const auto saved = fp8_state_tensors(*a);
  ASSERT_EQ(saved.size(), 8u);  // 2 layers x amax, amax_history, scale, scale_inv
  EXPECT_EQ(saved[0].first, "0.amax");
  auto b = make();
  load_fp8_state_tensors(*b, recipe, saved, "fp8_scales.safetensors");
  const auto loaded = fp8_state_tensors(*b);
  ASSERT_EQ(loaded.size(), saved.size());
  for (size_t i = 0; i < saved.size(); ++i) {
    EXPECT_EQ(loaded[i].first, saved[i].first);
    EXPECT_EQ(loaded[i].second.to_vector(), saved[i].second.to_vector()) << saved[i].first;
  }
  Fp8Recipe longer = recipe;
  longer.amax_history_len = 16;
  test::expect_error(
      [&] { load_fp8_state_tensors(*make(), longer, saved, "f.safetensors"); },
      "f.safetensors: 0.amax_history is f32 [3, 8], expected f32 [3, 16] (the fp8 amax history length differs)");
  auto renamed = saved;
  renamed[0].first = "2.amax";
  test::expect_error([&] { load_fp8_state_tensors(*make(), recipe, renamed, "f.safetensors"); },
                     "f.safetensors: 2.amax names no FP8 linear layer of the model");
}
