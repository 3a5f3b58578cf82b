// `fasttrain demo`: fits a small classifier with the engine's autograd.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "commands.h"
#include "fasttrain/fasttrain.h"

using namespace ft;

namespace {

const char* kDemoUsage = R"(usage: fasttrain demo [options]

Fits a 2-layer MLP with LayerNorm and GELU to a synthetic 3-class spiral with the engine's
autograd and an inline Adam update.

options:
  --steps N     optimisation steps (default 400)
  --threads N   CPU threads (default: all cores)
  --seed S      random seed (default 0)
  --lr X        learning rate (default 0.01)
  --dtype T     f32 (default) or f64

  -h, --help    show this help
)";

struct DemoOptions {
  int steps = 400;
  int threads = 0;
  uint64_t seed = 0;
  double lr = 0.01;
  DType dtype = DType::F32;
};

// Parses "--name value" pairs; every option must be known and have a value.
DemoOptions parse_demo(const std::vector<std::string>& args) {
  DemoOptions o;
  for (size_t i = 0; i < args.size(); i += 2) {
    const std::string& k = args[i];
    FT_CHECK(k.rfind("--", 0) == 0, "unexpected argument '", k, "' (options start with --; see fasttrain --help)");
    FT_CHECK(i + 1 < args.size(), "option ", k, " needs a value");
    const std::string& v = args[i + 1];
    auto to_int = [&](const std::string& s) {
      size_t pos = 0;
      long long x = 0;
      try {
        x = std::stoll(s, &pos);
      } catch (...) {
        pos = 0;
      }
      FT_CHECK(pos == s.size() && !s.empty(), "option ", k, ": expected an integer, found '", s, "'");
      return x;
    };
    if (k == "--steps") {
      o.steps = static_cast<int>(to_int(v));
      FT_CHECK(o.steps > 0, "option --steps: expected a positive number, found ", v);
    } else if (k == "--threads") {
      o.threads = static_cast<int>(to_int(v));
      FT_CHECK(o.threads > 0, "option --threads: expected a positive number, found ", v);
    } else if (k == "--seed") {
      o.seed = static_cast<uint64_t>(to_int(v));
    } else if (k == "--lr") {
      char* end = nullptr;
      o.lr = std::strtod(v.c_str(), &end);
      FT_CHECK(end && *end == '\0' && o.lr > 0, "option --lr: expected a positive number, found '", v, "'");
    } else if (k == "--dtype") {
      o.dtype = dtype_from_name(v);
      FT_CHECK(o.dtype == DType::F32 || o.dtype == DType::F64, "option --dtype: expected f32 or f64, found ", v);
    } else {
      FT_FAIL("unknown option '", k, "' (see fasttrain --help)");
    }
  }
  return o;
}

// Three interleaved spirals in the plane: a task a linear model cannot solve.
void make_spirals(int per_class, Generator& gen, Tensor& x, Tensor& y) {
  const int classes = 3;
  std::vector<double> xs, ys;
  Tensor noise = randn({per_class * classes, 2}, DType::F64, &gen);
  std::vector<double> nz = noise.to_vector();
  for (int c = 0; c < classes; ++c) {
    for (int i = 0; i < per_class; ++i) {
      double r = static_cast<double>(i) / per_class;
      double t = c * 2.0 * M_PI / classes + r * 4.0;
      int k = c * per_class + i;
      xs.push_back(r * std::sin(t) + 0.02 * nz[2 * k]);
      xs.push_back(r * std::cos(t) + 0.02 * nz[2 * k + 1]);
      ys.push_back(c);
    }
  }
  x = from_vector(xs, {per_class * classes, 2});
  y = from_vector(ys, {per_class * classes}, DType::I64);
}

int run_demo_with(const DemoOptions& o) {
  if (o.threads) set_num_threads(o.threads);
  Generator gen(o.seed);
  Tensor x, y;
  make_spirals(1000, gen, x, y);
  x = x.to(o.dtype);

  const int hidden = 64;
  auto param = [&](Shape s, double scale) {
    Tensor p = mul(randn(s, o.dtype, &gen), scale);
    return p.detach().requires_grad_();
  };
  std::vector<Tensor> params = {
      param({hidden, 2}, 1.0 / std::sqrt(2.0)),         zeros({hidden}, o.dtype).requires_grad_(),
      ones({hidden}, o.dtype).requires_grad_(),         zeros({hidden}, o.dtype).requires_grad_(),
      param({hidden, hidden}, 1.0 / std::sqrt(hidden)), zeros({hidden}, o.dtype).requires_grad_(),
      param({3, hidden}, 1.0 / std::sqrt(hidden)),      zeros({3}, o.dtype).requires_grad_()};
  auto forward = [&](const Tensor& in) {
    Tensor h = linear(in, params[0], params[1]);
    h = gelu(layer_norm(h, {hidden}, params[2], params[3]), GeluApprox::Tanh);
    h = relu(linear(h, params[4], params[5]));
    return linear(h, params[6], params[7]);
  };

  // Adam, written inline for the demo (the optimizers module comes with the Trainer).
  std::vector<Tensor> m, v;
  for (auto& p : params) {
    m.push_back(zeros_like(p));
    v.push_back(zeros_like(p));
  }
  const double b1 = 0.9, b2 = 0.999, eps = 1e-8;
  int64_t nparams = 0;
  for (auto& p : params) nparams += p.numel();
  std::printf("demo: MLP 2-%d-%d-3 (%lld parameters) on 3000 spiral points, %s, %d threads\n", hidden, hidden,
              static_cast<long long>(nparams), dtype_name(o.dtype), get_num_threads());

  auto t0 = std::chrono::steady_clock::now();
  double loss_value = 0;
  for (int step = 1; step <= o.steps; ++step) {
    zero_grad(params);
    Tensor loss = cross_entropy(forward(x), y);
    loss.backward();
    {
      autograd::NoGradGuard ng;
      double c1 = 1 - std::pow(b1, step), c2 = 1 - std::pow(b2, step);
      for (size_t i = 0; i < params.size(); ++i) {
        Tensor g = params[i].grad();
        m[i] = add(mul(m[i], b1), mul(g, 1 - b1));
        v[i] = add(mul(v[i], b2), mul(square(g), 1 - b2));
        Tensor update = div(div(m[i], c1), add(sqrt(div(v[i], c2)), eps));
        add_(params[i], update, -o.lr);
      }
    }
    if (step % 50 == 0 || step == 1 || step == o.steps) {
      loss_value = loss.item<double>();
      double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / step;
      std::printf("step %4d  loss %.4f  %.2f ms/step\n", step, loss_value, ms);
      std::fflush(stdout);
    }
  }
  autograd::InferenceMode im;
  Tensor pred = argmax(forward(x), 1);
  double acc = mean(eq(pred, y).to(DType::F32)).item<double>();
  std::printf("final loss %.4f, training accuracy %.1f%% (chance: 33.3%%)\n", loss_value, 100 * acc);
  return 0;
}

int run_demo(const std::vector<std::string>& args) {
  for (const auto& a : args)
    if (a == "-h" || a == "--help") {
      std::fputs(kDemoUsage, stdout);
      return 0;
    }
  return run_demo_with(parse_demo(args));
}

}  // namespace

FT_REGISTER_COMMAND(demo, "fit a small MLP to a synthetic spiral with the engine's autograd", run_demo);
