// The machine's peak arithmetic rate, measured rather than taken from a data sheet, so that a
// benchmark can say what fraction of it a training step reaches ("peak_fraction" in the bench
// JSON line, shared/BENCH.md). Three instruction streams, each as independent register-only
// chains (latency hidden, no memory traffic), run on every thread of the pool at once:
//
//   fp32:  vfmadd231ps zmm      32 FLOP per instruction (16 lanes x multiply-add)
//   bf16:  vdpbf16ps zmm        64 FLOP per instruction (16 lanes x 2 pairs x multiply-add)
//   AMX:   tdpbf16ps tmm        16384 FLOP per instruction (16 x 16 outputs x 32-long bf16 dot)
//
// GFLOP/s = instructions x FLOP per instruction / wall time, the best of a few short repeats
// (other processes only ever slow a repeat down). The ISA flags go with every figure so that
// rates from CPUs with and without AMX are never compared.
#pragma once
#include <string>

namespace ft::cpu {

struct PeakRates {
  int threads = 0;
  double fp32_gflops = 0;      // vfmadd231ps; 0 without AVX-512
  double bf16_dot_gflops = 0;  // vdpbf16ps; 0 without AVX512-BF16
  double amx_bf16_gflops = 0;  // tdpbf16ps; 0 where AMX is not usable (CPUID, XCR0, Linux permission)
  // The fastest way this machine multiplies bf16 operands: the largest of the three (bf16 may be
  // widened to f32 and run on FMA units, as the packed GEMM does).
  double bf16_gflops() const;
};

// Measured on `threads` threads of the pool the first time it is asked for that count, then
// cached for the process (a few tens of milliseconds per measurement).
const PeakRates& measured_peak_rates(int threads);
// Measures again and keeps, per rate, the larger of the two for the calls that follow.
const PeakRates& remeasure_peak_rates(int threads);

// The CPU's instruction sets that decide bf16 speed, as the PyTorch peer writes them
// (bench/torch_bench.py's cpu_isa): "+"-joined avx2, avx512f, avx512_bf16, avx512_fp16 and
// "amx" when CPUID has both amx_bf16 and amx_tile; "generic" when none.
std::string cpu_isa_flags();

// Which CPU this is, from CPUID: vendor, family and model ("AuthenticAMD family 25 model 17": a
// Zen 4). Machines of one kind with the same ISA flags can differ twofold in FMA rate (Zen 4 and
// Zen 5 both show avx2+avx512f+avx512_bf16), so figures carry this too. "unknown" off x86.
std::string cpu_model_name();
// The vendor of cpu_model_name(), for choices measured on one vendor's CPUs (linalg.h's f32 GEMM).
enum class CpuVendor { Intel, Amd, Other };
CpuVendor cpu_vendor();

}  // namespace ft::cpu
