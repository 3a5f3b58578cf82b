// A shared library opened on first use (dlopen) and its functions looked up by name (dlsym), for
// the CUDA libraries the backend calls but a CPU-only run never needs: cuBLASLt and cuDNN are
// hundreds of megabytes, and a program linked against them maps and relocates them at start
// (about 205 MiB of every CPU process's peak resident memory before this; docs/PERF.md). Each
// library gets a table of function pointers, declared from a list with the library's own names and
// types (cuda/cublaslt_library.h, cuda/cudnn_library.h), filled at the first call that needs it.
#pragma once
#include <initializer_list>
#include <string>

namespace ft::backend {

// Opens the first of `files` that loads: a bare soname goes through the dynamic loader's search
// (LD_LIBRARY_PATH, ld.so.cache); an absolute path is the file this build linked against. Throws
// ft::Error naming `what`, every file tried and the loader's last message when none loads.
void* open_shared_library(const char* what, std::initializer_list<const char*> files);

// The address of `symbol` in `library`; throws ft::Error naming both when it is missing (a
// library older than the one this build was compiled against).
void* library_symbol(void* library, const char* what, const char* symbol);

}  // namespace ft::backend
