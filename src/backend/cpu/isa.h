// The CPU instruction-set levels the kernels distinguish, detected once per process. The CPU
// kernel table (cpu/kernels.cpp) is built for one level; FASTTRAIN_CPU_ISA lowers it (never
// raises it past what the CPU and the OS allow), so every variant can be tested on one machine.
#pragma once
#include <optional>
#include <string_view>

namespace ft::cpu {

// Ordered: each level includes the ones before it.
enum class CpuIsa { Generic, Avx2, Avx512, Avx512Bf16, Amx };
inline constexpr CpuIsa kCpuIsaLevels[] = {CpuIsa::Generic, CpuIsa::Avx2, CpuIsa::Avx512, CpuIsa::Avx512Bf16,
                                           CpuIsa::Amx};

const char* cpu_isa_name(CpuIsa isa);  // "generic", "avx2", "avx512", "avx512_bf16", "amx"
std::optional<CpuIsa> parse_cpu_isa(std::string_view name);

// What AMX needs, each part separately: the CPU's CPUID bits, the OS saving tile state (XCR0)
// and Linux granting this process the tile permission.
struct AmxSupport {
  bool cpuid_amx_bf16 = false, cpuid_amx_tile = false, xcr0_tile_state = false, tile_permission = false;
  bool usable() const { return cpuid_amx_bf16 && cpuid_amx_tile && xcr0_tile_state && tile_permission; }
};
AmxSupport amx_support();

// The highest level this CPU and OS run (AMX also needs the kernel's tile permission).
CpuIsa detected_cpu_isa();
// The level the kernel table uses: detected_cpu_isa(), or the switch FASTTRAIN_CPU_ISA
// (core/switches.h: the variable or an in-process override) when that is lower. An unknown name
// or a level above the detected one is an error naming both.
CpuIsa selected_cpu_isa();

}  // namespace ft::cpu
