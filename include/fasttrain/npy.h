// NumPy .npy files (format versions 1-3, C order, little-endian) for the engine's dtypes.
// bf16 has no NumPy type; it is written as f32 values and read back with load_npy(path, BF16).
#pragma once
#include <string>

#include "fasttrain/tensor.h"

namespace ft {

// Reads a .npy file into a CPU tensor. Errors name the file and what was wrong (bad magic,
// unsupported dtype descriptor, Fortran order, a header that disagrees with the file size).
Tensor load_npy(const std::string& path);
// Maps a .npy file and returns a CPU tensor over the mapping without copying it (same checks as
// load_npy, plus data aligned to its element size). The tensor keeps the mapping alive; writes to
// it change this process's copy-on-write pages, never the file. Implemented in src/data/npy_mmap.cpp.
Tensor map_npy(const std::string& path);
// Writes a CPU tensor (made contiguous) atomically (atomic_file.h).
void save_npy(const std::string& path, const Tensor& t);

}  // namespace ft
