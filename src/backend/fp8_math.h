// The two 8-bit floating-point formats of FP8 training (OCP FP8, as Hopper's tensor cores, cuBLASLt,
// Transformer Engine and PyTorch's float8_e4m3fn / float8_e5m2 define them), converted one value at
// a time on the host and (compiled by nvcc) on the device, so both backends quantize alike:
//
//   E4M3 ("fn": finite): 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities; S.1111.111 is
//        NaN, so the largest finite value is S.1111.110 = 448. Normals 2^-6 .. 448, subnormals
//        k * 2^-9 (k = 1..7). Forward tensors (activations, weights): more precision.
//   E5M2: 1 sign, 5 exponent (bias 15), 2 mantissa bits; IEEE-like: S.11111.00 is infinity,
//        S.11111.xx (xx != 0) NaN, largest finite 57344. Normals 2^-14 .., subnormals k * 2^-16.
//        Gradients: more range.
//
// Encoding rounds to nearest, ties to even, and saturates: a finite value beyond the largest
// finite one becomes that value (cuda_fp8.h's __NV_SATFINITE, what Transformer Engine's casts do),
// so a delayed scale that is too large clips instead of making an infinity or NaN. NaN stays NaN
// (0x7F with the sign; a NaN in both formats); infinities saturate like any large value.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#include "backend/elementwise_math.h"  // FT_HD
#include "fasttrain/fp8.h"

namespace ft::math {

struct Fp8Spec {
  int mantissa_bits, bias;
  float max_finite;
  float min_normal;         // 2^(1 - bias)
  float subnormal_per_ulp;  // 2^(bias + M - 1): a subnormal's value times this is its code
};

FT_HD Fp8Spec fp8_spec(Fp8Format f) {
  return f == Fp8Format::E4M3 ? Fp8Spec{3, 7, 448.0f, 0x1p-6f, 0x1p9f} : Fp8Spec{2, 15, 57344.0f, 0x1p-14f, 0x1p16f};
}

FT_HD uint8_t fp8_encode(float x, Fp8Format f) {
  const Fp8Spec s = fp8_spec(f);
  uint32_t u;
  std::memcpy(&u, &x, 4);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return sign | 0x7f;  // NaN
  u &= 0x7fffffffu;
  float a;
  std::memcpy(&a, &u, 4);
  if (a > s.max_finite) a = s.max_finite;  // saturate (infinity included)
  if (a < s.min_normal) {
    // Subnormal (or zero): a multiple of 2^(1 - bias - M), found exactly by a power-of-two scale;
    // rounding it up to 2^M lands on the smallest normal's code, which is what it is.
    return sign | static_cast<uint8_t>(rintf(a * s.subnormal_per_ulp));
  }
  // Normal: round f32's 23-bit mantissa to M bits (nearest, ties to even; a carry moves into the
  // exponent), then rebias the exponent from 127 to `bias`. a <= max_finite, which is exact in
  // the format, so the result never passes it.
  std::memcpy(&u, &a, 4);
  const int shift = 23 - s.mantissa_bits;
  u += ((1u << (shift - 1)) - 1u) + ((u >> shift) & 1u);
  u >>= shift;
  return sign | static_cast<uint8_t>(u - (static_cast<uint32_t>(127 - s.bias) << s.mantissa_bits));
}

FT_HD float fp8_decode(uint8_t code, Fp8Format f) {
  const Fp8Spec s = fp8_spec(f);
  const int e_max = (1 << (7 - s.mantissa_bits)) - 1, m_max = (1 << s.mantissa_bits) - 1;
  const int e = (code >> s.mantissa_bits) & e_max, m = code & m_max;
  const uint32_t sign = static_cast<uint32_t>(code & 0x80) << 24;
  uint32_t u;
  if (f == Fp8Format::E4M3 && e == e_max && m == m_max) {
    u = sign | 0x7fc00000u;  // NaN
  } else if (f == Fp8Format::E5M2 && e == e_max) {
    u = sign | (m == 0 ? 0x7f800000u : 0x7fc00000u);  // infinity, NaN
  } else if (e == 0) {
    const float v = static_cast<float>(m) / s.subnormal_per_ulp;  // exact: a small integer over a power of two
    std::memcpy(&u, &v, 4);
    u |= sign;
  } else {
    u = sign | (static_cast<uint32_t>(e - s.bias + 127) << 23) | (static_cast<uint32_t>(m) << (23 - s.mantissa_bits));
  }
  float v;
  std::memcpy(&v, &u, 4);
  return v;
}

// Delayed scaling (Transformer Engine's recipe): the scale a tensor is quantized with comes from
// the largest magnitudes (amax) of earlier steps, so quantizing needs no pass over the tensor
// first. With amax the history's maximum (or its newest entry), scale = max_finite / amax / 2^margin:
// the largest value seen maps just inside the format. A zero or non-finite amax (nothing seen
// yet, or an overflow upstream) keeps the previous scale.
FT_HD float fp8_next_scale(float amax, float previous, Fp8Format f, int margin) {
  if (!(amax > 0.0f) || !std::isfinite(amax)) return previous;
  const float scale = fp8_spec(f).max_finite / amax / ldexpf(1.0f, margin);
  return std::isfinite(scale) ? scale : previous;
}

}  // namespace ft::math
