// FT_HD marks a formula that both the CPU kernels and (compiled by nvcc) the CUDA kernels call,
// so headers of per-element math can be shared without pulling in each other.
#pragma once

#ifndef FT_HD
#ifdef __CUDACC__
#define FT_HD __host__ __device__ __forceinline__
#else
// Always inlined: a formula called inside a vectorised loop must not become a call per element.
#define FT_HD inline __attribute__((always_inline))
#endif
#endif
