// The char task: a small GPT learns next-character prediction on text drawn from the built-in
// trigram Markov chain, whose entropy rate is the floor the validation loss is reported against.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "fasttrain/autograd.h"
#include "fasttrain/data.h"
#include "fasttrain/hf_folder.h"
#include "fasttrain/models.h"
#include "fasttrain/ops.h"
#include "fasttrain/process_groups.h"
#include "fasttrain/tasks.h"
#include "train/seeds.h"

namespace ft::train {

Tensor next_token_cross_entropy(const nn::UnaryModule& model, const Tensor& logits, const Tensor& targets) {
  const int64_t v = logits.size(-1);
  // A tensor-parallel model's logits are this rank's vocabulary columns: the loss is formed
  // across the tensor group without gathering them.
  const auto* split = dynamic_cast<const dist::VocabParallelOutput*>(&model);
  if (split != nullptr && split->vocab_group() != nullptr)
    return dist::vocab_parallel_cross_entropy(logits.reshape({-1, v}), targets.reshape({-1}), split->vocab_start(),
                                              split->vocab_group());
  return cross_entropy(logits.reshape({-1, v}), targets.reshape({-1}));
}

Tensor next_token_loss(nn::UnaryModule& model, const data::Batch& batch) {
  return next_token_cross_entropy(model, model(batch.fields[0]), batch.fields[1]);
}

namespace {

// The tensor group a model of this run is split over (null without --tp).
std::shared_ptr<dist::Communicator> tensor_group(const TrainerConfig& c) {
  if (c.dist.tp == 1) return nullptr;
  return dist::process_groups(static_cast<int>(c.dist.tp), static_cast<int>(c.dist.pp)).tensor;
}

// --sequence-parallel on a split model (tensor_parallel.h).
template <class Model>
std::shared_ptr<Model> with_sequence_parallel(const TrainerConfig& c, std::shared_ptr<Model> model) {
  if (c.dist.tp == 1 || !c.dist.sequence_parallel) return model;
  dist::set_sequence_parallel(*model, true);
  return model;
}

// This rank's pipeline stage (count 1 without --pp).
dist::PipelinePart pipeline_part(const TrainerConfig& c) {
  dist::PipelinePart part;
  if (c.dist.pp == 1) return part;
  const dist::ProcessGroups& g = dist::process_groups(static_cast<int>(c.dist.tp), static_cast<int>(c.dist.pp));
  part.index = g.pp_rank, part.count = g.pp, part.group = g.pipeline;
  part.layers = c.dist.pp_layers.layers;
  return part;
}

std::shared_ptr<nn::GPT> make_gpt(const TrainerConfig& c, int64_t vocab_size, Generator* gen) {
  nn::GPTConfig g;
  g.vocab_size = vocab_size;
  g.context = c.model.context;
  g.layers = c.model.layers;
  g.dim = c.model.dim;
  g.heads = c.model.heads;
  g.dropout = c.model.dropout;
  return std::make_shared<nn::GPT>(g, gen, /*gpt2_residual_scaling=*/true, tensor_group(c), pipeline_part(c));
}

std::shared_ptr<nn::CausalDecoder> make_whole_decoder(const TrainerConfig& c, int64_t vocab_size, Generator* gen) {
  if (is_hf_folder(c.model.init_from)) {
    // The folder's config.json is the architecture, as from_pretrained takes it: its vocabulary
    // too, which must hold the tokenizer's.
    const nn::HfModelConfig h = nn::read_hf_config(c.model.init_from);
    const int64_t model_vocab = h.type == nn::HfModelType::Llama ? h.llama.vocab_size : h.gpt.vocab_size;
    FT_CHECK(vocab_size <= model_vocab, "option init_from: ", c.model.init_from, " has a vocabulary of ", model_vocab,
             " tokens, fewer than the data's ", vocab_size);
    // With --tp or --pp the model is built split; load_hf_folder reads the whole folder on every
    // rank and keeps this rank's stage and parts (shard_tensor_parallel_state).
    if (h.type == nn::HfModelType::Llama)
      return std::make_shared<nn::Llama>(h.llama, gen, tensor_group(c), pipeline_part(c));
    nn::GPTConfig g = h.gpt;
    g.dropout = c.model.dropout;
    return std::make_shared<nn::GPT>(g, gen, /*gpt2_residual_scaling=*/true, tensor_group(c), pipeline_part(c));
  }
  if (is_llama(c.model.name))
    return std::make_shared<nn::Llama>(llama_config(c.model, vocab_size), gen, tensor_group(c), pipeline_part(c));
  return make_gpt(c, vocab_size, gen);
}

}  // namespace

std::shared_ptr<nn::GPT> make_gpt_model(const TrainerConfig& c, int64_t vocab_size, Generator* gen) {
  return with_sequence_parallel(c, make_gpt(c, vocab_size, gen));
}

std::shared_ptr<nn::CausalDecoder> make_decoder(const TrainerConfig& c, int64_t vocab_size, Generator* gen) {
  return with_sequence_parallel(c, make_whole_decoder(c, vocab_size, gen));
}

namespace {

// Next-character windows drawn by random_window_start. Sample i is row i % batch_size of batch
// number b: for training, the run-wide batch e * batches_per_epoch + i / batch_size of epoch e, so
// read in sequential order batch k of epoch e is exactly random_window_starts(..., e *
// batches_per_epoch + k); for validation (same_every_epoch), batch i / batch_size whatever the
// epoch, so every evaluation sees the same windows.
class CharWindows : public data::Dataset {
 public:
  CharWindows(const std::vector<uint8_t>& tokens, int64_t context, int64_t batch_size, int64_t batches_per_epoch,
              uint64_t seed, bool same_every_epoch)
      : tokens_(tokens),
        context_(context),
        batch_(batch_size),
        per_epoch_(batches_per_epoch),
        seed_(seed),
        same_every_epoch_(same_every_epoch) {}

  int64_t size() const override { return per_epoch_ * batch_; }
  data::SampleSpec spec() const override {
    return {{"tokens", Shape{context_}, DType::I64}, {"targets", Shape{context_}, DType::I64}};
  }
  void read(int64_t index, uint64_t epoch, const std::vector<Tensor>& fields) const override {
    FT_CHECK(index >= 0 && index < size(), "char windows: expected a sample index in [0, ", size(), "), found ", index);
    const int64_t first = same_every_epoch_ ? 0 : static_cast<int64_t>(epoch) * per_epoch_;
    const int64_t start = data::random_window_start(static_cast<int64_t>(tokens_.size()), context_, batch_, seed_,
                                                    first + index / batch_, index % batch_);
    const uint8_t* src = tokens_.data() + start;
    int64_t* x = fields[0].data<int64_t>();
    int64_t* y = fields[1].data<int64_t>();
    for (int64_t t = 0; t < context_; ++t) {
      x[t] = src[t];
      y[t] = src[t + 1];
    }
  }

 private:
  const std::vector<uint8_t>& tokens_;  // owned by the data module, which outlives its loaders
  int64_t context_, batch_, per_epoch_;
  uint64_t seed_;
  bool same_every_epoch_;
};

// The text: drawn once from the Markov chain, split into training and validation text.
class CharData : public DataModule {
 public:
  CharData(const TrainerConfig& c, const data::MarkovText& source)
      : c_(c), corpus_(source, c.data.train_chars, c.data.val_chars, derive_seed(c.seed, SeedUse::Data)) {}
  const data::CharCorpus& corpus() const { return corpus_; }

  // Sample i of epoch e is row i % batch_size of run-wide batch e * batches_per_epoch + i / batch_size,
  // read in order: the windows depend on the batch size, hence built here.
  TrainData train_data(int64_t batch_size) const override {
    const int64_t per_epoch =
        std::max<int64_t>(1, static_cast<int64_t>(corpus_.train().size()) / (batch_size * c_.model.context));
    auto windows = std::make_shared<CharWindows>(corpus_.train(), c_.model.context, batch_size, per_epoch,
                                                 derive_seed(c_.seed, SeedUse::TrainBatches), false);
    return {windows, std::make_shared<data::SequentialSampler>(windows->size()), nullptr};
  }
  ValData val_data(int64_t batch_size) const override {
    return {std::make_shared<CharWindows>(corpus_.val(), c_.model.context, batch_size, c_.eval_batches,
                                          derive_seed(c_.seed, SeedUse::ValBatches), true),
            nullptr};
  }

 private:
  TrainerConfig c_;
  data::CharCorpus corpus_;
};

class CharModule : public TrainModule {
 public:
  CharModule(const TrainerConfig& c, const data::MarkovText& source, const data::CharCorpus& corpus)
      : c_(c), source_(source), vocab_(corpus.vocab()) {
    Generator init(derive_seed(c.seed, SeedUse::Init));
    model_ = make_gpt_model(c, corpus.vocab_size(), &init);
  }

  nn::Module& model() override { return *model_; }
  ItemUnit unit() const override { return ItemUnit::Tokens; }
  int64_t items_in(const data::Batch& b) const override { return b.rows * c_.model.context; }

  StepOutput training_step(const data::Batch& b) override { return {next_token_loss(*model_, b), {}}; }
  StepOutput validation_step(const data::Batch& b) override { return {next_token_loss(*model_, b), {}}; }

  std::optional<double> loss_floor() const override { return source_.window_floor(c_.model.context); }

  std::optional<Goal> judge(const EvalResult& r) const override {
    const double floor = source_.window_floor(c_.model.context), gap = r.loss - floor;
    char buf[256];
    std::snprintf(buf, sizeof buf, "val loss %.4f vs entropy floor %.4f nats/char (gap %.4f; goal <= %.3f: %s)", r.loss,
                  floor, gap, c_.data.goal_gap, gap <= c_.data.goal_gap ? "met" : "not met");
    return Goal{buf, gap <= c_.data.goal_gap};
  }

  std::string description_json() const override {
    return nlohmann::json{{"task", "char"},
                          {"vocab", vocab_},
                          {"entropy_rate", source_.entropy_rate()},
                          {"first_order_entropy", source_.first_order_entropy()},
                          {"loss_floor", source_.window_floor(c_.model.context)},
                          {"source", "order-2 Markov chain of the built-in seed text (src/data/seed_text.cpp)"}}
        .dump();
  }

 private:
  TrainerConfig c_;
  const data::MarkovText& source_;
  std::string vocab_;
  std::shared_ptr<nn::GPT> model_;
};

}  // namespace

BuiltinTask make_char_task(const TrainerConfig& c) {
  const data::MarkovText& source = data::MarkovText::builtin();
  auto data = std::make_unique<CharData>(c, source);
  auto module = std::make_unique<CharModule>(c, source, data->corpus());
  return {std::move(module), std::move(data)};
}

}  // namespace ft::train
