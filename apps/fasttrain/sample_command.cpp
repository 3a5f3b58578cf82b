// `fasttrain sample`: continues a prompt with a GPT trained by `fasttrain train` (task char, or lm
// on shards with a vocabulary), decoded with the run's vocabulary.
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli_parse.h"
#include "commands.h"
#include "fasttrain/tasks.h"
#include "fasttrain/train.h"

using namespace ft;

namespace {

int run_sample(const std::vector<std::string>& args) {
  CLI::App app(
      "Generates text with a GPT trained by fasttrain train (task char, or lm on shards made by fasttrain data), "
      "encoding "
      "the prompt and decoding the text with the run's vocabulary.",
      "fasttrain sample");
  app.set_help_flag("-h,--help", "show this help");
  std::string dir;
  train::SampleOptions o;
  app.add_option("--checkpoint", dir, "run folder or checkpoint folder of a char or lm run")->required();
  app.add_option("--prompt", o.prompt, "text to continue (default \"" + o.prompt + "\")");
  app.add_option("--tokens", o.tokens, "tokens to generate (default " + std::to_string(o.tokens) + ")");
  app.add_option("--temperature", o.temperature,
                 "sampling temperature; 0 picks the most likely character (default 0.8)");
  app.add_option("--top-k", o.top_k, "sample among the k most likely tokens; 0: all (default 0)");
  app.add_option("--seed", o.seed, "random seed (default 0)");
  if (!cli::parse_command_line(app, args, "sample")) return 0;
  std::printf("%s\n", train::sample_text(dir, o).c_str());
  return 0;
}

}  // namespace

FT_REGISTER_COMMAND(sample, "generate text from a GPT trained by fasttrain train (task char or lm)", run_sample);
