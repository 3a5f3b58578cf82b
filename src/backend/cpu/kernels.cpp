// Fills the CPU kernel table: every entry of kernel_list.h gets the cpu:: function of the same
// name (a missing one, or one with another signature, fails to compile here), then the entries
// with instruction-set variants are chosen for the level in use. Adding a variant (AMX, say) is
// one line in choose_variants, not an edit of every op.
#include "backend/cpu/kernels.h"

#include <array>
#include <atomic>
#include <memory>
#include <mutex>

#include "backend/cpu/kernel_decls.h"
#include "backend/cpu/linalg.h"
#include "fasttrain/error.h"

namespace ft::backend {
namespace {

void choose_variants(cpu::CpuIsa isa, Kernels& k) {
  // bf16/f16 products: the packed AVX-512 GEMM (widening while packing) when the CPU has
  // AVX-512; oneDNN or widened copies through sgemm otherwise.
  if (isa < cpu::CpuIsa::Avx512) k.matmul = &cpu::matmul_portable;
}

std::unique_ptr<Kernels> make_cpu_kernels(cpu::CpuIsa isa) {
  auto k = std::make_unique<Kernels>(DeviceType::CPU);
#define FT_CPU_KERNEL(name, sig) k->name = &cpu::name;
  FT_KERNELS(FT_CPU_KERNEL)
  FT_KERNELS_OPTIM(FT_CPU_KERNEL)
  FT_KERNELS_FUSED(FT_CPU_KERNEL)
#undef FT_CPU_KERNEL
  choose_variants(isa, *k);
  return k;
}

}  // namespace

// The table of the level selected_cpu_isa() gives now: the switch may be changed in-process
// (tests run the portable variants so), hence a lookup per call, lock-free once a level's table
// exists.
const Kernels& cpu_kernels() { return cpu_kernels_for(cpu::selected_cpu_isa()); }

const Kernels& cpu_kernels_for(cpu::CpuIsa isa) {
  static std::array<std::atomic<const Kernels*>, std::size(cpu::kCpuIsaLevels)> built{};
  std::atomic<const Kernels*>& slot = built[static_cast<size_t>(isa)];
  if (const Kernels* t = slot.load(std::memory_order_acquire)) return *t;
  FT_CHECK(isa <= cpu::detected_cpu_isa(), "cpu kernels for ", cpu::cpu_isa_name(isa), ": this CPU runs up to ",
           cpu::cpu_isa_name(cpu::detected_cpu_isa()));
  static std::mutex mu;
  static std::array<std::unique_ptr<Kernels>, std::size(cpu::kCpuIsaLevels)> tables;
  std::lock_guard<std::mutex> lock(mu);
  auto& t = tables[static_cast<size_t>(isa)];
  if (!t) t = make_cpu_kernels(isa);
  slot.store(t.get(), std::memory_order_release);
  return *t;
}

}  // namespace ft::backend
