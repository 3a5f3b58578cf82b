// The lm task from the command line, as a user runs it: text -> `fasttrain data` (char
// vocabulary) -> `fasttrain train --task lm` -> `fasttrain sample` and `fasttrain eval`; and the
// guard rails: data and model that do not fit together are refused before the first step, with
// a message naming the file and nothing written. --doc-mask: attention confined to the documents
// packed into each window, for GPT and Llama, on shards made by `fasttrain data`.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "fasttrain/autograd.h"
#include "fasttrain/hf_folder.h"
#include "fasttrain/models.h"
#include "fasttrain/nn.h"
#include "fasttrain/tasks.h"
#include "fasttrain/token_shards.h"
#include "support/run_cli.h"
#include "support/toy_gpt2_vocab.h"
#include "support/trainer_configs.h"

namespace ft {
namespace {

namespace fs = std::filesystem;
using test::run_cli;

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::ostringstream os;
  os << f.rdbuf();
  return os.str();
}

// A corpus with plenty of structure: sentences drawn from a few fixed ones.
std::string corpus(int sentences) {
  const char* s[] = {"the cat sat on the mat. ", "a dog ran in the park. ", "we like green tea. ",
                     "it rains in spring. "};
  std::string text;
  uint64_t x = 12345;
  for (int i = 0; i < sentences; ++i) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    text += s[(x >> 33) % 4];
  }
  return text;
}

// Documents of one to three sentences separated by GPT-2's "<|endoftext|>": `fasttrain data`
// writes each as <|endoftext|> followed by its tokens, so a 32-token window holds several.
std::string documents(int count) {
  std::string text;
  uint64_t x = 777;
  for (int i = 0; i < count; ++i) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    text += corpus(1 + static_cast<int>((x >> 33) % 3) + i % 2) + "<|endoftext|>";
  }
  return text;
}

// The loss of a run's first logged step (metrics.csv: step,epoch,split,loss,...), as written.
std::string first_loss_text(const std::string& run_dir) {
  std::istringstream csv(slurp(run_dir + "/metrics.csv"));
  std::string header, step, epoch, split, loss;
  std::getline(csv, header);
  std::getline(csv, step, ',') && std::getline(csv, epoch, ',') && std::getline(csv, split, ',') &&
      std::getline(csv, loss, ',');
  return loss;
}

class Lm : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::scratch_dir("ft_lm", ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
    std::ofstream(dir_ + "/corpus.txt") << corpus(3000);
    // About 64k characters: the first shard (48k tokens) trains, the second validates.
    const auto made =
        run_cli("data --input " + dir_ + "/corpus.txt --output " + dir_ + "/shards --vocab char --shard-tokens 48000");
    ASSERT_EQ(made.code, 0) << made.output;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string train_args(const std::string& run, int steps = 150) const {
    return "train --task lm --data '" + dir_ + "/shards/tokens_000000.bin' --val-data '" + dir_ +
           "/shards/tokens_000001.bin' --model custom --layers 1 --dim 32 --heads 2 --context 32 --batch-size 16 "
           "--max-steps " +
           std::to_string(steps) +
           " --warmup-steps 10 --lr 0.01 --eval-every 0 --eval-batches 0 --threads 1 --progress false --run-dir " +
           dir_ + "/" + run;
  }

  std::string dir_;
};

TEST_F(Lm, TextToShardsToTrainingToSamplingAndEval) {
  const auto trained = run_cli(train_args("run"));
  ASSERT_EQ(trained.code, 0) << trained.output;
  const auto summary = nlohmann::json::parse(slurp(dir_ + "/run/summary.json"));
  const double val_loss = summary["final_val_loss"].get<double>();
  // The text is four sentences in random order: far below the uniform log(vocab), near the
  // entropy of picking the next sentence spread over its characters.
  EXPECT_LT(val_loss, 0.5) << trained.output;
  EXPECT_EQ(summary["unit"], "tokens");
  const auto task = nlohmann::json::parse(slurp(dir_ + "/run/task.json"));
  EXPECT_EQ(task["tokenizer"]["mode"], "char");

  // eval on the same validation shards gives the run's final validation loss.
  const auto evaluated = run_cli("eval --checkpoint " + dir_ + "/run --data '" + dir_ + "/shards/tokens_000001.bin'");
  ASSERT_EQ(evaluated.code, 0) << evaluated.output;
  char expected[64];
  std::snprintf(expected, sizeof expected, "loss %.4f, perplexity", val_loss);
  EXPECT_NE(evaluated.output.find(expected), std::string::npos) << evaluated.output << " vs " << expected;

  // The sample continues the prompt with the corpus's words, decoded with the run's vocabulary.
  // 40 tokens after the prompt's 8 pass the context of 32: the window slides.
  const auto sampled = run_cli("sample --checkpoint " + dir_ + "/run --prompt 'the cat ' --tokens 40 --temperature 0");
  ASSERT_EQ(sampled.code, 0) << sampled.output;
  EXPECT_EQ(sampled.output.rfind("the cat sat on the mat. ", 0), 0u) << sampled.output;
  EXPECT_EQ(sampled.output.size(), 8u + 40u + 1u) << sampled.output;  // a char vocabulary has no end of text
  // A nucleus of p = 0.01 is the most likely token alone, at any temperature: greedy decoding.
  const auto nucleus = run_cli("sample --checkpoint " + dir_ +
                               "/run --prompt 'the cat ' --tokens 40 --temperature 1.5 --top-p 0.01 --seed 4");
  ASSERT_EQ(nucleus.code, 0) << nucleus.output;
  EXPECT_EQ(nucleus.output, sampled.output);
  // Without the nucleus the same seed samples the hot distribution's tail.
  const auto hot =
      run_cli("sample --checkpoint " + dir_ + "/run --prompt 'the cat ' --tokens 40 --temperature 1.5 --seed 4");
  ASSERT_EQ(hot.code, 0) << hot.output;
  EXPECT_NE(hot.output, sampled.output);
}

// GPT-2's byte-level BPE (a small vocabulary written here): text -> `fasttrain data --tokenizer
// gpt2` with a validation split -> train -> sample decodes with the same tokenizer.
TEST_F(Lm, Gpt2TokenizerShardsTrainAndSample) {
  test::write_toy_gpt2_vocab(dir_ + "/encoder.json", dir_ + "/vocab.bpe",
                             {{"t", "h"}, {"th", "e"}, {" ", "the"}, {"a", "t"}, {" ", "c"}, {" c", "at"}, {"a", "n"}});
  auto r = run_cli("data --tokenizer gpt2 --encoder " + dir_ + "/encoder.json --merges " + dir_ +
                   "/vocab.bpe --input " + dir_ + "/corpus.txt --output " + dir_ + "/bpe --val-tokens 8000");
  ASSERT_EQ(r.code, 0) << r.output;
  // 300 steps: at 150 the greedy continuation depended on the trajectory (on the seed, and on
  // whether the 56 padding classes of the 264-token vocabulary took part in the softmax); at 300
  // the model has learnt the sentences (validation loss about 0.2 either way).
  r = run_cli("train --task lm --data '" + dir_ + "/bpe/*_train_*.bin' --val-data '" + dir_ +
              "/bpe/*_val_*.bin' --model custom --layers 1 --dim 32 --heads 2 --context 32 --batch-size 16 "
              "--max-steps 300 --warmup-steps 10 --lr 0.01 --eval-every 0 --threads 1 --progress false --run-dir " +
              dir_ + "/bpe_run");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto task = nlohmann::json::parse(slurp(dir_ + "/bpe_run/task.json"));
  EXPECT_EQ(task["tokenizer"]["mode"], "gpt2");
  EXPECT_EQ(task["vocab_size"], 256 + 7 + 1);
  r = run_cli("sample --checkpoint " + dir_ + "/bpe_run --prompt 'the cat ' --tokens 12 --temperature 0");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(r.output.rfind("the cat sat on the mat. ", 0), 0u) << r.output;
}

// --init-from starts from trained weights, in fasttrain's layout or Hugging Face GPT-2's (Conv1D,
// unpadded): both give the same first loss, far below a fresh model's.
TEST_F(Lm, InitFromLoadsFasttrainAndHuggingFaceWeights) {
  ASSERT_EQ(run_cli(train_args("base")).code, 0);
  const train::TrainerConfig c = train::load_run_config(dir_ + "/base");
  Generator gen(0);
  const int64_t vocab = nlohmann::json::parse(slurp(dir_ + "/base/task.json"))["vocab_size"].get<int64_t>();
  auto model = train::make_gpt_model(c, vocab, &gen);
  nn::load_gpt2_weights(*model, dir_ + "/base/model.safetensors");
  nn::save_gpt2_weights(*model, dir_ + "/hf.safetensors", nn::GptWeightLayout::HuggingFace);
  auto first_loss = [&](const std::string& run, const std::string& extra) {
    const auto r = run_cli(train_args(run, 1) + " --log-every-n-steps 1 " + extra);
    EXPECT_EQ(r.code, 0) << r.output;
    std::istringstream csv(slurp(dir_ + "/" + run + "/metrics.csv"));
    std::string header, step, epoch, split, loss;
    std::getline(csv, header);
    std::getline(csv, step, ',') && std::getline(csv, epoch, ',') && std::getline(csv, split, ',') &&
        std::getline(csv, loss, ',');  // the first row: step,epoch,split,loss,...
    return std::stod(loss);
  };
  const double fresh = first_loss("fresh", "");
  const double ours = first_loss("from_ours", "--init-from " + dir_ + "/base/model.safetensors");
  const double hf = first_loss("from_hf", "--init-from " + dir_ + "/hf.safetensors");
  EXPECT_LT(ours, 0.6 * fresh);
  EXPECT_EQ(hf, ours);
}

TEST_F(Lm, DataThatDoesNotFitTheModelIsRefusedBeforeTheFirstStep) {
  // A token at or above the vocabulary: --vocab-size smaller than the shards' vocabulary.
  auto r = run_cli(train_args("small_vocab") + " --vocab-size 5");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("option vocab_size: 5 is smaller than the"), std::string::npos) << r.output;
  // The same with no vocabulary file beside the shards: the shard and the token are named.
  fs::remove(dir_ + "/shards/vocab.json");
  r = run_cli(train_args("no_vocab_file") + " --vocab-size 5");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("training shard " + dir_ + "/shards/tokens_000000.bin holds token "), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("outside the vocabulary of 5"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir_ + "/no_vocab_file")) << "a run folder was written";
  r = run_cli(train_args("no_size"));
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("lm: no vocabulary size: give --vocab-size"), std::string::npos) << r.output;
  // Shards too short for one window of the context.
  data::write_token_shard(dir_ + "/tiny.bin", {1, 2, 3});
  r = run_cli("train --task lm --data '" + dir_ + "/shards/tokens_000000.bin' --val-data '" + dir_ +
              "/tiny.bin' --vocab-size 64 --progress false --run-dir " + dir_ + "/tiny_run");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("the validation shards (" + dir_ + "/tiny.bin) hold no window of context + 1 = 129 tokens"),
            std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(dir_ + "/tiny_run"));
  // No shard matches the glob.
  r = run_cli("train --task lm --data '" + dir_ + "/nothing*.bin' --val-data '" + dir_ +
              "/tiny.bin' --vocab-size 64 --progress false");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("no file matches '" + dir_ + "/nothing*.bin'"), std::string::npos) << r.output;
}

TEST_F(Lm, ModelPresetsAndCustomSizes) {
  auto r = run_cli("train --task lm --data x --val-data y --model gpt2 --layers 3");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("option --layers sizes --model custom; --model gpt2 has its own size"), std::string::npos)
      << r.output;
  r = run_cli("train --task lm --data x --val-data y --model gpt5");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("option model: expected gpt-mini, gpt2, gpt2-medium, gpt2-large, custom, llama-mini, "
                          "smollm-135m, smollm-360m, tinyllama-1.1b, llama-3.2-1b or llama, found 'gpt5'"),
            std::string::npos)
      << r.output;
  r = run_cli("train --task lm --val-data y");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("option data: expected a glob of token shards"), std::string::npos) << r.output;
  // gpt-mini, the default: BENCH.md's sizes, recorded in the run's config.
  const auto trained = run_cli("train --task lm --data '" + dir_ + "/shards/tokens_000000.bin' --val-data '" + dir_ +
                               "/shards/tokens_000001.bin' --max-steps 1 --eval-batches 1 --batch-size 2 --threads 1 "
                               "--progress false --run-dir " +
                               dir_ + "/mini");
  ASSERT_EQ(trained.code, 0) << trained.output;
  const std::string config = slurp(dir_ + "/mini/config.toml");
  EXPECT_NE(config.find("\n[model]\nname = 'gpt-mini'\ncontext = 128\nlayers = 4\ndim = 256\nheads = 4\n"),
            std::string::npos)
      << config;
}

// A Llama of its own (grouped-query attention: 2 heads sharing 1 key/value head) learns the text as
// the GPT does, and eval and sample load it from the run; --init-from takes a file in Hugging
// Face's names (LlamaForCausalLM's, tied head left out as save_pretrained does).
TEST_F(Lm, TrainsALlamaEvaluatesSamplesAndInitialisesFromHuggingFaceNames) {
  std::string args = train_args("llama");
  args.replace(args.find("--model custom"), 14, "--model llama --kv-heads 1 --ffn-dim 64");
  const auto trained = run_cli(args);
  ASSERT_EQ(trained.code, 0) << trained.output;
  const auto summary = nlohmann::json::parse(slurp(dir_ + "/llama/summary.json"));
  const double val_loss = summary["final_val_loss"].get<double>();
  EXPECT_LT(val_loss, 0.5) << trained.output;
  const std::string config = slurp(dir_ + "/llama/config.toml");
  EXPECT_NE(config.find("\n[model]\nname = 'llama'\ncontext = 32\nlayers = 1\ndim = 32\nheads = 2\nkv_heads = 1\n"
                        "ffn_dim = 64\nrope_theta = 1e+04\n"),
            std::string::npos)
      << config;
  const auto evaluated = run_cli("eval --checkpoint " + dir_ + "/llama --data '" + dir_ + "/shards/tokens_000001.bin'");
  ASSERT_EQ(evaluated.code, 0) << evaluated.output;
  char expected[64];
  std::snprintf(expected, sizeof expected, "loss %.4f, perplexity", val_loss);
  EXPECT_NE(evaluated.output.find(expected), std::string::npos) << evaluated.output << " vs " << expected;
  const auto sampled =
      run_cli("sample --checkpoint " + dir_ + "/llama --prompt 'the cat ' --tokens 40 --temperature 0");
  ASSERT_EQ(sampled.code, 0) << sampled.output;
  EXPECT_EQ(sampled.output.rfind("the cat sat on the mat. ", 0), 0u) << sampled.output;

  // The run's weights in Hugging Face's form: the same names without the tied head.
  TensorMap weights = load_safetensors(dir_ + "/llama/model.safetensors").tensors;
  std::erase_if(weights, [](const auto& w) { return w.first == "lm_head.weight"; });
  save_safetensors(dir_ + "/hf_llama.safetensors", weights, {{"format", "pt"}});
  std::string again = train_args("again", 1);
  again.replace(again.find("--model custom"), 14, "--model llama --kv-heads 1 --ffn-dim 64");
  const auto resumed = run_cli(again + " --init-from " + dir_ + "/hf_llama.safetensors");
  ASSERT_EQ(resumed.code, 0) << resumed.output;
  const double start = nlohmann::json::parse(slurp(dir_ + "/again/summary.json"))["final_val_loss"].get<double>();
  EXPECT_LT(start, 0.6) << "the Hugging Face-named weights did not load";

  // A Hugging Face model folder (config.json and sharded safetensors) is the architecture, the
  // size and the weights: no --model needed, and its [model] options are recorded.
  const train::TrainerConfig c = train::load_run_config(dir_ + "/llama");
  std::string plain = train_args("from_folder", 1);
  const std::string sizes = "--model custom --layers 1 --dim 32 --heads 2 ";
  plain.erase(plain.find(sizes), sizes.size());
  const TensorMap saved = load_safetensors(dir_ + "/llama/model.safetensors").tensors;
  const int64_t vocab = nlohmann::json::parse(slurp(dir_ + "/llama/task.json"))["vocab_size"].get<int64_t>();
  nn::Llama run_model(train::llama_config(c.model, vocab));
  run_model.load_state_dict(saved);
  nn::save_hf_folder(run_model, dir_ + "/hf_folder", {.max_shard_bytes = 20'000});
  ASSERT_TRUE(fs::exists(dir_ + "/hf_folder/model.safetensors.index.json"));
  const auto from_folder = run_cli(plain + " --init-from " + dir_ + "/hf_folder");
  ASSERT_EQ(from_folder.code, 0) << from_folder.output;
  const double folder_start =
      nlohmann::json::parse(slurp(dir_ + "/from_folder/summary.json"))["final_val_loss"].get<double>();
  EXPECT_LT(folder_start, 0.6) << "the folder's weights did not load";
  EXPECT_NE(slurp(dir_ + "/from_folder/config.toml").find("name = 'llama'\ncontext = 32\nlayers = 1\ndim = 32\n"),
            std::string::npos);
  // `fasttrain export --format hf` writes the same folder from the run: it starts the same.
  const auto exported = run_cli("export --format hf --max-shard-size 20000 " + dir_ + "/llama " + dir_ + "/exported");
  ASSERT_EQ(exported.code, 0) << exported.output;
  for (const char* file : {"config.json", "model.safetensors.index.json"})
    EXPECT_TRUE(fs::exists(dir_ + "/exported/" + file)) << file;
  EXPECT_EQ(nn::read_hf_weights(dir_ + "/exported").size(), nn::read_hf_weights(dir_ + "/hf_folder").size());
  EXPECT_EQ(nn::read_hf_config(dir_ + "/exported").llama.kv_heads, 1);
  const auto refused = run_cli("export --format gguf " + dir_ + "/llama " + dir_ + "/x");
  EXPECT_NE(refused.output.find("export: option --format: expected hf, found 'gguf'"), std::string::npos)
      << refused.output;
}

// The Llama presets bring their sizes (a size flag is refused) and take --context as the window.
// --batch-size auto and `fasttrain tune` on a Llama (issue 42): the finder's trial steps run the
// Llama's forward and backward under the memory budget, a smaller budget finds a smaller batch;
// tune's trials train it and write a run file that names the model.
TEST_F(Lm, ALlamaFindsItsBatchSizeAndIsTuned) {
  const std::string flags = "--task lm --data '" + dir_ + "/shards/tokens_000000.bin' --val-data '" + dir_ +
                            "/shards/tokens_000001.bin' --model llama --layers 1 --dim 64 --heads 2 --kv-heads 1 "
                            "--context 32 --max-steps 2 --eval-every 0 --threads 1 --tensorboard false ";
  auto found = [&](const std::string& budget) -> int64_t {
    const auto r = run_cli("train " + flags + "--batch-size auto --max-batch-size 512 --memory-limit " + budget +
                           " --run-dir " + dir_ + "/auto" + budget);
    EXPECT_EQ(r.code, 0) << r.output;
    const size_t at = r.output.find("-> batch size ");
    if (at == std::string::npos) {
      ADD_FAILURE() << r.output;
      return 0;
    }
    return std::stoll(r.output.substr(at + 14));
  };
  const int64_t roomy = found("24MiB"), tight = found("8MiB");
  EXPECT_GE(tight, 2);
  EXPECT_LT(tight, roomy);
  EXPECT_NE(slurp(dir_ + "/auto8MiB/config.toml").find("batch_size = " + std::to_string(tight) + "\n"),
            std::string::npos);

  const auto tuned = run_cli("tune " + flags + "--budget 60s --trial-steps 3 --run-dir " + dir_ + "/tune");
  ASSERT_EQ(tuned.code, 0) << tuned.output;
  EXPECT_NE(tuned.output.find("trial 0 [start]"), std::string::npos) << tuned.output;
  const std::string run_file = slurp(dir_ + "/tune/run.toml");
  EXPECT_NE(run_file.find("name = 'llama'"), std::string::npos) << run_file;
  EXPECT_NE(run_file.find("kv_heads = 1"), std::string::npos) << run_file;
}

TEST_F(Lm, LlamaPresetsBringTheirSizes) {
  auto r = run_cli("train --task lm --data x --val-data y --model smollm-135m --kv-heads 9");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("option --kv-heads sizes --model llama; --model smollm-135m has its own size"),
            std::string::npos)
      << r.output;
  r = run_cli("train --task lm --data x --val-data y --model llama --heads 4 --kv-heads 3");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("option kv_heads: expected 0 (heads) or a divisor of heads (4), found 3"), std::string::npos)
      << r.output;
  const auto trained = run_cli("train --task lm --data '" + dir_ + "/shards/tokens_000000.bin' --val-data '" + dir_ +
                               "/shards/tokens_000001.bin' --model llama-mini --context 64 --max-steps 1 "
                               "--eval-batches 1 --batch-size 2 --threads 1 --progress false --run-dir " +
                               dir_ + "/mini");
  ASSERT_EQ(trained.code, 0) << trained.output;
  const std::string config = slurp(dir_ + "/mini/config.toml");
  EXPECT_NE(config.find("\n[model]\nname = 'llama-mini'\ncontext = 64\nlayers = 4\ndim = 256\nheads = 8\n"
                        "kv_heads = 2\nffn_dim = 688\n"),
            std::string::npos)
      << config;
}

// --doc-mask on GPT-2 BPE shards: windows of several documents train (the loss falls) and their
// first step differs from the unmasked one; on a single long document (every window inside it)
// the masked run's first loss is the unmasked one exactly; the Llama family takes the flag too.
TEST_F(Lm, DocumentMaskTrainsGptAndLlamaOnPackedDocuments) {
  test::write_toy_gpt2_vocab(dir_ + "/encoder.json", dir_ + "/vocab.bpe",
                             {{"t", "h"}, {"th", "e"}, {" ", "the"}, {"a", "t"}, {" ", "c"}, {" c", "at"}, {"a", "n"}});
  std::ofstream(dir_ + "/docs.txt") << documents(600);
  const std::string tok = "data --tokenizer gpt2 --encoder " + dir_ + "/encoder.json --merges " + dir_ + "/vocab.bpe ";
  auto r = run_cli(tok + "--input " + dir_ + "/docs.txt --output " + dir_ + "/docs --val-tokens 4000");
  ASSERT_EQ(r.code, 0) << r.output;
  r = run_cli(tok + "--input " + dir_ + "/corpus.txt --output " + dir_ + "/one --val-tokens 4000");
  ASSERT_EQ(r.code, 0) << r.output;
  auto args = [&](const std::string& data, const std::string& run, int steps, const std::string& model) {
    return "train --task lm --data '" + dir_ + "/" + data + "/*_train_*.bin' --val-data '" + dir_ + "/" + data +
           "/*_val_*.bin' " + model + " --layers 1 --dim 32 --heads 2 --context 32 --batch-size 16 --max-steps " +
           std::to_string(steps) +
           " --warmup-steps 10 --lr 0.01 --eval-every 0 --threads 1 --progress false --log-every-n-steps 1 "
           "--run-dir " +
           dir_ + "/" + run;
  };
  const std::string gpt = "--model custom", llama = "--model llama --kv-heads 1 --ffn-dim 64";
  for (const std::string& model : {gpt, llama}) {
    SCOPED_TRACE(model);
    const std::string tag = model == gpt ? "gpt" : "llama";
    // Several documents per window: the mask changes the very first loss.
    r = run_cli(args("docs", tag + "_plain", 1, model));
    ASSERT_EQ(r.code, 0) << r.output;
    r = run_cli(args("docs", tag + "_masked", 1, model) + " --doc-mask");
    ASSERT_EQ(r.code, 0) << r.output;
    EXPECT_NE(first_loss_text(dir_ + "/" + tag + "_plain"), first_loss_text(dir_ + "/" + tag + "_masked"));
    EXPECT_NE(slurp(dir_ + "/" + tag + "_masked/config.toml").find("doc_mask = true"), std::string::npos);
    // One document in every window: the mask is the causal one, the loss the same to the last digit.
    r = run_cli(args("one", tag + "_one_plain", 1, model));
    ASSERT_EQ(r.code, 0) << r.output;
    r = run_cli(args("one", tag + "_one_masked", 1, model) + " --doc-mask");
    ASSERT_EQ(r.code, 0) << r.output;
    EXPECT_EQ(first_loss_text(dir_ + "/" + tag + "_one_plain"), first_loss_text(dir_ + "/" + tag + "_one_masked"));
  }
  // Training with the mask: the validation loss (also masked) ends far below the first step's.
  r = run_cli(args("docs", "trained", 150, gpt) + " --doc-mask");
  ASSERT_EQ(r.code, 0) << r.output;
  const double first = std::stod(first_loss_text(dir_ + "/trained"));
  const double final_val = nlohmann::json::parse(slurp(dir_ + "/trained/summary.json"))["final_val_loss"].get<double>();
  EXPECT_LT(final_val, 0.3 * first) << r.output;
  // eval reads the run's config: the same masked validation loss.
  r = run_cli("eval --checkpoint " + dir_ + "/trained --data '" + dir_ + "/docs/*_val_*.bin'");
  ASSERT_EQ(r.code, 0) << r.output;
  char expected[64];
  std::snprintf(expected, sizeof expected, "loss %.4f, perplexity", final_val);
  EXPECT_NE(r.output.find(expected), std::string::npos) << r.output << " vs " << expected;
}

// Shards without a token that marks documents (characters here), and tasks other than lm, are
// refused before anything is written.
TEST_F(Lm, DocumentMaskNeedsDocumentMarkers) {
  auto r = run_cli(train_args("char_vocab", 1) + " --doc-mask");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("option doc_mask: the training shards have no end-of-text or begin-of-text token to find "
                          "documents by (" +
                          dir_ +
                          "/shards/vocab.json has mode char); --doc-mask needs shards made by `fasttrain data` "
                          "with a GPT-2 or tokenizer.json tokenizer"),
            std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(dir_ + "/char_vocab"));
  fs::remove(dir_ + "/shards/vocab.json");
  r = run_cli(train_args("no_vocab", 1) + " --doc-mask --vocab-size 64");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("(no vocab.json beside " + dir_ + "/shards/tokens_000000.bin)"), std::string::npos)
      << r.output;
  r = run_cli("train --task char --doc-mask --max-steps 1 --progress false");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("option --doc-mask applies to the lm task, not char"), std::string::npos) << r.output;
}

// The decoders under a document mask: a token's logits depend on its own document only (the
// earlier document's tokens can change without moving them), while positions keep counting
// across documents: for GPT's learned positions the second document's logits differ from those
// of the document run alone from position 0; for Llama's rotary ones, whose attention scores
// depend on relative positions only, they are the same (up to rounding).
TEST(DecoderDocumentMask, AttentionStaysInsideDocumentsAndPositionsRunOn) {
  const int64_t T = 12, first = 5;
  const std::vector<double> tokens = {1, 4, 3, 7, 2, 9, 3, 3, 5, 6, 1, 8};
  const Tensor ids = from_vector(tokens, {1, T}, DType::I64);
  std::vector<double> other = tokens;
  for (int64_t t = 1; t < first; ++t) other[t] = 10 + t;  // the first document's tokens changed
  const Tensor ids2 = from_vector(other, {1, T}, DType::I64);
  const Tensor docs = from_vector({0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1}, {1, T}, DType::I32);
  auto later = [&](const Tensor& logits) { return logits.narrow(1, first, T - first).contiguous().to_vector(); };
  auto max_diff = [](const std::vector<double>& a, const std::vector<double>& b) {
    double m = 0;
    for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
    return m;
  };
  Generator g1(3), g2(3);
  nn::GPTConfig gc;
  gc.vocab_size = 16, gc.context = T, gc.layers = 2, gc.dim = 32, gc.heads = 4;
  nn::LlamaConfig lc;
  lc.vocab_size = 16, lc.context = T, lc.layers = 2, lc.dim = 32, lc.heads = 4, lc.kv_heads = 2, lc.ffn_dim = 64;
  nn::GPT gpt(gc, &g1);
  nn::Llama llama(lc, &g2);
  autograd::NoGradGuard no_grad;
  for (int m = 0; m < 2; ++m) {
    SCOPED_TRACE(m == 0 ? "GPT" : "Llama");
    auto run = [&](const Tensor& x, const Tensor& d) { return m == 0 ? gpt.forward(x, d) : llama.forward(x, d); };
    EXPECT_EQ(later(run(ids, docs)), later(run(ids2, docs)));  // bit for bit: no path from document 0
    EXPECT_GT(max_diff(later(run(ids, Tensor())), later(run(ids2, Tensor()))), 1e-3);  // causal: there is one
    const Tensor alone = m == 0 ? gpt(ids.narrow(1, first, T - first)) : llama(ids.narrow(1, first, T - first));
    const double moved = max_diff(later(run(ids, docs)), alone.contiguous().to_vector());
    if (m == 0)
      EXPECT_GT(moved, 1e-3) << "GPT's positions restarted at the document";
    else
      EXPECT_LT(moved, 1e-4) << "rotary attention depends on relative positions only";
  }
}

}  // namespace
}  // namespace ft
