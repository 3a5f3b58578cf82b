// SIGINT/SIGTERM during training: the first signal asks the running fit() to save a checkpoint
// and return after the current step; a second one restores the default action and re-raises, so
// an impatient user can still kill a stuck run. The handler only stores to a lock-free atomic
// (async-signal-safe).
#pragma once
#include <atomic>
#include <csignal>

namespace ft::train {

class StopSignalScope {
 public:
  // Routes SIGINT and SIGTERM to `flag` until destruction, then restores the previous handlers.
  explicit StopSignalScope(std::atomic<bool>& flag);
  ~StopSignalScope();
  StopSignalScope(const StopSignalScope&) = delete;
  StopSignalScope& operator=(const StopSignalScope&) = delete;

 private:
  struct sigaction old_int_, old_term_;
  std::atomic<bool>* prev_flag_;
};

}  // namespace ft::train
