#include "backend/cuda_hooks.h"

namespace ft {

#ifdef FASTTRAIN_WITH_CUDA
namespace cuda {
void register_backend(CudaHooks& hooks);  // src/backend/cuda/runtime.cu
}
#endif

CudaHooks& cuda_hooks() {
  static CudaHooks* hooks = [] {
    auto* h = new CudaHooks();
#ifdef FASTTRAIN_WITH_CUDA
    cuda::register_backend(*h);
#endif
    return h;
  }();
  return *hooks;
}

}  // namespace ft
