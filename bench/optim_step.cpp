// Optimizer step benchmark: one AdamW / Adam / SGD-momentum / LAMB / LARS step (and AdamW's
// step(found_inf) as GradScaler calls it, and clip_grad_norm_) over the parameters of the
// gpt-mini workload (shared/BENCH.md: 52 tensors, 3,323,392 floats, decay / no_decay groups,
// lr 3e-4, weight decay 0.1, betas 0.9/0.999, eps 1e-8). Prints one JSON line per optimizer, in
// the same format as bench/torch_optim_step.py. Usage: optim_step [--threads N] [--iters N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "fasttrain/fasttrain.h"
#include "fasttrain/optim.h"

using namespace ft;

namespace {

// gpt-mini: vocab 512, context 128, 4 layers, width 256, GPT-2 block layout, tied head.
std::vector<std::pair<std::string, Tensor>> gpt_mini_params() {
  const int64_t V = 512, T = 128, L = 4, C = 256;
  Generator gen(0);
  std::vector<std::pair<std::string, Tensor>> ps;
  auto add = [&](const std::string& name, Shape s) {
    ps.emplace_back(name, mul(randn(s, DType::F32, &gen), 0.02).requires_grad_());
  };
  add("wte", {V, C});
  add("wpe", {T, C});
  for (int64_t l = 0; l < L; ++l) {
    const std::string h = "h" + std::to_string(l) + ".";
    add(h + "ln_1.weight", {C});
    add(h + "ln_1.bias", {C});
    add(h + "attn.c_attn.weight", {3 * C, C});
    add(h + "attn.c_attn.bias", {3 * C});
    add(h + "attn.c_proj.weight", {C, C});
    add(h + "attn.c_proj.bias", {C});
    add(h + "ln_2.weight", {C});
    add(h + "ln_2.bias", {C});
    add(h + "mlp.c_fc.weight", {4 * C, C});
    add(h + "mlp.c_fc.bias", {4 * C});
    add(h + "mlp.c_proj.weight", {C, 4 * C});
    add(h + "mlp.c_proj.bias", {C});
  }
  add("ln_f.weight", {C});
  add("ln_f.bias", {C});
  for (auto& [n, p] : ps) p.set_grad(mul(randn(p.shape(), DType::F32, &gen), 0.01));
  return ps;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, iters = 50;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--threads"))
      threads = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--iters"))
      iters = std::atoi(argv[i + 1]);
  }
  set_num_threads(threads);
  auto named = gpt_mini_params();
  int64_t numel = 0;
  for (auto& [n, p] : named) numel += p.numel();
  const Tensor clean = scalar_tensor(0.0f);  // GradScaler's found_inf after a clean unscale_
  std::vector<Tensor> params;
  for (auto& [n, p] : named) params.push_back(p);
  for (const std::string kind : {"adamw", "adam", "sgd", "lamb", "lars", "adamw+found_inf", "clip_grad_norm_"}) {
    optim::GroupOptions o;
    o.lr = 3e-4;
    o.weight_decay = 0.1;
    o.momentum = 0.9;
    auto groups = optim::decay_groups(named, o);
    auto opt = kind == "adam"   ? optim::make_adam(groups)
               : kind == "sgd"  ? optim::make_sgd(groups)
               : kind == "lamb" ? optim::make_lamb(groups)
               : kind == "lars" ? optim::make_lars(groups)
                                : optim::make_adamw(groups);
    auto run = [&] {
      if (kind == "adamw+found_inf")
        opt->step(clean);
      else if (kind == "clip_grad_norm_")
        optim::clip_grad_norm_(params, 1e9);  // measures the norm pass
      else
        opt->step();
    };
    for (int i = 0; i < 3; ++i) run();
    std::vector<double> ms;
    for (int i = 0; i < iters; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      run();
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
    std::printf(
        "{\"impl\": \"fasttrain\", \"workload\": \"optim-gpt-mini\", \"optimizer\": \"%s\", \"threads\": %d, "
        "\"tensors\": %zu, \"params\": %lld, \"ms_per_step\": %.3f}\n",
        kind.c_str(), threads, named.size(), static_cast<long long>(numel), ms[ms.size() / 2]);
  }
}
