// Progress line (progress.h).
#include "train/progress.h"

#include <unistd.h>

#include <cstdio>

namespace ft::train {

namespace {

std::string clock_text(double s) {
  const long t = static_cast<long>(s + 0.5);
  char buf[32];
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
  else
    std::snprintf(buf, sizeof buf, "%ld:%02ld", t / 60, t % 60);
  return buf;
}

std::string rate_text(double r) {
  char buf[32];
  if (r >= 1e6)
    std::snprintf(buf, sizeof buf, "%.2fM", r / 1e6);
  else if (r >= 1e3)
    std::snprintf(buf, sizeof buf, "%.1fk", r / 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.0f", r);
  return buf;
}

}  // namespace

ProgressLine::ProgressLine(bool enabled, int64_t first_step, int64_t total_steps, std::string unit)
    : enabled_(enabled),
      tty_(isatty(STDERR_FILENO) == 1),
      first_step_(first_step),
      total_(total_steps),
      unit_(std::move(unit)) {}

void ProgressLine::draw(int64_t step, double elapsed_s, bool newline) {
  const int64_t done = step - first_step_;
  const double eta = done > 0 ? elapsed_s / done * (total_ - step) : 0;
  // Until the first log interval there is no loss, rate or lr to show yet.
  const bool logged = loss_ >= 0;
  char lr[16];
  std::snprintf(lr, sizeof lr, "%.2e", lr_);
  std::fprintf(stderr, "%sstep %lld/%lld  loss %s  lr %s  %s %s/s  %s < %s%s", tty_ ? "\r\033[K" : "",
               static_cast<long long>(step), static_cast<long long>(total_),
               logged ? std::to_string(loss_).substr(0, 6).c_str() : "-", logged ? lr : "-",
               logged ? rate_text(rate_).c_str() : "-", unit_.c_str(), clock_text(elapsed_s).c_str(),
               clock_text(eta).c_str(), newline ? "\n" : "");
  std::fflush(stderr);
  drawn_ = !newline;
}

void ProgressLine::tick(int64_t step, double elapsed_s) {
  if (!enabled_ || !tty_ || elapsed_s - last_draw_ < 0.1) return;
  last_draw_ = elapsed_s;
  draw(step, elapsed_s, false);
}

void ProgressLine::log(int64_t step, double loss, double lr, double items_per_s, double elapsed_s) {
  loss_ = loss;
  lr_ = lr;
  rate_ = items_per_s;
  if (!enabled_) return;
  last_draw_ = elapsed_s;
  draw(step, elapsed_s, !tty_);
}

void ProgressLine::note(const std::string& line) {
  if (enabled_) result(line);
}

void ProgressLine::result(const std::string& line) {
  std::fprintf(stderr, "%s%s\n", tty_ && drawn_ ? "\r\033[K" : "", line.c_str());
  std::fflush(stderr);
  drawn_ = false;
}

void ProgressLine::finish() {
  if (enabled_ && tty_ && drawn_) std::fputc('\n', stderr);
  drawn_ = false;
}

}  // namespace ft::train
