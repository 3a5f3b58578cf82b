// Built by scripts/test-install.sh (test install_and_consume) from one command line,
//   c++ -std=c++20 pkgconfig_consumer.cpp $(pkg-config --cflags --libs fasttrain)
// as a user without CMake would. It runs an f32 GEMM through the library and prints which
// OpenBLAS file the process mapped and which threading that build has, for the script to check.
#include <cstdio>
#include <fstream>
#include <string>

#include "fasttrain/fasttrain.h"

extern "C" int openblas_get_parallel(void);  // OpenBLAS: 0 sequential, 1 pthreads, 2 OpenMP

int main() {
  ft::Tensor c = ft::matmul(ft::ones({32, 16}), ft::full({16, 8}, 0.5));
  float total = ft::sum(c).item<float>();
  if (total != 32 * 8 * 16 * 0.5f) {
    std::fprintf(stderr, "matmul gave a wrong result: sum %g\n", total);
    return 1;
  }
  std::ifstream maps("/proc/self/maps");
  std::string line, openblas = "none";
  while (std::getline(maps, line)) {
    if (line.find("/libopenblas") != std::string::npos) {
      openblas = line.substr(line.find('/'));
      break;
    }
  }
  std::printf("openblas %s parallel %d\n", openblas.c_str(), openblas_get_parallel());
}
