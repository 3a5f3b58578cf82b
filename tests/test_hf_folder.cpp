// Hugging Face model folders (hf_folder.h) exchanged with the HF-style PyTorch models of
// tests/support/hf_llama.py and hf_gpt2.py, whose folders are written and read by
// tests/support/hf_folder_torch.py the way save_pretrained and from_pretrained do (config.json in
// transformers' field names, sharded safetensors with model.safetensors.index.json, a tied head
// left out). A folder from torch (sharded or not; GQA tied, Qwen2-style untied with biases, Llama 3
// rope scaling; GPT-2) loads and gives torch's logits; our folder (forced to shard) loads in torch,
// with the shards and index save_pretrained would write, and gives our logits; a round trip is bit
// exact; bf16 saves. Then the refusals, each naming the file and the field.
//
// transformers itself is not installed here (Debian's python3-torch only), so the PyTorch side is
// written from transformers' documented behaviour; with transformers importable these folders
// would also be loaded by LlamaForCausalLM / GPT2LMHeadModel.from_pretrained. Without torch the
// exchange tests skip (the scripts exit 77); the refusals need no torch.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "fasttrain/fasttrain.h"
#include "support/expect_error.h"
#include "support/temp_dir_test.h"
#include "support/torch_scripts.h"
#include "support/trainer_configs.h"

using namespace ft;
namespace fs = std::filesystem;
using json = nlohmann::json;
using test::expect_close;
using test::named;

namespace {

constexpr int64_t kSmallShard = 20000;  // bytes: the small models below take several shards
constexpr int64_t kOneShard = 100'000'000;

void expect_same_state(const nn::Module& a, const nn::Module& b) {
  const TensorMap sa = a.state_dict(), sb = b.state_dict();
  ASSERT_EQ(sa.size(), sb.size());
  for (size_t i = 0; i < sa.size(); ++i) {
    ASSERT_EQ(sa[i].first, sb[i].first);
    EXPECT_EQ(max(abs(sa[i].second - sb[i].second)).item<double>(), 0.0) << sa[i].first;
  }
}

// torch's logits for `ids_file`'s ids from the folder `dir` (checked to be sharded as
// save_pretrained shards with `max_shard_bytes`).
Tensor torch_logits(const char* script, const fs::path& dir, const fs::path& ids_file, int64_t max_shard_bytes) {
  const fs::path out = dir.parent_path() / (dir.filename().string() + "_logits.safetensors");
  const int rc = test::run_torch_script(
      script, detail::concat("run ", dir.string(), " ", ids_file.string(), " ", out.string(), " ", max_shard_bytes));
  EXPECT_EQ(rc, 0) << script << " run " << dir << " failed";
  return rc == 0 ? named(load_safetensors(out.string()).tensors, "logits") : Tensor();
}

nn::HfSaveOptions sharded(int64_t max_shard_bytes, DType dtype = DType::F32) {
  nn::HfSaveOptions o;
  o.max_shard_bytes = max_shard_bytes, o.dtype = dtype;
  return o;
}

// DIR/hf and DIR/reference.safetensors (ids, logits) from `script folder DIR ARGS`; returns its exit
// status (kNoTorch without torch).
struct TorchFolder {
  fs::path hf;
  Tensor ids, logits;
};
int write_torch_folder(const char* script, const fs::path& dir, const std::string& args, TorchFolder& out) {
  fs::create_directories(dir);
  const int rc = test::run_torch_script(script, "folder " + dir.string() + " " + args);
  if (rc != 0) return rc;
  const TensorMap ref = load_safetensors((dir / "reference.safetensors").string()).tensors;
  out = {dir / "hf", named(ref, "ids"), named(ref, "logits")};
  return rc;
}

json read_json(const fs::path& path) {
  std::ifstream in(path);
  return json::parse(in);
}

void write_json(const fs::path& path, const json& doc) { std::ofstream(path) << doc.dump(2); }

// --- Llama ---

struct LlamaCase {
  const char* name;
  int64_t heads, kv_heads;
  bool tied, bias;
  double llama3_factor;
  int64_t max_shard_bytes;  // of the torch side's folder
};

void PrintTo(const LlamaCase& k, std::ostream* os) { *os << k.name; }

std::string llama_args(const LlamaCase& k) {
  return detail::concat("300 16 2 32 ", k.heads, " ", k.kv_heads, " 48 10000 ", k.tied ? 1 : 0, " ", k.bias ? 1 : 0,
                        " ", k.llama3_factor);
}

class LlamaFolder : public ::testing::TestWithParam<LlamaCase> {};

TEST_P(LlamaFolder, ExchangedWithTorch) {
  const LlamaCase& k = GetParam();
  const fs::path dir = test::scratch_dir("ft_hf_llama", k.name);
  TorchFolder torch;
  const int rc = write_torch_folder("hf_llama.py", dir, llama_args(k) + " " + std::to_string(k.max_shard_bytes), torch);
  if (rc == test::kNoTorch)
    GTEST_SKIP() << "python3-torch not installed: Hugging Face folders not exchanged with PyTorch";
  ASSERT_EQ(rc, 0) << "tests/support/hf_llama.py folder failed";
  const fs::path ref = dir / "reference.safetensors";

  // torch's folder -> nn::Llama: the config read, the model built from it, torch's logits.
  const nn::HfModelConfig config = nn::read_hf_config(torch.hf.string());
  ASSERT_EQ(config.type, nn::HfModelType::Llama);
  const nn::LlamaConfig& c = config.llama;
  EXPECT_EQ(c.kv_heads, k.kv_heads);
  EXPECT_EQ(c.tie_embeddings, k.tied);
  EXPECT_EQ(c.attention_bias, k.bias);
  EXPECT_EQ(c.rope_scaling.type, k.llama3_factor > 0 ? RopeScaling::Type::Llama3 : RopeScaling::Type::None);
  nn::Llama model(c);
  nn::load_hf_folder(model, torch.hf.string());
  expect_close(model(torch.ids), torch.logits, "logits of torch's folder");

  // Ours -> torch: sharded as save_pretrained shards, and torch's logits are ours.
  const fs::path ours = dir / "ours";
  nn::HfSaveOptions options = sharded(kSmallShard);
  options.bos_token_id = 1, options.eos_token_id = 2;
  nn::save_hf_folder(model, ours.string(), options);
  EXPECT_TRUE(fs::exists(ours / "model.safetensors.index.json"));
  const json saved = read_json(ours / "config.json");
  EXPECT_EQ(saved["model_type"], k.bias ? "qwen2" : "llama");
  EXPECT_EQ(saved["eos_token_id"], 2);
  expect_close(torch_logits("hf_llama.py", ours, ref, kSmallShard), model(torch.ids), "torch's logits of our folder");

  // Round trip: bit exact.
  nn::Llama back(nn::read_hf_config(ours.string()).llama);
  nn::load_hf_folder(back, ours.string());
  expect_same_state(model, back);
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Folders, LlamaFolder,
                         ::testing::Values(LlamaCase{"gqa_tied_sharded", 4, 2, true, false, 0, kSmallShard},
                                           LlamaCase{"gqa_tied_single", 4, 2, true, false, 0, kOneShard},
                                           LlamaCase{"qwen2_untied_bias", 4, 1, false, true, 0, kSmallShard},
                                           LlamaCase{"llama3_scaling", 4, 2, false, false, 8.0, kSmallShard}),
                         [](const auto& info) { return std::string(info.param.name); });

nn::LlamaConfig small_llama() {
  nn::LlamaConfig c;
  c.vocab_size = 300, c.context = 16, c.layers = 2, c.dim = 32, c.heads = 4, c.kv_heads = 2, c.ffn_dim = 48;
  return c;
}

// bf16 weights: converted on write, torch_dtype says so, and the reloaded f32 model holds the
// rounded weights and gives torch's logits for the same file.
TEST(HfFolder, Bf16Save) {
  const fs::path dir = test::scratch_dir("ft_hf", "bf16");
  Generator gen(5);
  nn::Llama model(small_llama(), &gen);
  nn::save_hf_folder(model, (dir / "hf").string(), sharded(kSmallShard, DType::BF16));
  EXPECT_EQ(read_json(dir / "hf" / "config.json")["torch_dtype"], "bfloat16");
  for (auto& [name, t] : nn::read_hf_weights((dir / "hf").string())) EXPECT_EQ(t.dtype(), DType::BF16) << name;
  nn::Llama back(small_llama());
  nn::load_hf_folder(back, (dir / "hf").string());
  const TensorMap a = model.state_dict(), b = back.state_dict();
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_EQ(max(abs(a[i].second.to(DType::BF16).to(DType::F32) - b[i].second)).item<double>(), 0.0) << a[i].first;

  const Tensor ids = randint(0, 300, {2, 16}, DType::I64, &gen);
  save_safetensors((dir / "ids.safetensors").string(), {{"ids", ids}});
  if (std::system("/usr/bin/python3 -c 'import torch' 2>/dev/null") != 0)
    GTEST_SKIP() << "python3-torch not installed: the bf16 folder is not loaded in PyTorch";
  expect_close(torch_logits("hf_llama.py", dir / "hf", dir / "ids.safetensors", kSmallShard), back(ids),
               "torch's logits of the bf16 folder");
  fs::remove_all(dir);
}

// --- GPT-2 ---

class Gpt2Folder : public ::testing::TestWithParam<int64_t> {};

TEST_P(Gpt2Folder, ExchangedWithTorch) {
  const int64_t max_shard_bytes = GetParam();
  const fs::path dir = test::scratch_dir("ft_hf_gpt2", std::to_string(max_shard_bytes));
  TorchFolder torch;
  const int rc = write_torch_folder("hf_gpt2.py", dir, "300 16 2 32 4 " + std::to_string(max_shard_bytes), torch);
  if (rc == test::kNoTorch)
    GTEST_SKIP() << "python3-torch not installed: Hugging Face folders not exchanged with PyTorch";
  ASSERT_EQ(rc, 0) << "tests/support/hf_gpt2.py folder failed";

  const nn::HfModelConfig config = nn::read_hf_config(torch.hf.string());
  ASSERT_EQ(config.type, nn::HfModelType::Gpt2);
  EXPECT_EQ(config.gpt.vocab_size, 300);
  nn::GPT model(config.gpt);
  nn::load_hf_folder(model, torch.hf.string());
  expect_close(model(torch.ids), torch.logits, "logits of torch's folder");

  const fs::path ours = dir / "ours";
  nn::save_hf_folder(model, ours.string(), sharded(kSmallShard));
  EXPECT_EQ(read_json(ours / "config.json")["architectures"], json::array({"GPT2LMHeadModel"}));
  expect_close(torch_logits("hf_gpt2.py", ours, dir / "reference.safetensors", kSmallShard), model(torch.ids),
               "torch's logits of our folder");

  nn::GPT back(nn::read_hf_config(ours.string()).gpt);
  nn::load_hf_folder(back, ours.string());
  expect_same_state(model, back);
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Folders, Gpt2Folder, ::testing::Values(kSmallShard, kOneShard),
                         [](const auto& info) { return info.param == kSmallShard ? "sharded" : "single"; });

// --- refusals: a folder of ours, then one thing changed ---

class HfFolderErrors : public test::TempDirTest {
 protected:
  void SetUp() override {
    TempDirTest::SetUp();
    nn::Llama model(small_llama());
    nn::save_hf_folder(model, folder(), sharded(kSmallShard));
  }
  std::string folder() const { return file("hf"); }
  fs::path config_path() const { return dir_ / "hf" / "config.json"; }
  fs::path index_path() const { return dir_ / "hf" / "model.safetensors.index.json"; }
  void change_config(const std::function<void(json&)>& change) const {
    json c = read_json(config_path());
    change(c);
    write_json(config_path(), c);
  }
  std::string load_error() const {
    return test::error_of([&] {
      nn::Llama model(small_llama());
      nn::load_hf_folder(model, folder());
    });
  }
  std::string config_error() const {
    return test::error_of([&] { nn::read_hf_config(folder()); });
  }
};

TEST_F(HfFolderErrors, UnsupportedConfigFieldsAreNamed) {
  const std::string path = config_path().string();
  change_config([](json& c) { c["model_type"] = "mistral"; });
  EXPECT_NE(config_error().find(path + ": field \"model_type\" is \"mistral\""), std::string::npos) << config_error();
  change_config([](json& c) { c["model_type"] = "llama", c["hidden_act"] = "gelu"; });
  EXPECT_NE(config_error().find(path + ": field \"hidden_act\" is \"gelu\""), std::string::npos) << config_error();
  change_config([](json& c) { c["hidden_act"] = "silu", c["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4}}; });
  EXPECT_NE(config_error().find(path + ": field \"rope_scaling.rope_type\" is \"yarn\""), std::string::npos)
      << config_error();
  change_config([](json& c) { c["rope_scaling"] = {{"type", "linear"}, {"factor", 2}}; });
  EXPECT_NE(config_error().find(path + ": field \"rope_scaling.type\" is \"linear\""), std::string::npos)
      << config_error();
  change_config(
      [](json& c) { c["rope_scaling"] = nullptr, c["model_type"] = "qwen2", c["use_sliding_window"] = true; });
  EXPECT_NE(config_error().find(path + ": field \"use_sliding_window\" is true"), std::string::npos) << config_error();
  change_config(
      [](json& c) { c["model_type"] = "llama", c["use_sliding_window"] = false, c["attention_bias"] = true; });
  EXPECT_NE(config_error().find(path + ": field \"attention_bias\" is true"), std::string::npos) << config_error();
  change_config([](json& c) { c["attention_bias"] = false, c.erase("num_hidden_layers"); });
  EXPECT_NE(config_error().find(path + ": field \"num_hidden_layers\" is missing"), std::string::npos)
      << config_error();
  change_config([](json& c) { c = {{"model_type", "gpt2"}, {"activation_function", "relu"}}; });
  EXPECT_NE(config_error().find(path + ": field \"activation_function\" is \"relu\""), std::string::npos)
      << config_error();
}

TEST_F(HfFolderErrors, ConfigThatDiffersFromTheModelNamesEveryField) {
  nn::LlamaConfig other = small_llama();
  other.layers = 3, other.kv_heads = 4;
  nn::Llama model(other);
  const std::string e = test::error_of([&] { nn::load_hf_folder(model, folder()); });
  EXPECT_NE(e.find(config_path().string() + " does not describe this model: num_hidden_layers 2 in the file, 3 in "
                                            "the model; num_key_value_heads 2 in the file, 4 in the model"),
            std::string::npos)
      << e;
  nn::GPT gpt(nn::GPTConfig{});
  test::expect_error([&] { nn::load_hf_folder(gpt, folder()); },
                     "describes a Llama-family model, but the model is a GPT-2 model");
}

TEST_F(HfFolderErrors, MissingShard) {
  const json index = read_json(index_path());
  const std::string shard = index["weight_map"]["model.norm.weight"];
  fs::remove(dir_ / "hf" / shard);
  EXPECT_NE(load_error().find(index_path().string() + ": weight_map lists \"" + shard + "\""), std::string::npos)
      << load_error();
  EXPECT_NE(load_error().find("which is missing"), std::string::npos) << load_error();
}

TEST_F(HfFolderErrors, TensorInTwoShards) {
  const json index = read_json(index_path());
  const std::string first = index["weight_map"]["model.embed_tokens.weight"];
  const std::string last = index["weight_map"]["model.norm.weight"];
  ASSERT_NE(first, last);
  // The last shard gets a copy of the embedding as well.
  TensorMap tensors = load_safetensors((dir_ / "hf" / last).string()).tensors;
  tensors.emplace_back("model.embed_tokens.weight",
                       named(load_safetensors((dir_ / "hf" / first).string()).tensors, "model.embed_tokens.weight"));
  save_safetensors((dir_ / "hf" / last).string(), tensors, {{"format", "pt"}});
  EXPECT_NE(load_error().find(index_path().string() + ": tensor \"model.embed_tokens.weight\" is in two shards"),
            std::string::npos)
      << load_error();
}

TEST_F(HfFolderErrors, MalformedIndex) {
  std::ofstream(index_path()) << "{\"weight_map\": ";
  EXPECT_NE(load_error().find(index_path().string() + ": not valid JSON"), std::string::npos) << load_error();
  write_json(index_path(), {{"weight_map", json::array({1, 2})}});
  EXPECT_NE(load_error().find(index_path().string() + ": \"weight_map\" must be a non-empty object"), std::string::npos)
      << load_error();
  write_json(index_path(), {{"weight_map", {{"model.norm.weight", "../elsewhere.safetensors"}}}});
  EXPECT_NE(load_error().find("must name a file in the folder"), std::string::npos) << load_error();
}

// A tied head stored anyway must be the embedding; a missing weight is named by the strict load.
TEST_F(HfFolderErrors, WeightsMustFitTheModel) {
  json index = read_json(index_path());
  const std::string last = index["weight_map"]["model.norm.weight"];
  TensorMap tensors = load_safetensors((dir_ / "hf" / last).string()).tensors;
  tensors.emplace_back("lm_head.weight", zeros({300, 32}));
  save_safetensors((dir_ / "hf" / last).string(), tensors, {{"format", "pt"}});
  index["weight_map"]["lm_head.weight"] = last;
  write_json(index_path(), index);
  EXPECT_NE(load_error().find("\"lm_head.weight\" differs from \"model.embed_tokens.weight\""), std::string::npos)
      << load_error();
  std::erase_if(tensors, [](const auto& e) { return e.first == "lm_head.weight" || e.first == "model.norm.weight"; });
  save_safetensors((dir_ / "hf" / last).string(), tensors, {{"format", "pt"}});
  index["weight_map"].erase("lm_head.weight");
  index["weight_map"].erase("model.norm.weight");
  write_json(index_path(), index);
  EXPECT_NE(load_error().find("model.norm.weight"), std::string::npos) << load_error();
}

// Saving over a folder replaces it whole: no stale shard, no temporary left.
TEST_F(HfFolderErrors, SaveReplacesTheFolder) {
  nn::Llama model(small_llama());
  nn::save_hf_folder(model, folder());
  EXPECT_TRUE(fs::exists(dir_ / "hf" / "model.safetensors"));
  EXPECT_FALSE(fs::exists(index_path()));
  int entries = 0;
  for ([[maybe_unused]] auto& e : fs::directory_iterator(dir_)) ++entries;
  EXPECT_EQ(entries, 1);
}

}  // namespace
