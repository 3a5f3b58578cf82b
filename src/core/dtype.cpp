#include "fasttrain/dtype.h"

#include "fasttrain/error.h"

namespace ft {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::F64: return 8;
    case DType::BF16: return 2;
    case DType::F16: return 2;
    case DType::I32: return 4;
    case DType::I64: return 8;
    case DType::U8: return 1;
    case DType::Bool: return 1;
  }
  FT_FAIL("dtype_size: invalid dtype code ", static_cast<int>(t));
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::F64: return "f64";
    case DType::BF16: return "bf16";
    case DType::F16: return "f16";
    case DType::I32: return "i32";
    case DType::I64: return "i64";
    case DType::U8: return "u8";
    case DType::Bool: return "bool";
  }
  return "invalid";
}

DType dtype_from_name(const std::string& n) {
  if (n == "f32" || n == "float32" || n == "float") return DType::F32;
  if (n == "f64" || n == "float64" || n == "double") return DType::F64;
  if (n == "bf16" || n == "bfloat16") return DType::BF16;
  if (n == "f16" || n == "float16" || n == "half") return DType::F16;
  if (n == "i32" || n == "int32") return DType::I32;
  if (n == "i64" || n == "int64") return DType::I64;
  if (n == "u8" || n == "uint8") return DType::U8;
  if (n == "bool") return DType::Bool;
  FT_FAIL("unknown dtype '", n, "': expected one of f32, f64, bf16, f16, i32, i64, u8, bool");
}

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  auto category = [](DType t) { return t == DType::Bool ? 0 : is_integral(t) ? 1 : 2; };
  int ca = category(a), cb = category(b);
  if (ca != cb) return ca > cb ? a : b;
  if (ca == 2) {
    if (a == DType::F64 || b == DType::F64) return DType::F64;
    if (a == DType::F32 || b == DType::F32) return DType::F32;
    return DType::F32;  // bf16 with f16
  }
  // integers: u8 < i32 < i64
  auto rank = [](DType t) { return t == DType::U8 ? 0 : t == DType::I32 ? 1 : 2; };
  return rank(a) > rank(b) ? a : b;
}

// IEEE binary16 conversions with round-to-nearest-even, subnormals, infinities and NaN.
uint16_t f16::from_float_software(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow (>= 65520) -> inf
  if (abs < 0x38800000u) {                                               // below 2^-14: subnormal or zero
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);           // < 2^-25 rounds to zero
    // value = mant * 2^(exp-150); f16 subnormals count units of 2^-24, so shift right by 126-exp.
    uint32_t exp = abs >> 23;
    uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    uint32_t s = 126 - exp;
    uint32_t r = mant >> s;
    uint32_t rem = mant & ((1u << s) - 1);
    uint32_t half = 1u << (s - 1);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return static_cast<uint16_t>(sign | r);
  }
  uint32_t r = abs - 0x38000000u;  // rebias exponent 127 -> 15 (shifted by 13)
  uint32_t mant_rest = r & 0x1fffu;
  r >>= 13;
  if (mant_rest > 0x1000u || (mant_rest == 0x1000u && (r & 1u))) ++r;
  return static_cast<uint16_t>(sign | r);
}

float f16::to_float_software(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      bits = sign | ((127 - 15 - e) << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

}  // namespace ft
