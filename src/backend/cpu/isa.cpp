#include "backend/cpu/isa.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdlib>
#include <iterator>

#include "fasttrain/error.h"

namespace ft::cpu {
namespace {

constexpr const char* kNames[] = {"generic", "avx2", "avx512", "avx512_bf16", "amx"};
static_assert(std::size(kNames) == std::size(kCpuIsaLevels), "one name per CpuIsa level");

}  // namespace

const char* cpu_isa_name(CpuIsa isa) { return kNames[static_cast<int>(isa)]; }

std::optional<CpuIsa> parse_cpu_isa(std::string_view name) {
  for (CpuIsa isa : kCpuIsaLevels)
    if (name == cpu_isa_name(isa)) return isa;
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
  const char* env = std::getenv("FASTTRAIN_CPU_ISA");
  if (env == nullptr || *env == '\0') return detected;
  const std::optional<CpuIsa> wanted = parse_cpu_isa(env);
  FT_CHECK(wanted.has_value(), "FASTTRAIN_CPU_ISA: expected generic, avx2, avx512, avx512_bf16 or amx, found '", env,
           "'");
  FT_CHECK(*wanted <= detected, "FASTTRAIN_CPU_ISA: ", env, " is above what this CPU runs (", cpu_isa_name(detected),
           ")");
  return *wanted;
}

}  // namespace ft::cpu
