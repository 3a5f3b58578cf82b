// GEMM path benchmark: GFLOP/s of f32 sgemm, the 16-bit GEMM on bf16 operands (gemm_half, its
// f32-FMA and vdpbf16ps kernels; the function and its paths were called gemm_bf16 before), oneDNN's
// bf16 matmul and bf16 via f32 + sgemm, at the GEMM shapes of one gpt-mini training step (batch 16
// x context 128 = 2048 tokens, width 256, MLP 1024, vocab 512) in the layouts linear uses: forward
// x W^T, input gradient dY W, weight gradient dY^T X. Prints one JSON line per (shape, path) with
// the median of --iters runs: wall-clock ms and process CPU ms (all threads). The CPU time is only
// as fine as the kernel's accounting (a scheduler tick on some VMs), so trust it for shapes that
// run many ticks; on a loaded machine compare paths within one run. "onednn_bf16" against
// "gemm_half_fma" is the comparison behind FT_BF16_GEMM=auto (backend/cpu/linalg.h): oneDNN's
// bf16 matmul against the packed GEMM that dispatch would otherwise take.
// With --f32 WORKLOAD (gpt-mini, gpt2-124m, llama-mini, smollm-135m) it measures instead the two
// f32 paths (OpenBLAS's sgemm and oneDNN's f32 matmul, the choice of FT_F32_GEMM) at the linear
// layers of that BENCH.md workload's step (batch x context tokens; the attention's batched
// products are not linear layers and are left out). With --cold, 256 MiB of other memory is
// written before each timed product (untimed), so its operands come from memory, as in a training
// step, where the other layers' work has evicted them, instead of from the caches of the last run.
// Usage: gemm_paths [--threads N] [--iters N] [--f32 WORKLOAD [--cold]]
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <functional>
#include <string>
#include <vector>

#include "backend/cpu/gemm_half.h"
#include "backend/cpu/linalg.h"
#include "fasttrain/fasttrain.h"

using namespace ft;

namespace {

double cpu_ms() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

struct Timing {
  double wall_ms, cpu_ms;
};

// `before` runs untimed ahead of every run.
Timing median_times(const std::function<void()>& f, int iters, const std::function<void()>& before = {}) {
  std::vector<double> wall, cpu;
  for (int i = 0; i < 2 + iters; ++i) {
    if (before) before();
    const double c0 = cpu_ms();
    auto t0 = std::chrono::steady_clock::now();
    f();
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (i >= 2) wall.push_back(ms), cpu.push_back(cpu_ms() - c0);
  }
  std::sort(wall.begin(), wall.end());
  std::sort(cpu.begin(), cpu.end());
  return {wall[wall.size() / 2], cpu[cpu.size() / 2]};
}

struct Linear {
  int64_t in, out;
};

// A linear layer's three products in the layouts linear uses: forward x W^T, input gradient
// dY W, weight gradient dY^T X, for `tokens` rows of input.
struct Product {
  const char* name;
  Tensor a, b;
};
std::array<Product, 3> linear_products(const Linear& l, int64_t tokens, Generator& g) {
  Tensor x = randn({tokens, l.in}, DType::F32, &g), w = randn({l.out, l.in}, DType::F32, &g);
  Tensor dy = randn({tokens, l.out}, DType::F32, &g);
  return {Product{"fwd x@W^T", x, w.t()}, Product{"bwd dY@W", dy, w}, Product{"bwd dY^T@X", dy.t(), x}};
}

struct F32Workload {
  const char* name;
  int64_t tokens;  // batch x context of BENCH.md's CPU row
  std::vector<Linear> layers;
};

// The distinct linear layers of each workload's step, at BENCH.md's CPU batch.
const F32Workload kF32Workloads[] = {
    {"gpt-mini", 16 * 128, {{256, 768}, {256, 256}, {256, 1024}, {1024, 256}, {256, 512}}},
    {"gpt2-124m", 1024, {{768, 2304}, {768, 768}, {768, 3072}, {3072, 768}, {768, 50304}}},
    {"llama-mini", 8 * 256, {{256, 256}, {256, 64}, {256, 688}, {688, 256}, {256, 1000}}},
    {"smollm-135m", 1024, {{576, 576}, {576, 192}, {576, 1536}, {1536, 576}, {576, 49152}}},
};

void print_row(const char* bench, const char* name, int64_t M, int64_t N, int64_t K, const char* path, int threads,
               const Timing& t) {
  const double flop = 2.0 * M * N * K;
  std::printf(
      "{\"bench\": \"%s\", \"case\": \"%s\", \"M\": %lld, \"N\": %lld, \"K\": %lld, \"path\": \"%s\", "
      "\"threads\": %d, \"ms\": %.4f, \"cpu_ms\": %.4f, \"gflops\": %.1f, \"gflop_per_cpu_s\": %.1f}\n",
      bench, name, (long long)M, (long long)N, (long long)K, path, threads, t.wall_ms, t.cpu_ms,
      flop * 1e-6 / t.wall_ms, flop * 1e-6 / t.cpu_ms);
  std::fflush(stdout);
}

// OpenBLAS against oneDNN for f32, each product of each layer in the layout linear uses. The
// whole list runs twice, the first pass with one timed run per product, and only the second
// pass prints: the first products of a process (thread
// teams starting, pages first touched) measured up to 3x slower than the same product later.
int run_f32(const F32Workload& w, int threads, int iters, bool cold) {
  Tensor other = cold ? zeros({64 << 20}, DType::F32) : Tensor();  // 256 MiB
  double fills = 0;
  const std::function<void()> evict = [&] { other.fill_(++fills); };
  for (int pass = 0; pass < 2; ++pass) {
    Generator g(0);
    for (const Linear& l : w.layers) {
      for (const Product& c : linear_products(l, w.tokens, g)) {
        const int64_t M = c.a.size(0), K = c.a.size(1), N = c.b.size(1);
        Tensor o = empty({M, N}, DType::F32);
        for (switches::F32Gemm path : {switches::F32Gemm::Blas, switches::F32Gemm::Onednn}) {
          switches::Scoped on(switches::f32_gemm, path);
          const Timing t = median_times([&] { cpu::matmul(c.a, c.b, o, false, Tensor()); }, pass == 0 ? 1 : iters,
                                        cold ? evict : std::function<void()>{});
          if (pass == 1)
            print_row(cold ? "gemm_f32_cold" : "gemm_f32", c.name, M, N, K,
                      path == switches::F32Gemm::Blas ? "blas" : "onednn", threads, t);
        }
      }
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, iters = 9;
  const char* f32 = nullptr;
  bool cold = false;
  auto usage = [] {
    std::fprintf(stderr, "usage: gemm_paths [--threads N] [--iters N] [--f32 WORKLOAD [--cold]]\n");
    return 2;
  };
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--cold")) {
      cold = true;
      continue;
    }
    if (i + 1 >= argc) return usage();
    if (!std::strcmp(argv[i], "--threads"))
      threads = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--iters"))
      iters = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--f32"))
      f32 = argv[++i];
    else
      return usage();
  }
  set_num_threads(threads);
  if (f32) {
    for (const F32Workload& w : kF32Workloads)
      if (!std::strcmp(w.name, f32)) return run_f32(w, threads, iters, cold);
    std::fprintf(stderr, "gemm_paths: --f32 expects gpt-mini, gpt2-124m, llama-mini or smollm-135m, found %s\n", f32);
    return 2;
  }
  const int64_t T = 2048;
  const Linear layers[] = {{256, 768}, {256, 256}, {256, 1024}, {1024, 256}, {256, 512}};
  Generator g(0);
  for (const Linear& l : layers) {
    for (const Product& c : linear_products(l, T, g)) {
      const int64_t M = c.a.size(0), K = c.a.size(1), N = c.b.size(1);
      Tensor a16 = c.a.to(DType::BF16), b16 = c.b.to(DType::BF16);
      // to() keeps the layout of a transposed view only if it copies strides; rebuild them so
      // the bf16 operands are transposed views like the f32 ones.
      if (c.a.stride(0) == 1) a16 = c.a.t().contiguous().to(DType::BF16).t();
      if (c.b.stride(0) == 1) b16 = c.b.t().contiguous().to(DType::BF16).t();
      Tensor o32 = empty({M, N}, DType::F32), o16 = empty({M, N}, DType::BF16);
      std::vector<std::pair<const char*, std::function<void()>>> paths = {
          {"sgemm_f32", [&] { cpu::matmul(c.a, c.b, o32, false, Tensor()); }},
          {"via_f32", [&] { cpu::matmul_via_f32(a16, b16, o16); }},
          {"onednn_bf16", [&] { cpu::matmul_onednn(a16, b16, o16); }},
      };
      if (cpu::gemm_half_available()) paths.push_back({"gemm_half_fma", [&] { cpu::matmul_gemm_half(a16, b16, o16); }});
      cpu::GemmHalfArgs dot;
      dot.M = M;
      dot.N = N;
      dot.K = K;
      dot.a = reinterpret_cast<const uint16_t*>(a16.data<bf16>());
      dot.a_rs = a16.stride(0);
      dot.a_cs = a16.stride(1);
      dot.b = reinterpret_cast<const uint16_t*>(b16.data<bf16>());
      dot.b_rs = b16.stride(0);
      dot.b_cs = b16.stride(1);
      dot.c = o16.data<bf16>();
      dot.ldc = N;
      dot.c_half = true;
      dot.kernel = cpu::GemmHalfKernel::Dot;
      if (cpu::gemm_half_available(dot.kernel)) paths.push_back({"gemm_half_dot", [&] { cpu::gemm_half(dot); }});
      for (auto& [path, fn] : paths) print_row("gemm", c.name, M, N, K, path, threads, median_times(fn, iters));
    }
  }
  return 0;
}
