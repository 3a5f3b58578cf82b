// FP8 on the CPU (kernel-table entries fp8_quantize, fp8_update_scales, fp8_matmul; the recipe is
// in fasttrain/fp8.h, the formats in backend/fp8_math.h). The CPU has no FP8 arithmetic: the
// product decodes both operands' codes to f32 (exact: every E4M3 and E5M2 value is an f32), runs
// the f32 GEMM (products of two FP8 values are exact in f32; the sums round as a GPU's f32
// accumulator does, in another order) and applies the dequantizing factor and the bias to the f32
// result before its one rounding to the output dtype. An emulation for checking a recipe: it
// costs an f32 step plus the conversions.
#include <algorithm>
#include <array>
#include <cmath>

#include "backend/cpu/dispatch.h"
#include "backend/cpu/kernel_decls.h"
#include "backend/fp8_math.h"
#include "fasttrain/ops.h"
#include "fasttrain/parallel.h"

namespace ft::cpu {

namespace {

constexpr int64_t kGrainElements = 1 << 14;

// |v| folded into a running maximum that a NaN takes over and keeps (the scale update then keeps
// its previous scale).
inline float fold_amax(float m, float v) {
  if (std::isnan(m)) return m;
  const float a = std::fabs(v);
  return (a > m || std::isnan(a)) ? a : m;
}

// The 256 values of a format's codes.
const std::array<float, 256>& decode_table(Fp8Format f) {
  static const auto tables = [] {
    std::array<std::array<float, 256>, 2> t{};
    for (int code = 0; code < 256; ++code) {
      t[0][code] = math::fp8_decode(static_cast<uint8_t>(code), Fp8Format::E4M3);
      t[1][code] = math::fp8_decode(static_cast<uint8_t>(code), Fp8Format::E5M2);
    }
    return t;
  }();
  return tables[f == Fp8Format::E4M3 ? 0 : 1];
}

Tensor decoded(const Tensor& codes, Fp8Format f) {
  const std::array<float, 256>& table = decode_table(f);
  Tensor out = empty(codes.shape(), DType::F32);
  const uint8_t* c = static_cast<const uint8_t*>(codes.raw_data());
  float* o = out.data<float>();
  parallel_for(0, codes.numel(), kGrainElements, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) o[i] = table[c[i]];
  });
  return out;
}

}  // namespace

void fp8_quantize(const Tensor& x, Fp8Format format, const Tensor& scale, const Tensor& amax, const Tensor& codes,
                  const Tensor& codes_t) {
  const int64_t R = x.size(0), C = x.size(1), ld = x.stride(0);
  const float s = *scale.data<float>();
  uint8_t* q = static_cast<uint8_t*>(codes.raw_data());
  uint8_t* qt = codes_t.defined() ? static_cast<uint8_t*>(codes_t.raw_data()) : nullptr;
  std::vector<float> part_max(static_cast<size_t>(std::max<int64_t>(R, 1)), 0.0f);
  FT_DISPATCH_FLOATING(x.dtype(), "fp8_quantize", [&] {
    const scalar_t* X = static_cast<const scalar_t*>(x.raw_data());
    parallel_for(0, R, std::max<int64_t>(1, kGrainElements / std::max<int64_t>(C, 1)), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        float m = 0.0f;
        for (int64_t c = 0; c < C; ++c) {
          const float v = static_cast<float>(X[r * ld + c]);
          m = fold_amax(m, v);
          const uint8_t code = math::fp8_encode(v * s, format);
          q[r * C + c] = code;
          if (qt) qt[c * R + r] = code;
        }
        part_max[static_cast<size_t>(r)] = m;
      }
    });
  });
  float* a = amax.data<float>();
  for (float m : part_max) *a = fold_amax(*a, m);
}

void fp8_update_scales(const Tensor& amax, const Tensor& history, const Tensor& scale, const Tensor& scale_inv,
                       const Fp8ScaleParams& p) {
  const int64_t R = history.size(0), L = history.size(1);
  float* a = amax.data<float>();
  float* h = history.data<float>();
  float* s = scale.data<float>();
  float* si = scale_inv.data<float>();
  for (int64_t r = 0; r < R; ++r) {
    float* row = h + r * L;
    std::copy_backward(row, row + L - 1, row + L);
    row[0] = a[r];
    a[r] = 0.0f;
    float ref = row[0];
    if (p.algo == Fp8AmaxAlgo::Max)
      for (int64_t i = 1; i < L; ++i) ref = fold_amax(ref, row[i]);
    s[r] = math::fp8_next_scale(ref, s[r], p.formats[static_cast<size_t>(r)], p.margin);
    si[r] = 1.0f / s[r];
  }
}

void fp8_matmul(const Tensor& a, Fp8Format fa, const Tensor& a_scale_inv, const Tensor& b, Fp8Format fb,
                const Tensor& b_scale_inv, const Tensor& bias, bool fast_accumulate, const Tensor& out) {
  (void)fast_accumulate;  // a GPU's choice of accumulator; the CPU sums in f32 throughout
  const Tensor af = decoded(a, fa), bf = decoded(b, fb);
  const int64_t M = a.size(0), N = b.size(0);
  Tensor acc = out.dtype() == DType::F32 ? out : empty({M, N}, DType::F32);
  matmul(af, bf.t(), acc, false, Tensor());
  const float factor = *a_scale_inv.data<float>() * *b_scale_inv.data<float>();
  float* A = acc.data<float>();
  Tensor bias32 = bias.defined() ? bias.to(DType::F32).contiguous() : Tensor();
  const float* B = bias32.defined() ? bias32.data<float>() : nullptr;
  parallel_for(0, M, std::max<int64_t>(1, kGrainElements / std::max<int64_t>(N, 1)), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t c = 0; c < N; ++c) A[r * N + c] = A[r * N + c] * factor + (B ? B[c] : 0.0f);
  });
  if (acc.raw_data() != out.raw_data()) copy(out, acc);
}

}  // namespace ft::cpu
