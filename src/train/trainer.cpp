// The training loop (train.h). One step: lr (and momentum) from the schedule, then `accumulate`
// micro-batches from the DataLoader (timed: the data wait), each forward + backward, then
// unscale / clip / optimizer step / loss-scale update (StepRunner, train_step.h). The loss stays a
// tensor, summed on the device between log intervals and read once per interval.
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <tuple>

#include <nlohmann/json.hpp>

#include "core/fault_injection.h"
#include "fasttrain/atomic_file.h"
#include "fasttrain/autocast.h"
#include "fasttrain/callbacks.h"
#include "fasttrain/device_prefetcher.h"
#include "fasttrain/loader.h"
#include "fasttrain/optim.h"
#include "fasttrain/parallel.h"
#include "fasttrain/random.h"
#include "fasttrain/safetensors.h"
#include "fasttrain/tensorboard.h"
#include "fasttrain/train_step.h"
#include "train/progress.h"
#include "train/run_files.h"
#include "train/run_setup.h"
#include "train/seeds.h"
#include "train/stop_signal.h"
#include "train/task.h"

namespace ft::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

json config_to_json(const TrainerConfig& c) {
  json j = json::object();
  visit_fields(c, [&](const char* name, const auto& v, const char*) { j[name] = v; });
  return j;
}

// The value `monitor` names, from an evaluation (NaN when the task does not measure it).
double monitored(const TrainerConfig& c, const EvalResult& r) {
  if (c.monitor == "val_accuracy") return r.accuracy >= 0 ? r.accuracy : std::nan("");
  return r.loss;
}

// A folder whose writing was interrupted (checkpoints/step-N.tmp) is refused whatever it holds.
void check_finished(const std::string& dir, const char* who) {
  fs::path folder = fs::path(dir).lexically_normal();
  if (folder.filename().empty()) folder = folder.parent_path();  // "step-N/"
  FT_CHECK(!is_temporary_name(folder.filename().string()), who, dir,
           " is an unfinished checkpoint folder (its writing was interrupted); use a complete one, "
           "checkpoints/step-N without .tmp");
}

json parse_json(const std::string& text, const std::string& path) {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    FT_FAIL(path, ": invalid JSON: ", e.what());
  }
}

}  // namespace

struct Trainer::Impl {
  std::unique_ptr<optim::Optimizer> optimizer;
  std::unique_ptr<optim::Schedule> schedule;
  std::unique_ptr<StepRunner> runner;
  std::unique_ptr<data::DataLoader> loader;  // training batches
  // The loader's batches on the training device; its state is the data position.
  std::unique_ptr<data::DevicePrefetcher> batches;
  std::unique_ptr<EarlyStopping> early_stopping;
  std::unique_ptr<CheckpointKeeper> keeper;
  Tensor loss_sum;  // training loss summed since the last log, on the device
  int64_t loss_count = 0;
  std::atomic<bool> stop_requested{false};
  std::string resumed_from;                 // the checkpoint folder resume() read ("" if none)
  double checkpoint_metric = std::nan("");  // the monitored value saved with the next checkpoint
  // The evaluation done at the step of the next checkpoint (saved with it) or of the resumed one,
  // so a run resumed at its last step does not evaluate and log that step a second time.
  int64_t checkpoint_eval_step = -1;
  EvalResult checkpoint_eval;

  // Whether `run_dir` is the run folder the resumed checkpoint lives in (<run_dir>/checkpoints/step-N).
  bool resumed_into(const std::string& run_dir) const {
    std::error_code ec;
    return !resumed_from.empty() && fs::equivalent(fs::path(resumed_from).parent_path().parent_path(), run_dir, ec);
  }

  // The next training batch, crossing into the next epoch when this one is exhausted.
  const data::Batch& next_batch() {
    fault::point("data");
    const data::Batch* b = batches->next();
    if (b == nullptr) b = batches->next();
    FT_CHECK(b != nullptr, "Trainer: the data loader produced an empty epoch");
    return *b;
  }
  // The StepRunner for the current optimizer (rebuilt when lr_find replaces the optimizer).
  void make_runner(const TrainerConfig& c, Task& task) {
    runner = std::make_unique<StepRunner>(
        task.model(), *optimizer, [&task](const Tensor& out, const Tensor& y) { return task.loss(out, y); },
        step_options(c));
  }
  // One optimisation step over `accumulate` loader batches; returns the micro-batch losses summed
  // on the device and adds the time spent waiting for batches to *data_wait.
  Tensor train_step(int64_t accumulate, double* data_wait) {
    Tensor loss_sum;
    for (int64_t micro = 0; micro < accumulate; ++micro) {
      const auto wait_start = std::chrono::steady_clock::now();
      const data::Batch& batch = next_batch();  // valid until the next call: used before it
      *data_wait += std::chrono::duration<double>(std::chrono::steady_clock::now() - wait_start).count();
      Tensor l = runner->forward_backward(batch.fields[0], batch.fields[1]);
      loss_sum = loss_sum.defined() ? add(loss_sum, l) : l;
    }
    runner->optimizer_step();
    return loss_sum;
  }
  double momentum_in_use() const {
    const auto& o = optimizer->param_groups().front().options;
    return optim::optimizer_family(optimizer->kind()) == optim::OptimizerFamily::Adam ? o.beta1 : o.momentum;
  }
};

Trainer::Trainer(TrainerConfig config) : config_(std::move(config)) {
  config_.validate();
  if (config_.threads > 0) set_num_threads(static_cast<int>(config_.threads));
  const int64_t limit = parse_memory_size(config_.memory_limit);
  if (limit > 0) allocator_for(Device::cpu()).set_memory_limit(static_cast<size_t>(limit));
  if (config_.batch_size == 0) {  // --batch-size auto
    const BatchSizeSearch found = find_batch_size(config_);
    const double scale = static_cast<double>(found.batch_size) /
                         static_cast<double>(TrainerConfig::defaults_for(config_.task).batch_size);
    config_.batch_size = found.batch_size;
    config_.lr *= scale;  // the linear scaling rule
    config_.min_lr *= scale;
    batch_size_report_ = found.report;
  }
  // Dropout draws from the default generator: seeded here, saved and restored by checkpoints.
  default_generator().set_state({derive_seed(config_.seed, SeedUse::Dropout), 0});
  task_ = make_task(config_);
  task_->model().train();
  if (config_.checkpoint_blocks) set_block_checkpointing(task_->model(), true);
  impl_ = std::make_unique<Impl>();
  impl_->optimizer = make_optimizer(config_, task_->model());
  impl_->schedule = make_schedule(config_);
  impl_->make_runner(config_, *task_);
  const MonitorMode mode = config_.monitor == "val_accuracy" ? MonitorMode::Max : MonitorMode::Min;
  if (config_.early_stopping_patience > 0)
    impl_->early_stopping =
        std::make_unique<EarlyStopping>(mode, config_.early_stopping_patience, config_.early_stopping_min_delta);
  if (config_.keep_last > 0)  // keep_last 0 keeps every checkpoint
    impl_->keeper = std::make_unique<CheckpointKeeper>(config_.keep_last, config_.keep_best, mode);
  data::LoaderOptions lo;
  lo.batch_size = config_.batch_size;
  lo.num_workers = static_cast<int>(config_.workers);
  lo.pin_memory = config_.pin_memory;
  lo.prefetch_factor = static_cast<int>(config_.prefetch);
  lo.drop_last = true;  // every step sees batch_size samples
  lo.seed = config_.seed;
  impl_->loader = std::make_unique<data::DataLoader>(task_->train_dataset(), lo, task_->train_sampler());
  impl_->batches = std::make_unique<data::DevicePrefetcher>(*impl_->loader, Device::parse(config_.device));
  FT_CHECK(impl_->loader->batches_per_epoch() >= config_.accumulate,
           "Trainer: the training data holds fewer than "
           "batch_size x accumulate = ",
           config_.batch_size * config_.accumulate, " samples");
}

Trainer::~Trainer() = default;

void Trainer::request_stop() { impl_->stop_requested.store(true); }

TrainResult Trainer::fit() {
  const TrainerConfig& c = config_;
  Impl& im = *impl_;
  nn::UnaryModule& model = task_->model();
  TrainResult result;
  result.run_dir = c.run_dir.empty() ? default_run_dir(c.task) : c.run_dir;
  result.batch_size = c.batch_size;
  const std::string& dir = result.run_dir;
  make_dirs(dir);
  TrainerConfig resolved = c;
  resolved.run_dir = dir;
  write_file_atomically(dir + "/config.toml", config_to_toml(resolved));
  write_file_atomically(dir + "/task.json", task_->describe().dump(2) + "\n");
  // Resumed into its own run folder (a restarted job): what a killed process left half-written
  // goes, the rows logged after the checkpoint are logged again, and the checkpoints already
  // there count towards keep_last / keep_best instead of piling up.
  const bool resumed_here = im.resumed_into(dir);
  if (resumed_here) remove_stale_temporaries(dir);
  const bool append =
      resumed_here && truncate_metrics_after(dir + "/metrics.csv", step_) && fs::file_size(dir + "/metrics.csv") > 0;
  std::ofstream csv(dir + "/metrics.csv", append ? std::ios::app : std::ios::trunc);
  FT_CHECK(csv.good(), dir, "/metrics.csv: cannot open for writing");
  if (!append)
    csv << "step,epoch,split,loss,accuracy,lr,momentum,grad_norm,loss_scale,items_per_s,elapsed_s,data_wait_ms\n";
  if (resumed_here && im.keeper)
    for (const SavedCheckpoint& saved : complete_checkpoints(dir))
      if (saved.step <= step_) delete_unkept(im.keeper->add(saved.dir, saved.step, saved.metric));
  std::unique_ptr<TensorBoardWriter> tb;
  if (c.tensorboard) {
    make_dirs(dir + "/tensorboard");
    tb = std::make_unique<TensorBoardWriter>(dir + "/tensorboard");
  }
  StopSignalScope signals(im.stop_requested);

  const int64_t batches_per_epoch = im.loader->batches_per_epoch();
  int64_t end = c.max_steps;
  if (c.max_epochs > 0) end = std::min(end, c.max_epochs * batches_per_epoch / c.accumulate);
  const int64_t first_step = step_;
  const int64_t items_per_step = task_->items_per_batch() * c.accumulate;
  ProgressLine progress(c.progress, first_step, end, task_->unit());
  const auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  double eval_seconds = 0, last_log_train_seconds = 0;
  double data_wait = 0, last_log_data_wait = 0;  // seconds blocked in the loader
  int64_t last_log_step = step_;
  auto epoch_of = [&](int64_t step) {
    return static_cast<double>(step * c.accumulate) / static_cast<double>(batches_per_epoch);
  };
  auto record = [&](const MetricRow& r) {
    history_.push_back(r);
    auto opt = [](double v, const char* fmt) {
      if (v < 0) return std::string();
      char b[40];
      std::snprintf(b, sizeof b, fmt, v);
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
  };
  EvalResult last_eval;
  int64_t last_eval_step = -1;
  if (im.checkpoint_eval_step == step_) {  // e.g. resumed from a checkpoint taken right after one
    last_eval = im.checkpoint_eval;
    last_eval_step = step_;
  }
  auto evaluate = [&](double lr) {
    fault::point("eval");
    const double start = elapsed();
    {
      // Evaluation runs in the training precision (Lightning does the same).
      const bool mixed = precision_is_mixed(im.runner->options().precision);
      autocast::AutocastGuard amp(mixed ? im.runner->autocast_dtype() : DType::BF16, mixed);
      last_eval = task_->evaluate();
    }
    last_eval_step = step_;
    eval_seconds += elapsed() - start;
    record({step_, epoch_of(step_), "val", last_eval.loss, last_eval.accuracy, lr, -1, -1, -1, 0, elapsed(), 0});
    if (tb) {
      tb->add_scalar("val/loss", last_eval.loss, step_);
      if (last_eval.accuracy >= 0) tb->add_scalar("val/accuracy", last_eval.accuracy, step_);
      tb->flush();
    }
    char buf[160];
    if (last_eval.accuracy >= 0)
      std::snprintf(buf, sizeof buf, "step %lld  val loss %.4f  val accuracy %.2f%%", static_cast<long long>(step_),
                    last_eval.loss, 100 * last_eval.accuracy);
    else
      std::snprintf(buf, sizeof buf, "step %lld  val loss %.4f  (floor %.4f)", static_cast<long long>(step_),
                    last_eval.loss, task_->loss_floor());
    progress.note(buf);
    if (im.early_stopping && im.early_stopping->update(monitored(c, last_eval))) {
      result.stopped_early = true;
      char why[160];
      std::snprintf(why, sizeof why, "early stopping: %s did not improve for %lld evaluations (best %.6g)",
                    c.monitor.c_str(), static_cast<long long>(c.early_stopping_patience), im.early_stopping->best());
      progress.note(why);
    }
  };
  int64_t checkpoint_step = -1;
  auto checkpoint = [&] {
    checkpoint_step = step_;
    char name[32];
    std::snprintf(name, sizeof name, "step-%08lld", static_cast<long long>(step_));
    make_dirs(dir + "/checkpoints");
    const std::string path = dir + "/checkpoints/" + name;
    const double metric = last_eval_step == step_ ? monitored(c, last_eval) : std::nan("");
    im.checkpoint_metric = metric;
    im.checkpoint_eval_step = last_eval_step;
    im.checkpoint_eval = last_eval;
    try {
      save_checkpoint(path);
    } catch (const Error& e) {
      const std::string& previous = result.last_checkpoint.empty() ? im.resumed_from : result.last_checkpoint;
      throw Error("checkpoint " + path + " was not written: " + e.what() +
                  (previous.empty() ? std::string() : "; the previous checkpoint " + previous + " is intact"));
    }
    if (im.keeper) delete_unkept(im.keeper->add(path, step_, metric));
    result.last_checkpoint = path;
  };

  {
    char head[400];
    std::snprintf(
        head, sizeof head,
        "train: %s task, %s with %.2fM parameters, steps %lld-%lld of %lld %s (batch %lld x %lld), "
        "precision %s, %d thread(s)%s; run folder %s",
        c.task.c_str(), model.type_name().c_str(), model.num_parameters() / 1e6, static_cast<long long>(first_step + 1),
        static_cast<long long>(end), static_cast<long long>(items_per_step), task_->unit().c_str(),
        static_cast<long long>(c.batch_size), static_cast<long long>(c.accumulate),
        precision_name(im.runner->options().precision), get_num_threads(),
        task_->loss_floor() >= 0 ? (", loss floor " + std::to_string(task_->loss_floor()).substr(0, 6)).c_str() : "",
        dir.c_str());
    progress.note(head);
    if (!batch_size_report_.empty()) progress.note(batch_size_report_);
  }
  double lr = im.schedule->lr(step_);
  while (step_ < end && !result.stopped_early) {
    lr = im.schedule->lr(step_);
    im.optimizer->set_lr(lr);
    if (auto m = im.schedule->momentum(step_)) im.optimizer->set_momentum(*m);
    if (tb) {
      tb->add_scalar("train/lr", lr, step_);
      tb->add_scalar("train/momentum", im.momentum_in_use(), step_);
    }
    Tensor l;
    try {
      l = im.train_step(c.accumulate, &data_wait);
    } catch (const OutOfMemoryError& e) {
      throw OutOfMemoryError(detail::concat(
          "training step ", step_ + 1, ": ", e.what(), " (try a smaller --batch-size or --batch-size auto; ",
          result.last_checkpoint.empty() && im.resumed_from.empty()
              ? std::string("no checkpoint was written")
              : "resume from the last checkpoint, " +
                    (result.last_checkpoint.empty() ? im.resumed_from : result.last_checkpoint),
          ")"));
    }
    im.loss_sum = im.loss_sum.defined() ? add(im.loss_sum, l) : l;
    im.loss_count += c.accumulate;
    ++step_;

    const bool last = step_ == end;
    if (step_ % c.log_every_n_steps == 0 || last) {
      const double now = elapsed(), train_seconds = now - eval_seconds;
      const double train_loss = im.loss_sum.item<double>() / static_cast<double>(im.loss_count);
      im.loss_sum = Tensor();
      im.loss_count = 0;
      const double rate = static_cast<double>(items_per_step * (step_ - last_log_step)) /
                          std::max(1e-9, train_seconds - last_log_train_seconds);
      const double wait_ms = 1e3 * (data_wait - last_log_data_wait) / static_cast<double>(step_ - last_log_step);
      last_log_step = step_;
      last_log_train_seconds = train_seconds;
      last_log_data_wait = data_wait;
      result.final_train_loss = train_loss;
      const Tensor& norm = im.runner->last_grad_norm();
      const double grad_norm = norm.defined() ? norm.item<double>() : -1;
      const double loss_scale = im.runner->scaler().enabled() ? im.runner->scaler().get_scale() : -1;
      record({step_, epoch_of(step_), "train", train_loss, -1, lr, im.momentum_in_use(), grad_norm, loss_scale, rate,
              now, wait_ms});
      if (tb) {
        tb->add_scalar("train/loss", train_loss, step_);
        tb->add_scalar("train/" + task_->unit() + "_per_s", rate, step_);
        if (grad_norm >= 0) tb->add_scalar("train/grad_norm", grad_norm, step_);
        if (loss_scale >= 0) tb->add_scalar("train/loss_scale", loss_scale, step_);  // flushed at evaluations
      }
      progress.log(step_, train_loss, lr, rate, now);
    } else {
      progress.tick(step_, elapsed());
    }
    if ((c.eval_every > 0 && step_ % c.eval_every == 0) || last) evaluate(lr);
    if (c.checkpoint_every > 0 && step_ % c.checkpoint_every == 0) checkpoint();
    if (im.stop_requested.load()) {
      result.interrupted = true;
      if (checkpoint_step != step_) checkpoint();
      progress.note("interrupted: checkpoint saved to " + result.last_checkpoint + "; continue with --resume " +
                    result.last_checkpoint);
      break;
    }
  }
  if (last_eval_step < 0 && !result.interrupted) evaluate(lr);
  progress.finish();
  if (tb) tb->flush();
  model.save(dir + "/model.safetensors");

  result.steps = step_;
  result.seconds = elapsed();
  const double train_seconds = result.seconds - eval_seconds;
  result.items_per_s =
      train_seconds > 0 ? static_cast<double>(items_per_step * (step_ - first_step)) / train_seconds : 0;
  result.data_wait_s = data_wait;
  result.final_val_loss = last_eval.loss;
  result.final_val_accuracy = last_eval.accuracy;
  result.floor = task_->loss_floor();
  result.unit = task_->unit();
  result.model = model.type_name();
  result.parameters = model.num_parameters();
  std::tie(result.goal, result.goal_met) = task_->judge(last_eval);

  json summary = {
      {"task", c.task},
      {"model", result.model},
      {"parameters", result.parameters},
      {"steps", result.steps},
      {"seconds", result.seconds},
      {"threads", get_num_threads()},
      {"precision", c.precision},
      {"batch_size", c.batch_size},
      {"accumulate", c.accumulate},
      {"unit", task_->unit()},
      {"items_per_s", result.items_per_s},
      {"workers", c.workers},
      {"data_wait_s", result.data_wait_s},
      {"data_wait_ms_per_step", step_ > first_step ? 1e3 * data_wait / static_cast<double>(step_ - first_step) : 0.0},
      {"peak_allocated_bytes", allocator_for(Device::cpu()).stats().peak_allocated_bytes},
      {"final_train_loss", result.final_train_loss},
      {"final_val_loss", result.final_val_loss},
      {"interrupted", result.interrupted},
      {"stopped_early", result.stopped_early},
      {"goal", result.goal},
      {"goal_met", result.goal_met}};
  if (!result.last_checkpoint.empty()) summary["last_checkpoint"] = result.last_checkpoint;
  if (im.keeper && !im.keeper->best_dir().empty()) summary["best_checkpoint"] = im.keeper->best_dir();
  if (result.final_val_accuracy >= 0) summary["final_val_accuracy"] = result.final_val_accuracy;
  if (result.floor >= 0) {
    summary["loss_floor"] = result.floor;
    summary["gap"] = result.final_val_loss - result.floor;
  }
  write_file_atomically(dir + "/summary.json", summary.dump(2) + "\n");
  return result;
}

void Trainer::save_checkpoint(const std::string& dir) const {
  const std::string tmp = dir + ".tmp";
  std::error_code ec;
  fs::remove_all(tmp, ec);
  // A half-written folder helps nobody (its name already says it is unfinished): gone on any error.
  struct RemoveUnlessCommitted {
    const std::string& path;
    bool committed = false;
    ~RemoveUnlessCommitted() {
      std::error_code ignored;
      if (!committed) fs::remove_all(path, ignored);
    }
  } cleanup{tmp};
  make_dirs(tmp);
  task_->model().save(tmp + "/model.safetensors");
  fault::point("checkpoint-file", tmp + "/model.safetensors");
  save_safetensors(tmp + "/optimizer.safetensors", impl_->optimizer->state_tensors(),
                   impl_->optimizer->state_metadata());
  fault::point("checkpoint-file", tmp + "/optimizer.safetensors");
  save_safetensors(tmp + "/loss_scaler.safetensors", impl_->runner->scaler().state_tensors());
  fault::point("checkpoint-file", tmp + "/loss_scaler.safetensors");
  write_file_atomically(tmp + "/config.toml", config_to_toml(config_));
  fault::point("checkpoint-file", tmp + "/config.toml");
  write_file_atomically(tmp + "/task.json", task_->describe().dump(2) + "\n");
  fault::point("checkpoint-file", tmp + "/task.json");
  const GeneratorState g = default_generator().state();
  const data::LoaderState ls = impl_->batches->state();
  json state = {{"step", step_},
                {"epoch", static_cast<double>(step_) / static_cast<double>(impl_->loader->batches_per_epoch())},
                {"loader", {{"epoch", ls.epoch}, {"position", ls.position}, {"seed", ls.seed}}},
                {"default_generator", {{"seed", g.seed}, {"offset", g.offset}}},
                {"pending_loss_sum", impl_->loss_count ? impl_->loss_sum.item<double>() : 0.0},
                {"pending_loss_count", impl_->loss_count},
                {"optimizer", impl_->optimizer->name()},
                {"monitored", impl_->checkpoint_metric},
                {"config", config_to_json(config_)}};
  if (impl_->checkpoint_eval_step == step_)
    state["evaluation"] = {{"loss", impl_->checkpoint_eval.loss}, {"accuracy", impl_->checkpoint_eval.accuracy}};
  if (impl_->early_stopping) state["early_stopping"] = json::parse(impl_->early_stopping->state());
  // Last: a folder holding trainer_state.json holds every other file too.
  write_file_atomically(tmp + "/trainer_state.json", state.dump(2) + "\n");
  fault::point("checkpoint-file", tmp + "/trainer_state.json");
  fault::point("checkpoint-commit", dir);
  commit_dir(tmp, dir);
  cleanup.committed = true;
}

TrainerConfig load_run_config(const std::string& dir) {
  FT_CHECK(fs::is_directory(dir), dir, ": no such run or checkpoint folder");
  check_finished(dir, "");
  const std::string path = dir + "/config.toml";
  TrainerConfig c;
  apply_toml(c, read_text(path, "the run configuration"), path);
  return c;
}

void Trainer::resume(const std::string& dir) {
  const std::string state_path = dir + "/trainer_state.json";
  FT_CHECK(fs::is_directory(dir), "resume: ", dir, ": no such checkpoint folder");
  check_finished(dir, "resume: ");
  FT_CHECK(fs::exists(state_path), "resume: ", dir, " is not a checkpoint folder (it has no trainer_state.json)");
  const json saved = config_to_json(load_run_config(dir)), now = config_to_json(config_);
  visit_fields(config_, [&](const char* key, const auto&, const char*, OnResume on_resume) {
    if (on_resume == OnResume::MustMatch)
      FT_CHECK(saved[key] == now[key], "resume: the checkpoint was trained with ", key, " = ", saved[key].dump(),
               ", this run has ", key, " = ", now[key].dump());
  });
  const json st = parse_json(read_text(state_path, "the trainer state"), state_path);
  int64_t step = 0, pending_count = 0;
  double pending_sum = 0;
  GeneratorState g;
  data::LoaderState ls;
  EvalResult evaluation;
  const bool evaluated = st.contains("evaluation");
  try {
    if (evaluated) {
      auto number = [](const json& v) { return v.is_null() ? std::nan("") : v.get<double>(); };  // NaN is null
      evaluation.loss = number(st.at("evaluation").at("loss"));
      evaluation.accuracy = number(st.at("evaluation").at("accuracy"));
    }
    step = st.at("step").get<int64_t>();
    pending_count = st.at("pending_loss_count").get<int64_t>();
    pending_sum = st.at("pending_loss_sum").get<double>();
    g.seed = st.at("default_generator").at("seed").get<uint64_t>();
    g.offset = st.at("default_generator").at("offset").get<uint64_t>();
    ls.epoch = st.at("loader").at("epoch").get<uint64_t>();
    ls.position = st.at("loader").at("position").get<int64_t>();
    ls.seed = st.at("loader").at("seed").get<uint64_t>();
  } catch (const json::exception& e) {
    FT_FAIL(state_path, ": malformed trainer state: ", e.what());
  }
  FT_CHECK(step >= 0 && pending_count >= 0, state_path, ": malformed trainer state: negative step or count");
  // Read and check every file before changing anything: a truncated or altered checkpoint is an
  // error that leaves this trainer as it was (safetensors checks sizes, offsets and CRCs).
  SafetensorsFile weights = load_safetensors(dir + "/model.safetensors");
  SafetensorsFile opt_state = load_safetensors(dir + "/optimizer.safetensors");
  SafetensorsFile scaler_state = load_safetensors(dir + "/loss_scaler.safetensors");
  task_->model().load_state_dict(weights.tensors, /*strict=*/true);
  impl_->optimizer->load_state_tensors(opt_state.tensors);
  impl_->optimizer->load_state_metadata(opt_state.metadata);
  impl_->runner->scaler().load_state_tensors(scaler_state.tensors);
  try {
    // The checkpoint keeper is not restored: it manages the folders of this run, not the old one's.
    if (impl_->early_stopping && st.contains("early_stopping"))
      impl_->early_stopping->load_state(st.at("early_stopping").dump());
  } catch (const json::exception& e) {
    FT_FAIL(state_path, ": malformed trainer state: ", e.what());
  }
  impl_->batches->load_state(ls);
  step_ = step;
  default_generator().set_state(g);
  impl_->loss_count = pending_count;
  impl_->loss_sum = pending_count ? scalar_tensor(pending_sum, DType::F32) : Tensor();
  impl_->resumed_from = dir;
  impl_->checkpoint_eval_step = evaluated ? step : -1;
  impl_->checkpoint_eval = evaluation;
}

LrFindResult Trainer::lr_find(const LrFindOptions& options) {
  Impl& im = *impl_;
  nn::UnaryModule& model = task_->model();
  // Snapshot everything the sweep changes; state_dict and state tensors are live views: clone.
  TensorMap weights;
  for (const auto& [name, t] : model.state_dict()) weights.emplace_back(name, t.clone());
  const bool had_optimizer_state = im.optimizer->step_count() > 0;
  TensorMap opt_tensors;
  for (const auto& [name, t] : im.optimizer->state_tensors()) opt_tensors.emplace_back(name, t.clone());
  const auto opt_meta = im.optimizer->state_metadata();
  TensorMap scaler_state;
  for (const auto& [name, t] : im.runner->scaler().state_tensors()) scaler_state.emplace_back(name, t.clone());
  const data::LoaderState loader_state = im.batches->state();
  const GeneratorState generator = default_generator().state();

  double data_wait = 0;
  auto sweep_step = [&](double lr) {
    im.optimizer->set_lr(lr);
    return im.train_step(config_.accumulate, &data_wait).item<double>() / static_cast<double>(config_.accumulate);
  };
  LrFindResult result = find_lr(sweep_step, options);

  // Restore: weights, a fresh optimizer (and its state if it had one), scaler, data, RNG.
  model.load_state_dict(weights, /*strict=*/true);
  im.optimizer = make_optimizer(config_, model);
  if (had_optimizer_state) {
    im.optimizer->load_state_tensors(opt_tensors);
    im.optimizer->load_state_metadata(opt_meta);
  }
  im.make_runner(config_, *task_);
  im.runner->scaler().load_state_tensors(scaler_state);
  im.batches->load_state(loader_state);
  default_generator().set_state(generator);
  return result;
}

}  // namespace ft::train
