// Element types. bf16 and f16 are stored as 16-bit patterns and converted to and from f32 with
// round-to-nearest-even (the rounding every accelerator and PyTorch use), so values produced here
// match bit for bit what a GPU kernel or PyTorch would store.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>

namespace ft {

enum class DType : uint8_t { F32, F64, BF16, F16, I32, I64, U8, Bool };
inline constexpr int kNumDTypes = 8;

size_t dtype_size(DType t);
const char* dtype_name(DType t);                 // "f32", "bf16", ...
DType dtype_from_name(const std::string& name);  // throws on an unknown name
inline bool is_floating(DType t) { return t == DType::F32 || t == DType::F64 || t == DType::BF16 || t == DType::F16; }
inline bool is_integral(DType t) { return !is_floating(t); }  // bool counts as integral
// The dtype both operands are converted to by a binary op (PyTorch's promotion lattice:
// bool < integers < floating; within a category the wider type; bf16 with f16 gives f32).
DType promote_types(DType a, DType b);

struct bf16 {
  uint16_t bits = 0;
  bf16() = default;
  bf16(float f) : bits(from_float(f)) {}
  operator float() const { return to_float(bits); }
  // Branch-free (a select, not a jump) so loops converting to bf16 vectorise.
  static uint16_t from_float(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;  // nearest, ties to even
    const uint32_t quiet_nan = (u >> 16) | 0x40u;
    return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
  }
  static float to_float(uint16_t b) {
    uint32_t u = static_cast<uint32_t>(b) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

struct f16 {
  uint16_t bits = 0;
  f16() = default;
  f16(float f) : bits(from_float(f)) {}
  operator float() const { return to_float(bits); }
  // With F16C (x86's half-precision conversion instructions, in every AVX2-era CPU) a conversion
  // is one inlined instruction that rounds to nearest even, as IEEE and the software version do;
  // without it, the exact software conversion. The two agree on every value (tested), NaNs
  // included. Per-element calls into the software version used to be a large share of an
  // fp16-mixed step (docs/PERF.md).
#if defined(__F16C__) && defined(__FLT16_MAX__)
  static uint16_t from_float(float f) {
    const auto h = static_cast<_Float16>(f);
    uint16_t b;
    std::memcpy(&b, &h, 2);
    return b;
  }
  static float to_float(uint16_t b) {
    _Float16 h;
    std::memcpy(&h, &b, 2);
    return static_cast<float>(h);
  }
#else
  static uint16_t from_float(float f) { return from_float_software(f); }
  static float to_float(uint16_t b) { return to_float_software(b); }
#endif
  static uint16_t from_float_software(float f);
  static float to_float_software(uint16_t h);
};

template <class T>
struct dtype_of;
template <>
struct dtype_of<float> {
  static constexpr DType value = DType::F32;
};
template <>
struct dtype_of<double> {
  static constexpr DType value = DType::F64;
};
template <>
struct dtype_of<bf16> {
  static constexpr DType value = DType::BF16;
};
template <>
struct dtype_of<f16> {
  static constexpr DType value = DType::F16;
};
template <>
struct dtype_of<int32_t> {
  static constexpr DType value = DType::I32;
};
template <>
struct dtype_of<int64_t> {
  static constexpr DType value = DType::I64;
};
template <>
struct dtype_of<uint8_t> {
  static constexpr DType value = DType::U8;
};
template <>
struct dtype_of<bool> {
  static constexpr DType value = DType::Bool;
};

// The type arithmetic on T is carried out in: f32 for the 16-bit floats, T otherwise.
template <class T>
struct compute_type {
  using type = T;
};
template <>
struct compute_type<bf16> {
  using type = float;
};
template <>
struct compute_type<f16> {
  using type = float;
};
template <class T>
using compute_t = typename compute_type<T>::type;

}  // namespace ft
