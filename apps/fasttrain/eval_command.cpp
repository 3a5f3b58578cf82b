// `fasttrain eval`: the loss (and accuracy, or perplexity) of a trained model on data, without
// training: the run's task is rebuilt from its config.toml, the validation data replaced by
// --data where given, the weights read from the folder's model.safetensors.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli_parse.h"
#include "commands.h"
#include "fasttrain/tasks.h"
#include "fasttrain/train.h"

using namespace ft;
using namespace ft::train;

namespace {

int run_eval(const std::vector<std::string>& args) {
  CLI::App app(
      "Evaluates a run or checkpoint folder of fasttrain train on data: loss and accuracy (images, classify) or loss "
      "and perplexity (char, lm). Without --data, on the run's own validation data.",
      "fasttrain eval");
  app.set_help_flag("-h,--help", "show this help");
  std::string dir, data;
  int64_t batch_size = 0, batches = 0;
  app.add_option("--checkpoint", dir, "run folder or checkpoint folder (config.toml, model.safetensors)")
      ->required()
      ->type_name("DIR");
  app.add_option("--data", data,
                 "data to evaluate on, as the run's --val-data takes it (lm: a glob of token shards; classify: "
                 "mnist:DIR, cifar10:DIR, folder:DIR or npy:X.npy,y.npy)");
  app.add_option("--batch-size", batch_size, "batch size (default: the run's)");
  app.add_option("--eval-batches", batches, "batches to evaluate (default 0: all of the data)");
  if (!cli::parse_command_line(app, args, "eval")) return 0;

  TrainerConfig c = load_run_config(dir);
  // The run's model.safetensors is the whole model whatever its layout (--tp included): this
  // process evaluates it alone.
  c.dist.tp = c.dist.pp = 1, c.dist.sequence_parallel = false;
  if (!data.empty()) {
    FT_CHECK(c.task == "lm" || c.task == "classify",
             "eval: --data needs a run on data of one's own (task lm or "
             "classify); ",
             dir, " holds a '", c.task, "' run, whose data the project generates");
    c.data.val = data;
  }
  if (batch_size > 0) c.batch_size = batch_size;
  c.eval_batches = batches;
  c.progress = false;
  c.model.init_from.clear();  // the folder's own weights are loaded below
  Trainer trainer(c);
  const BuiltinTask task = make_builtin_task(trainer.config());
  task.module->model().load(dir + "/model.safetensors", /*strict=*/true);
  const EvalResult r = trainer.validate(*task.module, *task.data);
  std::printf("eval: %s on %s: loss %.4f", dir.c_str(), data.empty() ? "the run's validation data" : data.c_str(),
              r.loss);
  if (const auto accuracy = r.metric("accuracy")) std::printf(", accuracy %.2f%%", 100 * *accuracy);
  if (c.task == "char" || c.task == "lm") std::printf(", perplexity %.3f", std::exp(r.loss));
  for (const auto& [name, value] : r.metrics)
    if (name != "accuracy") std::printf(", %s %.4f", name.c_str(), value);
  std::printf("\n");
  return 0;
}

}  // namespace

FT_REGISTER_COMMAND(eval, "loss and accuracy or perplexity of a trained model on data", run_eval);
