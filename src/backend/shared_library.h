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

// A library's table of functions from its list macro LIST(X), which names each function once: one
// pointer per name, typed as the library's own header declares it, so a call with the wrong
// arguments fails to compile as a direct call would (cuda/cublaslt_library.h, cuda/cudnn_library.h,
// nccl/nccl_library.h).
#define FT_LIBRARY_TABLE(Name, LIST) \
  struct Name {                      \
    LIST(FT_LIBRARY_TABLE_ENTRY)     \
  }
#define FT_LIBRARY_TABLE_ENTRY(f) decltype(&::f) f = nullptr;

// The table Name filled from the first of the files (open_shared_library's list) that loads, every
// entry looked up by its name; throws ft::Error naming `what` when a file or a name is missing.
#define FT_LIBRARY_LOAD(Name, LIST, what, ...)                                \
  [] {                                                                        \
    const char* what_ = what;                                                 \
    void* handle_ = ::ft::backend::open_shared_library(what_, {__VA_ARGS__}); \
    Name table_;                                                              \
    LIST(FT_LIBRARY_LOAD_ENTRY)                                               \
    return table_;                                                            \
  }()
#define FT_LIBRARY_LOAD_ENTRY(f) \
  table_.f = reinterpret_cast<decltype(table_.f)>(::ft::backend::library_symbol(handle_, what_, #f));
