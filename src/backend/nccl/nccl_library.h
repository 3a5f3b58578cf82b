// NCCL, loaded on first use (backend/shared_library.h), as cuBLASLt is: the NCCL communicator
// (nccl_communicator.cpp) calls nccl().ncclAllReduce(...) where it would call ncclAllReduce(...).
// A CPU run, or a GPU run of one process, never maps the library.
#pragma once
#include <nccl.h>

#include "backend/shared_library.h"

#define FT_NCCL_FUNCTIONS(X) \
  X(ncclAllGather)           \
  X(ncclAllReduce)           \
  X(ncclBroadcast)           \
  X(ncclCommAbort)           \
  X(ncclCommDestroy)         \
  X(ncclCommGetAsyncError)   \
  X(ncclCommInitRank)        \
  X(ncclCommSplit)           \
  X(ncclGetErrorString)      \
  X(ncclGetUniqueId)         \
  X(ncclGetVersion)          \
  X(ncclGroupEnd)            \
  X(ncclGroupStart)          \
  X(ncclRecv)                \
  X(ncclReduceScatter)       \
  X(ncclSend)

namespace ft::cuda {

FT_LIBRARY_TABLE(NcclLibrary, FT_NCCL_FUNCTIONS);

// Loaded and resolved on the first call (thread-safe); throws ft::Error naming the files tried
// when the library is missing.
const NcclLibrary& nccl();

}  // namespace ft::cuda
