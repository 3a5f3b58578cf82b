// `fasttrain lr-find`: the learning-rate range test on a training configuration (the same options
// as `fasttrain train`). Writes lr_find.csv and lr_find.svg and prints the suggested rate.
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli_parse.h"
#include "commands.h"
#include "fasttrain/lr_finder.h"
#include "fasttrain/tasks.h"
#include "fasttrain/train.h"
#include "train_options.h"

using namespace ft;
using namespace ft::train;

namespace {

int run_lr_find(const std::vector<std::string>& args) {
  CLI::App app(
      "Learning-rate range test: trains with an exponentially growing learning rate from --start-lr to --end-lr "
      "over --num-steps steps, stops when the smoothed loss exceeds 4x its best, restores the model, and "
      "suggests the rate where the loss falls fastest. Writes lr_find.csv and lr_find.svg into the run folder "
      "(--run-dir; default runs/<task>-lr-find-<time>). Takes every option of fasttrain train.",
      "fasttrain lr-find");
  app.set_help_flag("-h,--help", "show this help");
  LrFindOptions o;
  app.add_option("--start-lr", o.min_lr, "first learning rate of the sweep")->capture_default_str();
  app.add_option("--end-lr", o.max_lr, "last learning rate of the sweep")->capture_default_str();
  app.add_option("--num-steps", o.steps, "steps of the sweep")->capture_default_str();
  app.add_option("--divergence", o.divergence, "stop once the smoothed loss exceeds this multiple of the best")
      ->capture_default_str();
  cli::TrainOptions options;
  cli::add_train_options(app, options, /*with_resume=*/false);
  if (!cli::parse_command_line(app, args, "lr-find")) return 0;
  TrainerConfig c = cli::resolve_train_config(options);
  const std::string dir = c.run_dir.empty() ? default_run_dir(c.task + "-lr-find") : c.run_dir;
  Trainer trainer(c);
  const BuiltinTask task = make_builtin_task(trainer.config());
  const LrFindResult r = trainer.lr_find(*task.module, *task.data, o);
  make_dirs(dir);
  write_lr_find_csv(dir + "/lr_find.csv", r);
  write_lr_find_svg(dir + "/lr_find.svg", r);
  std::printf("lr-find: %zu steps from %g to %g%s\n", r.lrs.size(), r.lrs.empty() ? 0.0 : r.lrs.front(),
              r.lrs.empty() ? 0.0 : r.lrs.back(), r.diverged ? " (stopped: the loss diverged)" : "");
  if (r.suggestion_index >= 0)
    std::printf("suggested lr: %.3g (steepest descent of the smoothed loss)\n", r.suggestion);
  else
    std::printf("no suggestion: the loss never fell (try a lower --start-lr or more --num-steps)\n");
  std::printf("curve: %s/lr_find.csv, %s/lr_find.svg\n", dir.c_str(), dir.c_str());
  return 0;
}

}  // namespace

FT_REGISTER_COMMAND_NAMED(lr_find, "lr-find", "learning-rate range test: sweep the lr, plot the loss, suggest a rate",
                          run_lr_find);
