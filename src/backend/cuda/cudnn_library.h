// cuDNN, loaded on first use (backend/shared_library.h): conv.cpp calls cudnn().cudnnConvolutionForward(...)
// where it would call cudnnConvolutionForward(...). Entries keep the library's own names and types
// (decltype of their declarations in cudnn.h). libcudnn.so.9 is a small front that opens its
// engine libraries from its own folder when first asked; loading it here changes nothing there.
#pragma once
#include <cudnn.h>

#include <mutex>
#include <string>

#include "backend/shared_library.h"

#define FT_CUDNN_FUNCTIONS(X)                           \
  X(cudnnBackendCreateDescriptor)                       \
  X(cudnnBackendDestroyDescriptor)                      \
  X(cudnnBackendExecute)                                \
  X(cudnnBackendFinalize)                               \
  X(cudnnBackendGetAttribute)                           \
  X(cudnnBackendSetAttribute)                           \
  X(cudnnConvolutionBackwardData)                       \
  X(cudnnConvolutionBackwardFilter)                     \
  X(cudnnConvolutionForward)                            \
  X(cudnnCreate)                                        \
  X(cudnnCreateConvolutionDescriptor)                   \
  X(cudnnCreateFilterDescriptor)                        \
  X(cudnnCreateTensorDescriptor)                        \
  X(cudnnDestroyConvolutionDescriptor)                  \
  X(cudnnDestroyFilterDescriptor)                       \
  X(cudnnDestroyTensorDescriptor)                       \
  X(cudnnFindConvolutionBackwardDataAlgorithmEx)        \
  X(cudnnFindConvolutionBackwardFilterAlgorithmEx)      \
  X(cudnnFindConvolutionForwardAlgorithmEx)             \
  X(cudnnGetConvolution2dForwardOutputDim)              \
  X(cudnnGetConvolutionBackwardDataAlgorithmMaxCount)   \
  X(cudnnGetConvolutionBackwardDataAlgorithm_v7)        \
  X(cudnnGetConvolutionBackwardDataWorkspaceSize)       \
  X(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount) \
  X(cudnnGetConvolutionBackwardFilterAlgorithm_v7)      \
  X(cudnnGetConvolutionBackwardFilterWorkspaceSize)     \
  X(cudnnGetConvolutionForwardAlgorithmMaxCount)        \
  X(cudnnGetConvolutionForwardAlgorithm_v7)             \
  X(cudnnGetConvolutionForwardWorkspaceSize)            \
  X(cudnnGetErrorString)                                \
  X(cudnnGetLastErrorString)                            \
  X(cudnnGetVersion)                                    \
  X(cudnnSetConvolution2dDescriptor)                    \
  X(cudnnSetConvolutionGroupCount)                      \
  X(cudnnSetConvolutionMathType)                        \
  X(cudnnSetFilter4dDescriptor)                         \
  X(cudnnSetStream)                                     \
  X(cudnnSetTensor4dDescriptor)

namespace ft::cuda {

FT_LIBRARY_TABLE(CudnnLibrary, FT_CUDNN_FUNCTIONS);

// Loaded and resolved on the first call (thread-safe); throws ft::Error naming the files tried
// when the library is missing.
const CudnnLibrary& cudnn();

// The library's last error message ("" when none).
std::string cudnn_last_error();
// cuDNN's name for `st`, and the library's last error message in parentheses when it has one.
std::string cudnn_status_text(cudnnStatus_t st);

// One cudnnHandle_t per device, created on first use and never destroyed (at exit the CUDA
// context may be gone first). A handle's stream is state set by cudnnSetStream, so setting it and
// issuing the call it is for happen under `mu`: two threads issuing cuDNN work on different
// streams must not interleave the two.
struct CudnnHandle {
  cudnnHandle_t handle = nullptr;
  std::mutex mu;
};
// Throws ft::Error naming `op` and the device when cuDNN cannot create the handle.
CudnnHandle& cudnn_handle(int device, const char* op);

}  // namespace ft::cuda
