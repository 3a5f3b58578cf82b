#include "backend/nccl/nccl_library.h"

#include "backend/shared_library.h"

namespace ft::cuda {

const NcclLibrary& nccl() {
  static const NcclLibrary library = [] {
    // The soname first (the machine's NCCL, or the one PyTorch's wheels carry on LD_LIBRARY_PATH),
    // then the file this build was compiled against (FT_NCCL_FILE, set by CMake).
    void* handle = backend::open_shared_library("NCCL", {"libnccl.so.2", FT_NCCL_FILE});
    NcclLibrary l;
#define FT_LIBRARY_RESOLVE(f) l.f = reinterpret_cast<decltype(l.f)>(backend::library_symbol(handle, "NCCL", #f));
    FT_NCCL_FUNCTIONS(FT_LIBRARY_RESOLVE)
#undef FT_LIBRARY_RESOLVE
    return l;
  }();
  return library;
}

}  // namespace ft::cuda
