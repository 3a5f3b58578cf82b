// `fasttrain tune`: measured trials of the speed settings of a training configuration (the same
// options as `fasttrain train`); writes the winner as run.toml and every trial to tune.csv.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli_parse.h"
#include "commands.h"
#include "fasttrain/tasks.h"
#include "fasttrain/train.h"
#include "fasttrain/tune.h"
#include "train_options.h"

using namespace ft;
using namespace ft::train;

namespace {

// "5m", "90s", "1h" or plain seconds.
double parse_duration(const std::string& text) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  const std::string unit = end;
  const double scale = unit.empty() || unit == "s" ? 1 : unit == "m" ? 60 : unit == "h" ? 3600 : NAN;
  FT_CHECK(end != text.c_str() && std::isfinite(v * scale) && v > 0, "option --budget: expected a duration like 5m, ",
           "90s or 1h, found '", text, "'");
  return v * scale;
}

int run_tune(const std::vector<std::string>& args) {
  CLI::App app(
      "Finds a faster configuration by measuring it: short trials of threads, loader workers, precision, batch size "
      "(lr scaled linearly), activation checkpointing and accumulation, one setting at a time from the given "
      "options, within --budget. A setting is kept only when it is faster and keeps the loss trajectory (bf16 is "
      "checked against fp32 step by step). Writes run.toml (the winning trial's settings; use with "
      "fasttrain train --config) and tune.csv (every trial) into --run-dir. Takes every option of fasttrain train.",
      "fasttrain tune");
  app.set_help_flag("-h,--help", "show this help");
  std::string budget = "5m";
  TuneOptions o;
  app.add_option("--budget", budget, "wall time for all trials (e.g. 5m, 90s)")->capture_default_str();
  app.add_option("--trial-steps", o.trial_steps, "optimizer steps per trial")->capture_default_str();
  app.add_option("--loss-tolerance", o.loss_tolerance, "largest mean relative loss difference a kept setting may cause")
      ->capture_default_str();
  cli::TrainOptions options;
  cli::add_train_options(app, options, /*with_resume=*/false);
  if (!cli::parse_command_line(app, args, "tune")) return 0;
  o.budget_s = parse_duration(budget);
  TrainerConfig c = cli::resolve_train_config(options);
  o.out_dir = c.run_dir.empty() ? default_run_dir(c.task + "-tune") : c.run_dir;
  c.run_dir.clear();  // run.toml trains into a folder of its own
  const TuneResult r = tune(c, make_builtin_task, o, [](const std::string& line) {
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  });
  write_tune_outputs(c, r, o.out_dir);
  std::printf("\n%s\nbest: trial %lld, %.2fx the starting configuration\nwrote %s/run.toml and %s/tune.csv\n",
              tune_table(r).c_str(), static_cast<long long>(r.best), r.speedup, o.out_dir.c_str(), o.out_dir.c_str());
  return 0;
}

}  // namespace

FT_REGISTER_COMMAND(tune, "measure threads, workers, precision and batch size; write the fastest as run.toml",
                    run_tune);
