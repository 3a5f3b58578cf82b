// What the engine knows about the CPU it runs on, for tools and reports (bench, tune, the
// advisor): the model, the instruction sets, the level the kernel table was built for, and the
// path bf16/f16 matrix products take. Implemented by the CPU backend (src/backend/cpu/machine.cpp).
#pragma once
#include <string>

namespace ft {

struct CpuInfo {
  std::string model;      // /proc/cpuinfo's model name ("AMD EPYC ...")
  std::string isa_flags;  // the instruction sets found ("avx2+avx512f+avx512_bf16")
  // The highest kernel-table level this CPU and OS run: generic, avx2, avx512, avx512_bf16 or amx
  // (FASTTRAIN_CPU_ISA may lower the one in use; `fasttrain switches` shows it).
  std::string detected_level;
  bool bf16_hardware = false;  // the detected level multiplies bf16 in hardware (avx512_bf16, amx)
};
CpuInfo cpu_info();

// The path bf16/f16 matrix products take on this CPU: "onednn" or "packed" (decided once per
// process, the first time a product or this asks; it may time both).
std::string half_gemm_path();

}  // namespace ft
