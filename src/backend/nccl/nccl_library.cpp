#include "backend/nccl/nccl_library.h"

#include "backend/shared_library.h"

namespace ft::cuda {

const NcclLibrary& nccl() {
  // The soname first (the machine's NCCL, or the one PyTorch's wheels carry on LD_LIBRARY_PATH),
  // then the file this build was compiled against (FT_NCCL_FILE, set by CMake).
  static const NcclLibrary library =
      FT_LIBRARY_LOAD(NcclLibrary, FT_NCCL_FUNCTIONS, "NCCL", "libnccl.so.2", FT_NCCL_FILE);
  return library;
}

}  // namespace ft::cuda
