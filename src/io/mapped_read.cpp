// SIGBUS from a truncated mapping -> ft::Error (mapped_read.h).
#include "io/mapped_read.h"

#include <setjmp.h>
#include <signal.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <mutex>

#include "fasttrain/error.h"

namespace ft::io {

namespace {

struct Guard {
  sigjmp_buf env;
  const char* begin;
  const char* end;
  Guard* outer;
};

// Plain pointer, no constructor: safe to read from the signal handler on any thread.
thread_local Guard* t_guard = nullptr;
struct sigaction g_previous;

void chain(int sig, siginfo_t* info, void* context) {
  if ((g_previous.sa_flags & SA_SIGINFO) && g_previous.sa_sigaction != nullptr) {
    g_previous.sa_sigaction(sig, info, context);
  } else if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN) {
    g_previous.sa_handler(sig);
  } else {
    // Returning retries the faulting access, which now takes the default action (core dump).
    ::signal(sig, SIG_DFL);
  }
}

extern "C" void on_sigbus(int sig, siginfo_t* info, void* context) {
  Guard* g = t_guard;
  const char* addr = static_cast<const char*>(info->si_addr);
  if (g != nullptr && addr >= g->begin && addr < g->end) siglongjmp(g->env, 1);
  chain(sig, info, context);
}

void install_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa;
    std::memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    // SA_NODEFER: SIGBUS is not blocked while the handler runs, so jumping out of it without
    // restoring a saved mask leaves the mask as it was.
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGBUS, &sa, &g_previous);
  });
}

}  // namespace

namespace detail {

bool guarded_call(const void* begin, size_t size, void (*fn)(void*), void* ctx) {
  install_once();
  Guard g;
  g.begin = static_cast<const char*>(begin);
  g.end = g.begin + size;
  g.outer = t_guard;
  if (sigsetjmp(g.env, 0) != 0) {
    t_guard = g.outer;
    return false;
  }
  t_guard = &g;
  try {
    fn(ctx);
  } catch (...) {
    t_guard = g.outer;
    throw;
  }
  t_guard = g.outer;
  return true;
}

void throw_changed_under_us(const std::string& path, size_t mapped_size) {
  struct stat st {};
  std::string now;
  if (::stat(path.c_str(), &st) == 0)
    now = "it now holds " + std::to_string(st.st_size) + " bytes";
  else
    now = std::string("it can no longer be read (") + std::strerror(errno) + ")";
  FT_FAIL(path, ": the file was truncated or rewritten while being read: ", mapped_size, " bytes were mapped, ", now,
          " (did another program change it during the run?)");
}

}  // namespace detail

}  // namespace ft::io
