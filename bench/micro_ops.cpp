// Op micro-benchmark: times the cases of bench/micro_cases.json (matmul, conv2d, batch_norm,
// max_pool2d, layer_norm, softmax, attention, cat, activations, SwiGLU's silu_mul, rotary
// embedding; forward and forward+backward; f32
// and bf16) and prints one JSON line per case, in the same format as bench/torch_micro.py so the
// two can be compared line by line. With --device cuda the inputs live on the GPU and each timed
// run ends with a wait for the device.
// With --clock cpu (CPU only) each run is timed by the process's CPU time instead of the wall
// clock: with --threads 1 that is the op's own time even while other processes share the cores
// (a loaded machine stretches wall-clock times by whole scheduler slices); with more threads it
// also counts threads waiting at barriers, so use it with one.
// Usage: micro_ops [--threads N] [--iters N] [--filter S] [--cases PATH] [--device cpu|cuda[:N]]
//                  [--clock wall|cpu]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "fasttrain/fasttrain.h"

using namespace ft;
using json = nlohmann::json;

namespace {

struct Bench {
  std::vector<Tensor> inputs;
  std::function<Tensor(const std::vector<Tensor>&)> fn;
};

// Document ids [B, T] for an attention case with "doc_len" L (micro_cases.json): each row packs
// documents whose lengths cycle through L/2, 3L/2, 3L/4, 5L/4, L (mean L, boundaries at varied
// offsets in the tiles), row b starting at entry b % 5 of the cycle. torch_micro.py builds the same.
Tensor bench_doc_ids(int64_t B, int64_t T, int64_t L) {
  const int64_t cycle[5] = {L / 2, 3 * L / 2, 3 * L / 4, 5 * L / 4, L};
  std::vector<double> ids;
  for (int64_t b = 0; b < B; ++b) {
    int64_t id = 0, k = b % 5, left = std::max<int64_t>(1, cycle[k]);
    for (int64_t t = 0; t < T; ++t, --left) {
      if (left == 0) left = std::max<int64_t>(1, cycle[++k % 5]), ++id;
      ids.push_back(static_cast<double>(id));
    }
  }
  return from_vector(ids, {B, T}, DType::I32);
}

Bench make(const json& c, DType dt, const std::string& layout) {
  Generator g(0);
  auto r = [&](Shape s, double scale = 1.0) { return mul(randn(s, DType::F32, &g), scale).to(dt); };
  const std::string op = c["op"];
  if (op == "matmul") {
    int64_t M = c["M"], K = c["K"], N = c["N"];
    return {{r({M, K}), r({K, N})}, [](const std::vector<Tensor>& in) { return matmul(in[0], in[1]); }};
  }
  if (op == "conv2d") {
    Tensor x = r({c["N"], c["C"], c["H"], c["W"]});
    Tensor w = r({c["O"], c["C"], c["k"], c["k"]}, 0.1);
    if (layout == "nhwc") {
      x = x.contiguous_channels_last();
      w = w.contiguous_channels_last();
    }
    int64_t s = c["stride"], p = c["pad"];
    return {{x, w}, [s, p](const std::vector<Tensor>& in) { return conv2d(in[0], in[1], Tensor(), {s, s}, {p, p}); }};
  }
  if (op == "batch_norm" || op == "max_pool2d") {
    // ResNet's per-layer memory-bound ops: training-mode batch norm (with the ReLU that follows
    // it fused, as nn::Sequential runs them; with "residual", a block's output relu(bn(x) + r))
    // and the stem's 3x3 stride-2 max pool.
    Tensor x = r({c["N"], c["C"], c["H"], c["W"]});
    if (layout == "nhwc") x = x.contiguous_channels_last();
    if (op == "max_pool2d") {
      const int64_t k = c["k"], s = c["stride"], p = c["pad"];
      return {{x}, [k, s, p](const std::vector<Tensor>& in) { return max_pool2d(in[0], {k, k}, {s, s}, {p, p}); }};
    }
    const int64_t C = c["C"];
    const bool fused_relu = c["relu"];
    if (c.value("residual", false)) {  // a ResNet block's output: relu(bn(x) + residual), one op
      Tensor res = r({c["N"], c["C"], c["H"], c["W"]});
      if (layout == "nhwc") res = res.contiguous_channels_last();
      return {{x, res, r({C}), r({C})}, [](const std::vector<Tensor>& in) {
                return batch_norm_add_relu(in[0], in[1], Tensor(), Tensor(), in[2], in[3], true, 0.1, 1e-5);
              }};
    }
    return {{x, r({C}), r({C})}, [fused_relu](const std::vector<Tensor>& in) {
              return (fused_relu ? batch_norm_relu : batch_norm)(in[0], Tensor(), Tensor(), in[1], in[2], true, 0.1,
                                                                 1e-5);
            }};
  }
  if (op == "layer_norm") {
    int64_t rows = c["rows"], cols = c["cols"];
    return {{r({rows, cols}), r({cols}), r({cols})},
            [cols](const std::vector<Tensor>& in) { return layer_norm(in[0], {cols}, in[1], in[2]); }};
  }
  if (op == "softmax") {
    return {{r({c["rows"], c["cols"]})}, [](const std::vector<Tensor>& in) { return softmax(in[0], -1); }};
  }
  if (op == "attention") {
    Shape s = {c["B"], c["H"], c["T"], c["D"]};
    bool causal = c["causal"];
    if (c.value("qkv", false)) {
      // As GPT's layers hand them over: q, k and v are permuted views of one [B, T, 3, H, D]
      // projection (rows 3 H D apart), not dense [B, H, T, D] tensors.
      return {{r({c["B"], c["T"], 3, c["H"], c["D"]})}, [causal](const std::vector<Tensor>& in) {
                auto part = [&](int64_t i) { return in[0].select(2, i).permute({0, 2, 1, 3}); };
                return scaled_dot_product_attention(part(0), part(1), part(2), causal);
              }};
    }
    if (c.value("bthd", false)) {
      // As the Llama layers hand them over: q, k and v are [B, T, H, D] tensors (the projections'
      // own layout, rotated in place) read through transposed [B, H, T, D] views.
      const Shape qs = {c["B"], c["T"], c["H"], c["D"]};
      const Shape ks = {c["B"], c["T"], c.value("Hkv", c["H"].get<int64_t>()), c["D"]};
      return {{r(qs), r(ks), r(ks)}, [causal](const std::vector<Tensor>& in) {
                return scaled_dot_product_attention(in[0].transpose(1, 2), in[1].transpose(1, 2), in[2].transpose(1, 2),
                                                    causal);
              }};
    }
    // "Hkv": grouped-query attention (k and v with Hkv heads); "doc_len": the document mask of
    // windows packed with documents of about that many tokens (bench_doc_ids).
    const Shape kv = {c["B"], c.value("Hkv", c["H"].get<int64_t>()), c["T"], c["D"]};
    if (c.contains("doc_len")) {
      // The ids are data, not an input that gets a gradient: moved to the inputs' device once.
      auto docs = std::make_shared<Tensor>(bench_doc_ids(c["B"], c["T"], c["doc_len"]));
      return {{r(s), r(kv), r(kv)}, [docs](const std::vector<Tensor>& in) {
                if (docs->device() != in[0].device()) *docs = docs->to(in[0].device());
                return scaled_dot_product_attention(in[0], in[1], in[2], DocumentMask{*docs});
              }};
    }
    return {{r(s), r(kv), r(kv)}, [causal](const std::vector<Tensor>& in) {
              return scaled_dot_product_attention(in[0], in[1], in[2], causal);
            }};
  }
  if (op == "cat") {
    // The backward of GPT's q, k, v split: three [B, H, T, D] gradients, each a permuted view,
    // concatenated into the [B, T, 3, H, D] gradient of the qkv projection.
    Shape s = {c["B"], c["H"], c["T"], c["D"]};
    return {{r(s), r(s), r(s)}, [](const std::vector<Tensor>& in) {
              std::vector<Tensor> parts;
              for (const Tensor& t : in) parts.push_back(t.permute({0, 2, 1, 3}).unsqueeze(2));
              return cat(parts, 2);
            }};
  }
  if (op == "activation") {
    // Memory-bound: one read and one write per element forward, three reads and a write backward,
    // so a slow case means the per-element formula stopped vectorising.
    const std::string fn = c["fn"];
    using Activation = Tensor (*)(const Tensor&);
    static const std::map<std::string, Activation> activations = {
        {"relu", [](const Tensor& x) { return relu(x); }},
        {"tanh", [](const Tensor& x) { return tanh(x); }},
        {"sigmoid", [](const Tensor& x) { return sigmoid(x); }},
        {"silu", [](const Tensor& x) { return silu(x); }},
        {"gelu", [](const Tensor& x) { return gelu(x); }},
        {"gelu_tanh", [](const Tensor& x) { return gelu(x, GeluApprox::Tanh); }},
        {"softplus", [](const Tensor& x) { return softplus(x); }},
        {"mish", [](const Tensor& x) { return mish(x); }},
        {"log", [](const Tensor& x) { return log(x); }},
    };
    auto it = activations.find(fn);
    FT_CHECK(it != activations.end(), "micro_ops: unknown activation ", fn);
    Activation f = it->second;
    Tensor x = r({c["rows"], c["cols"]});
    if (fn == "log") x = add(abs(x), 0.01);  // log's domain
    return {{x}, [f](const std::vector<Tensor>& in) { return f(in[0]); }};
  }
  if (op == "swiglu") {
    // A gated MLP's activation, gate and up the two halves of one [rows, 2F] projection: silu_mul
    // in one pass each way, or (fused false) silu then mul, as the composition runs.
    const int64_t F = c["cols"];
    const bool fused = c.value("fused", true);
    return {{r({c["rows"], 2 * F})}, [F, fused](const std::vector<Tensor>& in) {
              Tensor gate = in[0].narrow(1, 0, F), up = in[0].narrow(1, F, F);
              return fused ? silu_mul(gate, up) : mul(silu(gate), up);
            }};
  }
  if (op == "rope") {
    // q [B, T, H, D] as a projection's output viewed as heads, turned by rotary_embedding.
    const int64_t T = c["T"], D = c["D"];
    RopeTables tab = rope_tables(T, D, 10000.0, {}, DType::F32);
    return {{r({c["B"], T, c["H"], D})}, [tab](const std::vector<Tensor>& in) {
              return rotary_embedding(in[0], tab.cos.to(in[0].device()), tab.sin.to(in[0].device()));
            }};
  }
  FT_FAIL("micro_ops: unknown op ", op);
}

bool g_cpu_clock = false;  // --clock cpu

double now_ms() {
  if (g_cpu_clock) {
    timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return static_cast<double>(t.tv_sec) * 1e3 + static_cast<double>(t.tv_nsec) * 1e-6;
  }
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double time_case(const json& c, DType dt, const std::string& layout, bool backward, int iters, Device device) {
  Bench b = make(c, dt, layout);
  for (auto& t : b.inputs) t = t.to(device);
  if (backward)
    for (auto& t : b.inputs) t.requires_grad_(true);
  auto wait = [&] {
    if (device.is_cuda()) synchronize(current_stream(device));
  };
  std::vector<double> times;
  for (int i = 0; i < 3 + iters; ++i) {
    zero_grad(b.inputs);
    wait();
    const double t0 = now_ms();
    if (backward) {
      Tensor out = b.fn(b.inputs);
      out.backward(ones_like(out));
    } else {
      autograd::InferenceMode im;
      Tensor out = b.fn(b.inputs);
    }
    wait();
    const double ms = now_ms() - t0;
    if (i >= 3) times.push_back(ms);
  }
  std::sort(times.begin(), times.end());
  size_t n = times.size();
  return n % 2 ? times[n / 2] : 0.5 * (times[n / 2 - 1] + times[n / 2]);
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, iters = 10;
  std::string filter, cases_path = FT_BENCH_DIR "/micro_cases.json";
  Device device = Device::cpu();
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "micro_ops: option %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--threads")
      threads = std::stoi(value());
    else if (a == "--iters")
      iters = std::stoi(value());
    else if (a == "--filter")
      filter = value();
    else if (a == "--cases")
      cases_path = value();
    else if (a == "--device")
      device = Device::parse(value());
    else if (a == "--clock") {
      const std::string clock = value();
      if (clock != "wall" && clock != "cpu") {
        std::fprintf(stderr, "micro_ops: --clock takes wall or cpu, found %s\n", clock.c_str());
        return 2;
      }
      g_cpu_clock = clock == "cpu";
    } else {
      std::fprintf(stderr,
                   "micro_ops: unknown option %s (options: --threads --iters --filter --cases --device --clock)\n",
                   a.c_str());
      return 2;
    }
  }
  if (g_cpu_clock && !device.is_cpu()) {
    std::fprintf(stderr, "micro_ops: --clock cpu times CPU work only, not a device's\n");
    return 2;
  }
  set_num_threads(threads);
  std::ifstream f(cases_path);
  if (!f) {
    std::fprintf(stderr, "micro_ops: cannot open %s\n", cases_path.c_str());
    return 2;
  }
  json spec = json::parse(f);
  for (const auto& c : spec["cases"]) {
    std::string op = c["op"], name = c["name"];
    if (!filter.empty() && op.find(filter) == std::string::npos && name.find(filter) == std::string::npos) continue;
    std::vector<std::string> layouts = spec["layouts"].contains(op)
                                           ? spec["layouts"][op].get<std::vector<std::string>>()
                                           : std::vector<std::string>{""};
    for (const auto& layout : layouts)
      for (const auto& dt : spec["dtypes"])
        for (const auto& mode : spec["modes"]) {
          json line = {{"impl", "fasttrain"}, {"op", op},     {"case", name},       {"layout", layout},
                       {"dtype", dt},         {"mode", mode}, {"threads", threads}, {"device", device.str()}};
          if (g_cpu_clock) line["clock"] = "cpu";  // not comparable with wall-clock lines
          try {
            line["ms"] =
                std::round(time_case(c, dtype_from_name(dt), layout, mode == "fwd+bwd", iters, device) * 1e4) / 1e4;
          } catch (const Error& e) {
            line["error"] = e.what();
          }
          std::printf("%s\n", line.dump().c_str());
          std::fflush(stdout);
        }
  }
  return 0;
}
