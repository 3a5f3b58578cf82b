// The training loop: TrainerConfig (PyTorch Lightning's vocabulary), the learning-rate schedule,
// gradient clipping, and the Trainer that runs a task, evaluates it, logs, checkpoints and
// resumes exactly. Implemented in src/train/.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fasttrain/tensor.h"

namespace ft::train {

// Every option of a run. The CLI (`fasttrain train --help`), TOML run files and the config.toml
// written into each run folder all go through visit_fields(), so the names below are the flag
// names (with '-' for '_') and the TOML keys.
struct TrainerConfig {
  std::string task = "char";  // "char" (char-level GPT on the Markov text) or "images" (shapes)
  // --- loop ---
  int64_t max_steps = 600;
  int64_t max_epochs = 0;  // 0: no epoch limit; otherwise stop after this many passes as well
  int64_t eval_every = 100;  // Lightning's val_check_interval, in steps; 0: only at the end
  int64_t eval_batches = 16;  // validation batches per evaluation (images: the whole val split)
  int64_t log_every_n_steps = 25;
  int64_t checkpoint_every = 0;  // 0: no checkpoints
  uint64_t seed = 1337;
  bool deterministic = true;  // no nondeterministic kernels (all CPU kernels are deterministic)
  int64_t threads = 0;        // 0: all cores
  std::string device = "cpu";
  std::string run_dir;  // "": runs/<task>-<timestamp>
  bool progress = true;  // the live progress line on stderr
  // --- data loading (the DataLoader that feeds training batches) ---
  int64_t workers = 0;      // loader threads; 0: batches are read in the training thread
  bool pin_memory = false;  // page-locked batch buffers (CUDA); aligned host memory otherwise
  int64_t prefetch = 2;     // batches in flight per worker
  // --- optimisation ---
  int64_t batch_size = 32;
  std::string optimizer = "adamw";  // adamw, adam or sgd
  double lr = 5e-3;
  double min_lr = 5e-4;
  std::string schedule = "cosine";  // "cosine": linear warmup then cosine to min_lr; "constant"
  int64_t warmup_steps = 50;
  double weight_decay = 0.1;  // not applied to biases and norm weights
  double momentum = 0.9;      // sgd
  double beta1 = 0.9, beta2 = 0.99;  // adam/adamw
  double grad_clip = 1.0;     // max global gradient norm; 0: off
  // --- char task ---
  int64_t context = 64;
  int64_t layers = 2;
  int64_t dim = 128;
  int64_t heads = 4;
  double dropout = 0.0;
  int64_t train_chars = 2'000'000;
  int64_t val_chars = 200'000;
  double goal_gap = 0.05;  // stated goal: final val loss within this many nats of the entropy floor
  // --- images task ---
  std::string model = "cnn-mini";  // images: "cnn-mini" (BENCH.md) or "cnn-tiny" (faster)
  int64_t image_size = 32;
  int64_t classes = 6;
  int64_t train_images = 10000;
  int64_t val_images = 1000;
  double goal_accuracy = 0.95;  // stated goal: final validation accuracy

  // The defaults of a task ("char" or "images"): the fields above with the task's own loop and
  // optimisation settings.
  static TrainerConfig defaults_for(const std::string& task);
  // Checks every field and combination; throws ft::Error naming the option, expected, found.
  void validate() const;
};

// Calls v(name, field, help) for every field of `c` in a fixed order; field is a reference to
// an int64_t, uint64_t, double, bool or std::string member. One list for CLI, TOML and JSON.
template <class Config, class V>
void visit_fields(Config& c, V&& v) {
  v("task", c.task, "task: char (char-level GPT on generated text) or images (procedural shapes)");
  v("max_steps", c.max_steps, "optimisation steps");
  v("max_epochs", c.max_epochs, "stop after this many passes over the training data as well (0: no limit)");
  v("eval_every", c.eval_every, "evaluate on the validation split every N steps (0: only at the end)");
  v("eval_batches", c.eval_batches, "validation batches per evaluation (images: the whole split)");
  v("log_every_n_steps", c.log_every_n_steps, "log training metrics every N steps");
  v("checkpoint_every", c.checkpoint_every, "write a checkpoint every N steps (0: none)");
  v("seed", c.seed, "seed of the data, the initial weights and every random stream");
  v("deterministic", c.deterministic, "require deterministic kernels (every CPU kernel is: results do not depend on threads)");
  v("threads", c.threads, "CPU threads (0: all cores)");
  v("device", c.device, "device: cpu (cuda is not built yet)");
  v("run_dir", c.run_dir, "run folder (default runs/<task>-<timestamp>)");
  v("progress", c.progress, "show the live progress line on stderr");
  v("workers", c.workers, "data loader worker threads (0: read batches in the training thread)");
  v("pin_memory", c.pin_memory, "page-locked batch buffers for asynchronous host-to-device copies (CUDA)");
  v("prefetch", c.prefetch, "batches each data loader worker prepares ahead");
  v("batch_size", c.batch_size, "sequences (char) or images per step");
  v("optimizer", c.optimizer, "adamw, adam or sgd");
  v("lr", c.lr, "peak learning rate");
  v("min_lr", c.min_lr, "final learning rate of the cosine schedule");
  v("schedule", c.schedule, "cosine (linear warmup, then cosine decay to min_lr) or constant");
  v("warmup_steps", c.warmup_steps, "steps of linear warmup (cosine schedule)");
  v("weight_decay", c.weight_decay, "weight decay (decoupled for adamw; none on biases and norms)");
  v("momentum", c.momentum, "sgd momentum");
  v("beta1", c.beta1, "adam/adamw beta1");
  v("beta2", c.beta2, "adam/adamw beta2");
  v("grad_clip", c.grad_clip, "clip the global gradient norm to this value (0: off)");
  v("context", c.context, "char: characters of context");
  v("layers", c.layers, "char: transformer blocks");
  v("dim", c.dim, "char: model width");
  v("heads", c.heads, "char: attention heads");
  v("dropout", c.dropout, "char: dropout probability");
  v("train_chars", c.train_chars, "char: characters in the generated training text");
  v("val_chars", c.val_chars, "char: characters in the generated validation text");
  v("goal_gap", c.goal_gap, "char: goal, validation loss within this many nats of the entropy floor");
  v("model", c.model, "images: cnn-mini (BENCH.md) or cnn-tiny");
  v("image_size", c.image_size, "images: image side in pixels");
  v("classes", c.classes, "images: number of shape classes (2-6)");
  v("train_images", c.train_images, "images: training images");
  v("val_images", c.val_images, "images: validation images");
  v("goal_accuracy", c.goal_accuracy, "images: goal, validation accuracy");
}

// The config as TOML text (every field, resolved), and back. Parsing rejects unknown keys and
// values of the wrong type, naming the key; keys absent from the text keep their value in `into`.
std::string config_to_toml(const TrainerConfig& c);
void apply_toml(TrainerConfig& into, const std::string& toml_text, const std::string& source_name);
// Sets one field from its text form ("--lr 0.01" -> set_field(c, "lr", "0.01")).
void set_field(TrainerConfig& c, const std::string& name, const std::string& value);
// The task an option applies to: "char", "images", or "" for every task (options whose help in
// visit_fields starts with "char:" or "images:").
std::string option_scope(const std::string& name);

// Learning rate at `step` (0-based): with the cosine schedule a linear warmup from lr/warmup to lr
// over warmup_steps, then a half cosine from lr down to min_lr at max_steps; constant otherwise.
double learning_rate(const TrainerConfig& c, int64_t step);

// Scales the gradients of `params` in place so that their global L2 norm is at most `max_norm`
// (torch.nn.utils.clip_grad_norm_); returns the norm before clipping. Parameters without a
// gradient are skipped. The norm is one parallel pass over all gradients.
double clip_grad_norm(const std::vector<Tensor>& params, double max_norm);

// One logged row of metrics.csv.
struct MetricRow {
  int64_t step = 0;
  double epoch = 0;
  std::string split;  // "train" or "val"
  double loss = 0;
  double accuracy = -1;  // images, val rows; -1 where not measured
  double lr = 0;
  double items_per_s = 0;  // tokens/s (char) or samples/s (images), train rows
  double elapsed_s = 0;
  double data_wait_ms = 0;  // train rows: mean time per step blocked waiting for the batch
};

struct TrainResult {
  std::string run_dir;
  int64_t steps = 0;
  double final_train_loss = 0;
  double final_val_loss = 0;
  double final_val_accuracy = -1;  // images
  double floor = -1;               // char: the entropy floor of the validation windows
  bool goal_met = false;
  std::string goal;  // human sentence: what the goal was and how the run did
  double seconds = 0;
  double items_per_s = 0;  // training throughput (evaluation time excluded)
  double data_wait_s = 0;  // total time the steps were blocked waiting for their batch
  std::string unit;        // what items_per_s counts: "tokens" or "samples"
  std::string model;       // the model's type name
  int64_t parameters = 0;
};

class Task;

class Trainer {
 public:
  // Validates the config and builds the data, the model and the optimizer.
  explicit Trainer(TrainerConfig config);
  ~Trainer();
  // Restores model, optimizer, step, data position and RNG state from a checkpoint folder written
  // by this trainer; the checkpoint's model and data settings must match this config.
  void resume(const std::string& checkpoint_dir);
  // Trains to max_steps (or max_epochs), evaluating, logging and checkpointing on the way; writes
  // the run folder (metrics.csv, config.toml, task.json, model.safetensors, summary.json).
  TrainResult fit();

  const TrainerConfig& config() const { return config_; }
  Task& task() { return *task_; }
  int64_t step() const { return step_; }
  const std::vector<MetricRow>& history() const { return history_; }
  // Writes a checkpoint of the current state into `dir` (atomically: a temporary folder renamed).
  void save_checkpoint(const std::string& dir) const;

 private:
  struct Impl;
  TrainerConfig config_;
  std::unique_ptr<Task> task_;
  std::unique_ptr<Impl> impl_;
  int64_t step_ = 0;
  std::vector<MetricRow> history_;
};

// The config a checkpoint or run folder was trained with (its config.toml).
TrainerConfig load_run_config(const std::string& dir);

struct SampleOptions {
  std::string prompt = "The ";
  int64_t tokens = 200;      // characters to generate
  double temperature = 0.8;  // 0: always the most likely character
  int64_t top_k = 0;         // sample among the k most likely characters (0: all)
  uint64_t seed = 0;
};
// Loads the char-level GPT of a run or checkpoint folder (config.toml, task.json with the
// vocabulary, model.safetensors) and returns `prompt` continued by `tokens` characters.
std::string sample_text(const std::string& dir, const SampleOptions& options);

}  // namespace ft::train
