// A bf16 GEMM built on AVX512-BF16's vdpbf16ps (two bf16 products summed into each f32 lane):
//
//   C[m, n] (+)= sum_k A[m, k] * B[k, n] (+ bias[n])     f32 accumulation, f32 or bf16 C
//
// Why it exists: on this AVX512-BF16 CPU without AMX, vdpbf16ps does twice the multiply-adds
// of vfmadd231ps per instruction, while oneDNN 2.6's bf16 matmul and convert-to-f32 + sgemm both
// stay below sgemm's speed, so bf16 training was slower than f32.
//
// How: GotoBLAS-style. B is packed once per call into 32-column strips, k-pair interleaved
// ([k/2][32][2], one zmm per 16 columns per k pair, zero-padded for odd K and the last strip);
// each task packs its block of A rows as [k/2][rows][2] so the pair (A[m,k], A[m,k+1]) is one
// 32-bit broadcast. A 14 x 32 register tile (28 zmm accumulators) runs over the whole K, so C is
// read and written exactly once (accumulate, bias and the bf16 rounding happen at the store).
// Packing reads any element strides, so transposed views need no copy. Work is split over
// (row block, column block) tasks on the project's pool; each C element is one dot product in
// k order computed by one task, so results are bitwise identical for any thread count.
#pragma once
#include <cstdint>

namespace ft::cpu {

// True when the CPU has AVX512-BF16 (and the compiler could build the kernel): gemm_bf16 may run.
bool gemm_bf16_available();

struct GemmBf16Args {
  int64_t M = 0, N = 0, K = 0;
  // A[m, k] = a[m * a_rs + k * a_cs]; B[k, n] = b[k * b_rs + n * b_cs] (bf16 bits, any strides).
  const uint16_t* a = nullptr;
  int64_t a_rs = 0, a_cs = 0;
  const uint16_t* b = nullptr;
  int64_t b_rs = 0, b_cs = 0;
  // C row-major with leading dimension ldc: float* when c_bf16 is false, bf16 bits otherwise.
  void* c = nullptr;
  int64_t ldc = 0;
  bool c_bf16 = false;
  bool accumulate = false;          // C += A B instead of C = A B
  const uint16_t* bias = nullptr;   // optional bf16 [N], unit stride, added to every row
};

// Runs the GEMM, parallel over the thread pool (inline when already inside a parallel region).
// Throws ft::Error when the CPU lacks AVX512-BF16 or the arguments are inconsistent.
void gemm_bf16(const GemmBf16Args& args);

}  // namespace ft::cpu
