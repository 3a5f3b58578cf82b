// fasttrain/machine.h: the CPU backend's facts about this machine, for tools over the public API.
#include "fasttrain/machine.h"

#include "backend/cpu/isa.h"
#include "backend/cpu/linalg.h"
#include "backend/cpu/peak_rate.h"

namespace ft {

CpuInfo cpu_info() {
  // Read once: the model name comes from /proc/cpuinfo, and the CPU does not change.
  static const CpuInfo info = [] {
    CpuInfo i;
    i.model = cpu::cpu_model_name();
    i.isa_flags = cpu::cpu_isa_flags();
    const cpu::CpuIsa detected = cpu::detected_cpu_isa();
    i.detected_level = cpu::cpu_isa_name(detected);
    i.bf16_hardware = detected >= cpu::CpuIsa::Avx512Bf16;
    return i;
  }();
  return info;
}

std::string half_gemm_path() { return cpu::half_gemm_path_name(cpu::half_gemm_path()); }

}  // namespace ft
