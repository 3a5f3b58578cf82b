// The images task: a small CNN classifies procedurally drawn shapes (data.h, make_shapes).
// Training batches walk a per-epoch permutation of the training set, so an epoch sees every image
// once and batch k is a pure function of (seed, k): resuming mid-epoch continues exactly.
#include <cstdio>
#include <numeric>

#include "fasttrain/autograd.h"
#include "fasttrain/data.h"
#include "fasttrain/ops.h"
#include "fasttrain/random.h"
#include "train/seeds.h"
#include "train/task.h"

namespace ft::train {

namespace {

// A 4-conv network for quick runs (cnn-mini's pattern at half the depth): 16, 32 (stride 2),
// 64, 64 (stride 2) channels, each conv + BatchNorm + ReLU; global average pool; linear head.
std::shared_ptr<nn::UnaryModule> cnn_tiny(int64_t classes, Generator* gen) {
  auto seq = std::make_shared<nn::Sequential>();
  int64_t in = 3;
  for (auto [out, stride] : {std::pair<int64_t, int64_t>{16, 1}, {32, 2}, {64, 1}, {64, 2}}) {
    seq->push_back(std::make_shared<nn::Conv2d>(in, out, 3, stride, 1, /*bias=*/false, 1, 1, gen));
    seq->push_back(std::make_shared<nn::BatchNorm2d>(out));
    seq->push_back(std::make_shared<nn::ReLU>());
    in = out;
  }
  seq->push_back(std::make_shared<nn::AdaptiveAvgPool2d>(1));
  seq->push_back(std::make_shared<nn::Flatten>());
  seq->push_back(std::make_shared<nn::Linear>(in, classes, true, gen));
  return seq;
}

class ImageTask : public Task {
 public:
  explicit ImageTask(const TrainerConfig& c) : c_(c) {
    data::ShapesOptions o;
    o.image_size = c.image_size;
    o.classes = c.classes;
    train_ = data::make_shapes(c.train_images, derive_seed(c.seed, SeedUse::Data), o);
    val_ = data::make_shapes(c.val_images, derive_seed(c.seed, SeedUse::ValData), o);
    Generator init(derive_seed(c.seed, SeedUse::Init));
    if (c.model == "cnn-mini")
      model_ = nn::cnn_mini(3, c.classes, &init);
    else
      model_ = cnn_tiny(c.classes, &init);
  }

  std::string name() const override { return "images"; }
  nn::UnaryModule& model() override { return *model_; }
  std::string unit() const override { return "samples"; }
  int64_t items_per_batch() const override { return c_.batch_size; }
  int64_t batches_per_epoch() const override { return c_.train_images / c_.batch_size; }  // drop the last partial batch

  Batch train_batch(int64_t index) override {
    const int64_t epoch = index / batches_per_epoch(), within = index % batches_per_epoch();
    if (epoch != order_epoch_) shuffle_for(epoch);
    Tensor idx = empty({c_.batch_size}, DType::I64);
    std::copy_n(order_.begin() + within * c_.batch_size, c_.batch_size, idx.data<int64_t>());
    return {index_select(train_.images, 0, idx), index_select(train_.labels, 0, idx)};
  }

  Tensor loss(const Tensor& logits, const Tensor& target) const override { return cross_entropy(logits, target); }

  EvalResult evaluate() override {
    autograd::InferenceMode guard;
    model_->eval();
    const int64_t n = c_.val_images, chunk = 500;
    Tensor loss_sum, correct;
    for (int64_t b = 0; b < n; b += chunk) {
      const int64_t len = std::min(chunk, n - b);
      Tensor x = val_.images.narrow(0, b, len), y = val_.labels.narrow(0, b, len);
      Tensor logits = model_->forward(x);
      Tensor l = cross_entropy(logits, y, -100, 0.0, Reduction::Sum);
      Tensor k = sum(eq(argmax(logits, 1), y).to(DType::F32));
      loss_sum = loss_sum.defined() ? add(loss_sum, l) : l;
      correct = correct.defined() ? add(correct, k) : k;
    }
    model_->train();
    return {loss_sum.item<double>() / n, correct.item<double>() / n};
  }

  std::pair<std::string, bool> judge(const EvalResult& r) const override {
    const bool met = r.accuracy >= c_.goal_accuracy;
    char buf[256];
    std::snprintf(buf, sizeof buf, "val accuracy %.2f%% on %lld images of %lld classes (goal >= %.1f%%: %s)",
                  100 * r.accuracy, static_cast<long long>(c_.val_images), static_cast<long long>(c_.classes),
                  100 * c_.goal_accuracy, met ? "met" : "not met");
    return {buf, met};
  }

  nlohmann::json describe() const override {
    auto names = data::shape_class_names();
    names.resize(c_.classes);
    return {{"task", "images"}, {"classes", names}, {"image_size", c_.image_size}, {"model", c_.model}};
  }

 private:
  // Fisher-Yates with the epoch's own Philox stream.
  void shuffle_for(int64_t epoch) {
    order_.resize(c_.train_images);
    std::iota(order_.begin(), order_.end(), 0);
    const uint64_t key = derive_seed(c_.seed, SeedUse::TrainBatches);
    for (int64_t i = c_.train_images - 1; i > 0; --i) {
      Philox4 w = philox4x32(key, static_cast<uint64_t>(i), static_cast<uint64_t>(epoch));
      const uint64_t r = (static_cast<uint64_t>(w.v[0]) << 32) | w.v[1];
      std::swap(order_[i], order_[r % static_cast<uint64_t>(i + 1)]);
    }
    order_epoch_ = epoch;
  }

  TrainerConfig c_;
  data::ImageSet train_, val_;
  std::shared_ptr<nn::UnaryModule> model_;
  std::vector<int64_t> order_;
  int64_t order_epoch_ = -1;
};

}  // namespace

std::unique_ptr<Task> make_image_task(const TrainerConfig& c) { return std::make_unique<ImageTask>(c); }

}  // namespace ft::train
