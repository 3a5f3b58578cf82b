#include "backend/cuda/cudnn_library.h"

#include "backend/shared_library.h"

namespace ft::cuda {

const CudnnLibrary& cudnn() {
  // The soname first, as a link-time dependency would be found; then the file this build
  // linked against (FT_CUDNN_FILE, set by CMake).
  static const CudnnLibrary library =
      FT_LIBRARY_LOAD(CudnnLibrary, FT_CUDNN_FUNCTIONS, "cuDNN", FT_CUDNN_SONAME, FT_CUDNN_FILE);
  return library;
}

}  // namespace ft::cuda
