// The char task: a small GPT learns next-character prediction on text drawn from the built-in
// trigram Markov chain, whose entropy rate is the floor the validation loss is reported against.
#include <cmath>
#include <cstdio>

#include "fasttrain/autograd.h"
#include "fasttrain/data.h"
#include "fasttrain/ops.h"
#include "train/seeds.h"
#include "train/task.h"

namespace ft::train {

std::shared_ptr<nn::GPT> make_char_model(const TrainerConfig& c, int64_t vocab_size, Generator* gen) {
  nn::GPTConfig g;
  g.vocab_size = vocab_size;
  g.context = c.context;
  g.layers = c.layers;
  g.dim = c.dim;
  g.heads = c.heads;
  g.dropout = c.dropout;
  return std::make_shared<nn::GPT>(g, gen, /*gpt2_residual_scaling=*/true);
}

namespace {

// Training windows: sample i of epoch e is row i % batch_size of run-wide batch
// e * batches_per_epoch + i / batch_size, drawn by random_window_start. Read in sequential order,
// batch k of epoch e is therefore exactly random_window_starts(..., e * batches_per_epoch + k).
class CharWindows : public data::Dataset {
 public:
  CharWindows(const std::vector<uint8_t>& tokens, int64_t context, int64_t batch_size, int64_t batches_per_epoch,
              uint64_t seed)
      : tokens_(tokens), context_(context), batch_(batch_size), per_epoch_(batches_per_epoch), seed_(seed) {}

  int64_t size() const override { return per_epoch_ * batch_; }
  data::SampleSpec spec() const override {
    return {{"tokens", Shape{context_}, DType::I64}, {"targets", Shape{context_}, DType::I64}};
  }
  void read(int64_t index, uint64_t epoch, const std::vector<Tensor>& fields) const override {
    FT_CHECK(index >= 0 && index < size(), "char windows: expected a sample index in [0, ", size(), "), found ", index);
    const int64_t batch = static_cast<int64_t>(epoch) * per_epoch_ + index / batch_;
    const int64_t start =
        data::random_window_start(static_cast<int64_t>(tokens_.size()), context_, batch_, seed_, batch, index % batch_);
    const uint8_t* src = tokens_.data() + start;
    int64_t* x = fields[0].data<int64_t>();
    int64_t* y = fields[1].data<int64_t>();
    for (int64_t t = 0; t < context_; ++t) {
      x[t] = src[t];
      y[t] = src[t + 1];
    }
  }

 private:
  const std::vector<uint8_t>& tokens_;  // owned by the task, which outlives its loader
  int64_t context_, batch_, per_epoch_;
  uint64_t seed_;
};

class CharTask : public Task {
 public:
  explicit CharTask(const TrainerConfig& c)
      : c_(c),
        source_(data::MarkovText::builtin()),
        corpus_(source_, c.train_chars, c.val_chars, derive_seed(c.seed, SeedUse::Data)) {
    Generator init(derive_seed(c.seed, SeedUse::Init));
    model_ = make_char_model(c, corpus_.vocab_size(), &init);
  }

  std::string name() const override { return "char"; }
  nn::UnaryModule& model() override { return *model_; }
  std::string unit() const override { return "tokens"; }
  int64_t items_per_batch() const override { return c_.batch_size * c_.context; }

  data::DatasetPtr train_dataset() const override {
    const int64_t per_epoch = std::max<int64_t>(1, static_cast<int64_t>(corpus_.train().size()) / items_per_batch());
    return std::make_shared<CharWindows>(corpus_.train(), c_.context, c_.batch_size, per_epoch,
                                         derive_seed(c_.seed, SeedUse::TrainBatches));
  }
  data::SamplerPtr train_sampler() const override {
    return std::make_shared<data::SequentialSampler>(train_dataset()->size());
  }

  Tensor loss(const Tensor& logits, const Tensor& target) const override {
    const int64_t v = logits.size(-1);
    return cross_entropy(logits.reshape({-1, v}), target.reshape({-1}));
  }

  EvalResult evaluate() override {
    autograd::InferenceMode guard;
    model_->eval();
    const int64_t tokens = static_cast<int64_t>(corpus_.val().size());
    Tensor total;
    for (int64_t i = 0; i < c_.eval_batches; ++i) {
      // The same validation windows at every evaluation, so evaluations compare like with like.
      Batch b;
      auto starts =
          data::random_window_starts(tokens, c_.context, c_.batch_size, derive_seed(c_.seed, SeedUse::ValBatches), i);
      data::char_windows(corpus_.val(), starts, c_.context, b.input, b.target);
      Tensor l = loss(model_->forward(b.input), b.target);
      total = total.defined() ? add(total, l) : l;
    }
    model_->train();
    return {total.item<double>() / static_cast<double>(c_.eval_batches), -1};
  }

  double loss_floor() const override { return source_.window_floor(c_.context); }

  std::pair<std::string, bool> judge(const EvalResult& r) const override {
    const double gap = r.loss - loss_floor();
    char buf[256];
    std::snprintf(buf, sizeof buf, "val loss %.4f vs entropy floor %.4f nats/char (gap %.4f; goal <= %.3f: %s)", r.loss,
                  loss_floor(), gap, c_.goal_gap, gap <= c_.goal_gap ? "met" : "not met");
    return {buf, gap <= c_.goal_gap};
  }

  nlohmann::json describe() const override {
    return {{"task", "char"},
            {"vocab", corpus_.vocab()},
            {"entropy_rate", source_.entropy_rate()},
            {"first_order_entropy", source_.first_order_entropy()},
            {"loss_floor", loss_floor()},
            {"source", "order-2 Markov chain of the built-in seed text (src/data/seed_text.cpp)"}};
  }

 private:
  TrainerConfig c_;
  const data::MarkovText& source_;
  data::CharCorpus corpus_;
  std::shared_ptr<nn::GPT> model_;
};

}  // namespace

std::unique_ptr<Task> make_char_task(const TrainerConfig& c) { return std::make_unique<CharTask>(c); }

}  // namespace ft::train
