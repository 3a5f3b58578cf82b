// Deterministic fault injection for the fault tests (tests/test_faults.cpp) and the soak benchmark
// (bench/soak.sh). Timing luck cannot reliably kill a process between two files of a checkpoint,
// so the engine marks such places with fault::point("name") and the environment variable
// FASTTRAIN_FAULT says where this process should hurt itself:
//
//   FASTTRAIN_FAULT=<action>@<point>[:<n>][,<action>@<point>[:<n>]...]
//
// fires <action> the n-th time (default 1) this process reaches <point>. Actions: kill (SIGKILL),
// term (SIGTERM), int (SIGINT), stop (SIGSTOP: the test changes files, then sends SIGCONT), oom
// (the CPU memory limit drops to what is allocated now, so the next allocation fails). Points:
// data (waiting for a training batch), forward, backward, optimizer, eval, checkpoint-file (a file
// of a checkpoint folder written), checkpoint-commit (every file written, the folder not yet
// renamed), file-rename (any atomically written file fsynced, not yet renamed), load (a
// safetensors file mapped, nothing read yet). docs/RELIABILITY.md lists which test uses which.
//
// Unset, a point costs one relaxed load of a flag; the variable is read once, at start-up. Built
// only where CMake's FASTTRAIN_FAULT_INJECTION is on (it follows FASTTRAIN_TESTS): elsewhere a
// point is nothing, and FASTTRAIN_FAULT set at start-up is an error saying so.
#pragma once
#include <atomic>
#include <string>

namespace ft::fault {

namespace detail {
extern std::atomic<bool> g_armed;
void reached(const char* point, const std::string* what);
}  // namespace detail

// Marks a fault point; `what` (a file name, say) is printed when a fault fires there.
#if FT_FAULT_INJECTION
inline void point(const char* name) {
  if (detail::g_armed.load(std::memory_order_relaxed)) [[unlikely]]
    detail::reached(name, nullptr);
}
inline void point(const char* name, const std::string& what) {
  if (detail::g_armed.load(std::memory_order_relaxed)) [[unlikely]]
    detail::reached(name, &what);
}
#else
inline void point(const char*) {}
inline void point(const char*, const std::string&) {}
#endif

// Replaces the faults armed in this process (in-process tests; the hit counts restart); "" disarms.
// A malformed spec is an ft::Error naming the bad entry.
void arm(const std::string& spec);

}  // namespace ft::fault
