// Measured peak arithmetic rates (see peak_rate.h for the instructions and the FLOP counts).
// The loops are inline assembly so the compiler can neither drop nor reorder the arithmetic, and
// they assemble whatever -march the library is built for; each runs only after the CPU (and for
// AMX the OS) is known to support it.
#include "backend/cpu/peak_rate.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "backend/cpu/isa.h"
#include "fasttrain/parallel.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace ft::cpu {
namespace {

#if defined(__x86_64__)
// Twelve accumulators: more than latency x issue width of FMA units (4 x 2), so the loop runs at
// the throughput limit. Zero operands keep every value finite (no denormal or NaN slow paths).
#define FT_TWELVE(OP) OP(3) OP(4) OP(5) OP(6) OP(7) OP(8) OP(9) OP(10) OP(11) OP(12) OP(13) OP(14)
#define FT_FMA_PS(i) "vfmadd231ps %%zmm1, %%zmm2, %%zmm" #i "\n\t"
#define FT_DP_BF16(i) "vdpbf16ps %%zmm1, %%zmm2, %%zmm" #i "\n\t"
#define FT_CHAIN_LOOP(NAME, BODY)                                                                                     \
  void NAME(long n) {                                                                                                 \
    asm volatile(                                                                                                     \
        "vpxord %%zmm1, %%zmm1, %%zmm1\n\tvpxord %%zmm2, %%zmm2, %%zmm2\n\t"                                          \
        "1:\n\t" FT_TWELVE(BODY) "dec %0\n\tjnz 1b"                                                                   \
        : "+r"(n)                                                                                                     \
        :                                                                                                             \
        : "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", \
          "xmm14", "cc");                                                                                             \
  }
FT_CHAIN_LOOP(fma_ps_loop, FT_FMA_PS)
FT_CHAIN_LOOP(dp_bf16_loop, FT_DP_BF16)

// AMX: tiles 0-5 accumulate C (16 x 16 f32), tile 6 is A (16 rows x 32 bf16), tile 7 is B
// (16 pairs-rows x 16 columns x 2 bf16). Six accumulators cover tdpbf16ps's latency.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64, "ldtilecfg reads 64 bytes");

void amx_loop(long n) {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  asm volatile("ldtilecfg %0" : : "m"(cfg));
  asm volatile(
      "tilezero %%tmm0\n\ttilezero %%tmm1\n\ttilezero %%tmm2\n\ttilezero %%tmm3\n\t"
      "tilezero %%tmm4\n\ttilezero %%tmm5\n\ttilezero %%tmm6\n\ttilezero %%tmm7\n\t"
      "1:\n\t"
      "tdpbf16ps %%tmm7, %%tmm6, %%tmm0\n\ttdpbf16ps %%tmm7, %%tmm6, %%tmm1\n\t"
      "tdpbf16ps %%tmm7, %%tmm6, %%tmm2\n\ttdpbf16ps %%tmm7, %%tmm6, %%tmm3\n\t"
      "tdpbf16ps %%tmm7, %%tmm6, %%tmm4\n\ttdpbf16ps %%tmm7, %%tmm6, %%tmm5\n\t"
      "dec %0\n\tjnz 1b"
      : "+r"(n)
      :
      : "cc");
  asm volatile("tilerelease" ::: "memory");
}
#endif

double thread_cpu_seconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// GFLOP/s of `loop` on `threads` threads at once: `iters` loop trips per thread, each retiring
// `flop_per_iter`. Each thread's rate is taken over its own CPU time, not wall time, so time the
// thread spent descheduled (other processes on a shared machine) does not lower the figure: it is
// the rate of the cores while they are ours. The sum over threads, best of a few repeats after one
// warm-up (which also brings the clocks up).
double measure(void (*loop)(long), long iters, double flop_per_iter, int threads) {
  std::vector<double> rate(static_cast<size_t>(threads));
  auto run_all = [&](long n) {
    parallel_for(0, threads, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const double t0 = thread_cpu_seconds();
        loop(n);
        const double s = thread_cpu_seconds() - t0;
        rate[static_cast<size_t>(i)] = s > 0 ? static_cast<double>(n) * flop_per_iter / s / 1e9 : 0;
      }
    });
  };
  run_all(iters / 4);
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    run_all(iters);
    double sum = 0;
    for (double r : rate) sum += r;
    best = std::max(best, sum);
  }
  return best;
}

PeakRates measure_all(int threads) {
  PeakRates r;
  r.threads = threads;
#if defined(__x86_64__)
  // A few milliseconds per repeat at several G instructions per second.
  const CpuIsa isa = detected_cpu_isa();
  if (isa >= CpuIsa::Avx512) r.fp32_gflops = measure(fma_ps_loop, 2000000, 12.0 * 32, threads);
  if (isa >= CpuIsa::Avx512Bf16) r.bf16_dot_gflops = measure(dp_bf16_loop, 2000000, 12.0 * 64, threads);
  if (isa >= CpuIsa::Amx) r.amx_bf16_gflops = measure(amx_loop, 50000, 6.0 * 16 * 16 * 32 * 2, threads);
#endif
  return r;
}

}  // namespace

double PeakRates::bf16_gflops() const { return std::max({fp32_gflops, bf16_dot_gflops, amx_bf16_gflops}); }

namespace {

std::mutex g_rates_mu;
std::map<int, std::unique_ptr<PeakRates>> g_rates;  // by thread count

}  // namespace

const PeakRates& measured_peak_rates(int threads) {
  std::lock_guard<std::mutex> lock(g_rates_mu);
  auto& slot = g_rates[std::max(threads, 1)];
  if (!slot) slot = std::make_unique<PeakRates>(measure_all(std::max(threads, 1)));
  return *slot;
}

const PeakRates& remeasure_peak_rates(int threads) {
  const PeakRates again = measure_all(std::max(threads, 1));
  std::lock_guard<std::mutex> lock(g_rates_mu);
  auto& slot = g_rates[std::max(threads, 1)];
  if (!slot) slot = std::make_unique<PeakRates>(again);
  slot->fp32_gflops = std::max(slot->fp32_gflops, again.fp32_gflops);
  slot->bf16_dot_gflops = std::max(slot->bf16_dot_gflops, again.bf16_dot_gflops);
  slot->amx_bf16_gflops = std::max(slot->amx_bf16_gflops, again.amx_bf16_gflops);
  return *slot;
}

std::string cpu_isa_flags() {
  std::string s;
  auto add = [&](bool on, const char* name) {
    if (!on) return;
    if (!s.empty()) s += '+';  // appended piecewise: GCC 12 warned (-Wrestrict, falsely) on "+" + string
    s += name;
  };
#if defined(__x86_64__)
  // CPUID directly: the bits /proc/cpuinfo shows, and compilers' __builtin_cpu_supports does not
  // know every name (clang 14 lacks avx512fp16).
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_max(0, nullptr) >= 7) {
    __cpuid_count(7, 0, a, b, c, d);
    const unsigned leaf7_ebx = b, leaf7_edx = d;
    __cpuid_count(7, 1, a, b, c, d);
    const unsigned leaf7_1_eax = a;
    add((leaf7_ebx >> 5) & 1, "avx2");
    add((leaf7_ebx >> 16) & 1, "avx512f");
    add((leaf7_1_eax >> 5) & 1, "avx512_bf16");
    add((leaf7_edx >> 23) & 1, "avx512_fp16");
    add(((leaf7_edx >> 22) & 1) && ((leaf7_edx >> 24) & 1), "amx");  // amx_bf16 and amx_tile
  }
#endif
  return s.empty() ? "generic" : s;
}

namespace {
// CPUID leaf 0's vendor string ("AuthenticAMD", "GenuineIntel"); empty off x86 or without CPUID.
std::string cpuid_vendor() {
#if defined(__x86_64__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_max(0, nullptr) < 1) return "";
  __cpuid(0, a, b, c, d);
  char vendor[13] = {};
  std::memcpy(vendor, &b, 4);
  std::memcpy(vendor + 4, &d, 4);
  std::memcpy(vendor + 8, &c, 4);
  return vendor;
#else
  return "";
#endif
}
}  // namespace

std::string cpu_model_name() {
#if defined(__x86_64__)
  const std::string vendor = cpuid_vendor();
  if (vendor.empty()) return "unknown";
  unsigned a = 0, b = 0, c = 0, d = 0;
  __cpuid(1, a, b, c, d);
  // The displayed family and model, as the SDM and AMD's APM define them (and /proc/cpuinfo shows).
  const unsigned base_family = (a >> 8) & 0xf, base_model = (a >> 4) & 0xf;
  const unsigned family = base_family == 0xf ? base_family + ((a >> 20) & 0xff) : base_family;
  const unsigned model = base_family == 0x6 || base_family == 0xf ? (((a >> 16) & 0xf) << 4) | base_model : base_model;
  return vendor + " family " + std::to_string(family) + " model " + std::to_string(model);
#else
  return "unknown";
#endif
}

CpuVendor cpu_vendor() {
  const std::string v = cpuid_vendor();
  return v == "GenuineIntel" ? CpuVendor::Intel : v == "AuthenticAMD" ? CpuVendor::Amd : CpuVendor::Other;
}

}  // namespace ft::cpu
