// Learning-rate range test (Leslie Smith; fastai's lr_find / Lightning's Tuner.lr_find): train
// with an exponentially growing learning rate, stop when the loss diverges, and suggest the rate
// where the smoothed loss falls fastest. The search drives a caller-supplied step, so it does not
// depend on the Trainer; the Trainer saves and restores the model and optimizer around it.
// Implemented in src/train/lr_finder.cpp.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace ft::train {

struct LrFindOptions {
  double min_lr = 1e-7;
  double max_lr = 10;
  int64_t steps = 100;      // lr_i = min_lr * (max_lr/min_lr)^(i/(steps-1))
  double smoothing = 0.98;  // exponential moving average of the loss, bias-corrected
  double divergence = 4.0;  // stop once the smoothed loss exceeds divergence x the best so far
};

struct LrFindResult {
  std::vector<double> lrs;       // one per step taken
  std::vector<double> losses;    // raw loss of each step
  std::vector<double> smoothed;  // bias-corrected moving average
  bool diverged = false;         // stopped early by the divergence rule
  double suggestion = 0;         // lr at the steepest descent of the smoothed curve
  int64_t suggestion_index = -1;
};

// Runs up to options.steps calls of step(lr) -> loss. A non-finite loss counts as divergence.
// Validates the options (0 < min_lr < max_lr, steps >= 2 ...), naming the bad one.
LrFindResult find_lr(const std::function<double(double lr)>& step, const LrFindOptions& options);
// The curve as CSV (step,lr,loss,smoothed_loss) and as an SVG plot (log-scale lr axis, smoothed
// loss, the suggestion marked), both written atomically.
void write_lr_find_csv(const std::string& path, const LrFindResult& result);
void write_lr_find_svg(const std::string& path, const LrFindResult& result);
// The curve back from write_lr_find_csv's file; the suggestion is recomputed and `diverged` set
// when the last point broke the default divergence rule (or its loss is not finite).
LrFindResult read_lr_find_csv(const std::string& path);

}  // namespace ft::train
