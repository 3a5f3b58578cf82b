// A GEMM for 16-bit ("half") float operands — bf16, or IEEE f16 (`format`) — with f32
// accumulation:
//
//   C[m, n] (+)= sum_k A[m, k] * B[k, n] (+ bias[n])     f32 or 16-bit C
//
// Why it exists: bf16 matmul used to convert both operands to f32 in memory and call sgemm, or
// run oneDNN 2.6's bf16 matmul (slower still on this CPU). This GEMM widens bf16 to f32 while
// packing (no converted copies, no allocation per call), reads transposed and strided views
// through its packing, and fuses bias, accumulation and the bf16 rounding into the one store of
// each output tile.
//
// Two inner products (GemmHalfKernel):
// - Fma: packed f32 operands, vfmadd231ps. The default: on the Sapphire-Rapids-class development
//   VM (no AMX) vdpbf16ps does twice the work per instruction but retires so much more slowly
//   that it computes fewer FLOP per second than vfmadd231ps (bench/instruction_rates measures
//   both; figures in docs/PERF.md).
// - Dot: bf16 pairs, vdpbf16ps (AVX512-BF16); kept for CPUs where it runs at the FMA rate.
//   bf16 only.
//
// How: GotoBLAS-style. B is packed once per call into 32-column strips, A per task into 14-row
// strips (Fma: [K][width] f32; Dot: k pairs interleaved, [K/2][width][2], so (A[m,k], A[m,k+1])
// is one 32-bit broadcast), zero-padded at the edges and for odd K. A 14 x 32 register tile
// (28 zmm accumulators) runs over K in blocks of 256 (partial sums of earlier blocks staged in
// f32), so C is read and written exactly once. Threads of the project's pool take (row group,
// column block) items from a shared counter; each C element is one dot product in k order
// computed by one item, so results are bitwise identical for any thread count.
#pragma once
#include <cstdint>

namespace ft::cpu {

enum class GemmHalfKernel { Auto, Dot, Fma };  // Auto = Fma (see above)
enum class HalfFormat { BF16, F16 };
const char* gemm_half_kernel_name(GemmHalfKernel k);

// True when the CPU can run the kernel: AVX-512 (F, BW, VL), plus AVX512-BF16 for Dot.
bool gemm_half_available(GemmHalfKernel k = GemmHalfKernel::Auto);

struct GemmHalfArgs {
  int64_t M = 0, N = 0, K = 0;
  HalfFormat format = HalfFormat::BF16;  // of a, b, bias, and C when c_half
  // A[m, k] = a[m * a_rs + k * a_cs]; B[k, n] = b[k * b_rs + n * b_cs] (16-bit patterns, any strides).
  const uint16_t* a = nullptr;
  int64_t a_rs = 0, a_cs = 0;
  const uint16_t* b = nullptr;
  int64_t b_rs = 0, b_cs = 0;
  // C row-major with leading dimension ldc: float* when c_half is false, 16-bit patterns otherwise.
  void* c = nullptr;
  int64_t ldc = 0;
  bool c_half = false;
  bool accumulate = false;         // C += A B instead of C = A B
  const uint16_t* bias = nullptr;  // optional [N], unit stride, added to every row
  GemmHalfKernel kernel = GemmHalfKernel::Auto;
};

// Runs the GEMM, parallel over the thread pool (inline when already inside a parallel region).
// Throws ft::Error when the CPU cannot run the kernel or the arguments are inconsistent.
void gemm_half(const GemmHalfArgs& args);

}  // namespace ft::cpu
