// The run report (fasttrain/report.h) and its SVG charts (src/report/svg_plot.h): what each chart
// draws follows from its data, the page has every section from the run folder's files, and
// headless Chromium renders it without a console message. The screenshot is kept as a test
// artefact (build/<preset>/test-artefacts/report.png).
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include <gtest/gtest.h>

#include "fasttrain/lr_finder.h"
#include "fasttrain/report.h"
#include "fasttrain/train.h"
#include "report/svg_plot.h"
#include "support/expect_error.h"
#include "support/trainer_configs.h"

namespace ft {
namespace {

namespace fs = std::filesystem;
using report::LinePlot;

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream os;
  os << f.rdbuf();
  return os.str();
}

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + what.size())) ++n;
  return n;
}

// The (x, y) pairs of the index-th <polyline> of an SVG.
std::vector<std::pair<double, double>> polyline_points(const std::string& svg, size_t index) {
  size_t at = 0;
  for (size_t k = 0; k <= index; ++k) {
    at = svg.find("<polyline", at);
    if (at == std::string::npos) return {};
    at += 9;
  }
  const size_t begin = svg.find("points=\"", at) + 8, end = svg.find('"', begin);
  std::istringstream in(svg.substr(begin, end - begin));
  std::vector<std::pair<double, double>> points;
  double x = 0, y = 0;
  char comma = 0;
  while (in >> x >> comma >> y) points.emplace_back(x, y);
  return points;
}

TEST(SvgPlot, LinePlotDrawsTheFinitePointsInOrderOnTheirScale) {
  LinePlot plot;
  plot.title = "Loss <&> \"quoted\"";
  plot.x_label = "step";
  plot.y_label = "loss";
  report::Series a;
  a.label = "train";
  a.x = {0, 1, 2, 3, 4};
  a.y = {4, 3, NAN, 2, 1};
  plot.series.push_back(a);
  const std::string svg = report::line_plot_svg(plot);
  EXPECT_NE(svg.find("Loss &lt;&amp;&gt; &quot;quoted&quot;"), std::string::npos) << svg;
  const auto points = polyline_points(svg, 0);
  ASSERT_EQ(points.size(), 4u);  // the NaN is left out
  for (size_t i = 1; i < points.size(); ++i) {
    EXPECT_GT(points[i].first, points[i - 1].first);    // x grows to the right
    EXPECT_GT(points[i].second, points[i - 1].second);  // a falling loss goes down the page
  }
  // Equal steps in x are equal distances on a linear axis: x = 0, 1 | 3, 4.
  EXPECT_NEAR(points[1].first - points[0].first, points[3].first - points[2].first, 0.02);

  // On a log axis, equal ratios are equal distances and x <= 0 cannot be drawn.
  plot.log_x = true;
  plot.series[0].x = {0, 1e-4, 1e-3, 1e-2, 1e-1};
  plot.series[0].y = {1, 1, 2, 3, 4};
  const auto log_points = polyline_points(report::line_plot_svg(plot), 0);
  ASSERT_EQ(log_points.size(), 4u);
  EXPECT_NEAR(log_points[1].first - log_points[0].first, log_points[3].first - log_points[2].first, 0.02);
  EXPECT_NE(report::line_plot_svg(plot).find(">1e-3<"), std::string::npos);

  report::Series bad;
  bad.label = "short";
  bad.x = {1, 2};
  bad.y = {1};
  plot.series.push_back(bad);
  test::expect_error([&] { report::line_plot_svg(plot); }, "series 'short' has 2 x values and 1 y values");
  LinePlot empty;
  empty.title = "nothing";
  test::expect_error([&] { report::line_plot_svg(empty); }, "'nothing' has no point with finite coordinates");
}

TEST(SvgPlot, StackedAreaLayersSumToTheTotalAndBarsScaleWithTheirValues) {
  report::StackedArea area;
  area.title = "Memory";
  area.x = {0, 1, 2};
  area.layers = {{"parameters", {2, 2, 2}}, {"activations", {0, 4, 1}}};
  const std::string svg = report::stacked_area_svg(area);
  EXPECT_EQ(count(svg, "<polygon"), 2u);
  // The top layer's upper edge at x = 1 is the largest total (6): the top of the value range.
  const size_t second = svg.find("points=\"", svg.find("<polygon", svg.find("<polygon") + 1)) + 8;
  std::istringstream in(svg.substr(second, svg.find('"', second) - second));
  double x0, y0, x1, y1, x2, y2;
  char c;
  in >> x0 >> c >> y0 >> x1 >> c >> y1 >> x2 >> c >> y2;
  EXPECT_LT(y1, y0);
  EXPECT_LT(y1, y2);
  area.layers[1].second.pop_back();
  test::expect_error([&] { report::stacked_area_svg(area); },
                     "layer 'activations' has 2 values; expected one per x (3)");

  report::BarChart bars;
  bars.title = "Time per phase";
  bars.unit = "ms";
  bars.bars = {{"forward", 30}, {"backward", 60}, {"optimizer", 15}};
  const std::string b = report::bar_chart_svg(bars);
  std::vector<double> widths;
  std::regex width_re("class=\"bar\" x=\"[0-9.]+\" y=\"[0-9.]+\" width=\"([0-9.]+)\"");
  for (std::sregex_iterator it(b.begin(), b.end(), width_re), end; it != end; ++it)
    widths.push_back(std::stod((*it)[1]));
  ASSERT_EQ(widths.size(), 3u);
  EXPECT_NEAR(widths[0] / widths[1], 0.5, 1e-3);
  EXPECT_NEAR(widths[2] / widths[1], 0.25, 1e-3);
  bars.bars.push_back({"broken", NAN});
  test::expect_error([&] { report::bar_chart_svg(bars); }, "bar 'broken' has value nan");
}

// A short char run with an LR finder curve: the report shows each of them.
class RunReport : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(test::scratch_dir("ft_report", "run"));
    train::TrainerConfig c = test::tiny_char(*dir_);
    c.max_steps = 12;
    c.log_every_n_steps = 2;
    c.eval_every = 4;
    ft::train::set_field(c, "profile", "3:5");
    c.profile.memory_history = true;
    test::BuiltinRun run(c);
    run.fit();
    train::LrFindResult r =
        train::find_lr([](double lr) { return 3.0 - 0.1 * std::log10(lr) + lr * lr; }, {1e-5, 10, 40, 0.9, 4});
    train::write_lr_find_csv(*dir_ + "/lr_find.csv", r);
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
  }
  static std::string* dir_;
};
std::string* RunReport::dir_ = nullptr;

TEST_F(RunReport, HasEverySectionAndChartsTheLoggedRows) {
  const std::string path = report::write_run_report(*dir_);
  EXPECT_EQ(path, *dir_ + "/report.html");
  const std::string html = slurp(path);
  for (const char* id : {"summary", "curves", "step-breakdown", "memory", "lr-finder", "advisor", "config"})
    EXPECT_NE(html.find(std::string("<section id=\"") + id + "\">"), std::string::npos) << id;
  // Self-contained: no script and nothing fetched (the SVG namespace is a name, not a request).
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("src="), std::string::npos);
  EXPECT_EQ(html.find("href="), std::string::npos);
  EXPECT_EQ(count(html, "http"), count(html, "xmlns=\"http://www.w3.org/2000/svg\""));
  // The loss chart's train curve has one point per logged training row (steps 2, 4, ..., 12),
  // after the floor line; the validation curve one per evaluation (4, 8, 12).
  const size_t loss_chart = html.find("<title>Loss</title>");
  ASSERT_NE(loss_chart, std::string::npos);
  const std::string loss_svg = html.substr(loss_chart, html.find("</svg>", loss_chart) - loss_chart);
  EXPECT_EQ(polyline_points(loss_svg, 0).size(), 2u);  // the floor
  EXPECT_EQ(polyline_points(loss_svg, 1).size(), 6u);
  EXPECT_EQ(polyline_points(loss_svg, 2).size(), 3u);
  EXPECT_NE(html.find("<title>Learning-rate range test</title>"), std::string::npos);
  EXPECT_NE(html.find("<title>Throughput</title>"), std::string::npos);
  // The configuration, escaped ('model' quotes stay readable as &#39;).
  EXPECT_NE(html.find("max_steps = 12"), std::string::npos);
  EXPECT_NE(html.find("[model]"), std::string::npos);
  // Profiled: the step breakdown, the memory timeline and the advisor's findings.
  EXPECT_EQ(html.find("This run was not profiled"), std::string::npos);
  EXPECT_NE(html.find("<title>Time per phase (ms per step)</title>"), std::string::npos);
  EXPECT_NE(html.find("<title>Memory over one step"), std::string::npos);
  EXPECT_NE(html.find("the peak's top holders"), std::string::npos);
  // Without profile/: the sections say so and which flag writes them.
  fs::rename(*dir_ + "/profile", *dir_ + "/profile.kept");
  const std::string plain = slurp(report::write_run_report(*dir_, *dir_ + "/plain.html"));
  fs::rename(*dir_ + "/profile.kept", *dir_ + "/profile");
  EXPECT_EQ(count(plain, "This run was not profiled"), 3u);
  EXPECT_NE(plain.find("--profile START:END"), std::string::npos);
}

TEST_F(RunReport, RefusesWhatIsNotARunFolder) {
  const std::string other = test::scratch_dir("ft_report", "not_a_run");
  fs::create_directories(other);
  test::expect_error([&] { report::write_run_report(other + "/missing"); }, "no such run folder");
  test::expect_error([&] { report::write_run_report(other); },
                     "is not a run folder (expected metrics.csv, written by fasttrain train, found none)");
  std::ofstream(other + "/metrics.csv") << "step,epoch,split,loss\n1,0,train,2.5\n2,0,train,two\n";
  test::expect_error([&] { report::write_run_report(other); },
                     "metrics.csv:3: column loss: expected a number, found 'two'");
  std::ofstream(other + "/metrics.csv") << "step,epoch,split,loss\n1,0,train\n";
  test::expect_error([&] { report::write_run_report(other); }, "metrics.csv:2: expected 4 fields, found 3");
  fs::remove_all(other);
}

// Headless Chromium loads the page: its DOM (after parsing) and its console messages, which a
// page with no script must not produce.
struct Rendered {
  int code = -1;
  std::string dom, log;
};

Rendered render(const std::string& page, const std::string& screenshot) {
  const std::string log_path = page + ".chromium.log";
  const std::string flags = "--headless --no-sandbox --disable-gpu --hide-scrollbars --enable-logging=stderr --v=0 ";
  Rendered r;
  std::string cmd = "chromium " + flags + "--dump-dom 'file://" + page + "' 2>'" + log_path + "'";
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) return r;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, pipe)) > 0;) r.dom.append(buf, n);
  r.code = pclose(pipe);
  r.log = slurp(log_path);
  if (!screenshot.empty()) {
    cmd = "chromium " + flags + "--window-size=1100,5200 --screenshot='" + screenshot + "' 'file://" + page +
          "' >/dev/null 2>&1";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }
  return r;
}

std::vector<std::string> console_lines(const std::string& log) {
  std::vector<std::string> lines;
  std::istringstream in(log);
  for (std::string line; std::getline(in, line);)
    if (line.find(":CONSOLE") != std::string::npos) lines.push_back(line);
  return lines;
}

TEST_F(RunReport, RendersInHeadlessChromiumWithoutConsoleMessages) {
  if (std::system("command -v chromium >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "SKIP: chromium is not installed (Debian package chromium; scripts/install-deps.sh installs it)";
  const std::string page = report::write_run_report(*dir_);
  const std::string artefacts = FT_ARTEFACT_DIR;
  fs::create_directories(artefacts);
  const Rendered r = render(fs::absolute(page).string(), artefacts + "/report.png");
  ASSERT_EQ(r.code, 0) << r.log;
  for (const char* id : {"summary", "curves", "step-breakdown", "memory", "lr-finder", "advisor", "config"})
    EXPECT_NE(r.dom.find(std::string("<section id=\"") + id + "\">"), std::string::npos) << id;
  EXPECT_GE(count(r.dom, "<svg"), 4u);
  EXPECT_TRUE(console_lines(r.log).empty()) << r.log;
  EXPECT_GT(fs::file_size(artefacts + "/report.png"), 10000u);

  // The check itself: a page that throws is caught by its console message.
  const std::string bad = fs::absolute(*dir_ + "/bad.html").string();
  std::ofstream(bad) << "<!DOCTYPE html><html><body><p>x</p><script>throw new Error('planted')</script></body></html>";
  const Rendered b = render(bad, "");
  ASSERT_EQ(b.code, 0) << b.log;
  const auto lines = console_lines(b.log);
  ASSERT_EQ(lines.size(), 1u) << b.log;
  EXPECT_NE(lines[0].find("Uncaught Error: planted"), std::string::npos) << lines[0];
}

}  // namespace
}  // namespace ft
