// Learning-rate range test (include/fasttrain/lr_finder.h).
//
// The sweep multiplies the rate by a constant factor each step; the raw loss is noisy, so the
// decision rules read fastai's bias-corrected exponential moving average of it. The suggestion is
// where that curve falls fastest against log(lr) (Lightning's rule), ignoring the first points,
// where the average still mostly reflects the starting loss, and the last one, which is usually
// the divergence itself.
#include "fasttrain/lr_finder.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
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

// A 720x450 plot: smoothed loss against log10(lr), a tick per decade, five loss ticks, the
// suggestion as a dashed line and a dot. Non-finite points (a diverged last step) are left out.
void write_lr_find_svg(const std::string& path, const LrFindResult& result) {
  check_result("write_lr_find_svg", result);
  constexpr double W = 720, H = 450, left = 80, right = 20, top = 40, bottom = 60;
  const double pw = W - left - right, ph = H - top - bottom;
  std::vector<size_t> shown;
  for (size_t i = 0; i < result.lrs.size(); ++i)
    if (std::isfinite(result.smoothed[i]) && result.lrs[i] > 0) shown.push_back(i);
  FT_CHECK(!shown.empty(), "write_lr_find_svg: no point with a finite smoothed loss and a positive lr");

  // The loss axis spans the curve before the divergence: the diverging point can be orders of
  // magnitude higher and would flatten everything else; it is drawn leaving the plot (clipped).
  const size_t last = result.diverged && shown.size() > 2 ? shown.size() - 1 : shown.size();
  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
  for (size_t k = 0; k < shown.size(); ++k) {
    const size_t i = shown[k];
    x0 = std::min(x0, std::log10(result.lrs[i]));
    x1 = std::max(x1, std::log10(result.lrs[i]));
    if (k >= last) continue;
    y0 = std::min(y0, result.smoothed[i]);
    y1 = std::max(y1, result.smoothed[i]);
  }
  if (x1 - x0 < 1e-12) {
    x0 -= 0.5;
    x1 += 0.5;
  }
  if (y1 - y0 < 1e-12 * std::max(1.0, std::abs(y0))) {
    y0 -= 0.5;
    y1 += 0.5;
  }
  const auto px = [&](double lr) { return left + (std::log10(lr) - x0) / (x1 - x0) * pw; };
  const auto py = [&](double loss) { return top + (y1 - loss) / (y1 - y0) * ph; };
  const auto num = [](double v) { return format("%.2f", v); };

  std::string s =
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"720\" height=\"450\" viewBox=\"0 0 720 450\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n"
      "<rect width=\"720\" height=\"450\" fill=\"white\"/>\n"
      "<text x=\"360\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">Learning-rate range test</text>\n";
  // Axes and labels.
  s += "<g stroke=\"black\" fill=\"none\"><line x1=\"" + num(left) + "\" y1=\"" + num(top + ph) + "\" x2=\"" +
       num(left + pw) + "\" y2=\"" + num(top + ph) + "\"/><line x1=\"" + num(left) + "\" y1=\"" + num(top) +
       "\" x2=\"" + num(left) + "\" y2=\"" + num(top + ph) + "\"/></g>\n";
  s += "<text x=\"" + num(left + pw / 2) + "\" y=\"" + num(H - 15) +
       "\" text-anchor=\"middle\">learning rate (log scale)</text>\n";
  s += "<text x=\"18\" y=\"" + num(top + ph / 2) + "\" text-anchor=\"middle\" transform=\"rotate(-90 18 " +
       num(top + ph / 2) + ")\">smoothed loss</text>\n";
  // A tick and grid line per decade of lr.
  s += "<g class=\"x-ticks\">\n";
  for (double d = std::ceil(x0 - 1e-9); d <= x1 + 1e-9; d += 1) {
    const double x = left + (d - x0) / (x1 - x0) * pw;
    s += "<line x1=\"" + num(x) + "\" y1=\"" + num(top) + "\" x2=\"" + num(x) + "\" y2=\"" + num(top + ph + 5) +
         "\" stroke=\"#ddd\"/><text x=\"" + num(x) + "\" y=\"" + num(top + ph + 20) + "\" text-anchor=\"middle\">1e" +
         std::to_string(static_cast<int>(d)) + "</text>\n";
  }
  s += "</g>\n<g class=\"y-ticks\">\n";
  for (int k = 0; k <= 4; ++k) {
    const double v = y0 + (y1 - y0) * k / 4, y = py(v);
    s += "<line x1=\"" + num(left - 5) + "\" y1=\"" + num(y) + "\" x2=\"" + num(left + pw) + "\" y2=\"" + num(y) +
         "\" stroke=\"#ddd\"/><text x=\"" + num(left - 8) + "\" y=\"" + num(y + 4) + "\" text-anchor=\"end\">" +
         format("%.4g", v) + "</text>\n";
  }
  s += "</g>\n";
  // The curve.
  s += "<clipPath id=\"plot-area\"><rect x=\"" + num(left) + "\" y=\"" + num(top) + "\" width=\"" + num(pw) +
       "\" height=\"" + num(ph) + "\"/></clipPath>\n";
  s += "<polyline clip-path=\"url(#plot-area)\" fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"2\" points=\"";
  for (size_t k = 0; k < shown.size(); ++k) {
    const size_t i = shown[k];
    s += (k ? " " : "") + num(px(result.lrs[i])) + "," + num(py(result.smoothed[i]));
  }
  s += "\"/>\n";
  // The suggestion.
  if (result.suggestion_index >= 0 && static_cast<size_t>(result.suggestion_index) < result.lrs.size() &&
      std::isfinite(result.smoothed[result.suggestion_index])) {
    const double x = px(result.lrs[result.suggestion_index]), y = py(result.smoothed[result.suggestion_index]);
    s += "<line x1=\"" + num(x) + "\" y1=\"" + num(top) + "\" x2=\"" + num(x) + "\" y2=\"" + num(top + ph) +
         "\" stroke=\"#d62728\" stroke-dasharray=\"5,4\"/>\n<circle cx=\"" + num(x) + "\" cy=\"" + num(y) +
         "\" r=\"5\" fill=\"#d62728\"/>\n<text x=\"" + num(std::min(x + 8, left + pw - 150)) + "\" y=\"" +
         num(top + 16) + "\" fill=\"#d62728\">suggested lr " + format("%.3g", result.suggestion) + "</text>\n";
  }
  s += "</svg>\n";
  write_file_atomically(path, s);
}

}  // namespace ft::train
