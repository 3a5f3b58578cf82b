// The built-in tasks' options (task_options.h): each task's defaults for a whole run, the GPT
// presets of the lm task, and the checks of [model] and [data] for the task that reads them.
#include <algorithm>
#include <cmath>
#include <filesystem>

#include "fasttrain/tasks.h"

namespace ft::train {

bool is_llama_preset(const std::string& model) {
  return model == "llama-mini" || model == "smollm-135m" || model == "smollm-360m" || model == "tinyllama-1.1b" ||
         model == "llama-3.2-1b";
}

bool is_llama(const std::string& model) { return model == "llama" || is_llama_preset(model); }

bool is_hf_folder(const std::string& init_from) {
  return !init_from.empty() && std::filesystem::is_regular_file(std::filesystem::path(init_from) / "config.json");
}

void set_llama_preset(ModelOptions& m, bool keep_context) {
  const nn::LlamaConfig p = nn::LlamaConfig::preset(m.name);
  m.layers = p.layers, m.dim = p.dim, m.heads = p.heads, m.kv_heads = p.kv_heads, m.ffn_dim = p.ffn_dim;
  m.rope_theta = p.rope_theta;
  // Llama 3.2's 131072 positions are its long-context reach, not a window to train at by default.
  if (!keep_context) m.context = std::min<int64_t>(p.context, 2048);
}

nn::LlamaConfig llama_config(const ModelOptions& m, int64_t vocab_size) {
  nn::LlamaConfig c;
  if (is_llama_preset(m.name)) {
    c = nn::LlamaConfig::preset(m.name);  // its positions and rotary scaling; the window is m.context
  } else {
    c.context = m.context, c.layers = m.layers, c.dim = m.dim, c.heads = m.heads, c.rope_theta = m.rope_theta;
    c.kv_heads = m.kv_heads > 0 ? m.kv_heads : m.heads;
    c.ffn_dim = m.ffn_dim > 0 ? m.ffn_dim : (8 * m.dim / 3 + 63) / 64 * 64;
  }
  c.vocab_size = vocab_size;
  return c;
}

bool is_gpt_preset(const std::string& model) {
  return model == "gpt-mini" || model == "gpt2" || model == "gpt2-medium" || model == "gpt2-large";
}

void set_gpt_preset(ModelOptions& m) {
  const nn::GPTConfig p = nn::GPTConfig::preset(m.name);
  m.context = p.context;
  m.layers = p.layers;
  m.dim = p.dim;
  m.heads = p.heads;
}

TrainerConfig TrainerConfig::defaults_for(const std::string& task) {
  TrainerConfig c;  // the member initialisers are the char task's defaults
  c.task = task;
  if (task == "images") {
    c.data.goal_accuracy = 0.95;  // the generated shapes' stated goal; the user's own data has none
    c.max_steps = 500;
    c.eval_every = 100;
    c.log_every_n_steps = 25;
    c.batch_size = 32;
    c.optimizer.lr = 3e-3;
    c.schedule = CosineSchedule{.min_lr = 1e-4, .warmup_steps = 30};
    c.optimizer.weight_decay = 5e-4;
    c.optimizer.beta2 = 0.999;
    c.optimizer.grad_clip = 0.0;
    c.eval_batches = 0;  // the whole validation split
  } else if (task == "lm") {
    // nanoGPT's small-run settings with BENCH.md's gpt-mini.
    c.model.name = "gpt-mini";
    set_gpt_preset(c.model);
    c.max_steps = 1000;
    c.eval_every = 250;
    c.eval_batches = 20;
    c.optimizer.lr = 1e-3;
    c.schedule = CosineSchedule{.min_lr = 1e-4, .warmup_steps = 100};
  } else if (task == "classify") {
    c.model.name = "cnn-mini";
    c.max_steps = 1000;
    c.eval_every = 250;
    c.eval_batches = 0;
    c.batch_size = 64;
    c.optimizer.lr = 2e-3;
    c.schedule = CosineSchedule{.min_lr = 1e-4, .warmup_steps = 50};
    c.optimizer.weight_decay = 5e-4;
    c.optimizer.beta2 = 0.999;
    c.optimizer.grad_clip = 0.0;
    c.checkpoint.monitor = Monitor::ValAccuracy;
  }
  return c;
}

namespace {

// A Llama's options: its own checks (LlamaConfig::validate) in the options' names, and a preset's
// sizes unchanged but for the window, which fits its positions.
void validate_llama_options(const ModelOptions& m) {
  FT_CHECK(m.kv_heads >= 0 && (m.kv_heads == 0 || m.heads % m.kv_heads == 0),
           "option kv_heads: expected 0 (heads) or a divisor of heads (", m.heads, "), found ", m.kv_heads);
  FT_CHECK(m.ffn_dim >= 0, "option ffn_dim: expected 0 (8/3 dim) or a positive width, found ", m.ffn_dim);
  FT_CHECK(std::isfinite(m.rope_theta) && m.rope_theta > 0, "option rope_theta: expected a positive base, found ",
           m.rope_theta);
  FT_CHECK((m.dim / m.heads) % 2 == 0,
           "option dim: a Llama's head size dim / heads must be even (rotary pairs), found ", m.dim, " / ", m.heads);
  if (!is_llama_preset(m.name)) return;
  ModelOptions sized = m;
  set_llama_preset(sized, /*keep_context=*/true);
  FT_CHECK(sized.layers == m.layers && sized.dim == m.dim && sized.heads == m.heads && sized.kv_heads == m.kv_heads &&
               sized.ffn_dim == m.ffn_dim && sized.rope_theta == m.rope_theta,
           "option model: ", m.name, " has ", sized.layers, " layers, width ", sized.dim, ", ", sized.heads, " heads, ",
           sized.kv_heads, " key/value heads, MLP width ", sized.ffn_dim, " and rope_theta ", sized.rope_theta,
           "; found ", m.layers, ", ", m.dim, ", ", m.heads, ", ", m.kv_heads, ", ", m.ffn_dim, " and ", m.rope_theta,
           " (use model = \"llama\" for another size)");
  const int64_t positions = nn::LlamaConfig::preset(m.name).context;
  FT_CHECK(m.context <= positions, "option context: ", m.name, " has ", positions, " positions, found a window of ",
           m.context);
}

}  // namespace

void validate_task_options(const TrainerConfig& c) {
  auto check = [](bool ok, const char* name, const char* expected, const auto& found) {
    FT_CHECK(ok, "option ", name, ": expected ", expected, ", found ", found);
  };
  const std::string& task = c.task;
  const int64_t batch_size = c.batch_size, accumulate = c.accumulate;
  const ModelOptions& m = c.model;
  const DataOptions& d = c.data;
  const bool gpt = task == "char" || task == "lm", images = task == "images" || task == "classify";
  if (gpt) {
    check(m.context >= 1 && m.context <= 131072, "context", "1 to 131072", m.context);
    check(m.layers >= 1, "layers", "at least 1", m.layers);
    check(m.heads >= 1, "heads", "at least 1", m.heads);
    FT_CHECK(m.dim >= 1 && m.dim % m.heads == 0, "option dim: expected a positive multiple of heads (", m.heads,
             "), found ", m.dim);
    check(m.dropout >= 0 && m.dropout < 1, "dropout", "a value in [0, 1)", m.dropout);
  }
  if (task == "char") {
    FT_CHECK(d.train_chars > m.context + 1 && d.val_chars > m.context + 1,
             "options train_chars and val_chars: expected more than "
             "context + 1 = ",
             m.context + 1, " characters each, found ", d.train_chars, " and ", d.val_chars);
    check(d.goal_gap > 0, "goal_gap", "a positive gap in nats", d.goal_gap);
  }
  if (images) {
    check(d.image_size >= 8 && d.image_size <= 512, "image_size", "8 to 512", d.image_size);
    check(d.goal_accuracy >= 0 && d.goal_accuracy <= 1, "goal_accuracy", "0 (no goal) or a fraction in (0, 1]",
          d.goal_accuracy);
  }
  if (task == "images") {
    check(m.name == "cnn-mini" || m.name == "cnn-tiny", "model", "cnn-mini or cnn-tiny", "'" + m.name + "'");
    check(d.classes >= 2 && d.classes <= 6, "classes", "2 to 6", d.classes);
    FT_CHECK(d.train_images >= batch_size * accumulate,
             "option train_images: expected at least batch_size x accumulate = ", batch_size * accumulate,
             " images, found ", d.train_images);
    check(d.val_images >= 1, "val_images", "at least 1", d.val_images);
  }
  if (task == "lm") {
    check(!d.train.empty(), "data", "a glob of token shards (e.g. 'shards/*train*.bin')", "nothing");
    check(!d.val.empty(), "val_data", "a glob of validation token shards (e.g. 'shards/*val*.bin')", "nothing");
    check(d.vocab_size >= 0 && d.vocab_size <= int64_t{1} << 31, "vocab_size", "0 (from the vocab file) to 2^31",
          d.vocab_size);
    const bool preset = is_gpt_preset(m.name);
    check(preset || m.name == "custom" || is_llama(m.name), "model",
          "gpt-mini, gpt2, gpt2-medium, gpt2-large, custom, llama-mini, smollm-135m, smollm-360m, tinyllama-1.1b, "
          "llama-3.2-1b or llama",
          "'" + m.name + "'");
    if (is_llama(m.name)) validate_llama_options(m);
    if (preset) {
      ModelOptions sized = m;
      set_gpt_preset(sized);
      FT_CHECK(sized.context == m.context && sized.layers == m.layers && sized.dim == m.dim && sized.heads == m.heads,
               "option model: ", m.name, " has context ", sized.context, ", ", sized.layers, " layers, width ",
               sized.dim, " and ", sized.heads, " heads; found context ", m.context, ", ", m.layers, " layers, width ",
               m.dim, " and ", m.heads, " heads (use model = \"custom\" for another size)");
    }
  }
  if (task == "classify") {
    check(!d.train.empty(), "data", "mnist:DIR, cifar10:DIR, folder:DIR or npy:X.npy,y.npy", "nothing");
    check(d.val_fraction > 0 && d.val_fraction < 1, "val_fraction", "a fraction in (0, 1)", d.val_fraction);
    check(
        m.name == "mlp" || m.name == "cnn-mini" || m.name == "resnet18" || m.name == "resnet20" || m.name == "resnet50",
        "model", "mlp, cnn-mini, resnet18, resnet20 or resnet50", "'" + m.name + "'");
  }
}

}  // namespace ft::train
