// bf16 convolution weight-gradient paths: oneDNN's kernel against the paired kernel
// (backend/cpu/conv_weight_grad.h), for 3x3 stride-1 layers the Winograd kernel
// (backend/cpu/conv_winograd.h) and for channels-last 1x1 stride-1 layers one matrix product
// (conv.h's matmul_conv2d_backward_weight), on the convolution shapes of cnn-mini (batch 64) and
// ResNet-50 (batch 8), in NHWC or NCHW activations. Rounds alternate the paths on the same inputs; each
// round times --iters calls and keeps the median, and the line reports the median round. Prints one
// JSON line per (shape, path): ms, GFLOP/s, the relative error by norms against the f32
// reference sums of the same bf16 inputs, and whether conv2d takes that path here ("chosen":
// conv.h's rule, or FT_CONV_WEIGHT_GRAD). Shapes run isolated, so their inputs stay in cache;
// inside a training step they arrive from memory (docs/PERF.md has both kinds of figures). --cold
// writes 64 MiB before every timed call (untimed), so inputs come from memory as in a step.
// Usage: conv_weight_grad [--threads N] [--iters N] [--rounds N] [--nchw] [--cold]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#include "backend/cpu/conv.h"
#include "backend/cpu/conv_weight_grad.h"
#include "backend/cpu/isa.h"
#include "fasttrain/fasttrain.h"

using namespace ft;

namespace {

// Set by --cold: written before each timed call to push the inputs out of the caches.
std::vector<char>* g_evict = nullptr;

double median_ms(const std::function<void()>& f, int iters) {
  std::vector<double> t;
  for (int i = 0; i < 2 + iters; ++i) {
    if (g_evict) std::memset(g_evict->data(), i, g_evict->size());
    const auto t0 = std::chrono::steady_clock::now();
    f();
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (i >= 2) t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

double relative_error(const Tensor& actual, const Tensor& reference) {
  const Tensor d = sub(actual.to(DType::F32), reference);
  return std::sqrt(sum(mul(d, d)).item<double>() / sum(mul(reference, reference)).item<double>());
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, iters = 5, rounds = 5;
  bool nchw = false;
  std::vector<char> evict;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--nchw")) {
      nchw = true;
    } else if (!std::strcmp(argv[i], "--cold")) {
      evict.resize(64 << 20);
      g_evict = &evict;
    } else if (i + 1 < argc && !std::strcmp(argv[i], "--threads")) {
      threads = std::atoi(argv[++i]);
    } else if (i + 1 < argc && !std::strcmp(argv[i], "--iters")) {
      iters = std::atoi(argv[++i]);
    } else if (i + 1 < argc && !std::strcmp(argv[i], "--rounds")) {
      rounds = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: conv_weight_grad [--threads N] [--iters N] [--rounds N] [--nchw] [--cold]\n");
      return 2;
    }
  }
  set_num_threads(threads);
  struct Shape4 {
    const char* model;
    int64_t N, C, HW, O, k, stride;
  };
  const Shape4 shapes[] = {
      {"cnn-mini", 64, 32, 32, 32, 3, 1},   {"cnn-mini", 64, 32, 32, 64, 3, 2},  {"cnn-mini", 64, 64, 16, 64, 3, 1},
      {"cnn-mini", 64, 64, 16, 128, 3, 2},  {"cnn-mini", 64, 128, 8, 128, 3, 1}, {"resnet50", 8, 64, 56, 64, 3, 1},
      {"resnet50", 8, 128, 28, 128, 3, 1},  {"resnet50", 8, 256, 14, 256, 3, 1}, {"resnet50", 8, 512, 7, 512, 3, 1},
      {"resnet50", 8, 512, 14, 512, 3, 2},  {"resnet50", 8, 64, 56, 256, 1, 1},  {"resnet50", 8, 256, 56, 64, 1, 1},
      {"resnet50", 8, 128, 28, 512, 1, 1},  {"resnet50", 8, 512, 28, 128, 1, 1}, {"resnet50", 8, 256, 14, 1024, 1, 1},
      {"resnet50", 8, 1024, 14, 256, 1, 1}, {"resnet50", 8, 512, 7, 2048, 1, 1}, {"resnet50", 8, 2048, 7, 512, 1, 1}};
  const char* isa = cpu::cpu_isa_name(cpu::selected_cpu_isa());
  Generator g(0);
  for (const Shape4& s : shapes) {
    cpu::ConvParams p;
    p.N = s.N, p.C = s.C, p.H = p.W = s.HW, p.O = s.O, p.kH = p.kW = s.k;
    p.stride = {s.stride, s.stride}, p.padding = {s.k / 2, s.k / 2};
    p.OH = p.OW = (s.HW + 2 * (s.k / 2) - s.k) / s.stride + 1;
    p.channels_last = p.weight_channels_last = !nchw;
    auto layout = [&](Tensor t) { return nchw ? t : t.contiguous_channels_last(); };
    const Tensor x = layout(randn({s.N, s.C, s.HW, s.HW}, DType::F32, &g).to(DType::BF16));
    const Tensor gy = layout(randn({s.N, s.O, p.OH, p.OW}, DType::F32, &g).to(DType::BF16));
    Tensor gw_onednn = layout(empty({s.O, s.C, s.k, s.k}, TensorOptions(DType::BF16)));
    Tensor gw_paired = layout(empty({s.O, s.C, s.k, s.k}, TensorOptions(DType::BF16)));
    Tensor gw_ref = layout(empty({s.O, s.C, s.k, s.k}, TensorOptions(DType::F32)));
    cpu::conv2d_backward_weight_reference(p, gy, x, gw_ref, Tensor());
    if (!cpu::paired_conv2d_backward_weight(p, gy, x, gw_paired, Tensor())) {
      std::fprintf(stderr, "conv_weight_grad: the paired kernel does not run here (needs AVX512-BF16)\n");
      return 1;
    }
    Tensor gw_winograd = layout(empty({s.O, s.C, s.k, s.k}, TensorOptions(DType::BF16)));
    const bool winograd = cpu::winograd_conv2d_backward_weight(p, gy, x, gw_winograd, Tensor());
    Tensor gw_matmul = layout(empty({s.O, s.C, s.k, s.k}, TensorOptions(DType::BF16)));
    const bool as_matmul = cpu::matmul_conv2d_backward_weight(p, gy, x, gw_matmul, Tensor());
    std::vector<double> onednn_ms, paired_ms, winograd_ms, matmul_ms;
    for (int r = 0; r < rounds; ++r) {
      onednn_ms.push_back(median_ms([&] { cpu::onednn_conv2d_backward_weight(p, gy, x, gw_onednn, Tensor()); }, iters));
      paired_ms.push_back(median_ms([&] { cpu::paired_conv2d_backward_weight(p, gy, x, gw_paired, Tensor()); }, iters));
      if (winograd)
        winograd_ms.push_back(
            median_ms([&] { cpu::winograd_conv2d_backward_weight(p, gy, x, gw_winograd, Tensor()); }, iters));
      if (as_matmul)
        matmul_ms.push_back(
            median_ms([&] { cpu::matmul_conv2d_backward_weight(p, gy, x, gw_matmul, Tensor()); }, iters));
    }
    const double flops = 2.0 * s.N * p.OH * p.OW * s.O * s.C * s.k * s.k;
    const cpu::WeightGradPath chosen = cpu::weight_grad_path(p);
    using Path = cpu::WeightGradPath;
    for (auto [path, kind, times, gw] : {std::tuple{"onednn", Path::OneDnn, &onednn_ms, &gw_onednn},
                                         {"paired", Path::Paired, &paired_ms, &gw_paired},
                                         {"winograd", Path::Winograd, &winograd_ms, &gw_winograd},
                                         {"matmul", Path::Matmul, &matmul_ms, &gw_matmul}}) {
      if (times->empty()) continue;
      std::sort(times->begin(), times->end());
      const double ms = (*times)[times->size() / 2];
      std::printf(
          "{\"bench\": \"conv_weight_grad\", \"model\": \"%s\", \"N\": %lld, \"C\": %lld, \"HW\": %lld, \"O\": %lld, "
          "\"k\": %lld, \"stride\": %lld, \"layout\": \"%s\", \"path\": \"%s\", \"chosen\": %s, \"ms\": %.3f, "
          "\"gflops\": %.1f, \"rel_error\": %.2e, \"threads\": %d, \"cpu_isa\": \"%s\"}\n",
          s.model, (long long)s.N, (long long)s.C, (long long)s.HW, (long long)s.O, (long long)s.k, (long long)s.stride,
          nchw ? "nchw" : "nhwc", path, chosen == kind ? "true" : "false", ms, flops / ms / 1e6,
          relative_error(*gw, gw_ref), threads, isa);
    }
  }
}
