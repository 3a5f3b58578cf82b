#include "fasttrain/parallel.h"

#include <omp.h>

#include <algorithm>
#include <atomic>

#include "backend/cpu/blas_setup.h"

extern "C" void openblas_set_num_threads(int);

namespace ft {
namespace {
std::atomic<int> g_threads{0};
}

int default_num_threads() {
  // OpenMP's count before anything set one (OMP_NUM_THREADS, the CPUs this process may use).
  static const int initial = [] {
    cpu::ensure_blas_kernels();
    return omp_get_max_threads();
  }();
  return initial;
}

void set_num_threads(int n) {
  default_num_threads();  // remembered before this changes OpenMP's count
  if (n < 1) n = 1;
  cpu::ensure_blas_kernels();
  g_threads = n;
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}

int get_num_threads() {
  int n = g_threads.load(std::memory_order_relaxed);
  if (n == 0) {
    cpu::ensure_blas_kernels();
    n = omp_get_max_threads();
    g_threads = n;
  }
  return n;
}

namespace detail {

bool in_parallel_region() { return omp_in_parallel(); }

void parallel_run(int64_t begin, int64_t end, int64_t grain, const std::function<void(int64_t, int64_t)>& f) {
  int64_t n = end - begin;
  int64_t max_chunks = (n + grain - 1) / std::max<int64_t>(grain, 1);
  int threads = static_cast<int>(std::min<int64_t>(get_num_threads(), max_chunks));
  // Exceptions must not escape an OpenMP region: keep the first and rethrow on the caller.
  std::exception_ptr error;
#pragma omp parallel num_threads(threads)
  {
    int t = omp_get_thread_num();
    int nt = omp_get_num_threads();
    int64_t chunk = (n + nt - 1) / nt;
    int64_t b = begin + t * chunk, e = std::min(end, b + chunk);
    if (b < e) {
      try {
        f(b, e);
      } catch (...) {
#pragma omp critical
        if (!error) error = std::current_exception();
      }
    }
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace detail
}  // namespace ft
