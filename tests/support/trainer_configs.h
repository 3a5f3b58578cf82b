// Small Trainer configurations and scratch folders shared by the Trainer test files.
#pragma once
#include <filesystem>
#include <string>

#include <unistd.h>

#include "fasttrain/tasks.h"
#include "fasttrain/train.h"

namespace ft::test {

// A fresh (removed) folder under the temp dir, unique per test process: <prefix>_<pid>_<name>.
inline std::string scratch_dir(const std::string& prefix, const std::string& name) {
  std::filesystem::path p =
      std::filesystem::temp_directory_path() / (prefix + "_" + std::to_string(::getpid()) + "_" + name);
  std::filesystem::remove_all(p);
  return p.string();
}

// A char config small enough to train in well under a second.
inline train::TrainerConfig tiny_char(const std::string& run_dir) {
  train::TrainerConfig c = train::TrainerConfig::defaults_for("char");
  c.run_dir = run_dir;
  c.progress = false;
  c.max_steps = 8;
  c.schedule.as<ft::train::CosineSchedule>().warmup_steps = 2;
  c.log_every_n_steps = 2;
  c.eval_every = 4;
  c.eval_batches = 2;
  c.batch_size = 4;
  c.model.context = 16;
  c.model.layers = 1;
  c.model.dim = 32;
  c.model.heads = 2;
  c.data.train_chars = 20000;
  c.data.val_chars = 4000;
  return c;
}

// A built-in task and its Trainer, as `fasttrain train` runs them (Trainer + make_builtin_task).
struct BuiltinRun {
  explicit BuiltinRun(const train::TrainerConfig& c) : trainer(c), task(train::make_builtin_task(trainer.config())) {}
  train::TrainResult fit() { return trainer.fit(*task.module, *task.data); }
  void resume(const std::string& dir) { trainer.resume(dir); }
  train::LrFindResult lr_find(const train::LrFindOptions& o) { return trainer.lr_find(*task.module, *task.data, o); }
  nn::Module& model() { return task.module->model(); }
  const train::TrainerConfig& config() const { return trainer.config(); }
  int64_t step() const { return trainer.step(); }
  const std::vector<train::MetricRow>& history() const { return trainer.history(); }
  void save_checkpoint(const std::string& dir) const { trainer.save_checkpoint(dir); }
  void request_stop() { trainer.request_stop(); }

  train::Trainer trainer;
  train::BuiltinTask task;
};

}  // namespace ft::test
