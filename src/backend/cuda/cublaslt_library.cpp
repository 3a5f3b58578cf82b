#include "backend/cuda/cublaslt_library.h"

#include "backend/shared_library.h"

namespace ft::cuda {

const CublasLtLibrary& cublaslt() {
  // The soname first, as a link-time dependency would be found; then the file this build
  // linked against (FT_CUBLASLT_FILE, set by CMake).
  static const CublasLtLibrary library =
      FT_LIBRARY_LOAD(CublasLtLibrary, FT_CUBLASLT_FUNCTIONS, "cuBLASLt", FT_CUBLASLT_SONAME, FT_CUBLASLT_FILE);
  return library;
}

}  // namespace ft::cuda
