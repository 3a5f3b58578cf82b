// safetensors files (the format Hugging Face and PyTorch users exchange weights in):
// 8-byte little-endian header length N, N bytes of JSON {name: {"dtype", "shape",
// "data_offsets": [begin, end]}, "__metadata__": {str: str}}, then the raw little-endian data.
// Implemented in src/io/safetensors.cpp.
#pragma once
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "fasttrain/tensor.h"

namespace ft {

// Name -> tensor, in a fixed order (the order tensors were added; files are written in it).
using TensorMap = std::vector<std::pair<std::string, Tensor>>;

// Writes atomically (temporary file, fsync, rename). Tensors are written contiguous, CPU, in
// their own dtype (F32, F64, BF16, F16, I32, I64, U8, BOOL). Metadata goes in "__metadata__";
// a per-tensor checksum is added there ("crc32c.<name>") so corruption is detected on load.
void save_safetensors(const std::string& path, const TensorMap& tensors,
                      const std::map<std::string, std::string>& metadata = {});

struct SafetensorsFile {
  TensorMap tensors;
  std::map<std::string, std::string> metadata;
};
// Reads and validates: header length within the file, JSON well formed, known dtypes, shapes
// that match byte ranges, ranges inside the data section, contiguous and non-overlapping, and
// checksums when present. Every error names the file and the offending tensor/value.
SafetensorsFile load_safetensors(const std::string& path);

}  // namespace ft
