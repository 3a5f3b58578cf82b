// GEMM path benchmark: GFLOP/s of f32 sgemm, the vdpbf16ps bf16 GEMM (gemm_bf16), oneDNN's bf16
// matmul and bf16 via f32 + sgemm, at the GEMM shapes of one gpt-mini training step (batch 16 x
// context 128 = 2048 tokens, width 256, MLP 1024, vocab 512) in the layouts linear uses: forward
// x W^T, input gradient dY W, weight gradient dY^T X. Prints one JSON line per (shape, path)
// with the median of --iters runs.
// Usage: gemm_paths [--threads N] [--iters N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "backend/cpu/gemm_bf16.h"
#include "backend/cpu/linalg.h"
#include "fasttrain/fasttrain.h"

using namespace ft;

namespace {

double median_ms(const std::function<void()>& f, int iters) {
  std::vector<double> t;
  for (int i = 0; i < 2 + iters; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (i >= 2) t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, iters = 9;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--threads")) threads = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--iters")) iters = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: gemm_paths [--threads N] [--iters N]\n");
      return 2;
    }
  }
  set_num_threads(threads);
  const int64_t T = 2048;
  struct Linear {
    int64_t in, out;
  };
  const Linear layers[] = {{256, 768}, {256, 256}, {256, 1024}, {1024, 256}, {256, 512}};
  Generator g(0);
  for (const Linear& l : layers) {
    Tensor x = randn({T, l.in}, DType::F32, &g), w = randn({l.out, l.in}, DType::F32, &g);
    Tensor dy = randn({T, l.out}, DType::F32, &g);
    struct Case {
      const char* name;
      Tensor a, b;
    };
    const Case cases[] = {{"fwd x@W^T", x, w.t()}, {"bwd dY@W", dy, w}, {"bwd dY^T@X", dy.t(), x}};
    for (const Case& c : cases) {
      const int64_t M = c.a.size(0), K = c.a.size(1), N = c.b.size(1);
      Tensor a16 = c.a.to(DType::BF16), b16 = c.b.to(DType::BF16);
      // to() keeps the layout of a transposed view only if it copies strides; rebuild them so
      // the bf16 operands are transposed views like the f32 ones.
      if (c.a.stride(0) == 1) a16 = c.a.t().contiguous().to(DType::BF16).t();
      if (c.b.stride(0) == 1) b16 = c.b.t().contiguous().to(DType::BF16).t();
      Tensor o32 = empty({M, N}, DType::F32), o16 = empty({M, N}, DType::BF16);
      std::vector<std::pair<const char*, std::function<void()>>> paths = {
          {"sgemm_f32", [&] { cpu::matmul(c.a, c.b, o32); }},
          {"via_f32", [&] { cpu::matmul_via_f32(a16, b16, o16); }},
          {"onednn_bf16", [&] { cpu::matmul_onednn(a16, b16, o16); }},
      };
      if (cpu::gemm_bf16_available())
        paths.push_back({"gemm_bf16", [&] { cpu::matmul_gemm_bf16(a16, b16, o16); }});
      for (auto& [path, fn] : paths) {
        const double ms = median_ms(fn, iters);
        std::printf(
            "{\"bench\": \"gemm\", \"case\": \"%s\", \"M\": %lld, \"N\": %lld, \"K\": %lld, \"path\": \"%s\", "
            "\"threads\": %d, \"ms\": %.4f, \"gflops\": %.1f}\n",
            c.name, (long long)M, (long long)N, (long long)K, path, threads, ms, 2e-6 * M * N * K / ms);
        std::fflush(stdout);
      }
    }
  }
  return 0;
}
