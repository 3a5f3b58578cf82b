// cuBLASLt, loaded on first use (backend/shared_library.h): matmul.cpp calls cublaslt().cublasLtMatmul(...)
// where it would call cublasLtMatmul(...). Each entry keeps the library's own name and type
// (decltype of its declaration in cublasLt.h), so a call with the wrong arguments fails to compile
// as a direct call would. A function the backend starts to use is one more line in the list.
#pragma once
#include <cublasLt.h>

#include "backend/shared_library.h"

#define FT_CUBLASLT_FUNCTIONS(X)          \
  X(cublasLtCreate)                       \
  X(cublasLtGetStatusName)                \
  X(cublasLtGetStatusString)              \
  X(cublasLtMatmul)                       \
  X(cublasLtMatmulAlgoGetHeuristic)       \
  X(cublasLtMatmulDescCreate)             \
  X(cublasLtMatmulDescSetAttribute)       \
  X(cublasLtMatmulPreferenceCreate)       \
  X(cublasLtMatmulPreferenceDestroy)      \
  X(cublasLtMatmulPreferenceSetAttribute) \
  X(cublasLtMatrixLayoutCreate)           \
  X(cublasLtMatrixLayoutSetAttribute)

namespace ft::cuda {

FT_LIBRARY_TABLE(CublasLtLibrary, FT_CUBLASLT_FUNCTIONS);

// Loaded and resolved on the first call (thread-safe); throws ft::Error naming the files tried
// when the library is missing.
const CublasLtLibrary& cublaslt();

// Shared by the products of matmul.cpp and fp8_matmul.cpp (defined in matmul.cpp):
// Throws ft::Error "matmul: cuBLASLt <what> failed: <status>" unless st is success.
void check_lt(cublasStatus_t st, const char* what);
// The device's cuBLASLt handle (made on first use) and the workspace of a stream on it: kernels
// that split K use it; 32 MiB covers Hopper's largest choices.
inline constexpr size_t kLtWorkspaceBytes = size_t(32) << 20;
cublasLtHandle_t lt_handle(int device);
void* lt_workspace(int device, cudaStream_t stream);
// A heuristic preference allowing that workspace (the caller destroys it).
cublasLtMatmulPreference_t lt_workspace_preference();

}  // namespace ft::cuda
