// The Trainer's --profile and --memory-history (profile_run.h), and the per-step breakdown of a
// profiled range.
//
// Breakdown. Phases: the "phase" spans of each name summed over the range and divided by its
// steps; "other" is the step spans' time not inside any phase (logging, the schedule). Ops: the
// "kernel" spans by name with their self time (duration minus the spans directly inside them on
// the same lane), FLOPs (op_flops.cpp) and bytes. Achieved GFLOP/s = FLOPs / self time; the
// fraction of peak divides that by profiler::measured_peak_flops() for the run's precision: fp32
// FMA, or for bf16 runs the fastest bf16 product the CPU has (profiler.h says how it is measured).
#include "fasttrain/profile_run.h"

#include "fasttrain/advisor.h"

#include <algorithm>
#include <cstdio>
#include <map>

#include <nlohmann/json.hpp>

#include "fasttrain/allocator.h"
#include "fasttrain/atomic_file.h"
#include "fasttrain/error.h"
#include "fasttrain/train_step.h"
#include "train/run_files.h"

namespace ft::train {

using nlohmann::json;

// --- breakdown ---

ProfileSummary summarize(const std::vector<profiler::Span>& spans, const profiler::PeakFlops& peak) {
  ProfileSummary s;
  s.peak = peak;
  // Self times: per lane, spans by start (enclosing first); a stack of open spans finds each
  // span's parent.
  std::vector<size_t> order(spans.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const auto &x = spans[a], &y = spans[b];
    if (x.tid != y.tid) return x.tid < y.tid;
    if (x.start_ns != y.start_ns) return x.start_ns < y.start_ns;
    return x.duration_ns > y.duration_ns;
  });
  // FLOPs and bytes are made self too: a kernel that runs others (the CPU's linear_weight_grad
  // runs matmul) would otherwise count its children's work a second time.
  std::vector<int64_t> self(spans.size());
  std::vector<double> self_flops(spans.size()), self_bytes(spans.size());
  for (size_t i = 0; i < spans.size(); ++i)
    self[i] = spans[i].duration_ns, self_flops[i] = spans[i].flops, self_bytes[i] = spans[i].bytes;
  std::vector<size_t> stack;
  int lane = -1;
  for (size_t i : order) {
    const profiler::Span& sp = spans[i];
    if (sp.tid != lane) {
      stack.clear();
      lane = sp.tid;
    }
    while (!stack.empty() &&
           spans[stack.back()].start_ns + spans[stack.back()].duration_ns < sp.start_ns + sp.duration_ns)
      stack.pop_back();
    if (!stack.empty()) {
      self[stack.back()] -= sp.duration_ns;
      self_flops[stack.back()] -= sp.flops;
      self_bytes[stack.back()] -= sp.bytes;
    }
    stack.push_back(i);
  }

  std::map<int64_t, double> step_ms;
  std::map<std::string, double> phase_total;
  std::map<std::string, OpSummary> ops;
  double phases_in_steps = 0;
  for (size_t i = 0; i < spans.size(); ++i) {
    const profiler::Span& sp = spans[i];
    const double ms = static_cast<double>(sp.duration_ns) * 1e-6;
    if (sp.category == "step") {
      step_ms[sp.step] += ms;
    } else if (sp.category == "phase") {
      phase_total[sp.name] += ms;
      if (sp.step >= 0) phases_in_steps += ms;
    } else if (sp.category == "kernel") {
      OpSummary& o = ops[sp.name];
      o.name = sp.name;
      ++o.calls;
      o.self_ms += static_cast<double>(self[i]) * 1e-6;
      const double flops = std::max(0.0, self_flops[i]);
      o.flops += flops;
      o.bytes += std::max(0.0, self_bytes[i]);
      s.kernel_flops += flops;
    }
  }
  s.steps = static_cast<int64_t>(step_ms.size());
  if (!step_ms.empty()) {
    s.first_step = step_ms.begin()->first;
    s.last_step = step_ms.rbegin()->first;
  }
  const double n = s.steps > 0 ? static_cast<double>(s.steps) : 1.0;
  double total_step_ms = 0;
  for (const auto& [step, ms] : step_ms) total_step_ms += ms;
  s.step_ms = total_step_ms / n;
  for (int p = 1; p < profiler::kPhaseCount; ++p) {
    const char* name = profiler::phase_name(static_cast<profiler::Phase>(p));
    auto it = phase_total.find(name);
    if (it != phase_total.end()) s.phase_ms.emplace_back(name, it->second / n);
  }
  s.phase_ms.emplace_back("other", std::max(0.0, (total_step_ms - phases_in_steps) / n));
  for (auto& [name, o] : ops) s.ops.push_back(o);
  std::sort(s.ops.begin(), s.ops.end(), [](const OpSummary& a, const OpSummary& b) { return a.self_ms > b.self_ms; });
  s.kernel_flops /= n;
  return s;
}

namespace {
double gflops_of(double flops, double ms) { return ms > 0 ? flops / (ms * 1e-3) / 1e9 : 0; }
}  // namespace

std::string summary_json(const ProfileSummary& s, const memory::PeakReport* memory) {
  const double n = s.steps > 0 ? static_cast<double>(s.steps) : 1.0;
  json phases = json::object();
  for (const auto& [name, ms] : s.phase_ms) phases[name] = ms;
  json ops = json::array();
  for (const OpSummary& o : s.ops) {
    const double g = gflops_of(o.flops, o.self_ms);
    ops.push_back({{"name", o.name},
                   {"calls_per_step", static_cast<double>(o.calls) / n},
                   {"self_ms_per_step", o.self_ms / n},
                   {"share_of_step", s.step_ms > 0 ? o.self_ms / n / s.step_ms : 0.0},
                   {"flops_per_step", o.flops / n},
                   {"gflops", g},
                   {"fraction_of_peak", s.peak.gflops > 0 ? g / s.peak.gflops : 0.0},
                   {"bytes_per_step", o.bytes / n},
                   {"gb_per_s", o.self_ms > 0 ? o.bytes / (o.self_ms * 1e-3) / 1e9 : 0.0}});
  }
  const double achieved = gflops_of(s.kernel_flops, s.step_ms);
  json doc = {
      {"format", "fasttrain.profile_summary.v1"},
      {"first_step", s.first_step},
      {"last_step", s.last_step},
      {"steps", s.steps},
      {"step_ms", s.step_ms},
      {"phase_ms_per_step", phases},
      {"flops_per_step", s.kernel_flops},
      {"achieved_gflops", achieved},
      {"fraction_of_peak", s.peak.gflops > 0 ? achieved / s.peak.gflops : 0.0},
      {"peak",
       {{"gflops", s.peak.gflops},
        {"gflops_per_core", s.peak.gflops_per_core},
        {"threads", s.peak.threads},
        {"instruction", s.peak.instruction},
        {"method", "12 independent fp32 FMA chains on one core, best of 3 timed runs of >= 20 ms, times threads"}}},
      {"ops", ops}};
  if (memory != nullptr) {
    // The module holding the most: a named one ("" is work outside any module, mostly backward's
    // temporaries; "(before recording)" the unlabeled baseline).
    const memory::ModuleBytes* top = nullptr;
    for (const memory::ModuleBytes& m : memory->by_module)
      if (!m.module.empty() && m.module != "(before recording)") {
        top = &m;
        break;
      }
    json cats = json::object();
    for (int c = 0; c < memory::kCategoryCount; ++c)
      cats[memory::category_name(static_cast<memory::Category>(c))] = memory->by_category[c];
    doc["memory"] = {{"peak_bytes", memory->peak_bytes},
                     {"peak_phase", profiler::phase_name(memory->peak_phase)},
                     {"peak_step", memory->peak_step},
                     {"by_category", cats},
                     {"top_module", top ? json(top->module) : json(nullptr)},
                     {"top_module_bytes", top ? top->bytes : 0}};
  }
  return doc.dump(2) + "\n";
}

std::string summary_table(const ProfileSummary& s, size_t top_ops) {
  std::string out;
  char line[256];
  const double n = s.steps > 0 ? static_cast<double>(s.steps) : 1.0;
  std::snprintf(
      line, sizeof line,
      "profile: steps %lld-%lld, %.2f ms per step, %.2f GFLOP/s in kernels (%.1f%% of a measured peak of %.1f "
      "GFLOP/s: %s, %d threads)\n",
      static_cast<long long>(s.first_step), static_cast<long long>(s.last_step), s.step_ms,
      gflops_of(s.kernel_flops, s.step_ms),
      s.peak.gflops > 0 ? 100 * gflops_of(s.kernel_flops, s.step_ms) / s.peak.gflops : 0.0, s.peak.gflops,
      s.peak.instruction.c_str(), s.peak.threads);
  out += line;
  out += "  phase          ms/step   share\n";
  for (const auto& [name, ms] : s.phase_ms) {
    std::snprintf(line, sizeof line, "  %-12s %9.3f  %5.1f%%\n", name.c_str(), ms,
                  s.step_ms > 0 ? 100 * ms / s.step_ms : 0.0);
    out += line;
  }
  out += "  op (by self time)         calls/step  self ms/step   share    GFLOP/s  of peak\n";
  for (size_t i = 0; i < s.ops.size() && i < top_ops; ++i) {
    const OpSummary& o = s.ops[i];
    const double g = gflops_of(o.flops, o.self_ms);
    std::snprintf(line, sizeof line, "  %-24s %11.1f %13.3f  %5.1f%%  %9.2f  %6.1f%%\n", o.name.c_str(),
                  static_cast<double>(o.calls) / n, o.self_ms / n,
                  s.step_ms > 0 ? 100 * o.self_ms / n / s.step_ms : 0.0, g,
                  s.peak.gflops > 0 ? 100 * g / s.peak.gflops : 0.0);
    out += line;
  }
  return out;
}

std::string memory_table(const memory::PeakReport& r, size_t top_modules) {
  std::string out;
  char line[256];
  auto mib = [](int64_t b) { return static_cast<double>(b) / (1024.0 * 1024.0); };
  std::snprintf(line, sizeof line, "memory: peak %.2f MiB in step %lld (%s, %s)\n", mib(r.peak_bytes),
                static_cast<long long>(r.peak_step), profiler::phase_name(r.peak_phase),
                r.peak_op.empty() ? "-" : r.peak_op.c_str());
  out += line;
  for (int c = 0; c < memory::kCategoryCount; ++c) {
    if (r.by_category[c] == 0) continue;
    std::snprintf(line, sizeof line, "  %-16s %10.2f MiB  %5.1f%%\n",
                  memory::category_name(static_cast<memory::Category>(c)), mib(r.by_category[c]),
                  r.peak_bytes > 0 ? 100.0 * r.by_category[c] / r.peak_bytes : 0.0);
    out += line;
  }
  for (size_t i = 0; i < r.by_module.size() && i < top_modules; ++i) {
    const std::string& m = r.by_module[i].module;
    std::snprintf(line, sizeof line, "  module %-30s %10.2f MiB\n", m.empty() ? "(outside any module)" : m.c_str(),
                  mib(r.by_module[i].bytes));
    out += line;
  }
  return out;
}

// --- labels ---

void label_training_state(nn::Module& model, const optim::Optimizer& optimizer) {
  if (!memory::recording()) return;
  const auto params = model.named_parameters();
  auto module_of = [](const std::string& name) {
    const size_t dot = name.rfind('.');
    return dot == std::string::npos ? std::string("(model)") : name.substr(0, dot);
  };
  for (const auto& [name, p] : params) {
    memory::label(p, memory::Category::Parameters, name);
    memory::label(p.grad(), memory::Category::Gradients, name + ".grad", module_of(name));
  }
  for (const auto& [name, b] : model.named_buffers()) memory::label(b, memory::Category::Parameters, name);
  // State "<group>.<index>.<state>" belongs to param_groups()[group].params[index]: named after it.
  const auto& groups = optimizer.param_groups();
  for (const auto& [key, t] : optimizer.state_tensors()) {
    std::string name = "optimizer." + key, module = "(optimizer)";
    const size_t d1 = key.find('.'), d2 = key.find('.', d1 + 1);
    if (d1 != std::string::npos && d2 != std::string::npos) {
      const size_t g = std::stoul(key.substr(0, d1)), i = std::stoul(key.substr(d1 + 1, d2 - d1 - 1));
      if (g < groups.size() && i < groups[g].params.size())
        for (const auto& [pname, p] : params)
          if (p.storage() == groups[g].params[i].storage()) {
            name = pname + "." + key.substr(d2 + 1);
            module = module_of(pname);
          }
    }
    memory::label(t, memory::Category::OptimizerState, name, module);
  }
}

void label_batch(const data::Batch& batch) {
  if (!memory::recording()) return;
  for (size_t i = 0; i < batch.fields.size(); ++i)
    memory::label(batch.fields[i], memory::Category::DataBatches, "batch." + std::to_string(i), "(data)");
}

// --- the run ---

std::unique_ptr<ProfileRun> ProfileRun::create(const TrainerConfig& c, std::string run_dir, nn::Module& model,
                                               const optim::Optimizer& optimizer,
                                               std::function<void(const std::string&)> note,
                                               std::shared_ptr<dist::Communicator> job, std::string rank_label) {
  const StepRange& steps = c.profile.steps;
  if (steps.empty() && !c.profile.memory_history) return nullptr;
  std::unique_ptr<ProfileRun> r(new ProfileRun());
  if (job && job->world_size() > 1) {
    r->job_ = std::move(job);
    r->rank_label_ = std::move(rank_label);
  }
  r->dir_ = std::move(run_dir);
  r->config_ = c;
  r->model_ = &model;
  r->optimizer_ = &optimizer;
  r->note_ = std::move(note);
  r->trace_ = !steps.empty();
  r->memory_ = c.profile.memory_history && r->writes();
  r->first_ = steps.empty() ? 1 : steps.first;
  r->last_ = steps.empty() ? 3 : steps.last;
  profiler::set_thread_name("train");
  return r;
}

ProfileRun::~ProfileRun() {
  step_scope_.reset();
  if (session_) session_->stop();
  if (started_ && !done_ && memory_) memory::stop_history();
  profiler::forget_module_names();
}

void ProfileRun::start() {
  started_ = true;
  profiler::name_modules(*model_);
  if (trace_) {
    // Before the session: its tens of milliseconds are not in the trace.
    const bool bf16 = precision_is_bf16(config_.precision.mode);
    peak_ = profiler::measured_peak_flops(0, bf16 ? profiler::PeakOperands::BF16 : profiler::PeakOperands::F32);
    session_ = std::make_unique<profiler::Session>();
  }
  if (memory_) {
    allocator_for(Device::cpu()).reset_peak();  // the history replays to this peak
    memory::start_history();
    label_training_state(*model_, *optimizer_);
  }
}

void ProfileRun::before_step(int64_t step) {
  if (done_ || step < first_ || step > last_) return;
  if (!started_) start();
  step_scope_ = std::make_unique<profiler::StepScope>(step);
}

void ProfileRun::after_step(int64_t step) {
  if (!started_ || done_) return;
  label_training_state(*model_, *optimizer_);
  step_scope_.reset();
  if (step >= last_) stop_and_write();
}

void ProfileRun::finish() {
  if (started_ && !done_) {
    step_scope_.reset();
    stop_and_write();
  }
}

std::string ProfileRun::job_trace() const {
  if (!job_) return session_->chrome_trace_json();
  // The earliest session start is the common origin (-max(-t): the reductions have no min).
  Tensor start = scalar_tensor(-session_->start_unix_ns(), DType::I64);
  job_->all_reduce(start, dist::ReduceOp::Max);
  profiler::TraceProcess process;
  process.pid = job_->rank();
  process.name = rank_label_.empty() ? "rank " + std::to_string(job_->rank()) : rank_label_;
  process.origin_unix_ns = -start.item<int64_t>();
  const std::vector<std::string> all = dist::all_gather_strings(*job_, session_->chrome_trace_json(process));
  return writes() ? profiler::merge_chrome_traces(all) : std::string();
}

void ProfileRun::stop_and_write() {
  done_ = true;
  if (!writes()) {  // another rank: its trace goes to rank 0, which writes every file
    if (trace_) {
      session_->stop();
      job_trace();
    }
    profiler::forget_module_names();
    return;
  }
  const std::string folder = dir_ + "/profile";
  make_dirs(folder);
  std::optional<memory::PeakReport> mem;
  if (memory_) {
    memory::stop_history();
    const std::vector<memory::Event> events = memory::history();
    mem = memory::analyze(events);
    write_file_atomically(folder + "/memory.json", memory::history_json(events, *mem));
  }
  if (trace_) {
    session_->stop();
    write_file_atomically(folder + "/trace.json", job_trace());
    const ProfileSummary s = summarize(session_->spans(), peak_);
    write_file_atomically(folder + "/summary.json", summary_json(s, mem ? &*mem : nullptr));
    note_(summary_table(s));
    // The advisor reads what was just measured, with the model for the rules about its layers.
    const std::vector<Finding> findings =
        advise(config_, measurements_from_profile(folder + "/summary.json", config_), model_);
    write_file_atomically(folder + "/advice.json", findings_json(findings));
    note_(findings_text(findings));
  }
  if (mem) note_(memory_table(*mem));
  note_("profile: written to " + folder);
  profiler::forget_module_names();
}

}  // namespace ft::train
