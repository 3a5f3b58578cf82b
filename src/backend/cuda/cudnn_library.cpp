#include "backend/cuda/cudnn_library.h"

#include <cuda_runtime.h>

#include <map>

#include "backend/cuda/cuda_check.h"
#include "backend/shared_library.h"

namespace ft::cuda {

const CudnnLibrary& cudnn() {
  // The soname first, as a link-time dependency would be found; then the file this build
  // linked against (FT_CUDNN_FILE, set by CMake).
  static const CudnnLibrary library =
      FT_LIBRARY_LOAD(CudnnLibrary, FT_CUDNN_FUNCTIONS, "cuDNN", FT_CUDNN_SONAME, FT_CUDNN_FILE);
  return library;
}

std::string cudnn_last_error() {
  char last[4096] = {};
  cudnn().cudnnGetLastErrorString(last, sizeof(last));
  return last;
}

std::string cudnn_status_text(cudnnStatus_t st) {
  std::string text = cudnn().cudnnGetErrorString(st);
  if (const std::string last = cudnn_last_error(); !last.empty()) text += " (" + last + ")";
  return text;
}

CudnnHandle& cudnn_handle(int device, const char* op) {
  static std::mutex mu;
  static std::map<int, CudnnHandle> handles;  // std::map: entries never move
  std::lock_guard<std::mutex> lock(mu);
  CudnnHandle& h = handles[device];
  if (h.handle == nullptr) {
    check(cudaSetDevice(device), op);
    const cudnnStatus_t st = cudnn().cudnnCreate(&h.handle);
    if (st != CUDNN_STATUS_SUCCESS) {
      h.handle = nullptr;
      FT_FAIL(op, ": cuDNN handle creation on cuda:", device, " failed: ", cudnn().cudnnGetErrorString(st),
              " (this build was compiled against cuDNN ", CUDNN_MAJOR, ".", CUDNN_MINOR,
              "; libcudnn.so.9 and its engine libraries must be installed together)");
    }
  }
  return h;
}

}  // namespace ft::cuda
