// `fasttrain export --format hf` (tasks.h: export_hf_folder): a char or lm run's decoder written
// as a Hugging Face model folder, with the run's tokenizer.json beside it when it had one.
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "fasttrain/hf_folder.h"
#include "fasttrain/tasks.h"

namespace ft::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

json read_task_description(const std::string& dir) {
  const std::string path = dir + "/task.json";
  try {
    return json::parse(read_text(path, "the run's task description"));
  } catch (const json::exception& e) {
    FT_FAIL(path, ": malformed task description: ", e.what());
  }
}

// The tokenizer.json `fasttrain data` copied beside the run's shards, if the run used one.
std::string tokenizer_json_of(const json& task) {
  const json tokenizer = task.value("tokenizer", json::object());
  if (tokenizer.value("mode", std::string()) != "tokenizer.json") return "";
  const fs::path vocab_file = tokenizer.at("file").get<std::string>();
  const json vocab = json::parse(read_text(vocab_file.string(), "the shards' vocabulary file"));
  return (vocab_file.parent_path() / vocab.at("tokenizer").get<std::string>()).string();
}

}  // namespace

void export_hf_folder(const std::string& dir, const std::string& out_dir, const nn::HfSaveOptions& options) {
  TrainerConfig c = load_run_config(dir);
  // The run's model.safetensors is the whole model whatever its layout: one process exports it.
  c.dist.tp = c.dist.pp = 1, c.dist.sequence_parallel = false;
  FT_CHECK(c.task == "char" || c.task == "lm", "export: ", dir, " holds a '", c.task,
           "' run; a Hugging Face folder holds a GPT or a Llama (task char or lm)");
  const json task = read_task_description(dir);
  Generator init(0);
  const auto model = make_decoder(c, task.at("vocab_size").get<int64_t>(), &init);
  model->load(dir + "/model.safetensors", /*strict=*/true);
  if (auto* gpt = dynamic_cast<nn::GPT*>(model.get()))
    nn::save_hf_folder(*gpt, out_dir, options);
  else
    nn::save_hf_folder(dynamic_cast<nn::Llama&>(*model), out_dir, options);
  const std::string tokenizer = tokenizer_json_of(task);
  if (!tokenizer.empty()) fs::copy_file(tokenizer, fs::path(out_dir) / "tokenizer.json");
}

}  // namespace ft::train
