// `fasttrain train`: trains a task (default: the char-level GPT on generated text) with the
// Trainer. Options come from the task's defaults, then a checkpoint's config (--resume), then a
// TOML file (--config), then flags, each overriding the one before.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli_parse.h"
#include "commands.h"
#include "fasttrain/dist.h"
#include "fasttrain/models.h"
#include "fasttrain/parallel.h"
#include "fasttrain/tasks.h"
#include "fasttrain/train.h"
#include "train_options.h"

using namespace ft;
using namespace ft::train;

namespace {

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
  if (r.interrupted) {
    std::printf("interrupted at step %lld: checkpoint %s (continue with --resume %s)\n",
                static_cast<long long>(r.steps), r.last_checkpoint.c_str(), r.last_checkpoint.c_str());
  } else {
    if (r.stopped_early) std::printf("stopped early at step %lld (no improvement)\n", static_cast<long long>(r.steps));
    std::printf("final train loss %.4f; ", r.final_train_loss);
    if (!r.goal.empty())
      std::printf("%s\n", r.goal.c_str());
    else if (r.final_val_accuracy)
      std::printf("val loss %.4f, val accuracy %.2f%%\n", r.final_val_loss, 100 * *r.final_val_accuracy);
    else
      std::printf("val loss %.4f (perplexity %.3f)\n", r.final_val_loss, std::exp(r.final_val_loss));
  }
  std::printf("run folder: %s (metrics.csv, model.safetensors, summary.json, config.toml)\n", r.run_dir.c_str());
}

int run_train(const std::vector<std::string>& args) {
  CLI::App app(
      "Trains a model and writes a run folder (metrics.csv, config.toml, task.json, model.safetensors, "
      "summary.json, tensorboard/; checkpoints/ with --checkpoint-every). SIGINT or SIGTERM saves a checkpoint "
      "and exits with status 130; a second one stops at once.\nWith no options: a char-level GPT learns text "
      "drawn from a Markov chain with a known entropy, and the summary says how close its loss came to that "
      "floor.\nOptions marked 'char:' or 'images:' apply to that task only.",
      "fasttrain train");
  app.set_help_flag("-h,--help", "show this help");
  cli::TrainOptions options;
  cli::add_train_options(app, options);
  if (!cli::parse_command_line(app, args, "train")) return 0;
  if (!options.resume_dir.empty()) {
    const std::string run_dir = options.values.count("run_dir") ? options.values.at("run_dir") : "";
    options.resume_dir = find_resume_checkpoint(options.resume_dir, run_dir);
  }
  const TrainerConfig c = cli::resolve_train_config(options);
  Trainer trainer(c);
  if (!options.resume_dir.empty()) trainer.resume(options.resume_dir);
  const BuiltinTask task = make_builtin_task(trainer.config());
  TrainResult r = trainer.fit(*task.module, *task.data);
  TrainerConfig shown = trainer.config();  // as trained: the batch-size finder may have changed it
  if (shown.threads == 0) shown.threads = get_num_threads();
  if (dist::world()->rank() == 0) print_summary(r, shown);  // one summary per job
  return r.interrupted ? 130 : 0;                           // 128 + SIGINT, as shells report an interrupted command
}

}  // namespace

FT_REGISTER_COMMAND(train, "train a model (default: a char-level GPT on generated text, under 3 minutes)", run_train);
