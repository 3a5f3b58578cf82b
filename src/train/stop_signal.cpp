// SIGINT/SIGTERM handling for fit() (stop_signal.h).
#include "train/stop_signal.h"

#include <cstring>

namespace ft::train {

namespace {

std::atomic<std::atomic<bool>*> g_flag{nullptr};
static_assert(std::atomic<std::atomic<bool>*>::is_always_lock_free && std::atomic<bool>::is_always_lock_free);

extern "C" void on_stop_signal(int sig) {
  std::atomic<bool>* flag = g_flag.load();
  if (flag == nullptr || flag->exchange(true)) {  // no run, or asked twice: die as the signal says
    std::signal(sig, SIG_DFL);
    std::raise(sig);
  }
}

}  // namespace

StopSignalScope::StopSignalScope(std::atomic<bool>& flag) : prev_flag_(g_flag.exchange(&flag)) {
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_stop_signal;
  // The run goes on after the first signal: a read or write it interrupted must resume, not fail
  // with EINTR (checkpoint files, metrics.csv, the loader's waits).
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &old_int_);
  sigaction(SIGTERM, &sa, &old_term_);
}

StopSignalScope::~StopSignalScope() {
  sigaction(SIGINT, &old_int_, nullptr);
  sigaction(SIGTERM, &old_term_, nullptr);
  g_flag.store(prev_flag_);
}

}  // namespace ft::train
