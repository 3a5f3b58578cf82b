// The advisor: reads what a profiled run measured and says which change would make it faster or
// fit, each finding with its evidence and the exact flag to change. It reports only what it
// measured: a rule whose measurement is missing (no memory history, no model) stays silent.
// `fasttrain train --profile` prints the findings and writes profile/advice.json; the run report
// shows them. Implemented in src/tools/advisor.cpp.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "fasttrain/train.h"

namespace ft::nn {
class Module;
}

namespace ft::train {

// What the rules look at, from the profile summary (profile/summary.json), the memory history,
// the machine and the model.
struct RunMeasurements {
  double step_ms = 0;                               // mean time of a profiled step
  std::map<std::string, double> phase_ms;           // per step: data, forward, backward, optimizer, checkpoint, ...
  std::map<std::string, double> op_self_ms;         // per step, by kernel name
  std::optional<int64_t> peak_bytes;                // memory history: the peak
  std::map<std::string, int64_t> peak_by_category;  // parameters, gradients, optimizer_state, activations, ...
  std::optional<double> communication_wait_ms;      // distributed: per step, waiting for gradients after backward
  int64_t cores = 1;                                // the machine's logical CPUs
  int64_t local_ranks = 1;                          // processes of the run on this machine
  bool bf16_hardware = false;                       // AVX512-BF16 or AMX
  std::string cpu_isa;                              // "avx512_bf16", "amx", ...
  int64_t memory_budget_bytes = 0;                  // memory_limit, else the machine's memory
};

struct Finding {
  std::string rule;      // "data-wait", "batch-size", "precision", "memory", "bias-before-batchnorm",
                         // "channels-last", "threads", "optimizer", "communication"
  std::string evidence;  // what was measured
  std::string change;    // the flag (or the code change) to make
};

// Every rule over the run's configuration and measurements; `model` (optional) enables the
// rules that look at its layers.
std::vector<Finding> advise(const TrainerConfig& config, const RunMeasurements& m, const nn::Module* model = nullptr);

// The measurements of a run folder's profile/summary.json (format fasttrain.profile_summary.v1)
// and of this machine. An ft::Error names the file when it is missing or malformed.
RunMeasurements measurements_from_profile(const std::string& summary_json_path, const TrainerConfig& config);

// The findings as JSON (profile/advice.json) and back, and as lines of text.
std::string findings_json(const std::vector<Finding>& findings);
std::vector<Finding> findings_from_json(const std::string& text, const std::string& source);
std::string findings_text(const std::vector<Finding>& findings);

}  // namespace ft::train
