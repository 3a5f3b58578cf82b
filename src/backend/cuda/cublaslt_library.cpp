#include "backend/cuda/cublaslt_library.h"

#include "backend/shared_library.h"

namespace ft::cuda {

const CublasLtLibrary& cublaslt() {
  static const CublasLtLibrary library = [] {
    // The soname first, as a link-time dependency would be found; then the file this build
    // linked against (FT_CUBLASLT_FILE, set by CMake).
    void* handle = backend::open_shared_library("cuBLASLt", {FT_CUBLASLT_SONAME, FT_CUBLASLT_FILE});
    CublasLtLibrary l;
#define FT_LIBRARY_RESOLVE(f) l.f = reinterpret_cast<decltype(l.f)>(backend::library_symbol(handle, "cuBLASLt", #f));
    FT_CUBLASLT_FUNCTIONS(FT_LIBRARY_RESOLVE)
#undef FT_LIBRARY_RESOLVE
    return l;
  }();
  return library;
}

}  // namespace ft::cuda
