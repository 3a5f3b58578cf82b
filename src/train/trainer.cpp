// The training loop (train.h). One step: set_lr from the schedule, the next batch from the
// DataLoader (timed: the data wait), zero_grad
// (set to none), forward, loss, backward, optional global-norm clip, optimizer step. The loss
// stays a tensor, summed on the device between log intervals and read once per interval.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "fasttrain/atomic_file.h"
#include "fasttrain/loader.h"
#include "fasttrain/optim.h"
#include "fasttrain/parallel.h"
#include "fasttrain/random.h"
#include "fasttrain/safetensors.h"
#include "train/progress.h"
#include "train/run_files.h"
#include "train/seeds.h"
#include "train/task.h"

namespace ft::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Options that define the model, the data or the optimizer state: a checkpoint only resumes
// under the same values. The others (steps, intervals, lr schedule, threads, folders) may change.
// The optimizer's hyper-parameters other than the learning rate travel in its state, so they are
// locked too; the learning rate is set from the schedule every step.
const char* const kLockedOnResume[] = {"task",         "seed",       "batch_size", "optimizer",   "weight_decay",
                                       "momentum",     "beta1",      "beta2",      "context",     "layers",
                                       "dim",          "heads",      "train_chars", "val_chars",  "model",
                                       "image_size",   "classes",    "train_images", "val_images"};

json config_to_json(const TrainerConfig& c) {
  json j = json::object();
  visit_fields(c, [&](const char* name, const auto& v, const char*) { j[name] = v; });
  return j;
}

std::unique_ptr<optim::Optimizer> make_optimizer(const TrainerConfig& c, nn::Module& model) {
  optim::GroupOptions o;
  o.lr = c.lr;
  o.weight_decay = c.weight_decay;
  o.momentum = c.momentum;
  o.beta1 = c.beta1;
  o.beta2 = c.beta2;
  auto groups = optim::decay_groups(model.named_parameters(), o);
  if (c.optimizer == "sgd") return optim::make_sgd(std::move(groups));
  if (c.optimizer == "adam") return optim::make_adam(std::move(groups));
  return optim::make_adamw(std::move(groups));
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
  std::vector<Tensor> params;
  std::unique_ptr<data::DataLoader> loader;  // training batches; its state is the data position
  Tensor loss_sum;  // training loss summed since the last log, on the device
  int64_t loss_count = 0;

  // The next training batch, crossing into the next epoch when this one is exhausted.
  const data::Batch& next_batch() {
    const data::Batch* b = loader->next();
    if (b == nullptr) b = loader->next();
    FT_CHECK(b != nullptr, "Trainer: the data loader produced an empty epoch");
    return *b;
  }
};

Trainer::Trainer(TrainerConfig config) : config_(std::move(config)) {
  config_.validate();
  if (config_.threads > 0) set_num_threads(static_cast<int>(config_.threads));
  // Dropout draws from the default generator: seeded here, saved and restored by checkpoints.
  default_generator().set_state({derive_seed(config_.seed, SeedUse::Dropout), 0});
  task_ = make_task(config_);
  task_->model().train();
  impl_ = std::make_unique<Impl>();
  impl_->params = task_->model().parameters();
  impl_->optimizer = make_optimizer(config_, task_->model());
  data::LoaderOptions lo;
  lo.batch_size = config_.batch_size;
  lo.num_workers = static_cast<int>(config_.workers);
  lo.pin_memory = config_.pin_memory;
  lo.prefetch_factor = static_cast<int>(config_.prefetch);
  lo.drop_last = true;  // every step sees batch_size samples
  lo.seed = config_.seed;
  impl_->loader = std::make_unique<data::DataLoader>(task_->train_dataset(), lo, task_->train_sampler());
  FT_CHECK(impl_->loader->batches_per_epoch() >= 1, "Trainer: the training data holds fewer than batch_size = ",
           config_.batch_size, " samples");
}

Trainer::~Trainer() = default;

TrainResult Trainer::fit() {
  const TrainerConfig& c = config_;
  Impl& im = *impl_;
  nn::UnaryModule& model = task_->model();
  TrainResult result;
  result.run_dir = c.run_dir.empty() ? default_run_dir(c.task) : c.run_dir;
  const std::string& dir = result.run_dir;
  make_dirs(dir);
  TrainerConfig resolved = c;
  resolved.run_dir = dir;
  write_file_atomically(dir + "/config.toml", config_to_toml(resolved));
  write_file_atomically(dir + "/task.json", task_->describe().dump(2) + "\n");
  std::ofstream csv(dir + "/metrics.csv", std::ios::trunc);
  FT_CHECK(csv.good(), dir, "/metrics.csv: cannot open for writing");
  csv << "step,epoch,split,loss,accuracy,lr,items_per_s,elapsed_s,data_wait_ms\n";

  int64_t end = c.max_steps;
  const int64_t batches_per_epoch = im.loader->batches_per_epoch();
  if (c.max_epochs > 0) end = std::min(end, c.max_epochs * batches_per_epoch);
  const int64_t first_step = step_;
  ProgressLine progress(c.progress, first_step, end, task_->unit());
  const auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  double eval_seconds = 0, last_log_train_seconds = 0;
  double data_wait = 0, last_log_data_wait = 0;  // seconds blocked in the loader
  int64_t last_log_step = step_;
  auto epoch_of = [&](int64_t step) { return static_cast<double>(step) / static_cast<double>(batches_per_epoch); };
  auto record = [&](const MetricRow& r) {
    history_.push_back(r);
    char buf[256];
    std::snprintf(buf, sizeof buf, "%lld,%.4f,%s,%.9g,%s,%.9g,%.1f,%.3f,%.3f\n", static_cast<long long>(r.step),
                  r.epoch, r.split.c_str(), r.loss, r.accuracy >= 0 ? std::to_string(r.accuracy).c_str() : "", r.lr,
                  r.items_per_s, r.elapsed_s, r.data_wait_ms);
    csv << buf << std::flush;
  };
  EvalResult last_eval;
  bool evaluated = false;
  auto evaluate = [&](double lr) {
    const double start = elapsed();
    last_eval = task_->evaluate();
    evaluated = true;
    eval_seconds += elapsed() - start;
    record({step_, epoch_of(step_), "val", last_eval.loss, last_eval.accuracy, lr, 0, elapsed(), 0});
    char buf[160];
    if (last_eval.accuracy >= 0)
      std::snprintf(buf, sizeof buf, "step %lld  val loss %.4f  val accuracy %.2f%%", static_cast<long long>(step_),
                    last_eval.loss, 100 * last_eval.accuracy);
    else
      std::snprintf(buf, sizeof buf, "step %lld  val loss %.4f  (floor %.4f)", static_cast<long long>(step_),
                    last_eval.loss, task_->loss_floor());
    progress.note(buf);
  };

  {
    char head[320];
    std::snprintf(head, sizeof head, "train: %s task, %s with %.2fM parameters, steps %lld-%lld of %lld %s, %d thread(s)%s; run folder %s",
                  c.task.c_str(), model.type_name().c_str(), model.num_parameters() / 1e6,
                  static_cast<long long>(first_step + 1), static_cast<long long>(end),
                  static_cast<long long>(task_->items_per_batch()), task_->unit().c_str(), get_num_threads(),
                  task_->loss_floor() >= 0 ? (", loss floor " + std::to_string(task_->loss_floor()).substr(0, 6)).c_str() : "",
                  dir.c_str());
    progress.note(head);
  }
  double lr = learning_rate(c, step_);
  while (step_ < end) {
    lr = learning_rate(c, step_);
    im.optimizer->set_lr(lr);
    const auto wait_start = std::chrono::steady_clock::now();
    const data::Batch& batch = im.next_batch();  // valid until the next call: the step is done by then
    data_wait += std::chrono::duration<double>(std::chrono::steady_clock::now() - wait_start).count();
    model.zero_grad(/*set_to_none=*/true);
    Tensor loss = task_->loss(model.forward(batch.fields[0]), batch.fields[1]);
    loss.backward();
    if (c.grad_clip > 0) clip_grad_norm(im.params, c.grad_clip);
    im.optimizer->step();
    ++step_;
    Tensor l = loss.detach();
    im.loss_sum = im.loss_sum.defined() ? add(im.loss_sum, l) : l;
    ++im.loss_count;

    const bool last = step_ == end;
    if (step_ % c.log_every_n_steps == 0 || last) {
      const double now = elapsed(), train_seconds = now - eval_seconds;
      const double train_loss = im.loss_sum.item<double>() / static_cast<double>(im.loss_count);
      im.loss_sum = Tensor();
      im.loss_count = 0;
      const double rate = static_cast<double>(task_->items_per_batch() * (step_ - last_log_step)) /
                          std::max(1e-9, train_seconds - last_log_train_seconds);
      const double wait_ms = 1e3 * (data_wait - last_log_data_wait) / static_cast<double>(step_ - last_log_step);
      last_log_step = step_;
      last_log_train_seconds = train_seconds;
      last_log_data_wait = data_wait;
      result.final_train_loss = train_loss;
      record({step_, epoch_of(step_), "train", train_loss, -1, lr, rate, now, wait_ms});
      progress.log(step_, train_loss, lr, rate, now);
    } else {
      progress.tick(step_, elapsed());
    }
    if ((c.eval_every > 0 && step_ % c.eval_every == 0) || last) evaluate(lr);
    if (c.checkpoint_every > 0 && step_ % c.checkpoint_every == 0) {
      char name[32];
      std::snprintf(name, sizeof name, "step-%08lld", static_cast<long long>(step_));
      make_dirs(dir + "/checkpoints");
      save_checkpoint(dir + "/checkpoints/" + name);
    }
  }
  if (!evaluated) evaluate(lr);
  progress.finish();
  model.save(dir + "/model.safetensors");

  result.steps = step_;
  result.seconds = elapsed();
  const double train_seconds = result.seconds - eval_seconds;
  result.items_per_s = train_seconds > 0 ? static_cast<double>(task_->items_per_batch() * (step_ - first_step)) / train_seconds : 0;
  result.data_wait_s = data_wait;
  result.final_val_loss = last_eval.loss;
  result.final_val_accuracy = last_eval.accuracy;
  result.floor = task_->loss_floor();
  result.unit = task_->unit();
  result.model = model.type_name();
  result.parameters = model.num_parameters();
  std::tie(result.goal, result.goal_met) = task_->judge(last_eval);

  json summary = {{"task", c.task},
                  {"model", result.model},
                  {"parameters", result.parameters},
                  {"steps", result.steps},
                  {"seconds", result.seconds},
                  {"threads", get_num_threads()},
                  {"unit", task_->unit()},
                  {"items_per_s", result.items_per_s},
                  {"workers", c.workers},
                  {"data_wait_s", result.data_wait_s},
                  {"data_wait_ms_per_step", step_ > first_step ? 1e3 * data_wait / static_cast<double>(step_ - first_step) : 0.0},
                  {"final_train_loss", result.final_train_loss},
                  {"final_val_loss", result.final_val_loss},
                  {"goal", result.goal},
                  {"goal_met", result.goal_met}};
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
  make_dirs(tmp);
  task_->model().save(tmp + "/model.safetensors");
  save_safetensors(tmp + "/optimizer.safetensors", impl_->optimizer->state_tensors(),
                   impl_->optimizer->state_metadata());
  const GeneratorState g = default_generator().state();
  const data::LoaderState ls = impl_->loader->state();
  json state = {{"step", step_},
                {"epoch", static_cast<double>(step_) / static_cast<double>(impl_->loader->batches_per_epoch())},
                {"loader", {{"epoch", ls.epoch}, {"position", ls.position}, {"seed", ls.seed}}},
                {"default_generator", {{"seed", g.seed}, {"offset", g.offset}}},
                {"pending_loss_sum", impl_->loss_count ? impl_->loss_sum.item<double>() : 0.0},
                {"pending_loss_count", impl_->loss_count},
                {"optimizer", impl_->optimizer->name()},
                {"config", config_to_json(config_)}};
  write_file_atomically(tmp + "/trainer_state.json", state.dump(2) + "\n");
  write_file_atomically(tmp + "/config.toml", config_to_toml(config_));
  write_file_atomically(tmp + "/task.json", task_->describe().dump(2) + "\n");
  commit_dir(tmp, dir);
}

TrainerConfig load_run_config(const std::string& dir) {
  FT_CHECK(fs::is_directory(dir), dir, ": no such run or checkpoint folder");
  const std::string path = dir + "/config.toml";
  TrainerConfig c;
  apply_toml(c, read_text(path, "the run configuration"), path);
  return c;
}

void Trainer::resume(const std::string& dir) {
  const std::string state_path = dir + "/trainer_state.json";
  FT_CHECK(fs::is_directory(dir), "resume: ", dir, ": no such checkpoint folder");
  FT_CHECK(fs::exists(state_path), "resume: ", dir, " is not a checkpoint folder (it has no trainer_state.json)");
  const json saved = config_to_json(load_run_config(dir)), now = config_to_json(config_);
  for (const char* key : kLockedOnResume)
    FT_CHECK(saved[key] == now[key], "resume: the checkpoint was trained with ", key, " = ", saved[key].dump(),
             ", this run has ", key, " = ", now[key].dump());
  const json st = parse_json(read_text(state_path, "the trainer state"), state_path);
  int64_t step = 0, pending_count = 0;
  double pending_sum = 0;
  GeneratorState g;
  data::LoaderState ls;
  try {
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
  // Read and check both files before changing anything.
  SafetensorsFile weights = load_safetensors(dir + "/model.safetensors");
  SafetensorsFile opt_state = load_safetensors(dir + "/optimizer.safetensors");
  task_->model().load_state_dict(weights.tensors, /*strict=*/true);
  impl_->optimizer->load_state_tensors(opt_state.tensors);
  impl_->optimizer->load_state_metadata(opt_state.metadata);
  impl_->loader->load_state(ls);
  step_ = step;
  default_generator().set_state(g);
  impl_->loss_count = pending_count;
  impl_->loss_sum = pending_count ? scalar_tensor(pending_sum, DType::F32) : Tensor();
}

}  // namespace ft::train
