// SVG charts (svg_plot.h). A plot maps data to a frame of `width` x `height` pixels with fixed
// margins for the labels: px = left + (x - x0) / (x1 - x0) * plot_width, and y likewise, flipped.
// Axis ticks are "nice" numbers, 1, 2 or 5 times a power of ten, about five per axis; a log axis
// gets one tick per decade.
#include "report/svg_plot.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <tuple>

#include "fasttrain/error.h"

namespace ft::report {

namespace {

constexpr const char* kPalette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
constexpr size_t kPaletteSize = sizeof kPalette / sizeof kPalette[0];
constexpr double kLeft = 80, kRight = 20, kTop = 40, kBottom = 60;

std::string printf_text(const char* fmt, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

// About `count` ticks over [lo, hi] at a step of 1, 2 or 5 times a power of ten.
std::vector<double> nice_ticks(double lo, double hi, int count) {
  const double raw = (hi - lo) / count, magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  const double residual = raw / magnitude;
  const double step = magnitude * (residual > 5 ? 10 : residual > 2 ? 5 : residual > 1 ? 2 : 1);
  std::vector<double> ticks;
  for (double t = std::ceil(lo / step - 1e-9) * step; t <= hi + step * 1e-9; t += step)
    ticks.push_back(std::abs(t) < step * 1e-9 ? 0.0 : t);
  return ticks;
}

// A span of zero width (one point, a constant curve) widened so the mapping stays finite.
std::pair<double, double> widen(double lo, double hi) {
  if (!(hi - lo > 1e-12 * std::max(1.0, std::abs(lo)))) return {lo - 0.5, hi + 0.5};
  return {lo, hi};
}

struct Frame {
  double width, height, x0, x1, y0, y1;
  bool log_x;
  double plot_width() const { return width - kLeft - kRight; }
  double plot_height() const { return height - kTop - kBottom; }
  double px(double x) const {
    const double v = log_x ? std::log10(x) : x;
    return kLeft + (v - x0) / (x1 - x0) * plot_width();
  }
  double py(double y) const { return kTop + (y1 - y) / (y1 - y0) * plot_height(); }
};

std::string line(double x1, double y1, double x2, double y2, const char* stroke) {
  return "<line x1=\"" + coordinate(x1) + "\" y1=\"" + coordinate(y1) + "\" x2=\"" + coordinate(x2) + "\" y2=\"" +
         coordinate(y2) + "\" stroke=\"" + stroke + "\"/>";
}

std::string text(double x, double y, const char* anchor, const std::string& body, const std::string& extra = "") {
  return "<text x=\"" + coordinate(x) + "\" y=\"" + coordinate(y) + "\" text-anchor=\"" + anchor + "\"" + extra + ">" +
         escape_xml(body) + "</text>";
}

std::string svg_open(const std::string& title, double width, double height) {
  const std::string w = std::to_string(static_cast<int>(width)), h = std::to_string(static_cast<int>(height));
  return "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + w + "\" height=\"" + h + "\" viewBox=\"0 0 " + w + " " +
         h + "\" font-family=\"sans-serif\" font-size=\"12\" role=\"img\">\n<title>" + escape_xml(title) +
         "</title>\n<rect width=\"" + w + "\" height=\"" + h + "\" fill=\"white\"/>\n" +
         text(width / 2, 18, "middle", title, " font-size=\"15\"") + "\n";
}

// Axes, labels, grid and ticks of a frame; the x ticks are decades on a log axis.
std::string axes(const Frame& f, const std::string& x_label, const std::string& y_label) {
  const double left = kLeft, top = kTop, pw = f.plot_width(), ph = f.plot_height();
  std::string s = "<g stroke=\"black\" fill=\"none\">" + line(left, top + ph, left + pw, top + ph, "black") +
                  line(left, top, left, top + ph, "black") + "</g>\n";
  s += text(left + pw / 2, f.height - 15, "middle", x_label) + "\n";
  s += text(18, top + ph / 2, "middle", y_label, " transform=\"rotate(-90 18 " + coordinate(top + ph / 2) + ")\"") +
       "\n<g class=\"x-ticks\">\n";
  std::vector<std::pair<double, std::string>> xticks;
  if (f.log_x) {
    for (double d = std::ceil(f.x0 - 1e-9); d <= f.x1 + 1e-9; d += 1)
      xticks.emplace_back(d, "1e" + std::to_string(static_cast<int>(d)));
  } else {
    for (double t : nice_ticks(f.x0, f.x1, 6)) xticks.emplace_back(t, printf_text("%g", t));
  }
  for (const auto& [v, label] : xticks) {
    const double x = left + (v - f.x0) / (f.x1 - f.x0) * pw;
    s += line(x, top, x, top + ph + 5, "#ddd") + text(x, top + ph + 20, "middle", label) + "\n";
  }
  s += "</g>\n<g class=\"y-ticks\">\n";
  for (double v : nice_ticks(f.y0, f.y1, 5)) {
    const double y = f.py(v);
    s += line(left - 5, y, left + pw, y, "#ddd") + text(left - 8, y + 4, "end", printf_text("%.4g", v)) + "\n";
  }
  return s + "</g>\n";
}

bool usable(double x, double y, bool log_x) { return std::isfinite(x) && std::isfinite(y) && (!log_x || x > 0); }

std::string legend(const std::vector<std::string>& labels, const std::vector<std::string>& colors, double width) {
  std::string s = "<g class=\"legend\">\n";
  double x = width - kRight - 10;
  for (size_t i = labels.size(); i-- > 0;) {
    if (labels[i].empty()) continue;
    const double w = 14 + 7.0 * static_cast<double>(labels[i].size());
    x -= w;
    s += "<rect x=\"" + coordinate(x) + "\" y=\"" + coordinate(kTop - 12) + "\" width=\"10\" height=\"10\" fill=\"" +
         colors[i] + "\"/>" + text(x + 13, kTop - 3, "start", labels[i]) + "\n";
    x -= 10;
  }
  return s + "</g>\n";
}

}  // namespace

std::string escape_xml(std::string_view in) {
  std::string out;
  out.reserve(in.size());
  for (char ch : in) {
    switch (ch) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += ch;
    }
  }
  return out;
}

std::string coordinate(double v) { return printf_text("%.2f", v); }

std::string line_plot_svg(const LinePlot& plot) {
  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
  for (const Series& s : plot.series) {
    FT_CHECK(s.x.size() == s.y.size(), "line_plot_svg: series '", s.label, "' has ", s.x.size(), " x values and ",
             s.y.size(), " y values; expected as many of each");
    for (size_t i = 0; i < s.x.size(); ++i) {
      if (!usable(s.x[i], s.y[i], plot.log_x)) continue;
      const double x = plot.log_x ? std::log10(s.x[i]) : s.x[i];
      x0 = std::min(x0, x), x1 = std::max(x1, x);
      y0 = std::min(y0, s.y[i]), y1 = std::max(y1, s.y[i]);
    }
  }
  FT_CHECK(x0 <= x1, "line_plot_svg: '", plot.title, "' has no point with finite coordinates");
  std::tie(x0, x1) = widen(x0, x1);
  std::tie(y0, y1) = widen(y0, y1);
  if (plot.y_range) {
    std::tie(y0, y1) = widen(plot.y_range->first, plot.y_range->second);
  } else {  // a margin of 5% so that a flat line (a floor, a constant lr) does not hide in the frame
    const double pad = (y1 - y0) * 0.05;
    y0 -= pad, y1 += pad;
  }
  const Frame f{double(plot.width), double(plot.height), x0, x1, y0, y1, plot.log_x};

  std::string s = svg_open(plot.title, f.width, f.height) + axes(f, plot.x_label, plot.y_label);
  // Each plot gets its own clip id: several plots share one HTML page.
  static std::atomic<int> next_clip{0};
  const std::string clip = "plot-area-" + std::to_string(next_clip++);
  s += "<clipPath id=\"" + clip + "\"><rect x=\"" + coordinate(kLeft) + "\" y=\"" + coordinate(kTop) + "\" width=\"" +
       coordinate(f.plot_width()) + "\" height=\"" + coordinate(f.plot_height()) + "\"/></clipPath>\n";
  std::vector<std::string> labels, colors;
  for (size_t k = 0; k < plot.series.size(); ++k) {
    const Series& series = plot.series[k];
    const std::string color = series.color.empty() ? kPalette[k % kPaletteSize] : series.color;
    labels.push_back(series.label);
    colors.push_back(color);
    s += "<polyline class=\"series\" clip-path=\"url(#" + clip + ")\" fill=\"none\" stroke=\"" + color +
         "\" stroke-width=\"2\"" + (series.dashed ? " stroke-dasharray=\"6,4\"" : "") + " points=\"";
    bool first = true;
    for (size_t i = 0; i < series.x.size(); ++i) {
      if (!usable(series.x[i], series.y[i], plot.log_x)) continue;
      if (!first) s += ' ';
      s += coordinate(f.px(series.x[i])) + "," + coordinate(f.py(series.y[i]));
      first = false;
    }
    s += "\"/>\n";
  }
  for (const Marker& m : plot.markers) {
    if (!usable(m.x, m.y.value_or(0), plot.log_x)) continue;
    const double x = f.px(m.x);
    s += "<line x1=\"" + coordinate(x) + "\" y1=\"" + coordinate(kTop) + "\" x2=\"" + coordinate(x) + "\" y2=\"" +
         coordinate(kTop + f.plot_height()) + "\" stroke=\"" + m.color + "\" stroke-dasharray=\"5,4\"/>\n";
    if (m.y)
      s += "<circle cx=\"" + coordinate(x) + "\" cy=\"" + coordinate(f.py(*m.y)) + "\" r=\"5\" fill=\"" + m.color +
           "\"/>\n";
    if (!m.label.empty())
      s += text(std::min(x + 8, kLeft + f.plot_width() - 150), kTop + 16, "start", m.label,
                " fill=\"" + m.color + "\"") +
           "\n";
  }
  if (plot.series.size() > 1) s += legend(labels, colors, f.width);
  return s + "</svg>\n";
}

std::string stacked_area_svg(const StackedArea& plot) {
  FT_CHECK(!plot.x.empty(), "stacked_area_svg: '", plot.title, "' has no x values");
  std::vector<double> top(plot.x.size(), 0.0);
  for (const auto& [label, values] : plot.layers) {
    FT_CHECK(values.size() == plot.x.size(), "stacked_area_svg: layer '", label, "' has ", values.size(),
             " values; expected one per x (", plot.x.size(), ")");
    for (size_t i = 0; i < values.size(); ++i) top[i] += values[i];
  }
  const auto [x0, x1] =
      widen(*std::min_element(plot.x.begin(), plot.x.end()), *std::max_element(plot.x.begin(), plot.x.end()));
  const auto [y0, y1] = widen(0.0, *std::max_element(top.begin(), top.end()));
  const Frame f{double(plot.width), double(plot.height), x0, x1, y0, y1, false};
  std::string s = svg_open(plot.title, f.width, f.height) + axes(f, plot.x_label, plot.y_label);
  std::vector<double> base(plot.x.size(), 0.0);
  std::vector<std::string> labels, colors;
  for (size_t k = 0; k < plot.layers.size(); ++k) {
    const auto& [label, values] = plot.layers[k];
    const std::string color = kPalette[k % kPaletteSize];
    labels.push_back(label);
    colors.push_back(color);
    // The layer's upper edge left to right, then its lower edge (the layers below) back.
    std::string points;
    for (size_t i = 0; i < plot.x.size(); ++i)
      points += coordinate(f.px(plot.x[i])) + "," + coordinate(f.py(base[i] + values[i])) + " ";
    for (size_t i = plot.x.size(); i-- > 0;)
      points += coordinate(f.px(plot.x[i])) + "," + coordinate(f.py(base[i])) + " ";
    points.pop_back();
    s += "<polygon class=\"layer\" fill=\"" + color + "\" fill-opacity=\"0.85\" stroke=\"none\" points=\"" + points +
         "\"><title>" + escape_xml(label) + "</title></polygon>\n";
    for (size_t i = 0; i < values.size(); ++i) base[i] += values[i];
  }
  return s + legend(labels, colors, f.width) + "</svg>\n";
}

std::string bar_chart_svg(const BarChart& chart) {
  FT_CHECK(!chart.bars.empty(), "bar_chart_svg: '", chart.title, "' has no bars");
  constexpr double label_width = 260, bar_height = 22, gap = 6, value_width = 110;
  const double width = chart.width, height = kTop + chart.bars.size() * (bar_height + gap) + 20;
  double most = 0;
  for (const auto& [label, v] : chart.bars) {
    FT_CHECK(std::isfinite(v) && v >= 0, "bar_chart_svg: bar '", label, "' has value ", v,
             "; expected a finite non-negative value");
    most = std::max(most, v);
  }
  const double span = width - label_width - value_width - kRight;
  std::string s = svg_open(chart.title, width, height);
  for (size_t i = 0; i < chart.bars.size(); ++i) {
    const auto& [label, v] = chart.bars[i];
    const double y = kTop + i * (bar_height + gap), w = most > 0 ? v / most * span : 0;
    std::string name = label.size() > 40 ? label.substr(0, 39) + "…" : label;
    s += text(label_width - 8, y + bar_height * 0.7, "end", name) + "<rect class=\"bar\" x=\"" +
         coordinate(label_width) + "\" y=\"" + coordinate(y) + "\" width=\"" + coordinate(w) + "\" height=\"" +
         coordinate(bar_height) + "\" fill=\"" + kPalette[i % kPaletteSize] + "\"><title>" + escape_xml(label) +
         "</title></rect>" +
         text(label_width + w + 6, y + bar_height * 0.7, "start", printf_text("%.4g", v) + " " + chart.unit) + "\n";
  }
  return s + "</svg>\n";
}

}  // namespace ft::report
