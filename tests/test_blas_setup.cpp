#include <gtest/gtest.h>

#include "backend/cpu/blas_setup.h"
#include "fasttrain/fasttrain.h"

// On an AVX-512 machine OpenBLAS must not be left on its generic SSE3 kernels (much slower GEMMs;
// docs/PERF.md).
TEST(BlasSetup, AvoidsGenericKernelsOnAvx512Machines) {
  ft::get_num_threads();  // first use of the thread pool configures BLAS
  std::string core = ft::cpu::blas_core_name();
  std::cout << "OpenBLAS core: " << core << "\n";
  if (__builtin_cpu_supports("avx512f")) {
    EXPECT_NE(core, "Prescott");
  } else {
    GTEST_SKIP() << "no AVX-512 on this CPU; OpenBLAS's own choice (" << core << ") stands";
  }
}
