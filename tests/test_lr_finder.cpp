// LR range test (src/train/lr_finder.cpp) on a problem whose diverging rate is known: plain
// gradient descent on the least-squares loss 1/(2n)|Xw - y|^2, trained through the engine's ops,
// autograd and SGD, diverges exactly when lr > 2/lambda_max(X^T X / n). Below that the loss falls
// monotonically, so the sweep cannot stop early, and the suggestion must lie below it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include <unistd.h>

#include "fasttrain/fasttrain.h"
#include "fasttrain/lr_finder.h"
#include "fasttrain/optim.h"
#include "support/expect_error.h"

using namespace ft;
using namespace ft::train;
using test::expect_error;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kRows = 64, kCols = 6;

struct LeastSquares {
  std::vector<double> x, y;  // row-major X [rows, cols], y [rows]
  double lambda_max = 0;     // largest eigenvalue of the Hessian X^T X / rows

  LeastSquares() {
    std::mt19937_64 gen(5);
    std::normal_distribution<double> normal;
    for (int64_t i = 0; i < kRows * kCols; ++i) x.push_back(normal(gen) * (1 + i % kCols));  // unequal curvatures
    for (int64_t r = 0; r < kRows; ++r) {
      double t = 0.1 * normal(gen);
      for (int64_t c = 0; c < kCols; ++c) t += x[r * kCols + c] * (c - 2.5);
      y.push_back(t);
    }
    // Power iteration on the Hessian, in plain doubles (independent of the engine).
    std::vector<double> v(kCols, 1.0), hv(kCols);
    for (int it = 0; it < 500; ++it) {
      std::fill(hv.begin(), hv.end(), 0.0);
      for (int64_t r = 0; r < kRows; ++r) {
        double xv = 0;
        for (int64_t c = 0; c < kCols; ++c) xv += x[r * kCols + c] * v[c];
        for (int64_t c = 0; c < kCols; ++c) hv[c] += x[r * kCols + c] * xv / kRows;
      }
      double norm = 0;
      for (double e : hv) norm += e * e;
      norm = std::sqrt(norm);
      for (int64_t c = 0; c < kCols; ++c) v[c] = hv[c] / norm;
      lambda_max = norm;
    }
  }

  // A fresh model and SGD optimizer; the returned step does one update at the given lr and
  // returns the loss before it.
  std::function<double(double)> trainer() const {
    Tensor X = from_vector(x, {kRows, kCols}, DType::F64);
    Tensor Y = from_vector(y, {kRows, 1}, DType::F64);
    Tensor w = zeros({kCols, 1}, DType::F64).requires_grad_();
    optim::ParamGroup g;
    g.params = {w};
    std::shared_ptr<optim::Optimizer> opt = optim::make_sgd({g});
    return [X, Y, w, opt](double lr) {
      opt->zero_grad();
      Tensor loss = mul(mean(square(sub(matmul(X, w), Y))), 0.5);
      loss.backward();
      opt->set_lr(lr);
      opt->step();
      return loss.item<double>();
    };
  }
};

std::string read(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("ft_lr_finder_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

}  // namespace

TEST(LrFinder, StopsAfterTheKnownDivergenceAndSuggestsBelowIt) {
  const LeastSquares problem;
  const double diverging = 2 / problem.lambda_max;
  LrFindOptions o;
  o.min_lr = 1e-6;
  o.max_lr = 10;
  o.steps = 100;
  const LrFindResult r = find_lr(problem.trainer(), o);

  ASSERT_TRUE(r.diverged);
  ASSERT_LT(static_cast<int64_t>(r.lrs.size()), o.steps);
  EXPECT_EQ(r.losses.size(), r.lrs.size());
  EXPECT_EQ(r.smoothed.size(), r.lrs.size());
  // Below 2/lambda_max every step lowers the loss, so the stop comes only after crossing it; and
  // soon after, though not at once: the loss then grows geometrically, but the moving average
  // (a window of ~50 steps) must first rise to 4x its best.
  EXPECT_GT(r.lrs.back(), diverging);
  const auto past = std::count_if(r.lrs.begin(), r.lrs.end(), [&](double lr) { return lr > diverging; });
  EXPECT_LE(past, 20);
  for (size_t i = 1; i < r.lrs.size(); ++i) {
    EXPECT_NEAR(r.lrs[i] / r.lrs[i - 1], std::pow(1e7, 1.0 / 99), 1e-12);
    if (r.lrs[i] < diverging) EXPECT_LT(r.losses[i], r.losses[i - 1]) << "step " << i;
  }
  EXPECT_DOUBLE_EQ(r.lrs.front(), o.min_lr);
  // The suggestion: below divergence, and not in the flat start where nothing is learnt.
  EXPECT_LT(r.suggestion, diverging);
  EXPECT_GT(r.suggestion, diverging / 1000);
  ASSERT_GE(r.suggestion_index, 10);
  EXPECT_EQ(r.suggestion, r.lrs[r.suggestion_index]);
  // The bias-corrected average: the first smoothed value is the first loss itself.
  EXPECT_DOUBLE_EQ(r.smoothed[0], r.losses[0]);
  double avg = 0;
  for (size_t i = 0; i < r.lrs.size(); ++i) {
    avg = 0.98 * avg + 0.02 * r.losses[i];
    EXPECT_NEAR(r.smoothed[i], avg / (1 - std::pow(0.98, i + 1)), 1e-9 * std::abs(r.smoothed[i]));
  }
}

TEST(LrFinder, NonFiniteLossStopsTheSweep) {
  int calls = 0;
  const LrFindResult r = find_lr(
      [&](double lr) {
        ++calls;
        return lr > 1e-3 ? NAN : 1.0 / (1 + lr);
      },
      {});
  EXPECT_TRUE(r.diverged);
  EXPECT_EQ(calls, static_cast<int>(r.lrs.size()));
  EXPECT_GT(r.lrs.back(), 1e-3);
  EXPECT_TRUE(std::isnan(r.losses.back()));
  EXPECT_LE(r.lrs[r.lrs.size() - 2], 1e-3);
  EXPECT_LE(r.suggestion, 1e-3);
}

TEST(LrFinder, RunsEveryStepWithoutDivergence) {
  LrFindOptions o;
  o.steps = 30;
  const LrFindResult r = find_lr([](double lr) { return 1.0 / (1 + 1e3 * lr); }, o);
  EXPECT_FALSE(r.diverged);
  ASSERT_EQ(r.lrs.size(), 30u);
  EXPECT_DOUBLE_EQ(r.lrs.back(), o.max_lr);
}

TEST(LrFinder, CsvAndSvgDescribeTheCurve) {
  const LeastSquares problem;
  const LrFindResult r = find_lr(problem.trainer(), {});
  const fs::path dir = temp_dir("files");

  write_lr_find_csv((dir / "lr_find.csv").string(), r);
  std::istringstream csv(read(dir / "lr_find.csv"));
  std::string line;
  std::getline(csv, line);
  EXPECT_EQ(line, "step,lr,loss,smoothed_loss");
  size_t rows = 0;
  while (std::getline(csv, line)) {
    std::istringstream fields(line);
    std::string step, lr, loss, smoothed;
    std::getline(fields, step, ',');
    std::getline(fields, lr, ',');
    std::getline(fields, loss, ',');
    std::getline(fields, smoothed, ',');
    ASSERT_LT(rows, r.lrs.size());
    EXPECT_EQ(std::stoul(step), rows);
    EXPECT_EQ(std::stod(lr), r.lrs[rows]);  // %.17g round-trips exactly
    EXPECT_EQ(std::stod(loss), r.losses[rows]);
    EXPECT_EQ(std::stod(smoothed), r.smoothed[rows]);
    ++rows;
  }
  EXPECT_EQ(rows, r.lrs.size());

  write_lr_find_svg((dir / "lr_find.svg").string(), r);
  const std::string svg = read(dir / "lr_find.svg");
  EXPECT_EQ(svg.rfind("<?xml", 0), 0u);
  EXPECT_NE(svg.find("<svg xmlns=\"http://www.w3.org/2000/svg\""), std::string::npos);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_EQ(count(svg, "<polyline"), 1u);
  const size_t at = svg.find("points=\"", svg.find("<polyline")) + 8;
  const std::string points = svg.substr(at, svg.find('"', at) - at);
  size_t finite = 0;
  for (double v : r.smoothed) finite += std::isfinite(v);
  EXPECT_EQ(count(points, ","), finite);
  EXPECT_EQ(count(points, " ") + 1, finite);
  EXPECT_EQ(count(svg, "<circle"), 1u);  // the suggestion marker
  EXPECT_NE(svg.find("learning rate (log scale)"), std::string::npos);
  EXPECT_NE(svg.find(">1e-5<"), std::string::npos);  // a decade tick inside the swept range
  EXPECT_EQ(count(svg, "<g"), count(svg, "</g>"));
  EXPECT_EQ(count(svg, "<text"), count(svg, "</text>"));
  // Atomic writes leave no temporary files behind.
  size_t files = 0;
  for (const auto& e : fs::directory_iterator(dir)) files += e.is_regular_file();
  EXPECT_EQ(files, 2u);
  fs::remove_all(dir);
}

TEST(LrFinder, RejectsBadOptionsAndResults) {
  const auto step = [](double) { return 1.0; };
  LrFindOptions o;
  o.min_lr = 0;
  expect_error([&] { find_lr(step, o); }, "lr_find: min_lr must be a finite positive number, found 0");
  o = {};
  o.max_lr = 1e-8;
  expect_error([&] { find_lr(step, o); },
               "lr_find: max_lr must be finite and greater than min_lr = 1e-07, found 1e-08");
  o = {};
  o.steps = 1;
  expect_error([&] { find_lr(step, o); }, "lr_find: steps must be >= 2, found 1");
  o = {};
  o.smoothing = 1;
  expect_error([&] { find_lr(step, o); }, "lr_find: smoothing must be in [0, 1), found 1");
  o = {};
  o.divergence = 0.5;
  expect_error([&] { find_lr(step, o); }, "lr_find: divergence must be a finite number > 1, found 0.5");
  expect_error([&] { find_lr(nullptr, {}); }, "lr_find: the step function is empty");

  const fs::path dir = temp_dir("errors");
  expect_error([&] { write_lr_find_csv((dir / "a.csv").string(), LrFindResult{}); },
               "write_lr_find_csv: the result has no steps");
  LrFindResult bad;
  bad.lrs = {1e-3, 1e-2};
  bad.losses = {1};
  bad.smoothed = {1, 1};
  expect_error([&] { write_lr_find_svg((dir / "a.svg").string(), bad); },
               "write_lr_find_svg: lrs, losses and smoothed must have the same length, found 2, 1 and 2");
  EXPECT_TRUE(fs::is_empty(dir));
  fs::remove_all(dir);
}
