// The options `fasttrain train` and `fasttrain lr-find` share: --config, --resume and one flag
// per TrainerConfig field, resolved in the order task defaults, checkpoint, TOML file, flags.
#pragma once
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "fasttrain/train.h"

namespace ft::cli {

struct TrainOptions {
  std::string config_path, resume_dir;
  std::map<std::string, std::string> values;                  // flag text by field name
  std::vector<std::pair<std::string, CLI::Option*>> options;  // field name -> its flag
};

// Adds --config, --resume and a flag per config field to `app`; `with_resume` false for commands
// that do not continue a run.
void add_train_options(CLI::App& app, TrainOptions& o, bool with_resume = true);
// The config after parsing: task defaults, then the resumed checkpoint's config, the TOML file,
// then the flags given. Flags of another task are an error.
train::TrainerConfig resolve_train_config(const TrainOptions& o);

}  // namespace ft::cli
