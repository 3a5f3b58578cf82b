// Dtype dispatch: runs a generic lambda body with `scalar_t` bound to the C++ type of a dtype.
// Usage: FT_DISPATCH_FLOATING(t.dtype(), "exp", [&] { kernel<scalar_t>(...); });
#pragma once
#include "fasttrain/dtype.h"
#include "fasttrain/error.h"

#define FT_DISPATCH_CASE(DT, TYPE, ...) \
  case ::ft::DType::DT: {               \
    using scalar_t = TYPE;              \
    return __VA_ARGS__();               \
  }

#define FT_DISPATCH_FLOATING(DTYPE, NAME, ...)                                                             \
  [&] {                                                                                                    \
    switch (DTYPE) {                                                                                       \
      FT_DISPATCH_CASE(F32, float, __VA_ARGS__)                                                            \
      FT_DISPATCH_CASE(F64, double, __VA_ARGS__)                                                           \
      FT_DISPATCH_CASE(BF16, ::ft::bf16, __VA_ARGS__)                                                      \
      FT_DISPATCH_CASE(F16, ::ft::f16, __VA_ARGS__)                                                        \
      default: FT_FAIL(NAME, ": expected a floating-point tensor, found dtype ", ::ft::dtype_name(DTYPE)); \
    }                                                                                                      \
  }()

#define FT_DISPATCH_ALL(DTYPE, NAME, ...)                            \
  [&] {                                                              \
    switch (DTYPE) {                                                 \
      FT_DISPATCH_CASE(F32, float, __VA_ARGS__)                      \
      FT_DISPATCH_CASE(F64, double, __VA_ARGS__)                     \
      FT_DISPATCH_CASE(BF16, ::ft::bf16, __VA_ARGS__)                \
      FT_DISPATCH_CASE(F16, ::ft::f16, __VA_ARGS__)                  \
      FT_DISPATCH_CASE(I32, int32_t, __VA_ARGS__)                    \
      FT_DISPATCH_CASE(I64, int64_t, __VA_ARGS__)                    \
      FT_DISPATCH_CASE(U8, uint8_t, __VA_ARGS__)                     \
      FT_DISPATCH_CASE(Bool, bool, __VA_ARGS__)                      \
    }                                                                \
    FT_FAIL(NAME, ": invalid dtype code ", static_cast<int>(DTYPE)); \
  }()

#define FT_DISPATCH_INDEX(DTYPE, NAME, ...)                                                                      \
  [&] {                                                                                                          \
    switch (DTYPE) {                                                                                             \
      FT_DISPATCH_CASE(I32, int32_t, __VA_ARGS__)                                                                \
      FT_DISPATCH_CASE(I64, int64_t, __VA_ARGS__)                                                                \
      default: FT_FAIL(NAME, ": expected an index tensor of dtype i64 or i32, found ", ::ft::dtype_name(DTYPE)); \
    }                                                                                                            \
  }()
