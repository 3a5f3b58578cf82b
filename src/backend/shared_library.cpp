#include "backend/shared_library.h"

#include <dlfcn.h>

#include "fasttrain/error.h"

namespace ft::backend {

void* open_shared_library(const char* what, std::initializer_list<const char*> files) {
  std::string tried;
  std::string last_error;
  for (const char* file : files) {
    if (file == nullptr || *file == '\0') continue;
    // Global like a library linked at start: cuDNN's engine libraries, which it opens itself,
    // resolve against it.
    if (void* handle = dlopen(file, RTLD_NOW | RTLD_GLOBAL)) return handle;
    const char* err = dlerror();
    last_error = err != nullptr ? err : "unknown error";
    tried += (tried.empty() ? "" : ", ") + std::string(file);
  }
  FT_FAIL(what, " could not be loaded (tried ", tried, "): ", last_error);
}

void* library_symbol(void* library, const char* what, const char* symbol) {
  dlerror();
  void* address = dlsym(library, symbol);
  FT_CHECK(address != nullptr, what, ": the loaded library has no ", symbol,
           " (it is older than the one this build was compiled against)");
  return address;
}

}  // namespace ft::backend
