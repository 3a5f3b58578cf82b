// The live progress line on stderr: "step 350/1000  loss 1.2345  41.2k tokens/s  0:42 < 1:18".
// On a terminal it redraws in place (carriage return) every step, at most 10 times a second,
// with the loss of the last log interval (the loss is only read from the tensors at log
// intervals); otherwise it prints one plain line per log interval.
#pragma once
#include <cstdint>
#include <string>

namespace ft::train {

class ProgressLine {
 public:
  ProgressLine(bool enabled, int64_t first_step, int64_t total_steps, std::string unit);
  // Every step: cheap; redraws on a terminal when due.
  void tick(int64_t step, double elapsed_s);
  // At a log interval, with fresh metrics.
  void log(int64_t step, double loss, double lr, double items_per_s, double elapsed_s);
  // A line of its own (evaluation results), keeping the progress line intact on a terminal.
  void note(const std::string& line);
  // A line the user asked for (the profile's tables, the advisor's findings): printed even when
  // the progress line is off.
  void result(const std::string& line);
  void finish();

 private:
  void draw(int64_t step, double elapsed_s, bool newline);
  bool enabled_, tty_;
  int64_t first_step_, total_;
  std::string unit_;
  double loss_ = -1, lr_ = 0, rate_ = 0, last_draw_ = -1;
  bool drawn_ = false;
};

}  // namespace ft::train
