// The parsed header of a .npy file, shared by load_npy (which copies the data) and map_npy (which
// maps it). parse_npy_header validates magic, version, descriptor, order, shape, and that the
// data that follows has exactly the size the header states; errors name the file.
#pragma once
#include <cstddef>
#include <string>

#include "fasttrain/tensor.h"

namespace ft {

struct NpyHeader {
  DType dtype;
  Shape shape;
  size_t data_offset;  // where the array's bytes start
};

NpyHeader parse_npy_header(const char* bytes, size_t size, const std::string& path);

}  // namespace ft
