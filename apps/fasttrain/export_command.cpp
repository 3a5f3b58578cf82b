// `fasttrain export`: a trained GPT or Llama as a Hugging Face model folder (tasks.h:
// export_hf_folder), loadable by transformers' from_pretrained.
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli_parse.h"
#include "commands.h"
#include "fasttrain/tasks.h"

using namespace ft;

namespace {

int run_export(const std::vector<std::string>& args) {
  CLI::App app(
      "Writes the model of a char or lm run (or checkpoint) folder as a Hugging Face model folder: config.json, "
      "safetensors (sharded with model.safetensors.index.json past --max-shard-size) and the run's tokenizer.json "
      "when its shards were made with one.",
      "fasttrain export");
  app.set_help_flag("-h,--help", "show this help");
  std::string format = "hf", dtype = "f32", run_dir, out_dir;
  nn::HfSaveOptions o;
  app.add_option("--format", format, "the layout written: hf (Hugging Face transformers; the only one)");
  app.add_option("--dtype", dtype, "the weights' type in the files: f32, bf16 or f16 (default f32)");
  app.add_option("--max-shard-size", o.max_shard_bytes, "bytes of weights per file before a new shard (default 5e9)");
  app.add_option("RUN_DIR", run_dir, "run folder or checkpoint folder")->required();
  app.add_option("OUT_DIR", out_dir, "the folder to write (must not exist)")->required();
  if (!cli::parse_command_line(app, args, "export")) return 0;
  FT_CHECK(format == "hf", "export: option --format: expected hf, found '", format, "'");
  FT_CHECK(dtype == "f32" || dtype == "bf16" || dtype == "f16",
           "export: option --dtype: expected f32, bf16 or f16, found '", dtype, "'");
  o.dtype = dtype_from_name(dtype);
  train::export_hf_folder(run_dir, out_dir, o);
  std::printf("wrote %s (Hugging Face model folder)\n", out_dir.c_str());
  return 0;
}

}  // namespace

FT_REGISTER_COMMAND(export, "write a trained GPT or Llama as a Hugging Face model folder", run_export);
