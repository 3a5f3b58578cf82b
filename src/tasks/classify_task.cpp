// The classify task (tasks.h): a classifier trained on data of one's own, --data in one of the
// forms of classify_data.h, with --model mlp, cnn-mini, resnet18, resnet20 or resnet50. The data
// module reads and checks everything (data and model together) when the task is made, so a bad
// file or a model that cannot take the data is refused before the Trainer writes its run folder.
// task.json records what `fasttrain eval` needs to rebuild the same input pipeline: the classes,
// the sample shape, the normalisation and the data options.
#include <cstdio>

#include <nlohmann/json.hpp>

#include "fasttrain/autograd.h"
#include "fasttrain/models.h"
#include "fasttrain/ops.h"
#include "fasttrain/tasks.h"
#include "tasks/classify_data.h"
#include "train/seeds.h"

namespace ft::train {

namespace {

// The mlp of the classify task: flatten, two hidden layers of this width with ReLU, linear head.
constexpr int64_t kMlpHidden = 256;

std::shared_ptr<nn::UnaryModule> make_model(const TrainerConfig& c, const ClassifyInfo& d) {
  Generator init(derive_seed(c.seed, SeedUse::Init));
  const auto classes = static_cast<int64_t>(d.classes.size());
  if (c.model.name == "mlp") {
    auto net = std::make_shared<nn::Sequential>();
    net->push_back(std::make_shared<nn::Flatten>());
    int64_t in = d.sample_shape().numel();
    for (int layer = 0; layer < 2; ++layer) {
      net->push_back(std::make_shared<nn::Linear>(in, kMlpHidden, true, &init));
      net->push_back(std::make_shared<nn::ReLU>());
      in = kMlpHidden;
    }
    net->push_back(std::make_shared<nn::Linear>(in, classes, true, &init));
    return net;
  }
  if (c.model.name == "cnn-mini") return nn::cnn_mini(d.channels, classes, &init);
  return nn::resnet(c.model.name, classes, &init);
}

class ClassifyModule : public TrainModule {
 public:
  ClassifyModule(const TrainerConfig& c, const ClassifyInfo& info) : c_(c), info_(info) {
    model_ = make_model(c, info);
  }

  nn::Module& model() override { return *model_; }

  StepOutput training_step(const data::Batch& b) override { return classification_step(*model_, b); }
  StepOutput validation_step(const data::Batch& b) override { return classification_eval_step(*model_, b); }
  // Data of one's own has no goal unless the user states one (--goal-accuracy; default 0: none).
  std::optional<Goal> judge(const EvalResult& r) const override {
    return accuracy_goal(r, c_.data.goal_accuracy, info_.val_samples, info_.images ? "images" : "samples",
                         static_cast<int64_t>(info_.classes.size()));
  }

  std::string description_json() const override {
    nlohmann::json input = {{"kind", info_.images ? "image" : "vector"}, {"shape", info_.sample_shape().vec()}};
    if (info_.images) {
      input["channels"] = info_.channels;
      input["image_size"] = info_.image_size;
      // How a new image becomes a sample (data::load_image does the same for JPEG/PNG files).
      if (info_.kind != "npy")
        input["pixels"] =
            "u8 RGB (folder) or as stored (mnist, cifar10); centred square of side min(H, W) resampled to image_size "
            "(antialiased bilinear); then / 255";
    }
    nlohmann::json normalisation = {{"per", info_.images ? "channel" : "feature"},
                                    {"mean", info_.mean},
                                    {"std", info_.std},
                                    {"samples", info_.stats_samples}};
    nlohmann::json split = {{"train", info_.train_samples}, {"val", info_.val_samples}, {"held_out", info_.held_out}};
    if (info_.held_out) {
      split["val_fraction"] = c_.data.val_fraction;
      split["seed"] = c_.seed;
    }
    return nlohmann::json{{"task", "classify"},
                          {"classes", info_.classes},
                          {"data", c_.data.train},
                          {"val_data", c_.data.val},
                          {"kind", info_.kind},
                          {"model", c_.model.name},
                          {"input", input},
                          {"normalisation", normalisation},
                          {"augment", {{"crop_padding", info_.crop_padding}, {"horizontal_flip", info_.flip}}},
                          {"split", split},
                          {"decoded_lazily", info_.decoded_lazily}}
        .dump();
  }

 private:
  TrainerConfig c_;
  ClassifyInfo info_;
  std::shared_ptr<nn::UnaryModule> model_;
};

}  // namespace

BuiltinTask make_classify_task(const TrainerConfig& c) {
  auto data = std::make_unique<ClassifyData>(c);
  auto module = std::make_unique<ClassifyModule>(c, data->info());
  return {std::move(module), std::move(data)};
}

}  // namespace ft::train
