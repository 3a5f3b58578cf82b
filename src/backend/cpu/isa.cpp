#include "backend/cpu/isa.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdlib>
#include <iterator>

#include "core/switches.h"
#include "fasttrain/error.h"

namespace ft::cpu {

// The names are those FASTTRAIN_CPU_ISA accepts (core/switches.h), one row per level in order.
static_assert(detail::rows_start_in_enum_order(switches::kCpuIsaNames, std::size(kCpuIsaLevels)) &&
                  std::size(switches::kCpuIsaNames) == std::size(kCpuIsaLevels),
              "one name per CpuIsa level, in order");

const char* cpu_isa_name(CpuIsa isa) { return switches::kCpuIsaNames[static_cast<int>(isa)].name; }

std::optional<CpuIsa> parse_cpu_isa(std::string_view name) {
  for (const auto& row : switches::kCpuIsaNames)
    if (name == row.name) return row.value;
  return std::nullopt;
}

AmxSupport amx_support() {
  AmxSupport s;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_max(0, nullptr) < 7) return s;
  __cpuid_count(7, 0, a, b, c, d);
  s.cpuid_amx_bf16 = (d >> 22) & 1;
  s.cpuid_amx_tile = (d >> 24) & 1;
  __cpuid(1, a, b, c, d);
  if ((c >> 27) & 1) {  // OSXSAVE: xgetbv may be executed
    unsigned lo = 0, hi = 0;
    asm volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    s.xcr0_tile_state = ((lo >> 17) & 1) && ((lo >> 18) & 1);  // XTILECFG and XTILEDATA
  }
  // Linux hands out the (large) tile state only to processes that ask: ARCH_REQ_XCOMP_PERM.
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  s.tile_permission = s.cpuid_amx_tile && syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  return s;
}

CpuIsa detected_cpu_isa() {
  static const CpuIsa isa = [] {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return CpuIsa::Generic;
    if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
        !__builtin_cpu_supports("avx512vl"))
      return CpuIsa::Avx2;
    if (!__builtin_cpu_supports("avx512bf16")) return CpuIsa::Avx512;
    return amx_support().usable() ? CpuIsa::Amx : CpuIsa::Avx512Bf16;
  }();
  return isa;
}

CpuIsa selected_cpu_isa() {
  const CpuIsa detected = detected_cpu_isa();
  const std::optional<CpuIsa> wanted = switches::cpu_isa.setting();
  if (!wanted) return detected;
  FT_CHECK(*wanted <= detected, switches::cpu_isa.variable(), ": ", cpu_isa_name(*wanted),
           " is above what this CPU runs (", cpu_isa_name(detected), ")");
  return *wanted;
}

}  // namespace ft::cpu
