#include "backend/cuda/cudnn_library.h"

#include "backend/shared_library.h"

namespace ft::cuda {

const CudnnLibrary& cudnn() {
  static const CudnnLibrary library = [] {
    // The soname first, as a link-time dependency would be found; then the file this build
    // linked against (FT_CUDNN_FILE, set by CMake).
    void* handle = backend::open_shared_library("cuDNN", {FT_CUDNN_SONAME, FT_CUDNN_FILE});
    CudnnLibrary l;
#define FT_LIBRARY_RESOLVE(f) l.f = reinterpret_cast<decltype(l.f)>(backend::library_symbol(handle, "cuDNN", #f));
    FT_CUDNN_FUNCTIONS(FT_LIBRARY_RESOLVE)
#undef FT_LIBRARY_RESOLVE
    return l;
  }();
  return library;
}

}  // namespace ft::cuda
