// The CPU's kernel table. backend::kernels(Device::cpu()) returns the one built for
// selected_cpu_isa(); tests ask for a table per level to check that the variants agree.
#pragma once
#include "backend/cpu/isa.h"
#include "backend/kernels.h"

namespace ft::backend {

const Kernels& cpu_kernels();                     // for selected_cpu_isa(), built on first use
const Kernels& cpu_kernels_for(cpu::CpuIsa isa);  // any level up to detected_cpu_isa()

}  // namespace ft::backend
