// What the Trainer trains: a Task owns the data and the model, exposes its training samples as a
// Dataset with the Sampler that orders them (the Trainer reads them through a DataLoader, so batch
// k of epoch e is a pure function of the seed, e and k and a resumed run sees the same batches),
// and evaluates on its held-out split. Tasks: "char" (char_task.cpp), "images" (image_task.cpp).
#pragma once
#include <memory>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "fasttrain/loader.h"
#include "fasttrain/nn.h"
#include "fasttrain/train.h"

namespace ft::train {

struct Batch {
  Tensor input, target;
};

struct EvalResult {
  double loss = 0;
  double accuracy = -1;  // classification tasks only
};

class Task {
 public:
  virtual ~Task() = default;
  virtual std::string name() const = 0;
  virtual nn::UnaryModule& model() = 0;
  virtual std::string unit() const = 0;  // what throughput counts: "tokens" or "samples"
  virtual int64_t items_per_batch() const = 0;
  // Training samples: field 0 is the model input, field 1 the target. The Trainer batches them
  // with batch_size rows and drop_last, in train_sampler() order.
  virtual data::DatasetPtr train_dataset() const = 0;
  virtual data::SamplerPtr train_sampler() const = 0;
  virtual Tensor loss(const Tensor& output, const Tensor& target) const = 0;
  // Loss (and accuracy) on the validation split, under inference mode with the model in eval mode.
  virtual EvalResult evaluate() = 0;
  // The lowest achievable validation loss where known (char: the entropy floor), else -1.
  virtual double loss_floor() const { return -1; }
  // The stated goal as a sentence, and whether `r` meets it.
  virtual std::pair<std::string, bool> judge(const EvalResult& r) const = 0;
  // What a reader of the run folder needs besides the config (vocabulary, classes, floor).
  virtual nlohmann::json describe() const = 0;
};

std::unique_ptr<Task> make_task(const TrainerConfig& c);

// The char task's model, built from the config (also used by `fasttrain sample`).
std::shared_ptr<nn::GPT> make_char_model(const TrainerConfig& c, int64_t vocab_size, Generator* gen);

}  // namespace ft::train
