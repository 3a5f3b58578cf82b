// Learning-rate range test (include/fasttrain/lr_finder.h).
//
// The sweep multiplies the rate by a constant factor each step; the raw loss is noisy, so the
// decision rules read fastai's bias-corrected exponential moving average of it. The suggestion is
// where that curve falls fastest against log(lr) (Lightning's rule), ignoring the first points,
// where the average still mostly reflects the starting loss, and the last one, which is usually
// the divergence itself.
#include "fasttrain/lr_finder.h"

#include "train/lr_find_plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>

#include "fasttrain/atomic_file.h"
#include "fasttrain/error.h"

namespace ft::train {
namespace {

constexpr int64_t kSkipBegin = 10;  // Lightning's suggestion(skip_begin=10, skip_end=1)
constexpr int64_t kSkipEnd = 1;

void validate(const LrFindOptions& o) {
  FT_CHECK(std::isfinite(o.min_lr) && o.min_lr > 0, "lr_find: min_lr must be a finite positive number, found ",
           o.min_lr);
  FT_CHECK(std::isfinite(o.max_lr) && o.max_lr > o.min_lr,
           "lr_find: max_lr must be finite and greater than min_lr = ", o.min_lr, ", found ", o.max_lr);
  FT_CHECK(o.steps >= 2, "lr_find: steps must be >= 2, found ", o.steps);
  FT_CHECK(o.smoothing >= 0 && o.smoothing < 1, "lr_find: smoothing must be in [0, 1), found ", o.smoothing);
  FT_CHECK(std::isfinite(o.divergence) && o.divergence > 1, "lr_find: divergence must be a finite number > 1, found ",
           o.divergence);
}

// Index of the steepest descent of the smoothed loss against log(lr): central differences inside
// the considered range, one-sided at its ends (numpy.gradient's rule). Too short a curve for a
// slope falls back to the lowest smoothed loss.
int64_t steepest_descent(const LrFindResult& r) {
  const int64_t n = static_cast<int64_t>(r.smoothed.size());
  int64_t end = n - kSkipEnd;
  while (end > 0 && !std::isfinite(r.smoothed[end - 1])) --end;  // a non-finite tail has no slope
  const int64_t begin = std::min<int64_t>(kSkipBegin, std::max<int64_t>(0, end - 3));
  if (end - begin < 2) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; ++i)
      if (std::isfinite(r.smoothed[i]) && r.smoothed[i] < r.smoothed[best]) best = i;
    return best;
  }
  int64_t best = begin;
  double best_slope = INFINITY;
  for (int64_t i = begin; i < end; ++i) {
    const int64_t lo = std::max(begin, i - 1), hi = std::min(end - 1, i + 1);
    const double slope = (r.smoothed[hi] - r.smoothed[lo]) / (std::log(r.lrs[hi]) - std::log(r.lrs[lo]));
    if (slope < best_slope) {
      best_slope = slope;
      best = i;
    }
  }
  return best;
}

void check_result(const char* what, const LrFindResult& r) {
  FT_CHECK(!r.lrs.empty(), what, ": the result has no steps");
  FT_CHECK(r.losses.size() == r.lrs.size() && r.smoothed.size() == r.lrs.size(), what,
           ": lrs, losses and smoothed must have the same length, found ", r.lrs.size(), ", ", r.losses.size(), " and ",
           r.smoothed.size());
}

std::string format(const char* fmt, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

}  // namespace

LrFindResult find_lr(const std::function<double(double lr)>& step, const LrFindOptions& options) {
  validate(options);
  FT_CHECK(static_cast<bool>(step), "lr_find: the step function is empty");
  LrFindResult r;
  const double ratio = options.max_lr / options.min_lr;
  const double beta = options.smoothing;
  double average = 0, best = INFINITY, beta_power = 1;
  for (int64_t i = 0; i < options.steps; ++i) {
    const double lr = options.min_lr * std::pow(ratio, static_cast<double>(i) / static_cast<double>(options.steps - 1));
    const double loss = step(lr);
    average = beta * average + (1 - beta) * loss;
    beta_power *= beta;
    const double smoothed = average / (1 - beta_power);
    r.lrs.push_back(lr);
    r.losses.push_back(loss);
    r.smoothed.push_back(smoothed);
    if (!std::isfinite(loss) || (i > 0 && smoothed > options.divergence * best)) {
      r.diverged = true;
      break;
    }
    best = std::min(best, smoothed);
  }
  r.suggestion_index = steepest_descent(r);
  r.suggestion = r.lrs[r.suggestion_index];
  return r;
}

void write_lr_find_csv(const std::string& path, const LrFindResult& result) {
  check_result("write_lr_find_csv", result);
  std::string out = "step,lr,loss,smoothed_loss\n";
  for (size_t i = 0; i < result.lrs.size(); ++i) {
    out += std::to_string(i) + "," + format("%.17g", result.lrs[i]) + "," + format("%.17g", result.losses[i]) + "," +
           format("%.17g", result.smoothed[i]) + "\n";
  }
  write_file_atomically(path, out);
}

LrFindResult read_lr_find_csv(const std::string& path) {
  std::ifstream in(path);
  FT_CHECK(in.good(), path, ": cannot read the LR finder's curve");
  std::string line;
  std::getline(in, line);
  FT_CHECK(line == "step,lr,loss,smoothed_loss", path, ": expected the header step,lr,loss,smoothed_loss, found '",
           line, "'");
  LrFindResult r;
  for (int64_t row = 1; std::getline(in, line); ++row) {
    double step = 0, lr = 0, loss = 0, smoothed = 0;
    char tail = 0;
    // %lf reads "nan" and "inf" as written by %.17g.
    FT_CHECK(std::sscanf(line.c_str(), "%lf,%lf,%lf,%lf%c", &step, &lr, &loss, &smoothed, &tail) == 4, path, ": row ",
             row, ": expected step,lr,loss,smoothed_loss numbers, found '", line, "'");
    r.lrs.push_back(lr);
    r.losses.push_back(loss);
    r.smoothed.push_back(smoothed);
  }
  FT_CHECK(!r.lrs.empty(), path, ": expected at least one row of the curve, found none");
  const double last = r.smoothed.back();
  double best = INFINITY;
  for (size_t i = 0; i + 1 < r.smoothed.size(); ++i) best = std::min(best, r.smoothed[i]);
  r.diverged = !std::isfinite(r.losses.back()) || (r.smoothed.size() > 1 && last > LrFindOptions{}.divergence * best);
  r.suggestion_index = steepest_descent(r);
  r.suggestion = r.lrs[r.suggestion_index];
  return r;
}

// A 720x450 plot: smoothed loss against the lr on a log axis, the suggestion as a dashed line and
// a dot. Non-finite points (a diverged last step) are left out.
void write_lr_find_svg(const std::string& path, const LrFindResult& result) {
  check_result("write_lr_find_svg", result);
  write_file_atomically(path, std::string(report::svg_prolog) + report::line_plot_svg(lr_find_plot(result)));
}

report::LinePlot lr_find_plot(const LrFindResult& result) {
  std::vector<double> lrs, shown;
  for (size_t i = 0; i < result.lrs.size(); ++i)
    if (std::isfinite(result.smoothed[i]) && result.lrs[i] > 0) {
      lrs.push_back(result.lrs[i]);
      shown.push_back(result.smoothed[i]);
    }
  FT_CHECK(!shown.empty(), "write_lr_find_svg: no point with a finite smoothed loss and a positive lr");
  report::LinePlot plot;
  plot.title = "Learning-rate range test";
  plot.x_label = "learning rate (log scale)";
  plot.y_label = "smoothed loss";
  plot.log_x = true;
  plot.height = 450;
  // The loss axis spans the curve before the divergence: the diverging point can be orders of
  // magnitude higher and would flatten everything else; it is drawn leaving the plot (clipped).
  const size_t last = result.diverged && shown.size() > 2 ? shown.size() - 1 : shown.size();
  plot.y_range = std::pair{*std::min_element(shown.begin(), shown.begin() + last),
                           *std::max_element(shown.begin(), shown.begin() + last)};
  plot.series.push_back({"", std::move(lrs), std::move(shown), "#1f77b4", false});
  if (result.suggestion_index >= 0 && static_cast<size_t>(result.suggestion_index) < result.lrs.size() &&
      std::isfinite(result.smoothed[result.suggestion_index]))
    plot.markers.push_back({result.suggestion, result.smoothed[result.suggestion_index],
                            "suggested lr " + format("%.3g", result.suggestion)});
  return plot;
}

}  // namespace ft::train
