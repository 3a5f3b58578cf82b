// The images task (tasks.h): a small CNN classifies procedurally drawn shapes (data.h,
// make_shapes). Training batches walk a per-epoch permutation of the training set
// (RandomSampler), so an epoch sees every image of its full batches once and batch k of epoch e
// is a pure function of (seed, e, k): resuming mid-epoch continues exactly.
#include <cstdio>
#include <cstring>

#include <nlohmann/json.hpp>

#include "fasttrain/autograd.h"
#include "fasttrain/data.h"
#include "fasttrain/models.h"
#include "fasttrain/ops.h"
#include "fasttrain/random.h"
#include "fasttrain/tasks.h"
#include "train/seeds.h"

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

// The rows of an ImageSet as loader samples: "image" f32 [3, size, size] and "label" i64 [].
class ImageRows : public data::Dataset {
 public:
  explicit ImageRows(data::ImageSet set) : set_(std::move(set)) {}
  int64_t size() const override { return set_.images.size(0); }
  data::SampleSpec spec() const override {
    Shape image = set_.images.shape();
    image.erase(0);
    return {{"image", image, DType::F32}, {"label", Shape{}, DType::I64}};
  }
  void read(int64_t index, uint64_t, const std::vector<Tensor>& fields) const override {
    FT_CHECK(index >= 0 && index < size(), "images: expected a sample index in [0, ", size(), "), found ", index);
    const int64_t pixels = fields[0].numel();
    std::memcpy(fields[0].data<float>(), set_.images.data<float>() + index * pixels, sizeof(float) * pixels);
    *fields[1].data<int64_t>() = set_.labels.data<int64_t>()[index];
  }

 private:
  data::ImageSet set_;
};

// Training and validation shapes, drawn once with different seeds (disjoint splits). Training
// batches walk a per-epoch permutation (the Trainer's default RandomSampler).
class ImageData : public DataModule {
 public:
  explicit ImageData(const TrainerConfig& c) {
    data::ShapesOptions o;
    o.image_size = c.data.image_size;
    o.classes = c.data.classes;
    train_ = std::make_shared<ImageRows>(data::make_shapes(c.data.train_images, derive_seed(c.seed, SeedUse::Data), o));
    val_ = std::make_shared<ImageRows>(data::make_shapes(c.data.val_images, derive_seed(c.seed, SeedUse::ValData), o));
  }
  TrainData train_data(int64_t) const override { return {train_, nullptr, nullptr}; }
  ValData val_data(int64_t) const override { return {val_, nullptr}; }

 private:
  std::shared_ptr<const ImageRows> train_, val_;
};

class ImageModule : public TrainModule {
 public:
  explicit ImageModule(const TrainerConfig& c) : c_(c) {
    Generator init(derive_seed(c.seed, SeedUse::Init));
    if (c.model.name == "cnn-mini")
      model_ = nn::cnn_mini(3, c.data.classes, &init);
    else
      model_ = cnn_tiny(c.data.classes, &init);
  }

  nn::Module& model() override { return *model_; }

  StepOutput training_step(const data::Batch& b) override { return classification_step(*model_, b); }
  StepOutput validation_step(const data::Batch& b) override { return classification_eval_step(*model_, b); }
  std::optional<Goal> judge(const EvalResult& r) const override {
    return accuracy_goal(r, c_.data.goal_accuracy, c_.data.val_images, "images", c_.data.classes);
  }

  std::string description_json() const override {
    auto names = data::shape_class_names();
    names.resize(c_.data.classes);
    return nlohmann::json{
        {"task", "images"}, {"classes", names}, {"image_size", c_.data.image_size}, {"model", c_.model.name}}
        .dump();
  }

 private:
  TrainerConfig c_;
  std::shared_ptr<nn::UnaryModule> model_;
};

}  // namespace

BuiltinTask make_image_task(const TrainerConfig& c) {
  return {std::make_unique<ImageModule>(c), std::make_unique<ImageData>(c)};
}

}  // namespace ft::train
