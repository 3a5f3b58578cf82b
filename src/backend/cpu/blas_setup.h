// OpenBLAS set-up. OpenBLAS picks its kernels by CPU model name; on a CPU it does not recognise
// (virtual machines often report a generic "Intel Xeon Processor") it falls back to the SSE3
// "Prescott" kernels, several times slower than its AVX-512 ones (docs/PERF.md). The choice is made
// when the library loads, from OPENBLAS_CORETYPE. ensure_blas_kernels() repairs it once per
// process: when OpenBLAS chose a generic core, the user did not set OPENBLAS_CORETYPE, and the CPU
// has AVX-512, it selects the matching AVX-512 core and re-runs OpenBLAS's kernel selection.
#pragma once
#include <string>

namespace ft::cpu {

void ensure_blas_kernels();
std::string blas_core_name();  // e.g. "Cooperlake", "SkylakeX", "Prescott"

}  // namespace ft::cpu
