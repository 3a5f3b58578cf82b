// The training loop (train.h, Trainer::fit). One step: lr (and momentum) from the schedule, then
// `accumulate` micro-batches from the loader (timed: the data wait), each the module's
// training_step + backward, then unscale / clip / optimizer step / loss-scale update
// (StepRunner, train_step.h). The loss and metrics stay tensors, summed on the device between
// log intervals and read once per interval. Around the step: log, evaluate, checkpoint, and at
// the end finish (final evaluation, model, summary.json).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>

#include <sys/resource.h>

#include <nlohmann/json.hpp>

#include "core/fault_injection.h"
#include "fasttrain/allocator.h"
#include "fasttrain/atomic_file.h"
#include "fasttrain/parallel.h"
#include "fasttrain/profile_run.h"
#include "fasttrain/tensorboard.h"
#include "train/progress.h"
#include "train/run_files.h"
#include "train/stop_signal.h"
#include "train/trainer_impl.h"

namespace ft::train {

namespace fs = std::filesystem;
using nlohmann::json;

// One call of fit(): the run folder's files, the clocks and the last evaluation.
struct Trainer::Run {
  Trainer& t;
  Impl& im;
  const TrainerConfig& c;
  TrainResult result;
  std::string dir;
  std::ofstream csv;
  std::unique_ptr<TensorBoardWriter> tb;
  int64_t end = 0, first_step = 0;
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  double eval_seconds = 0, last_log_train_seconds = 0;
  double data_wait = 0, last_log_data_wait = 0;  // seconds blocked in the loader
  int64_t last_log_step = 0, items_trained = 0, checkpoint_step = -1;
  double lr = 0;
  EvalResult last_eval;
  int64_t last_eval_step = -1;
  std::unique_ptr<ProgressLine> progress;
  std::vector<Tensor> step_losses;  // each step's loss since the last log (to name a non-finite one)
  // --profile / --memory-history (profile_run.h), else null
  std::unique_ptr<ProfileRun> profile;
  std::string host_syncs;            // --detect-sync: the last step's summary
  int64_t host_syncs_per_step = -1;  // and its count (-1: not counted)

  explicit Run(Trainer& trainer) : t(trainer), im(*trainer.impl_), c(trainer.config_) {}

  double elapsed() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); }
  std::string unit() const { return item_unit_name(im.module->unit()); }
  // This process in a job's profile trace: "rank 3", with its coordinates under model parallelism.
  std::string rank_label() const {
    std::string label = "rank " + std::to_string(im.job->rank());
    if (c.dist.tp * c.dist.pp == 1) return label;
    const dist::ProcessGroups& g = dist::process_groups(static_cast<int>(c.dist.tp), static_cast<int>(c.dist.pp));
    return label + " (tp " + std::to_string(g.tp_rank) + ", dp " + std::to_string(g.dp_rank) + ", pp " +
           std::to_string(g.pp_rank) + ")";
  }
  // The checkpoint a failed run can resume from ("" if none).
  std::string last_good_checkpoint() const {
    return result.last_checkpoint.empty() ? im.resumed_from : result.last_checkpoint;
  }

  // The run folder, its config and description, metrics.csv (appended to when resumed into the
  // same folder) and the TensorBoard writer; the header line.
  void open() {
    // Rank 0 names the folder (a default name has a timestamp); only rank 0 writes in it.
    result.run_dir = im.agreed(c.run_dir.empty() ? default_run_dir(c.task) : c.run_dir);
    result.batch_size = c.batch_size;
    dir = result.run_dir;
    if (im.rank0()) open_files();
    end = c.max_steps;
    const int64_t per_epoch = im.loader->batches_per_epoch();
    if (c.max_epochs > 0 && per_epoch > 0) end = std::min(end, c.max_epochs * per_epoch / c.accumulate);
    first_step = last_log_step = t.step_;
    if (im.checkpoint_eval_step == t.step_) {  // e.g. resumed from a checkpoint taken right after one
      last_eval = im.checkpoint_eval;
      last_eval_step = t.step_;
    }
    progress = std::make_unique<ProgressLine>(c.progress && im.rank0(), first_step, end, unit());
    print_header();
    // Every rank profiles its own steps (stages and tensor ranks differ); rank 0 writes the files.
    profile = ProfileRun::create(
        c, dir, im.module->model(), *im.optimizer,
        [this](const std::string& line) {
          if (im.rank0()) progress->result(line);
        },
        im.job, rank_label());
  }

  void open_files() {
    make_dirs(dir);
    TrainerConfig resolved = c;
    resolved.run_dir = dir;
    write_file_atomically(dir + "/config.toml", config_to_toml(resolved));
    write_file_atomically(dir + "/task.json", task_description(*im.module));
    // What a killed process left half-written in this folder goes (an unfinished checkpoint is
    // never taken for a complete one). Resumed into its own run folder (a restarted job): the rows
    // logged after the checkpoint are logged again, and the checkpoints already there count
    // towards keep_last / keep_best instead of piling up.
    remove_stale_temporaries(dir);
    const bool resumed_here = resumed_into(dir);
    const bool append = resumed_here && truncate_metrics_after(dir + "/metrics.csv", t.step_) &&
                        fs::file_size(dir + "/metrics.csv") > 0;
    csv.open(dir + "/metrics.csv", append ? std::ios::app : std::ios::trunc);
    FT_CHECK(csv.good(), dir, "/metrics.csv: cannot open for writing");
    if (!append)
      csv << "step,epoch,split,loss,accuracy,lr,momentum,grad_norm,loss_scale,items_per_s,elapsed_s,data_wait_ms\n";
    if (resumed_here && im.keeper)
      for (const SavedCheckpoint& saved : complete_checkpoints(dir))
        if (saved.step <= t.step_) delete_unkept(im.keeper->add(saved.dir, saved.step, saved.metric));
    if (c.tensorboard) {
      make_dirs(dir + "/tensorboard");
      tb = std::make_unique<TensorBoardWriter>(dir + "/tensorboard");
    }
  }

  // Whether `run_dir` is the run folder the resumed checkpoint lives in (<run_dir>/checkpoints/step-N).
  bool resumed_into(const std::string& run_dir) const {
    std::error_code ec;
    return !im.resumed_from.empty() &&
           fs::equivalent(fs::path(im.resumed_from).parent_path().parent_path(), run_dir, ec);
  }

  void print_header() {
    const nn::Module& model = im.module->model();
    const std::optional<double> floor = im.module->loss_floor();
    char head[400];
    std::snprintf(head, sizeof head,
                  "train: %s, %s with %.2fM parameters, steps %lld-%lld (batch %lld x %lld), precision %s, %d "
                  "thread(s)%s; run folder %s",
                  c.task.c_str(), model.type_name().c_str(), model.num_parameters() / 1e6,
                  static_cast<long long>(first_step + 1), static_cast<long long>(end),
                  static_cast<long long>(c.batch_size), static_cast<long long>(c.accumulate),
                  precision_name(im.runner->options().precision), get_num_threads(),
                  floor ? (", loss floor " + std::to_string(*floor).substr(0, 6)).c_str() : "", dir.c_str());
    progress->note(head);
    if (im.tensor)
      progress->note("tensor parallel: " +
                     dist::process_groups(static_cast<int>(c.dist.tp), static_cast<int>(c.dist.pp)).describe() + " (" +
                     name_of(c.dist.strategy) + " over the data groups), global batch " +
                     std::to_string(c.batch_size * im.world()) + " x " + std::to_string(c.accumulate) +
                     "; this rank holds " + std::to_string(im.tp_sync->sharded_elements()) + " split and " +
                     std::to_string(im.tp_sync->replicated_elements()) + " replicated parameter elements");
    if (im.pipeline) {
      const dist::PipelineStage& st = dist::pipeline_stage_of(im.module->model())->pipeline_stage();
      progress->note("pipeline parallel: " +
                     dist::process_groups(static_cast<int>(c.dist.tp), static_cast<int>(c.dist.pp)).describe() +
                     ", schedule " + name_of(c.dist.pp_schedule) + " over " + std::to_string(c.accumulate) +
                     " micro-batches" +
                     (im.world() > 1 ? std::string(" (") + name_of(c.dist.strategy) + " over the data groups)" : "") +
                     ", global batch " + std::to_string(c.batch_size * im.world()) + " x " +
                     std::to_string(c.accumulate) + "; rank 0 holds " + st.describe());
    } else if (!im.tensor && im.world() > 1)
      progress->note("data parallel: " + std::to_string(im.world()) + " ranks (" + name_of(c.dist.strategy) +
                     (im.device.is_cpu() ? std::string()
                                         : "; " + im.device.str() + " on this rank, " + im.comm->backend() +
                                               (im.comm->backend() == "mpi" ? " through host copies" : "")) +
                     "), global batch " + std::to_string(c.batch_size * im.world()) + " x " +
                     std::to_string(c.accumulate));
    if (!t.batch_size_report_.empty()) progress->note(t.batch_size_report_);
    if (c.precision.mode == Precision::FP8Mixed && im.device.is_cpu())
      progress->note(
          "fp8-mixed on the CPU: the FP8 products are emulated (8-bit values decoded to f32), for "
          "checking a recipe; expect an f32 step's speed, not FP8's");
  }

  // Whether the loop goes on: steps left, no early stop, and (a stream with max_epochs) epochs left.
  bool more_steps() const {
    if (t.step_ >= end || result.stopped_early) return false;
    if (c.max_epochs > 0 && im.loader->batches_per_epoch() <= 0)
      return static_cast<int64_t>(im.batches->state().epoch) < c.max_epochs;
    return true;
  }

  void step() {
    lr = im.schedule->lr(t.step_);
    im.optimizer->set_lr(lr);
    if (auto m = im.schedule->momentum(t.step_)) im.optimizer->set_momentum(*m);
    if (tb) {
      tb->add_scalar("train/lr", lr, t.step_);
      tb->add_scalar("train/momentum", im.momentum_in_use(), t.step_);
    }
    Tensor l;
    std::optional<SyncTracker> syncs;
    if (c.profile.detect_sync) syncs.emplace();
    try {
      l = im.train_step(c.accumulate, &data_wait);
    } catch (const OutOfMemoryError& e) {
      const std::string previous = last_good_checkpoint();
      throw OutOfMemoryError(detail::concat(
          "training step ", t.step_ + 1, ": ", e.what(), " (try a smaller --batch-size or --batch-size auto; ",
          previous.empty() ? std::string("no checkpoint was written") : "resume from the last checkpoint, " + previous,
          ")"));
    }
    im.loss_sum = im.loss_sum.defined() ? add(im.loss_sum, l) : l;
    im.loss_count += c.accumulate;
    step_losses.push_back(l);
    ++t.step_;
    if (syncs) report_syncs(*syncs);
  }

  // --detect-sync: the step's waits on the device, printed when they differ from the last step's
  // (a steady loop prints once).
  void report_syncs(const SyncTracker& syncs) {
    const std::string now = syncs.summary();
    if (now != host_syncs) {
      if (im.rank0())
        progress->result(detail::concat("detect-sync: step ", t.step_, ": host-device synchronisations ", now));
      host_syncs = now;
    }
    host_syncs_per_step = syncs.total();
  }

  // Stops the run when a loss since the last check, or the gradient norm, is not finite: the
  // weights have taken the update of a NaN or infinite gradient, so nothing from here on may be
  // saved (no checkpoint, no model); the last good checkpoint stays. fp16-mixed runs are left to
  // the loss scaler, which skips the steps whose gradients overflow.
  void check_finite() {
    if (im.runner->options().precision == Precision::FP16Mixed || !im.loss_sum.defined()) return;
    const Tensor& norm = im.runner->last_grad_norm();
    const double sum = im.loss_sum.item<double>(), grad_norm = norm.defined() ? norm.item<double>() : 0.0;
    if (std::isfinite(sum) && std::isfinite(grad_norm)) return;
    int64_t step = t.step_;
    for (size_t i = 0; i < step_losses.size(); ++i)
      if (!std::isfinite(step_losses[i].item<double>())) {
        step = t.step_ - static_cast<int64_t>(step_losses.size() - 1 - i);
        break;
      }
    auto text = [](double v) { return std::isnan(v) ? std::string("NaN") : v > 0 ? "inf" : "-inf"; };
    std::string what = std::isfinite(sum)
                           ? "the gradient norm is " + text(grad_norm)
                           : "the loss is not finite (" + text(sum) + " summed since step " +
                                 std::to_string(t.step_ - static_cast<int64_t>(step_losses.size())) + ")";
    const std::string previous = last_good_checkpoint();
    throw Error(
        detail::concat("training step ", step, ": ", what, "; ", first_non_finite_parameter(im.module->model()),
                       "; stopped without writing a checkpoint or the model",
                       previous.empty() ? std::string() : "; the last good checkpoint " + previous + " is intact",
                       " (try a lower --lr, --grad-clip, or another --precision)"));
  }

  // The first parameter (in registration order) whose gradient, or else whose value, holds a NaN
  // or an infinity: 0 * x is 0 for every finite x and NaN otherwise, so the sum tells exactly.
  static std::string first_non_finite_parameter(const nn::Module& model) {
    // A parameter whose memory ZeRO stage 3 released between steps has no values here to judge.
    auto finite = [](const Tensor& x) {
      if (!x.storage()->data) return true;
      return sum(mul(x.detach().to(DType::F32), 0.0)).item<double>() == 0.0;
    };
    for (const auto& [name, p] : model.named_parameters())
      if (p.grad().defined() && !finite(p.grad())) return "the first parameter with a non-finite gradient: " + name;
    for (const auto& [name, p] : model.named_parameters())
      if (!finite(p)) return "the first non-finite parameter: " + name;
    return "every parameter and gradient is finite";
  }

  bool last() const { return t.step_ == end; }

  void record(const MetricRow& r) {
    t.history_.push_back(r);
    if (!csv.is_open()) return;  // ranks other than 0 write nothing
    auto opt = [](const std::optional<double>& v, const char* fmt) {
      if (!v) return std::string();
      char b[40];
      std::snprintf(b, sizeof b, fmt, *v);
      return std::string(b);
    };
    char buf[384];
    std::snprintf(buf, sizeof buf, "%lld,%.4f,%s,%.9g,%s,%.9g,%s,%s,%s,%.1f,%.3f,%.3f\n",
                  static_cast<long long>(r.step), r.epoch, r.split.c_str(), r.loss, opt(r.accuracy, "%.6f").c_str(),
                  r.lr, opt(r.momentum, "%.9g").c_str(), opt(r.grad_norm, "%.9g").c_str(),
                  opt(r.loss_scale, "%.9g").c_str(), r.items_per_s, r.elapsed_s, r.data_wait_ms);
    csv << buf << std::flush;
    // A full disk must stop the run with a message, not leave a metrics file silently cut short.
    FT_CHECK(csv.good(), dir, "/metrics.csv: cannot write the file: ", std::strerror(errno));
  }

  // The training row of the interval that ends at this step.
  void log() {
    check_finite();
    im.reduce_log_sums();  // the global batch's loss and metrics (several ranks)
    step_losses.clear();
    const double now = elapsed(), train_seconds = now - eval_seconds;
    MetricRow r;
    r.step = t.step_;
    r.epoch = im.epoch_at(t.step_, c.accumulate);
    r.split = "train";
    const double count = static_cast<double>(im.loss_count);
    r.loss = im.loss_sum.item<double>() / count;
    for (const auto& [name, sum] : im.metric_sums) r.metrics.emplace_back(name, sum.item<double>() / count);
    r.accuracy = metric_of(r.metrics, "accuracy");
    r.lr = lr;
    r.momentum = im.momentum_in_use();
    if (const Tensor& norm = im.runner->last_grad_norm(); norm.defined()) r.grad_norm = norm.item<double>();
    if (im.runner->scaler().enabled()) r.loss_scale = im.runner->scaler().get_scale();
    // Every rank trains as many items as this one.
    r.items_per_s = static_cast<double>(im.items * im.world()) / std::max(1e-9, train_seconds - last_log_train_seconds);
    r.elapsed_s = now;
    r.data_wait_ms = 1e3 * (data_wait - last_log_data_wait) / static_cast<double>(t.step_ - last_log_step);
    items_trained += im.items * im.world();
    im.loss_sum = Tensor();
    im.metric_sums.clear();
    im.loss_count = 0;
    im.items = 0;
    last_log_step = t.step_;
    last_log_train_seconds = train_seconds;
    last_log_data_wait = data_wait;
    result.final_train_loss = r.loss;
    record(r);
    if (tb) {
      tb->add_scalar("train/loss", r.loss, t.step_);
      tb->add_scalar("train/" + unit() + "_per_s", r.items_per_s, t.step_);
      for (const auto& [name, value] : r.metrics) tb->add_scalar("train/" + name, value, t.step_);
      if (r.grad_norm) tb->add_scalar("train/grad_norm", *r.grad_norm, t.step_);
      if (r.loss_scale) tb->add_scalar("train/loss_scale", *r.loss_scale, t.step_);  // flushed at evaluations
    }
    progress->log(t.step_, r.loss, lr, r.items_per_s, now);
  }

  static std::optional<double> metric_of(const std::vector<std::pair<std::string, double>>& metrics, const char* name) {
    for (const auto& [n, v] : metrics)
      if (n == name) return v;
    return std::nullopt;
  }

  void evaluate() {
    fault::point("eval");
    profiler::PhaseScope phase(profiler::Phase::Eval);
    const double start = elapsed();
    last_eval = im.evaluate(c);
    last_eval_step = t.step_;
    eval_seconds += elapsed() - start;
    MetricRow r;
    r.step = t.step_;
    r.epoch = im.epoch_at(t.step_, c.accumulate);
    r.split = "val";
    r.loss = last_eval.loss;
    r.metrics = last_eval.metrics;
    r.accuracy = last_eval.metric("accuracy");
    r.lr = lr;
    r.elapsed_s = elapsed();
    record(r);
    if (tb) {
      tb->add_scalar("val/loss", last_eval.loss, t.step_);
      for (const auto& [name, value] : last_eval.metrics) tb->add_scalar("val/" + name, value, t.step_);
      tb->flush();
    }
    std::string line = "step " + std::to_string(t.step_) + "  val loss " + fixed(last_eval.loss, 4);
    if (r.accuracy) line += "  val accuracy " + fixed(100 * *r.accuracy, 2) + "%";
    for (const auto& [name, value] : last_eval.metrics)
      if (name != "accuracy") line += "  val " + name + " " + fixed(value, 4);
    if (const auto floor = im.module->loss_floor()) line += "  (floor " + fixed(*floor, 4) + ")";
    progress->note(line);
    if (im.early_stopping && im.early_stopping->update(monitored(c, last_eval))) {
      result.stopped_early = true;
      char why[160];
      std::snprintf(why, sizeof why, "early stopping: %s did not improve for %lld evaluations (best %.6g)",
                    name_of(c.checkpoint.monitor), static_cast<long long>(c.checkpoint.early_stopping_patience),
                    im.early_stopping->best());
      progress->note(why);
    }
  }

  static std::string fixed(double v, int digits) {
    char b[48];
    std::snprintf(b, sizeof b, "%.*f", digits, v);
    return b;
  }

  void checkpoint() {
    check_finite();
    checkpoint_step = t.step_;
    char name[32];
    std::snprintf(name, sizeof name, "step-%08lld", static_cast<long long>(t.step_));
    make_dirs(dir + "/checkpoints");
    const std::string path = dir + "/checkpoints/" + name;
    const double metric = last_eval_step == t.step_ ? monitored(c, last_eval) : std::nan("");
    im.checkpoint_metric = metric;
    im.checkpoint_eval_step = last_eval_step;
    im.checkpoint_eval = last_eval;
    try {
      profiler::PhaseScope phase(profiler::Phase::Checkpoint);
      // DDP's replicas are identical: rank 0 writes; under ZeRO every rank writes its shard.
      // Tensor parallelism: rank 0's tensor group gathers the model with it.
      if (im.rank0() || im.zero || im.writes_model()) t.save_checkpoint(path);
    } catch (const Error& e) {
      const std::string previous = last_good_checkpoint();
      throw Error("checkpoint " + path + " was not written: " + e.what() +
                  (previous.empty() ? std::string() : "; the previous checkpoint " + previous + " is intact"));
    }
    if (im.keeper && im.rank0()) delete_unkept(im.keeper->add(path, t.step_, metric));
    result.last_checkpoint = path;
  }

  // SIGINT / SIGTERM / request_stop(): a checkpoint of this step, then out of the loop.
  void interrupt() {
    result.interrupted = true;
    if (checkpoint_step != t.step_) checkpoint();
    progress->note("interrupted: checkpoint saved to " + result.last_checkpoint + "; continue with --resume " +
                   result.last_checkpoint);
  }

  // The final evaluation if the last step had none, the model, the result and summary.json.
  TrainResult finish() {
    check_finite();
    if (profile) profile->finish();
    if (last_eval_step < 0 && !result.interrupted) evaluate();
    progress->finish();
    if (tb) tb->flush();
    nn::Module& model = im.module->model();
    // ZeRO stage 3: every rank gathers (a collective); the model stays whole after fit().
    if (im.zero) im.zero->gather_all();
    if (im.writes_model()) im.save_model(dir + "/model.safetensors");
    const std::string bubble = im.pipeline_report(c);  // every rank: a collective of the pipeline group
    if (!bubble.empty()) progress->note(bubble);
    items_trained += im.items * im.world();
    result.steps = t.step_;
    result.seconds = elapsed();
    const double train_seconds = result.seconds - eval_seconds;
    result.items_per_s = train_seconds > 0 ? static_cast<double>(items_trained) / train_seconds : 0;
    result.data_wait_s = data_wait;
    result.final_val_loss = last_eval.loss;
    result.final_val_accuracy = last_eval.metric("accuracy");
    result.floor = im.module->loss_floor();
    result.unit = unit();
    result.model = model.type_name();
    result.parameters = model.num_parameters();
    if (const std::optional<Goal> goal = im.module->judge(last_eval)) {
      result.goal = goal->sentence;
      result.goal_met = goal->met;
    }
    const json ranks = per_rank_figures();  // a collective of the job: before rank 0 alone goes on
    if (im.rank0()) write_summary(ranks);
    return result;
  }

  // Each rank's memory and communication, for summary.json's "ranks" (a job of several processes
  // only: ranks of a pipeline or tensor-parallel layout hold different parts of the model, so rank
  // 0's figures do not stand for the others').
  json per_rank_figures() const {
    if (im.job->world_size() == 1) return json();
    std::vector<std::shared_ptr<dist::Communicator>> groups{im.job};
    if (c.dist.tp * c.dist.pp > 1) {
      const dist::ProcessGroups& g = dist::process_groups(static_cast<int>(c.dist.tp), static_cast<int>(c.dist.pp));
      groups = {g.world, g.tensor, g.data, g.pipeline};
    } else if (im.comm != im.job) {
      groups.push_back(im.comm);
    }
    int64_t sent = 0;
    for (const auto& g : groups) sent += g->bytes_issued();
    struct rusage usage {};
    getrusage(RUSAGE_SELF, &usage);
    constexpr int64_t kFields = 3;
    Tensor mine = empty({kFields}, DType::I64);
    int64_t* m = mine.data<int64_t>();
    m[0] = allocator_for(Device::cpu()).stats().peak_allocated_bytes;
    m[1] = static_cast<int64_t>(usage.ru_maxrss) * 1024;  // Linux reports KiB
    m[2] = sent;
    const int n = im.job->world_size();
    Tensor all = empty({n * kFields}, DType::I64);
    im.job->all_gather(mine, all);
    json out = json::array();
    const int64_t* v = all.data<int64_t>();
    for (int r = 0; r < n; ++r)
      out.push_back({{"rank", r},
                     {"peak_allocated_bytes", v[r * kFields]},
                     {"max_rss_bytes", v[r * kFields + 1]},
                     {"bytes_communicated", v[r * kFields + 2]}});
    return out;
  }

  void write_summary(const json& ranks) {
    const int64_t steps_run = t.step_ - first_step;
    json summary = {{"task", c.task},
                    {"model", result.model},
                    {"parameters", result.parameters},
                    {"steps", result.steps},
                    {"seconds", result.seconds},
                    {"threads", get_num_threads()},
                    {"precision", name_of(c.precision.mode)},
                    {"batch_size", c.batch_size},
                    {"accumulate", c.accumulate},
                    {"unit", result.unit},
                    {"items_per_s", result.items_per_s},
                    {"workers", c.workers},
                    {"data_wait_s", result.data_wait_s},
                    {"data_wait_ms_per_step", steps_run > 0 ? 1e3 * data_wait / static_cast<double>(steps_run) : 0.0},
                    {"peak_allocated_bytes", allocator_for(Device::cpu()).stats().peak_allocated_bytes},
                    {"final_train_loss", result.final_train_loss},
                    {"final_val_loss", result.final_val_loss},
                    {"interrupted", result.interrupted},
                    {"stopped_early", result.stopped_early}};
    if (host_syncs_per_step >= 0) {
      summary["host_syncs_last_step"] = host_syncs_per_step;
      summary["host_syncs"] = host_syncs;
    }
    if (!result.goal.empty()) {
      summary["goal"] = result.goal;
      summary["goal_met"] = result.goal_met;
    }
    for (const auto& [name, value] : last_eval.metrics) summary["final_val_" + name] = value;
    if (!result.last_checkpoint.empty()) summary["last_checkpoint"] = result.last_checkpoint;
    if (im.keeper && !im.keeper->best_dir().empty()) summary["best_checkpoint"] = im.keeper->best_dir();
    if (result.floor) {
      summary["loss_floor"] = *result.floor;
      summary["gap"] = result.final_val_loss - *result.floor;
    }
    if (!ranks.is_null()) summary["ranks"] = ranks;
    write_file_atomically(dir + "/summary.json", summary.dump(2) + "\n");
  }
};

// A function-try-block: an error on any rank of a job ends the job (see the handler).
TrainResult Trainer::fit(TrainModule& module, const DataModule& data) try {
  attach(module, data);
  Run run(*this);
  run.open();
  StopSignalScope signals(impl_->stop_requested);
  while (run.more_steps()) {
    if (run.profile) run.profile->before_step(step_ + 1);  // the step span encloses log, eval, checkpoint
    run.step();
    if (config_.log_every_n_steps > 0 && (step_ % config_.log_every_n_steps == 0 || run.last()))
      run.log();
    else
      run.progress->tick(step_, run.elapsed());
    if ((config_.eval_every > 0 && step_ % config_.eval_every == 0) || run.last()) run.evaluate();
    if (config_.checkpoint.every > 0 && step_ % config_.checkpoint.every == 0) run.checkpoint();
    if (run.profile) run.profile->after_step(step_);
    if (impl_->stop_requested_anywhere()) {
      run.interrupt();
      break;
    }
  }
  return run.finish();
} catch (const std::exception& e) {
  // The other ranks would wait for this one in their next collective: the job ends here, with
  // this rank and its message on stderr (dist.h, abort_job).
  if (impl_->job && impl_->job->world_size() > 1) dist::abort_job(e.what(), 2);
  throw;
}

}  // namespace ft::train
