// map_npy: a .npy array as a tensor over the file's mapping (declared in fasttrain/npy.h).
#include "data/mapped_file.h"
#include "fasttrain/npy.h"
#include "io/npy_header.h"

namespace ft {

Tensor map_npy(const std::string& path) {
  std::shared_ptr<const data::MappedFile> file = data::map_file(path);
  NpyHeader h = parse_npy_header(file->data, file->size, path);
  // The mapping is page-aligned, so this only fails for a header padded to an odd length
  // (NumPy pads to 64 bytes); elements must be naturally aligned to be read through a T*.
  FT_CHECK(h.data_offset % dtype_size(h.dtype) == 0, path, ": array data starts at byte ", h.data_offset,
           ", not aligned to its ", dtype_size(h.dtype), "-byte elements (load_npy reads such files)");
  void* data = file->data + h.data_offset;
  return from_blob(data, h.shape, TensorOptions(h.dtype), [file](void*) mutable { file.reset(); });
}

}  // namespace ft
