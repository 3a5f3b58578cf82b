// Peak arithmetic rate of one core for the instructions the 16-bit GEMM could be built on:
// vfmadd231ps (f32 FMA), vdpbf16ps (bf16 pair dot products, AVX512-BF16) and vfmadd231ph (f16 FMA,
// AVX512-FP16), each as 12 independent register-only chains so latency is hidden and nothing
// touches memory. It answers "can a bf16 GEMM beat the f32 one on this CPU?" without AMX: only if
// vdpbf16ps retires more FLOPs per second than vfmadd231ps. One JSON line per instruction, then
// one saying whether AMX (tdpbf16ps) is usable: CPUID's AMX bits, the OS enabling tile state in
// XCR0, and Linux granting this process the tile data permission (arch_prctl). Last, the
// library's own short measurement that `fasttrain bench` divides by (backend/cpu/peak_rate.h:
// per-thread CPU time, on --threads threads, with the AMX tile rate where AMX is usable).
// Between the two, the f32 GEMM ceiling: a register-blocked 14 x 32 kernel (28 accumulators, per
// k two loads of B and 14 broadcasts of A, the shape OpenBLAS's and oneDNN's AVX-512 sgemm kernels
// take) on packed operands that stay in L1, on every thread at once. No GEMM outruns its inner
// kernel with operands in L1, so this, not the register-only FMA rate the peak fraction divides
// by, is the most a whole product can reach on this machine.
// Usage: instruction_rates [--iters N] [--threads T]   (N x 12 instructions each, default 2e7; T default 1)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "backend/cpu/peak_rate.h"
#include "fasttrain/parallel.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace {

#if defined(__x86_64__)
#define FT_TWELVE(OP) OP(3) OP(4) OP(5) OP(6) OP(7) OP(8) OP(9) OP(10) OP(11) OP(12) OP(13) OP(14)
#define FT_FMA_PS(i) "vfmadd231ps %%zmm1, %%zmm2, %%zmm" #i "\n\t"
#define FT_DP_BF16(i) "vdpbf16ps %%zmm1, %%zmm2, %%zmm" #i "\n\t"
#define FT_FMA_PH(i) "vfmadd231ph %%zmm1, %%zmm2, %%zmm" #i "\n\t"
// Zero operands keep every value finite (no denormal or NaN slow paths).
#define FT_CHAIN_LOOP(BODY)                                                                                           \
  [](long n) {                                                                                                        \
    asm volatile(                                                                                                     \
        "vpxord %%zmm1, %%zmm1, %%zmm1\n\tvpxord %%zmm2, %%zmm2, %%zmm2\n\t"                                          \
        "1:\n\t" FT_TWELVE(BODY) "dec %0\n\tjnz 1b"                                                                   \
        : "+r"(n)                                                                                                     \
        :                                                                                                             \
        : "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", \
          "xmm14");                                                                                                   \
  }

struct Case {
  const char* name;
  bool (*supported)();        // __builtin_cpu_supports wants a literal, hence one lambda per case
  int flops_per_instruction;  // per 512-bit instruction
  void (*run)(long);
};

const Case kCases[] = {
    {"vfmadd231ps", [] { return __builtin_cpu_supports("avx512f") != 0; }, 32, FT_CHAIN_LOOP(FT_FMA_PS)},
    {"vdpbf16ps", [] { return __builtin_cpu_supports("avx512bf16") != 0; }, 64, FT_CHAIN_LOOP(FT_DP_BF16)},
    {"vfmadd231ph", [] { return __builtin_cpu_supports("avx512fp16") != 0; }, 64, FT_CHAIN_LOOP(FT_FMA_PH)},
};

// C[14 x 32] += A[14 x K] B[K x 32], A packed k-major (14 values per k), B packed (32 per k).
constexpr int kMr = 14, kKc = 256;
__attribute__((target("avx512f"), noinline)) void gemm_kernel_14x32(int K, const float* a, const float* b, float* c) {
  __m512 lo[kMr], hi[kMr];
  for (int i = 0; i < kMr; ++i) lo[i] = hi[i] = _mm512_setzero_ps();
  for (int k = 0; k < K; ++k) {
    const __m512 b0 = _mm512_loadu_ps(b + 32 * k), b1 = _mm512_loadu_ps(b + 32 * k + 16);
#pragma GCC unroll 14
    for (int i = 0; i < kMr; ++i) {
      const __m512 av = _mm512_set1_ps(a[kMr * k + i]);
      lo[i] = _mm512_fmadd_ps(av, b0, lo[i]);
      hi[i] = _mm512_fmadd_ps(av, b1, hi[i]);
    }
  }
  for (int i = 0; i < kMr; ++i) {
    _mm512_storeu_ps(c + 32 * i, _mm512_add_ps(_mm512_loadu_ps(c + 32 * i), lo[i]));
    _mm512_storeu_ps(c + 32 * i + 16, _mm512_add_ps(_mm512_loadu_ps(c + 32 * i + 16), hi[i]));
  }
}

// GFLOP/s of all threads together, each running the kernel on its own L1-resident panels.
double gemm_kernel_gflops(long iters, int threads) {
  const long calls = std::max(1L, iters / kKc);
  auto work = [calls] {
    std::vector<float> a(kMr * kKc, 0.5f), b(32 * kKc, 0.25f), c(kMr * 32, 0.f);
    for (long n = 0; n < calls; ++n) gemm_kernel_14x32(kKc, a.data(), b.data(), c.data());
  };
  work();  // warm-up, as for the chains
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> team;
  for (int t = 0; t < threads; ++t) team.emplace_back(work);
  for (std::thread& t : team) t.join();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return 2.0 * kMr * 32 * kKc * static_cast<double>(calls) * threads / s / 1e9;
}

void report_amx() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  __cpuid_count(7, 0, a, b, c, d);
  const unsigned amx_bf16 = (d >> 22) & 1, amx_tile = (d >> 24) & 1;
  unsigned xcr0 = 0;
  if (__get_cpuid_max(0, nullptr) >= 1) {
    unsigned a1, b1, c1, d1;
    __cpuid(1, a1, b1, c1, d1);
    if ((c1 >> 27) & 1) {  // OSXSAVE: xgetbv is allowed
      unsigned hi;
      asm volatile("xgetbv" : "=a"(xcr0), "=d"(hi) : "c"(0));
    }
  }
  const unsigned tile_state = (xcr0 >> 17) & (xcr0 >> 18) & 1;
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  const bool permitted = syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  std::printf(
      "{\"instruction\": \"tdpbf16ps (AMX)\", \"supported\": %s, \"cpuid_amx_bf16\": %u, \"cpuid_amx_tile\": %u, "
      "\"xcr0_tile_state\": %u, \"tile_permission\": %s}\n",
      amx_bf16 && amx_tile && tile_state && permitted ? "true" : "false", amx_bf16, amx_tile, tile_state,
      permitted ? "true" : "false");
}

#endif

}  // namespace

int main(int argc, char** argv) {
  long iters = 20000000;
  int threads = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--iters")) {
      iters = std::atol(argv[i + 1]);
    } else if (!std::strcmp(argv[i], "--threads")) {
      threads = std::atoi(argv[i + 1]);
    } else {
      std::fprintf(stderr, "instruction_rates: unknown option %s\n", argv[i]);
      return 2;
    }
  }
  if (iters < 1 || threads < 1) {
    std::fprintf(stderr, "instruction_rates: expected --iters >= 1 and --threads >= 1, found %ld and %d\n", iters,
                 threads);
    return 2;
  }
#if defined(__x86_64__)
  for (const Case& c : kCases) {
    if (!c.supported()) {
      std::printf("{\"instruction\": \"%s\", \"supported\": false}\n", c.name);
      continue;
    }
    c.run(iters / 10);  // warm-up: clocks up, and an AVX-512 licence change out of the way
    const auto start = std::chrono::steady_clock::now();
    c.run(iters);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double instructions = 12.0 * static_cast<double>(iters);
    std::printf(
        "{\"instruction\": \"%s\", \"supported\": true, \"g_instructions_per_s\": %.2f, \"gflop_per_s\": %.1f}\n",
        c.name, instructions / s / 1e9, instructions * c.flops_per_instruction / s / 1e9);
  }
  if (__builtin_cpu_supports("avx512f"))
    std::printf("{\"kernel\": \"f32 GEMM 14x32, operands in L1\", \"threads\": %d, \"gflop_per_s\": %.1f}\n", threads,
                gemm_kernel_gflops(iters, threads));
  report_amx();
  ft::set_num_threads(threads);
  const ft::cpu::PeakRates& p = ft::cpu::measured_peak_rates(threads);
  std::printf(
      "{\"peak_rates\": \"backend/cpu/peak_rate.h\", \"threads\": %d, \"cpu_isa\": \"%s\", \"fp32_gflops\": %.1f, "
      "\"bf16_dot_gflops\": %.1f, \"amx_bf16_gflops\": %.1f, \"bf16_gflops\": %.1f}\n",
      p.threads, ft::cpu::cpu_isa_flags().c_str(), p.fp32_gflops, p.bf16_dot_gflops, p.amx_bf16_gflops,
      p.bf16_gflops());
  return 0;
#else
  std::fprintf(stderr, "instruction_rates: x86-64 only\n");
  return 2;
#endif
}
