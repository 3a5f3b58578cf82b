// `fasttrain sample`: continues a prompt with a GPT or Llama trained by `fasttrain train` (task char,
// or lm on shards with a vocabulary), decoded with the run's vocabulary.
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
      "Generates text with a GPT or Llama trained by fasttrain train (task char, or lm on shards made by fasttrain "
      "data), encoding the prompt and decoding the text with the run's vocabulary. The prompt runs through the "
      "model once, then each new token alone with a key/value cache.",
      "fasttrain sample");
  app.set_help_flag("-h,--help", "show this help");
  std::string dir;
  train::SampleOptions o;
  bool ignore_eos = false;
  app.add_option("--checkpoint", dir, "run folder or checkpoint folder of a char or lm run")->required();
  app.add_option("--prompt", o.prompt, "text to continue (default \"" + o.prompt + "\")");
  app.add_option("--tokens", o.tokens, "tokens to generate, at most (default " + std::to_string(o.tokens) + ")");
  app.add_option("--temperature", o.temperature, "sampling temperature; 0 picks the most likely token (default 0.8)");
  app.add_option("--top-k", o.top_k, "sample among the k most likely tokens; 0: all (default 0)");
  app.add_option("--top-p", o.top_p,
                 "nucleus sampling, after --temperature and --top-k: sample among the most likely tokens whose "
                 "probabilities sum to at least p, in (0, 1]; 1: all (default 1)");
  app.add_flag("--ignore-eos", ignore_eos,
               "keep generating past the tokenizer's end-of-text token (by default generation stops there, "
               "as Hugging Face's generate does)");
  app.add_option("--seed", o.seed, "random seed (default 0)");
  if (!cli::parse_command_line(app, args, "sample")) return 0;
  o.stop_at_eos = !ignore_eos;
  std::printf("%s\n", train::sample_text(dir, o).c_str());
  return 0;
}

}  // namespace

FT_REGISTER_COMMAND(sample, "generate text from a GPT or Llama trained by fasttrain train (task char or lm)",
                    run_sample);
