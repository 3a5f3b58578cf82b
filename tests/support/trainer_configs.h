// Small Trainer configurations and scratch folders shared by the Trainer test files.
#pragma once
#include <filesystem>
#include <string>

#include <unistd.h>

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
  c.warmup_steps = 2;
  c.log_every_n_steps = 2;
  c.eval_every = 4;
  c.eval_batches = 2;
  c.batch_size = 4;
  c.context = 16;
  c.layers = 1;
  c.dim = 32;
  c.heads = 2;
  c.train_chars = 20000;
  c.val_chars = 4000;
  return c;
}

}  // namespace ft::test
