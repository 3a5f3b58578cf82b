// fasttrain/machine.h: the CPU backend's facts about this machine, for tools over the public API.
#include "fasttrain/machine.h"

#include "backend/cpu/isa.h"
#include "backend/cpu/linalg.h"
#include "backend/cpu/peak_rate.h"

namespace ft {

CpuInfo cpu_info() {
  CpuInfo info;
  info.model = cpu::cpu_model_name();
  info.isa_flags = cpu::cpu_isa_flags();
  const cpu::CpuIsa detected = cpu::detected_cpu_isa();
  info.detected_level = cpu::cpu_isa_name(detected);
  info.bf16_hardware = detected >= cpu::CpuIsa::Avx512Bf16;
  return info;
}

std::string half_gemm_path() { return cpu::half_gemm_path_name(cpu::half_gemm_path()); }

}  // namespace ft
