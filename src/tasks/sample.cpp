// Text generation from a trained decoder (tasks.h, sample_text): the char task's model, or an lm run
// whose shards came with a vocabulary (task.json records the tokenizer: a char vocabulary, GPT-2's
// BPE files or a Hugging Face tokenizer.json). The prompt is encoded with the run's vocabulary, the
// continuation generated with the key/value cache (generation.h) and decoded with the vocabulary.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <map>

#include <nlohmann/json.hpp>

#include "fasttrain/data.h"
#include "fasttrain/generation.h"
#include "fasttrain/models.h"
#include "fasttrain/random.h"
#include "fasttrain/tasks.h"
#include "fasttrain/token_shards.h"
#include "fasttrain/tokenizer.h"
#include "train/run_files.h"

namespace ft::train {

namespace {

using nlohmann::json;

// A run's vocabulary: text to token ids and back.
struct Codec {
  int64_t vocab = 0;
  std::function<std::vector<int64_t>(const std::string&)> encode;
  std::vector<std::string> pieces;  // the text of each id
  int64_t eos = -1;                 // the end-of-text token, -1 if the vocabulary has none
};

// Splits UTF-8 text into code points' byte sequences (a stray byte is one piece of its own).
std::vector<std::string> utf8_pieces(const std::string& text) {
  std::vector<std::string> out;
  for (size_t i = 0; i < text.size();) {
    const auto lead = static_cast<unsigned char>(text[i]);
    const size_t n = lead < 0x80 ? 1 : (lead >> 5) == 6 ? 2 : (lead >> 4) == 14 ? 3 : (lead >> 3) == 30 ? 4 : 1;
    out.push_back(text.substr(i, n));
    i += n;
  }
  return out;
}

Codec pieces_codec(std::vector<std::string> pieces, const std::string& where) {
  Codec c;
  c.vocab = static_cast<int64_t>(pieces.size());
  c.pieces = std::move(pieces);
  std::map<std::string, int64_t> id;
  for (size_t i = 0; i < c.pieces.size(); ++i) id.emplace(c.pieces[i], static_cast<int64_t>(i));
  c.encode = [id = std::move(id), where](const std::string& text) {
    std::vector<int64_t> ids;
    for (const std::string& p : utf8_pieces(text)) {
      auto it = id.find(p);
      FT_CHECK(it != id.end(), "sample: the prompt's character '", p, "' is not in the vocabulary of ", where);
      ids.push_back(it->second);
    }
    return ids;
  };
  return c;
}

// A BPE tokenizer (GPT-2's files or a tokenizer.json) that `fasttrain data` left beside the shards.
// The prompt starts with the begin-of-text token when the tokenizer has one, as every document the
// model was trained on did.
template <class T>
Codec bpe_codec(T t) {
  Codec c;
  c.vocab = t.vocab_size();
  c.eos = t.eos_token();
  for (int64_t id = 0; id < c.vocab; ++id) c.pieces.emplace_back(t.token_bytes(static_cast<int32_t>(id)));
  c.encode = [t](const std::string& text) {
    std::vector<int32_t> ids;
    if (t.bos_token() >= 0) ids.push_back(t.bos_token());
    t.encode(text, ids);
    return std::vector<int64_t>(ids.begin(), ids.end());
  };
  return c;
}

Codec codec_of_run(const std::string& dir, const TrainerConfig& c) {
  const std::string task_path = dir + "/task.json";
  try {
    const json task = json::parse(read_text(task_path, "the task description"));
    if (c.task == "char") {
      const std::string vocab = task.at("vocab").get<std::string>();
      FT_CHECK(!vocab.empty(), task_path, ": the vocabulary is empty");
      std::vector<std::string> pieces;
      for (char ch : vocab) pieces.emplace_back(1, ch);
      return pieces_codec(std::move(pieces), task_path);
    }
    const json& tokenizer = task.at("tokenizer");
    const std::string mode = tokenizer.value("mode", std::string());
    if (mode == "gpt2") return bpe_codec(data::read_gpt2_tokenizer(tokenizer.at("file").get<std::string>()));
    if (mode == "tokenizer.json") return bpe_codec(data::read_json_tokenizer(tokenizer.at("file").get<std::string>()));
    FT_CHECK(mode == "char", "sample: ", dir, " was trained on shards without a vocabulary file (tokenizer mode '",
             mode,
             "'); sample needs shards made by `fasttrain data --vocab char`, `--tokenizer gpt2` or "
             "`--tokenizer FILE.json`");
    return pieces_codec(tokenizer.at("tokens").get<std::vector<std::string>>(), task_path);
  } catch (const json::exception& e) {
    FT_FAIL(task_path, ": malformed task description: ", e.what());
  }
}

}  // namespace

std::string sample_text(const std::string& dir, const SampleOptions& o) {
  FT_CHECK(o.tokens >= 0 && o.tokens <= 1'000'000, "sample: expected --tokens in [0, 1000000], found ", o.tokens);
  FT_CHECK(std::isfinite(o.temperature) && o.temperature >= 0, "sample: expected a temperature >= 0, found ",
           o.temperature);
  FT_CHECK(o.top_k >= 0, "sample: expected --top-k >= 0, found ", o.top_k);
  FT_CHECK(o.top_p > 0 && o.top_p <= 1, "sample: expected --top-p in (0, 1] (1: no nucleus filtering), found ",
           o.top_p);
  FT_CHECK(!o.prompt.empty(), "sample: the prompt must have at least one character");
  TrainerConfig c = load_run_config(dir);
  // The run's model.safetensors is the whole model whatever its layout: one process samples it.
  c.dist.tp = c.dist.pp = 1, c.dist.sequence_parallel = false;
  FT_CHECK(c.task == "char" || c.task == "lm", "sample: ", dir, " holds a '", c.task,
           "' run; sample needs a GPT (task char or lm)");
  const Codec codec = codec_of_run(dir, c);
  const int64_t V = codec.vocab;
  FT_CHECK(o.top_k <= V, "sample: expected --top-k at most the vocabulary size ", V, ", found ", o.top_k);

  Generator init(0);
  auto model = make_decoder(c, V, &init);
  model->load(dir + "/model.safetensors", /*strict=*/true);
  model->eval();

  nn::GenerationOptions g;
  g.max_new_tokens = o.tokens;
  g.sampling = {o.temperature, o.top_k, o.top_p};
  g.seed = o.seed;
  g.eos_token = o.stop_at_eos ? codec.eos : -1;
  // The window the model was trained on (a Llama's rotary tables may have more positions).
  g.window = std::min(c.model.context, model->context_length());
  std::string out = o.prompt;
  for (int64_t id : nn::generate(*model, codec.encode(o.prompt), g).tokens)
    if (id != g.eos_token) out += codec.pieces[id];  // the end of the text is no text
  return out;
}

}  // namespace ft::train
