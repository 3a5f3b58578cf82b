// `fasttrain train`: trains a task (default: the char-level GPT on generated text) with the
// Trainer. Options come from the task's defaults, then a checkpoint's config (--resume), then a
// TOML file (--config), then flags, each overriding the one before.
#include <algorithm>
#include <cstdio>
#include <map>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli_parse.h"
#include "commands.h"
#include "fasttrain/parallel.h"
#include "fasttrain/train.h"

using namespace ft;
using namespace ft::train;

namespace {

template <class T>
std::string value_text(const T& v) {
  if constexpr (std::is_same_v<T, std::string>)
    return v.empty() ? "\"\"" : v;
  else if constexpr (std::is_same_v<T, bool>)
    return v ? "true" : "false";
  else {
    std::ostringstream os;
    os << v;
    return os.str();
  }
}

std::string dashed(std::string name) {
  std::replace(name.begin(), name.end(), '_', '-');
  return name;
}

std::string clock_text(double s) {
  char buf[32];
  const long t = static_cast<long>(s + 0.5);
  std::snprintf(buf, sizeof buf, "%ld:%02ld", t / 60, t % 60);
  return buf;
}

void print_summary(const TrainResult& r, const TrainerConfig& c) {
  std::printf("done: %lld steps in %s (%.0f %s/s on %lld thread%s), %s with %.2fM parameters\n",
              static_cast<long long>(r.steps), clock_text(r.seconds).c_str(), r.items_per_s, r.unit.c_str(),
              static_cast<long long>(c.threads), c.threads == 1 ? "" : "s", r.model.c_str(), r.parameters / 1e6);
  std::printf("final train loss %.4f; %s\n", r.final_train_loss, r.goal.c_str());
  std::printf("run folder: %s (metrics.csv, model.safetensors, summary.json, config.toml)\n", r.run_dir.c_str());
}

int run_train(const std::vector<std::string>& args) {
  CLI::App app(
      "Trains a model and writes a run folder (metrics.csv, config.toml, task.json, model.safetensors, "
      "summary.json; checkpoints/ with --checkpoint-every).\nWith no options: a char-level GPT learns text "
      "drawn from a Markov chain with a known entropy, and the summary says how close its loss came to that "
      "floor.\nOptions marked 'char:' or 'images:' apply to that task only.",
      "fasttrain train");
  app.set_help_flag("-h,--help", "show this help");
  std::string config_path, resume_dir;
  app.add_option("--config", config_path, "TOML file with any of the options below (keys with '_'); flags override it")
      ->type_name("FILE");
  app.add_option("--resume", resume_dir,
                 "continue exactly from a checkpoint folder (runs/.../checkpoints/step-N); its config is the base")
      ->type_name("DIR");

  // One flag per config field; the help shows the char default and, where it differs, the images one.
  const TrainerConfig char_defaults = TrainerConfig::defaults_for("char");
  const TrainerConfig image_defaults = TrainerConfig::defaults_for("images");
  std::vector<std::string> defaults_text;
  visit_fields(image_defaults, [&](const char*, const auto& v, const char*) { defaults_text.push_back(value_text(v)); });
  std::map<std::string, std::string> values;
  std::vector<std::pair<std::string, CLI::Option*>> options;
  size_t i = 0;
  visit_fields(char_defaults, [&](const char* name, const auto& v, const char* help) {
    using T = std::decay_t<decltype(v)>;
    std::string text = help, def = value_text(v);
    const bool differs = defaults_text[i] != def && std::string(name) != "task";
    if (def != "\"\"") text += " (default " + def + (differs ? "; images: " + defaults_text[i] : "") + ")";
    CLI::Option* opt = app.add_option("--" + dashed(name), values[name], text);
    opt->type_name(std::is_same_v<T, std::string> ? "TEXT"
                   : std::is_same_v<T, bool>      ? "BOOL"
                   : std::is_same_v<T, double>    ? "NUM"
                                                  : "INT");
    options.emplace_back(name, opt);
    ++i;
  });

  if (!cli::parse_command_line(app, args, "train")) return 0;
  auto given = [&](const std::string& name) {
    for (const auto& [n, opt] : options)
      if (n == name) return opt->count() > 0;
    return false;
  };

  // The task decides the defaults: from the flag, else the file, else the checkpoint, else char.
  std::string file_text;
  if (!config_path.empty()) {
    std::FILE* f = std::fopen(config_path.c_str(), "rb");
    FT_CHECK(f, "train: cannot read the config file ", config_path);
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) file_text.append(buf, n);
    std::fclose(f);
  }
  std::string task = "char";
  TrainerConfig base;
  if (!resume_dir.empty()) {
    base = load_run_config(resume_dir);
    base.run_dir.clear();  // a resumed run writes a new run folder unless --run-dir says otherwise
    task = base.task;
  }
  if (!file_text.empty()) {
    TrainerConfig probe;
    probe.task.clear();
    apply_toml(probe, file_text, config_path);
    if (!probe.task.empty()) task = probe.task;
  }
  if (given("task")) task = values["task"];
  TrainerConfig c = resume_dir.empty() ? TrainerConfig::defaults_for(task) : base;
  c.task = task;
  if (!file_text.empty()) apply_toml(c, file_text, config_path);
  for (const auto& [name, opt] : options) {
    if (opt->count() == 0) continue;
    const std::string scope = option_scope(name);
    FT_CHECK(scope.empty() || scope == c.task, "train: option --", dashed(name), " applies to the ", scope,
             " task, not ", c.task);
    set_field(c, name, values[name]);
  }

  Trainer trainer(c);
  if (!resume_dir.empty()) trainer.resume(resume_dir);
  TrainerConfig shown = trainer.config();
  if (shown.threads == 0) shown.threads = get_num_threads();
  TrainResult r = trainer.fit();
  print_summary(r, shown);
  return 0;
}

}  // namespace

FT_REGISTER_COMMAND(train, "train a model (default: a char-level GPT on generated text, under 3 minutes)", run_train);
