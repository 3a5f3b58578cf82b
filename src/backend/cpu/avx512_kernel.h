// AVX-512 intrinsics in a library built for any x86-64 level: functions using them carry these
// target attributes and run only after a run-time check of the CPU (isa.h, gemm_half.h). Include
// this instead of <immintrin.h>.
#pragma once

// GCC 12 reports the deliberately undefined lanes inside AVX-512 intrinsics as "maybe
// uninitialized" when they are inlined into target() functions.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#define FT_AVX512_KERNEL __attribute__((target("avx512f,avx512bw,avx512vl")))
#define FT_BF16_KERNEL __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
