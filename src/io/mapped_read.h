// Reading a memory-mapped file that another program truncates while we read it. Touching a page
// of the mapping past the file's new end raises SIGBUS, which would kill the process with no word
// about which file went bad. guarded_read turns that SIGBUS into an ft::Error naming the file: a
// process-wide SIGBUS handler jumps back (siglongjmp) into the guarded call when the faulting
// address lies inside the range this thread is reading; any other SIGBUS goes on to the previous
// handler or the default action. The guard costs a sigsetjmp without a signal-mask save (no
// system call), so per-sample reads can afford it.
#pragma once
#include <cstddef>
#include <string>
#include <type_traits>

namespace ft::io {

namespace detail {
// Runs fn(ctx); false when a SIGBUS inside [begin, begin + size) cut it short.
bool guarded_call(const void* begin, size_t size, void (*fn)(void*), void* ctx);
[[noreturn]] void throw_changed_under_us(const std::string& path, size_t mapped_size);
}  // namespace detail

// Calls read(), which reads the mapping [begin, begin + size) of `path`. A fault abandons read()
// midway, so it must be a plain copy: no allocation, no locks, no objects with destructors (it may
// throw before touching the mapping).
template <class F>
void guarded_read(const std::string& path, const void* begin, size_t size, F&& read) {
  using Fn = std::remove_reference_t<F>;
  if (!detail::guarded_call(
          begin, size, [](void* f) { (*static_cast<Fn*>(f))(); }, &read))
    detail::throw_changed_under_us(path, size);
}

}  // namespace ft::io
