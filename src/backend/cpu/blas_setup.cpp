#include "backend/cpu/blas_setup.h"

#include <cstdlib>
#include <cstring>
#include <mutex>

extern "C" {
char* openblas_get_corename(void);
void gotoblas_dynamic_init(void);  // exported by OpenBLAS's DYNAMIC_ARCH builds (Debian's)
void gotoblas_dynamic_quit(void);
}

namespace ft::cpu {

std::string blas_core_name() { return openblas_get_corename(); }

void ensure_blas_kernels() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (std::getenv("OPENBLAS_CORETYPE")) return;  // the user's choice wins
    std::string core = blas_core_name();
    bool generic = core == "Prescott" || core == "Nehalem" || core == "Core2" || core == "Katmai";
    if (!generic || !__builtin_cpu_supports("avx512f")) return;
    const char* want = __builtin_cpu_supports("avx512bf16") ? "Cooperlake" : "SkylakeX";
    setenv("OPENBLAS_CORETYPE", want, 0);
    gotoblas_dynamic_quit();
    gotoblas_dynamic_init();
  });
}

}  // namespace ft::cpu
