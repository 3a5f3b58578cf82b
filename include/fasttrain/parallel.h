// The CPU thread pool (OpenMP underneath). Kernels split work with parallel_for; chunks never
// nest, and the split does not change results that are computed per element.
#pragma once
#include <cstdint>
#include <functional>

namespace ft {

void set_num_threads(int n);  // also sets the BLAS library's thread count
int get_num_threads();
// The count a process starts with (OpenMP's default: OMP_NUM_THREADS or the CPUs it may use),
// whatever set_num_threads() did since: what "all cores" means.
int default_num_threads();

namespace detail {
void parallel_run(int64_t begin, int64_t end, int64_t grain, const std::function<void(int64_t, int64_t)>& f);
bool in_parallel_region();
}  // namespace detail

// Calls f(chunk_begin, chunk_end) over [begin, end) on up to get_num_threads() threads, with at
// least `grain` iterations per chunk. Runs inline when the range is small or already inside a
// parallel region.
template <class F>
void parallel_for(int64_t begin, int64_t end, int64_t grain, F&& f) {
  if (end <= begin) return;
  if (end - begin <= grain || get_num_threads() == 1 || detail::in_parallel_region()) {
    f(begin, end);
    return;
  }
  detail::parallel_run(begin, end, grain, std::function<void(int64_t, int64_t)>(std::forward<F>(f)));
}

}  // namespace ft
