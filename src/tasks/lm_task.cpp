// The lm task (tasks.h): a GPT learns next-token prediction on llm.c token shards the user made
// (`fasttrain data`), nanoGPT-style. Training samples are the shards' non-overlapping windows in a
// new random order every epoch; validation reads the validation shards' windows in order. The
// vocabulary size comes from --vocab-size or from the vocabulary file `fasttrain data` wrote
// beside the shards (vocab.json); every shard is checked against it before the first step.
// With --doc-mask the windows also carry their document ids (data::document_ids, from the
// document-start token vocab.json names) and every attention layer is confined to its document
// (DocumentMask); positions are not reset per document.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "fasttrain/autograd.h"
#include "fasttrain/hf_folder.h"
#include "fasttrain/models.h"
#include "fasttrain/ops.h"
#include "fasttrain/safetensors.h"
#include "fasttrain/tasks.h"
#include "fasttrain/token_shards.h"
#include "train/seeds.h"

namespace ft::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The vocabulary file `fasttrain data` writes beside its shards, if there is one.
std::string vocab_file_beside(const std::vector<data::TokenShard>& shards) {
  const fs::path file = fs::path(shards.front().path()).parent_path() / "vocab.json";
  return fs::exists(file) ? file.string() : std::string();
}

json read_json_file(const std::string& path) {
  std::ifstream in(path);
  FT_CHECK(in.good(), path, ": cannot open the vocabulary file");
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    FT_FAIL(path, ": the vocabulary file is not JSON (", e.what(), ")");
  }
}

// Refuses a shard holding a token the model has no row for, naming the shard and the position.
void check_tokens_below(const std::vector<data::TokenShard>& shards, int64_t vocab, const char* which) {
  for (const data::TokenShard& s : shards) {
    const auto [top, at] = s.max_token();
    FT_CHECK(s.size() == 0 || top < vocab, which, " shard ", s.path(), " holds token ", top, " at position ", at,
             ", outside the vocabulary of ", vocab, " (set --vocab-size, or check the tokenizer)");
  }
}

// The vocabulary size and the tokenizer description a run records (task.json) for sampling.
struct LmVocabulary {
  int64_t size = 0;
  json tokenizer;
  // The token `fasttrain data` wrote before every document (data::document_start_token's rule):
  // GPT-2's end-of-text; a tokenizer.json's begin-of-text, else its end-of-text. -1: none known.
  int64_t doc_start = -1;
};

int64_t document_start_of(const json& vocab) {
  const std::string mode = vocab.value("mode", std::string());
  auto id = [&](const char* key) {
    return vocab.contains(key) && vocab[key].is_number_integer() ? vocab[key].get<int64_t>() : int64_t{-1};
  };
  if (mode == "gpt2") return id("eot_token");
  if (mode == "tokenizer.json") return id("bos_token") >= 0 ? id("bos_token") : id("eos_token");
  return -1;  // bytes, characters, or no vocabulary file: no token marks documents
}

LmVocabulary lm_vocabulary(const TrainerConfig& c) {
  LmVocabulary v;
  const std::vector<data::TokenShard> shards = data::open_token_shards(c.data.train);
  const std::string file = vocab_file_beside(shards);
  if (!file.empty()) {
    const json j = read_json_file(file);
    FT_CHECK(j.is_object() && j.contains("vocab_size") && j["vocab_size"].is_number_integer(), file,
             ": expected a vocabulary file with an integer vocab_size");
    v.size = j["vocab_size"].get<int64_t>();
    v.tokenizer = j;
    v.tokenizer["file"] = fs::absolute(file).string();
  }
  if (c.data.vocab_size > 0) {
    FT_CHECK(file.empty() || v.size <= c.data.vocab_size, "option vocab_size: ", c.data.vocab_size,
             " is smaller than the ", v.size, " tokens of ", file);
    v.size = c.data.vocab_size;
  }
  FT_CHECK(v.size > 0,
           "lm: no vocabulary size: give --vocab-size, or make the shards with `fasttrain data`, which "
           "writes vocab.json beside them (none beside ",
           shards.front().path(), ")");
  if (v.tokenizer.is_null()) v.tokenizer = json{{"mode", "none"}, {"vocab_size", v.size}};
  if (c.data.doc_mask) {
    v.doc_start = document_start_of(v.tokenizer);
    FT_CHECK(v.doc_start >= 0,
             "option doc_mask: the training shards have no end-of-text or begin-of-text token to find "
             "documents by (",
             file.empty() ? "no vocab.json beside " + shards.front().path()
                          : file + " has mode " + v.tokenizer.value("mode", std::string("?")),
             "); --doc-mask needs shards made by `fasttrain data` with a GPT-2 or tokenizer.json tokenizer");
    FT_CHECK(v.doc_start < v.size, "option doc_mask: the document-start token ", v.doc_start,
             " is outside the vocabulary of ", v.size);
  }
  return v;
}

class LmData : public DataModule {
 public:
  LmData(const TrainerConfig& c, int64_t vocab, int64_t doc_start)
      : c_(c),
        doc_start_(doc_start),
        train_(data::open_token_shards(c.data.train)),
        val_(data::open_token_shards(c.data.val)) {
    check_tokens_below(train_, vocab, "training");
    check_tokens_below(val_, vocab, "validation");
    // Fail here, before the first step, rather than in the Trainer with a less specific message.
    FT_CHECK(data::TokenWindowDataset(train_, c.model.context).size() > 0, "lm: the training shards (", c.data.train,
             ") hold no window of context + 1 = ", c.model.context + 1, " tokens");
    FT_CHECK(data::TokenWindowDataset(val_, c.model.context).size() > 0, "lm: the validation shards (", c.data.val,
             ") hold no window of context + 1 = ", c.model.context + 1, " tokens");
  }
  const std::vector<data::TokenShard>& train_shards() const { return train_; }

  // With a document mask, the windows carry a third field: their document ids.
  TrainData train_data(int64_t) const override {
    return {std::make_shared<data::TokenWindowDataset>(train_, c_.model.context, doc_start_), nullptr, nullptr};
  }
  ValData val_data(int64_t) const override {
    return {std::make_shared<data::TokenWindowDataset>(val_, c_.model.context, doc_start_), nullptr};
  }

 private:
  TrainerConfig c_;
  int64_t doc_start_;  // -1: no document mask
  std::vector<data::TokenShard> train_, val_;
};

// The decoder's logits with every attention layer confined to its document (GPT and Llama are the
// decoders make_decoder builds).
Tensor forward_with_documents(nn::UnaryModule& model, const Tensor& ids, const Tensor& doc_ids) {
  if (auto* gpt = dynamic_cast<nn::GPT*>(&model)) return gpt->forward(ids, doc_ids);
  return dynamic_cast<nn::Llama&>(model).forward(ids, doc_ids);
}

class LmModule : public TrainModule {
 public:
  LmModule(const TrainerConfig& c, int64_t vocab, json tokenizer) : c_(c), tokenizer_(std::move(tokenizer)) {
    Generator init(derive_seed(c.seed, SeedUse::Init));
    model_ = make_decoder(c, vocab, &init);
    vocab_ = vocab;
    if (!c.model.init_from.empty()) load_decoder_weights(*model_, c.model.init_from);
  }

  nn::Module& model() override { return *model_; }
  ItemUnit unit() const override { return ItemUnit::Tokens; }
  int64_t items_in(const data::Batch& b) const override { return b.rows * c_.model.context; }
  StepOutput training_step(const data::Batch& b) override { return {loss(b), {}}; }
  StepOutput validation_step(const data::Batch& b) override { return {loss(b), {}}; }

  std::string description_json() const override {
    return json{{"task", "lm"}, {"vocab_size", vocab_}, {"model", c_.model.name}, {"tokenizer", tokenizer_}}.dump();
  }

 private:
  TrainerConfig c_;
  json tokenizer_;
  Tensor loss(const data::Batch& b) {
    if (!c_.data.doc_mask) return next_token_loss(*model_, b);
    return next_token_cross_entropy(*model_, forward_with_documents(*model_, b.field("tokens"), b.field("doc_ids")),
                                    b.field("targets"));
  }

  std::shared_ptr<nn::UnaryModule> model_;
  int64_t vocab_ = 0;
};

}  // namespace

void load_gpt_weights(nn::GPT& model, const std::string& path) { nn::load_gpt2_weights(model, path); }

void load_decoder_weights(nn::UnaryModule& model, const std::string& path) {
  auto* gpt = dynamic_cast<nn::GPT*>(&model);
  if (gpt != nullptr) return is_hf_folder(path) ? nn::load_hf_folder(*gpt, path) : load_gpt_weights(*gpt, path);
  auto& llama = dynamic_cast<nn::Llama&>(model);
  if (is_hf_folder(path)) return nn::load_hf_folder(llama, path);
  nn::load_llama_weights(llama, path);  // a split Llama keeps its parts of the file
}

BuiltinTask make_lm_task(const TrainerConfig& c) {
  const LmVocabulary vocab = lm_vocabulary(c);
  auto data = std::make_unique<LmData>(c, vocab.size, vocab.doc_start);
  return {std::make_unique<LmModule>(c, vocab.size, vocab.tokenizer), std::move(data)};
}

}  // namespace ft::train
