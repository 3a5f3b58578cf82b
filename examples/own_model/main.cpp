// A model of one's own trained on .npy data with the Trainer: a TrainModule says what a batch
// computes, a DataModule where the batches come from; the Trainer does the rest (optimizer and
// schedule, accumulation, clipping, precision, checkpoints, metrics.csv, TensorBoard).
//   own_model [X.npy y.npy]   features f32 [n, d] and labels i64 [n]; without arguments it
//                             writes a small generated pair (two noisy rings) and trains on that.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "fasttrain/fasttrain.h"

using namespace ft;

// An MLP classifier: d -> 64 -> 64 -> classes.
class Mlp : public nn::Module {
 public:
  Mlp(int64_t d, int64_t classes) {
    l1 = register_module("l1", std::make_shared<nn::Linear>(d, 64));
    l2 = register_module("l2", std::make_shared<nn::Linear>(64, 64));
    out = register_module("out", std::make_shared<nn::Linear>(64, classes));
  }
  std::string type_name() const override { return "Mlp"; }
  Tensor forward(const Tensor& x) { return out->forward(relu(l2->forward(relu(l1->forward(x))))); }
  std::shared_ptr<nn::Linear> l1, l2, out;
};

class Classifier : public train::TrainModule {
 public:
  Classifier(int64_t d, int64_t classes) : mlp_(d, classes) {}
  nn::Module& model() override { return mlp_; }
  train::StepOutput training_step(const data::Batch& b) override {
    return {cross_entropy(mlp_.forward(b.field("x")), b.field("y")), {}};
  }
  train::StepOutput validation_step(const data::Batch& b) override {
    Tensor logits = mlp_.forward(b.field("x"));
    Tensor accuracy = mean(eq(argmax(logits, 1), b.field("y")).to(DType::F32));
    return {cross_entropy(logits, b.field("y")), {{"accuracy", accuracy}}};
  }

 private:
  Mlp mlp_;
};

// Two concentric noisy rings in 2-d: class 0 at radius 1, class 1 at radius 2.
void write_rings(const std::string& x_path, const std::string& y_path, int64_t n) {
  manual_seed(0);
  const std::vector<double> u = rand({n, 2}, DType::F64).to_vector();  // angle and noise draws
  std::vector<double> xy, label;
  for (int64_t i = 0; i < n; ++i) {
    const double angle = 2 * M_PI * u[2 * i], radius = 1.0 + i % 2 + 0.3 * (u[2 * i + 1] - 0.5);
    xy.push_back(radius * std::cos(angle));
    xy.push_back(radius * std::sin(angle));
    label.push_back(static_cast<double>(i % 2));
  }
  save_npy(x_path, from_vector(xy, {n, 2}, DType::F32));
  save_npy(y_path, from_vector(label, {n}, DType::I64));
}

int main(int argc, char** argv) {
  std::string x_path = "rings_x.npy", y_path = "rings_y.npy";
  if (argc == 3) {
    x_path = argv[1];
    y_path = argv[2];
  } else {
    write_rings(x_path, y_path, 4000);
  }
  const Tensor x = load_npy(x_path), y = load_npy(y_path);
  const int64_t n = x.size(0), val = n / 5, classes = static_cast<int64_t>(max(y).item<double>()) + 1;
  auto rows = [&](int64_t start, int64_t len) {
    return std::make_shared<data::TensorDataset>(
        std::vector<std::pair<std::string, Tensor>>{{"x", x.narrow(0, start, len)}, {"y", y.narrow(0, start, len)}});
  };
  train::DatasetModule data({rows(val, n - val), nullptr, nullptr}, {rows(0, val), nullptr});

  train::TrainerConfig config;
  config.task = "rings";  // names the run folder: runs/rings-<time>
  config.max_steps = 300;
  config.batch_size = 64;
  config.optimizer.lr = 3e-3;
  config.schedule = train::CosineSchedule{.min_lr = 3e-4, .warmup_steps = 20};
  config.eval_every = 100;
  config.eval_batches = 0;  // the whole validation split
  config.checkpoint.monitor = train::Monitor::ValAccuracy;
  config.progress = false;
  Classifier module(x.size(1), classes);
  train::Trainer trainer(config);
  const train::TrainResult r = trainer.fit(module, data);
  std::printf("trained %lld steps: val loss %.4f, val accuracy %.3f; run folder %s\n", static_cast<long long>(r.steps),
              r.final_val_loss, r.final_val_accuracy.value_or(0), r.run_dir.c_str());
  return r.final_val_accuracy.value_or(0) > 0.9 ? 0 : 1;
}
