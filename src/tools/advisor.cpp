// The advisor's rules (include/fasttrain/advisor.h). Each rule is a function from the config and
// the measurements to at most one finding; its threshold is where the change starts to pay:
//   data-wait        data phase > 5% of the step and > 0.1 ms   -> more loader workers (below
//                    0.1 ms the time is handing a ready batch over, which workers cannot cut)
//   batch-size       peak memory < 25% of the budget            -> --batch-size auto
//   precision        fp32 on a CPU with bf16 dot products       -> --precision bf16-mixed
//   memory           peak > 85% of the budget                   -> checkpointing or accumulation
//   bias-before-bn   a convolution's bias feeding a BatchNorm   -> bias=false (BN removes it)
//   channels-last    convolutions > 20% of the step, NCHW       -> --channels-last true
//   threads          threads x local ranks > logical CPUs       -> fewer threads per rank
//   optimizer        optimizer > 15% of the step                -> accumulate (fewer updates)
//   communication    waiting for gradients > 10% of the step    -> smaller buckets
#include "fasttrain/advisor.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <thread>

#include <nlohmann/json.hpp>

#include "fasttrain/dist.h"
#include "fasttrain/error.h"
#include "fasttrain/machine.h"
#include "fasttrain/nn.h"

namespace ft::train {

namespace {

using nlohmann::json;

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string mib(int64_t bytes) { return fmt("%.1f MiB", static_cast<double>(bytes) / 1048576.0); }

double phase(const RunMeasurements& m, const char* name) {
  const auto it = m.phase_ms.find(name);
  return it == m.phase_ms.end() ? 0.0 : it->second;
}

int64_t effective_threads(const TrainerConfig& c, const RunMeasurements& m) {
  return c.threads > 0 ? c.threads : std::max<int64_t>(1, m.cores / std::max<int64_t>(1, m.local_ranks));
}

using Rule = std::optional<Finding> (*)(const TrainerConfig&, const RunMeasurements&, const nn::Module*);

std::optional<Finding> data_wait(const TrainerConfig& c, const RunMeasurements& m, const nn::Module*) {
  const double wait = phase(m, "data");
  if (m.step_ms <= 0 || wait / m.step_ms <= 0.05 || wait <= 0.1) return std::nullopt;
  const int64_t workers = std::max<int64_t>(2, c.workers * 2);
  return Finding{"data-wait",
                 "waiting for data " + fmt("%.0f", 100 * wait / m.step_ms) + "% of the step (" + fmt("%.2f", wait) +
                     " of " + fmt("%.2f", m.step_ms) + " ms) with " + std::to_string(c.workers) + " loader workers",
                 "--workers " + std::to_string(workers)};
}

std::optional<Finding> batch_size(const TrainerConfig& c, const RunMeasurements& m, const nn::Module*) {
  if (!m.peak_bytes || m.memory_budget_bytes <= 0 || c.batch_size == 0) return std::nullopt;
  const double share = static_cast<double>(*m.peak_bytes) / static_cast<double>(m.memory_budget_bytes);
  if (share >= 0.25) return std::nullopt;
  return Finding{"batch-size",
                 "peak memory " + mib(*m.peak_bytes) + " is " + fmt("%.1f", 100 * share) + "% of the budget " +
                     mib(m.memory_budget_bytes) + " at batch size " + std::to_string(c.batch_size),
                 "--batch-size auto (the largest batch that fits, lr scaled linearly)"};
}

std::optional<Finding> precision(const TrainerConfig& c, const RunMeasurements& m, const nn::Module*) {
  if ((c.precision.mode != Precision::FP32 && c.precision.mode != Precision::TF32) || !m.bf16_hardware)
    return std::nullopt;
  return Finding{"precision", "fp32 matrix products on a CPU with bf16 dot-product hardware (" + m.cpu_isa + ")",
                 "--precision bf16-mixed"};
}

std::optional<Finding> memory(const TrainerConfig& c, const RunMeasurements& m, const nn::Module*) {
  if (!m.peak_bytes || m.memory_budget_bytes <= 0) return std::nullopt;
  const double share = static_cast<double>(*m.peak_bytes) / static_cast<double>(m.memory_budget_bytes);
  if (share <= 0.85) return std::nullopt;
  const auto it = m.peak_by_category.find("activations");
  const int64_t activations = it == m.peak_by_category.end() ? 0 : it->second;
  std::string evidence = "peak memory " + mib(*m.peak_bytes) + " is " + fmt("%.0f", 100 * share) + "% of the budget " +
                         mib(m.memory_budget_bytes) + "; activations hold " + mib(activations) + " of it";
  if (!c.precision.checkpoint_blocks && activations * 2 > *m.peak_bytes)
    return Finding{"memory", evidence, "--checkpoint-blocks true (recompute each block's activations in backward)"};
  const int64_t half = std::max<int64_t>(1, c.batch_size / 2);
  return Finding{"memory", evidence,
                 "--batch-size " + std::to_string(half) + " --accumulate " + std::to_string(c.accumulate * 2) +
                     " (the same effective batch in half the activation memory)"};
}

// A Conv2d with a bias directly followed by a BatchNorm2d among a module's children (in the
// order they were registered, which is the order sequential models run them).
void find_bias_before_bn(const nn::Module& module, const std::string& prefix, std::vector<std::string>& found) {
  const auto children = module.named_children();
  for (size_t i = 0; i < children.size(); ++i) {
    const auto& [name, child] = children[i];
    const std::string path = prefix.empty() ? name : prefix + "." + name;
    if (i + 1 < children.size() && child->type_name() == "Conv2d" &&
        children[i + 1].second->type_name() == "BatchNorm2d" && static_cast<const nn::Conv2d&>(*child).bias.defined())
      found.push_back(path + " -> " + (prefix.empty() ? "" : prefix + ".") + children[i + 1].first);
    find_bias_before_bn(*child, path, found);
  }
}

std::optional<Finding> bias_before_bn(const TrainerConfig&, const RunMeasurements&, const nn::Module* model) {
  if (model == nullptr) return std::nullopt;
  std::vector<std::string> found;
  find_bias_before_bn(*model, "", found);
  if (found.empty()) return std::nullopt;
  std::string list;
  for (size_t i = 0; i < found.size() && i < 4; ++i) list += (i ? ", " : "") + found[i];
  if (found.size() > 4) list += " and " + std::to_string(found.size() - 4) + " more";
  return Finding{"bias-before-batchnorm",
                 std::to_string(found.size()) +
                     " convolution(s) with a bias feed a BatchNorm, which subtracts the "
                     "mean and so cancels the bias: " +
                     list,
                 "build those convolutions without a bias (nn::Conv2d with bias = false)"};
}

std::optional<Finding> channels_last(const TrainerConfig& c, const RunMeasurements& m, const nn::Module*) {
  if (c.precision.channels_last || m.step_ms <= 0) return std::nullopt;
  double conv_ms = 0;
  for (const auto& [op, ms] : m.op_self_ms)
    if (op.find("conv") != std::string::npos) conv_ms += ms;
  if (conv_ms / m.step_ms <= 0.2) return std::nullopt;
  return Finding{"channels-last",
                 "convolutions take " + fmt("%.0f", 100 * conv_ms / m.step_ms) + "% of the step (" +
                     fmt("%.2f", conv_ms) + " ms) in NCHW memory; oneDNN's convolutions run NHWC natively",
                 "--channels-last true"};
}

std::optional<Finding> threads(const TrainerConfig& c, const RunMeasurements& m, const nn::Module*) {
  const int64_t per_rank = effective_threads(c, m), total = per_rank * m.local_ranks;
  if (total <= m.cores) return std::nullopt;
  return Finding{"threads",
                 std::to_string(m.local_ranks) + " process(es) x " + std::to_string(per_rank) +
                     " threads = " + std::to_string(total) + " threads on " + std::to_string(m.cores) +
                     " logical CPUs: spinning OpenMP threads that share a core slow every step",
                 "--threads " + std::to_string(std::max<int64_t>(1, m.cores / m.local_ranks))};
}

std::optional<Finding> optimizer(const TrainerConfig& c, const RunMeasurements& m, const nn::Module*) {
  const double opt = phase(m, "optimizer");
  if (m.step_ms <= 0 || opt / m.step_ms <= 0.15) return std::nullopt;
  // The update is already one multi-tensor pass per group: what remains is doing it less often.
  return Finding{"optimizer",
                 "the optimizer update takes " + fmt("%.0f", 100 * opt / m.step_ms) + "% of the step (" +
                     fmt("%.2f", opt) + " ms, already one fused pass per parameter group)",
                 "--accumulate " + std::to_string(c.accumulate * 2) + " (one update per " +
                     std::to_string(c.accumulate * 2) + " micro-batches) or a larger --batch-size"};
}

std::optional<Finding> communication(const TrainerConfig&, const RunMeasurements& m, const nn::Module*) {
  if (!m.communication_wait_ms || m.step_ms <= 0 || *m.communication_wait_ms / m.step_ms <= 0.1) return std::nullopt;
  return Finding{"communication",
                 "after backward the step waits " + fmt("%.2f", *m.communication_wait_ms) + " ms (" +
                     fmt("%.0f", 100 * *m.communication_wait_ms / m.step_ms) +
                     "% of the step) for gradient all-reduces that backward did not hide",
                 "--bucket-cap-mb 5 (smaller buckets start communicating earlier in backward)"};
}

constexpr Rule kRules[] = {data_wait,     batch_size, precision, memory,       bias_before_bn,
                           channels_last, threads,    optimizer, communication};

int64_t machine_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : 0;
}

}  // namespace

std::vector<Finding> advise(const TrainerConfig& config, const RunMeasurements& m, const nn::Module* model) {
  std::vector<Finding> findings;
  for (Rule rule : kRules)
    if (auto f = rule(config, m, model)) findings.push_back(std::move(*f));
  return findings;
}

RunMeasurements measurements_from_profile(const std::string& path, const TrainerConfig& config) {
  json doc;
  try {
    doc = json::parse(read_text(path, "the profile summary"));
  } catch (const json::exception& e) {
    FT_FAIL(path, ": invalid JSON (the profile summary): ", e.what());
  }
  FT_CHECK(doc.value("format", std::string()) == "fasttrain.profile_summary.v1", path,
           ": expected format fasttrain.profile_summary.v1, found '", doc.value("format", std::string()), "'");
  RunMeasurements m;
  try {
    m.step_ms = doc.at("step_ms").get<double>();
    for (const auto& [name, ms] : doc.at("phase_ms_per_step").items()) m.phase_ms[name] = ms.get<double>();
    for (const json& op : doc.at("ops"))
      m.op_self_ms[op.at("name").get<std::string>()] += op.at("self_ms_per_step").get<double>();
    if (doc.contains("memory")) {
      const json& mem = doc.at("memory");
      m.peak_bytes = mem.at("peak_bytes").get<int64_t>();
      for (const auto& [name, bytes] : mem.at("by_category").items()) m.peak_by_category[name] = bytes.get<int64_t>();
    }
    // Only data-parallel steps have the phase (a world of one has nothing to wait for).
    if (m.phase_ms.count("communication") > 0) m.communication_wait_ms = m.phase_ms.at("communication");
  } catch (const json::exception& e) {
    FT_FAIL(path, ": malformed profile summary: ", e.what());
  }
  m.cores = std::max<int64_t>(1, std::thread::hardware_concurrency());
  m.local_ranks = dist::launched() ? dist::world()->local_size() : 1;
  const CpuInfo cpu = cpu_info();
  m.bf16_hardware = cpu.bf16_hardware;
  m.cpu_isa = cpu.detected_level;
  const int64_t limit = config.memory_limit.bytes;
  m.memory_budget_bytes = limit > 0 ? limit : machine_memory_bytes();
  return m;
}

std::string findings_json(const std::vector<Finding>& findings) {
  json list = json::array();
  for (const Finding& f : findings) list.push_back({{"rule", f.rule}, {"evidence", f.evidence}, {"change", f.change}});
  return json{{"format", "fasttrain.advice.v1"}, {"findings", list}}.dump(2) + "\n";
}

std::vector<Finding> findings_from_json(const std::string& text, const std::string& source) {
  std::vector<Finding> out;
  try {
    const json doc = json::parse(text);
    FT_CHECK(doc.value("format", std::string()) == "fasttrain.advice.v1", source,
             ": expected format fasttrain.advice.v1");
    for (const json& f : doc.at("findings"))
      out.push_back(
          {f.at("rule").get<std::string>(), f.at("evidence").get<std::string>(), f.at("change").get<std::string>()});
  } catch (const json::exception& e) {
    FT_FAIL(source, ": malformed advice: ", e.what());
  }
  return out;
}

std::string findings_text(const std::vector<Finding>& findings) {
  if (findings.empty()) return "advisor: nothing to change (no rule's threshold was crossed)\n";
  std::string s = "advisor:\n";
  for (const Finding& f : findings) s += "  [" + f.rule + "] " + f.evidence + "\n      -> " + f.change + "\n";
  return s;
}

}  // namespace ft::train
