// Charts drawn as SVG text, for the run report (report.cpp) and the LR finder's curve: line
// plots (linear or log x), a stacked-area plot (memory by category over a step) and horizontal
// bars (time per phase or op). Everything a chart shows is in the text: no script, no external
// font or style, so a page embedding it renders offline and identically everywhere.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ft::report {

// One curve: y against x; points whose x or y is not finite (or x <= 0 on a log axis) are left
// out, so a diverged last loss does not break the line.
struct Series {
  std::string label;
  std::vector<double> x, y;
  std::string color;  // "" picks from the palette by position
  bool dashed = false;
};

// A vertical line at x (a suggested lr, an evaluation), with a dot at y when given.
struct Marker {
  double x = 0;
  std::optional<double> y;
  std::string label;
  std::string color = "#d62728";
};

struct LinePlot {
  std::string title, x_label, y_label;
  bool log_x = false;
  std::vector<Series> series;
  std::vector<Marker> markers;
  // The y axis' span; absent: the finite points' span. Points outside are clipped at the frame.
  std::optional<std::pair<double, double>> y_range;
  int width = 720, height = 360;
};

// Layers stacked bottom to top over a shared x (memory in use by category over a step).
struct StackedArea {
  std::string title, x_label, y_label;
  std::vector<double> x;
  std::vector<std::pair<std::string, std::vector<double>>> layers;  // label, one value per x
  int width = 720, height = 360;
};

// Horizontal bars, longest first as given, each labelled with its value and unit.
struct BarChart {
  std::string title, unit;
  std::vector<std::pair<std::string, double>> bars;
  int width = 720;
};

// Each returns one <svg> element (no XML prolog) to embed in HTML or to write as a file after
// svg_prolog().
std::string line_plot_svg(const LinePlot& plot);
std::string stacked_area_svg(const StackedArea& plot);
std::string bar_chart_svg(const BarChart& chart);
inline constexpr std::string_view svg_prolog = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";

// Text made safe inside XML/HTML elements and attribute values.
std::string escape_xml(std::string_view text);
// A number as it appears in coordinates: two decimals.
std::string coordinate(double v);

}  // namespace ft::report
