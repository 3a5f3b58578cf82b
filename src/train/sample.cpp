// Text generation from a trained char-level GPT (train.h, sample_text).
#include <algorithm>
#include <cmath>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "fasttrain/autograd.h"
#include "fasttrain/data.h"
#include "fasttrain/random.h"
#include "fasttrain/tasks.h"
#include "train/run_files.h"

namespace ft::train {

std::string sample_text(const std::string& dir, const SampleOptions& o) {
  FT_CHECK(o.tokens >= 0 && o.tokens <= 1'000'000, "sample: expected --tokens in [0, 1000000], found ", o.tokens);
  FT_CHECK(std::isfinite(o.temperature) && o.temperature >= 0, "sample: expected a temperature >= 0, found ",
           o.temperature);
  FT_CHECK(o.top_k >= 0, "sample: expected --top-k >= 0, found ", o.top_k);
  FT_CHECK(!o.prompt.empty(), "sample: the prompt must have at least one character");
  const TrainerConfig c = load_run_config(dir);
  FT_CHECK(c.task == "char", "sample: ", dir, " holds a '", c.task, "' run; sample needs a char-level GPT (task char)");
  const std::string task_path = dir + "/task.json";
  std::string vocab;
  try {
    vocab = nlohmann::json::parse(read_text(task_path, "the task description")).at("vocab").get<std::string>();
  } catch (const nlohmann::json::exception& e) {
    FT_FAIL(task_path, ": malformed task description: ", e.what());
  }
  FT_CHECK(!vocab.empty(), task_path, ": the vocabulary is empty");
  const int64_t V = static_cast<int64_t>(vocab.size());
  FT_CHECK(o.top_k <= V, "sample: expected --top-k at most the vocabulary size ", V, ", found ", o.top_k);

  Generator init(0);
  auto model = make_char_model(c, V, &init);
  model->load(dir + "/model.safetensors", /*strict=*/true);
  model->eval();
  autograd::InferenceMode guard;

  std::vector<int64_t> ids = data::encode_chars(vocab, o.prompt);
  std::string out = o.prompt;
  std::vector<double> p(V);
  for (int64_t i = 0; i < o.tokens; ++i) {
    const int64_t t = std::min<int64_t>(c.context, static_cast<int64_t>(ids.size()));
    std::vector<double> window(ids.end() - t, ids.end());
    Tensor logits = model->forward(from_vector(window, {1, t}, DType::I64));
    std::vector<double> row = logits.select(0, 0).select(0, t - 1).narrow(0, 0, V).to_vector();
    int64_t next = 0;
    if (o.temperature == 0) {
      next = std::max_element(row.begin(), row.end()) - row.begin();
    } else {
      // Softmax at the temperature over the top k (or all) characters, then one uniform draw.
      double cutoff = -INFINITY;
      if (o.top_k > 0) {
        std::vector<double> sorted = row;
        std::nth_element(sorted.begin(), sorted.begin() + (o.top_k - 1), sorted.end(), std::greater<>());
        cutoff = sorted[o.top_k - 1];
      }
      const double mx = *std::max_element(row.begin(), row.end());
      double total = 0;
      for (int64_t k = 0; k < V; ++k) total += p[k] = row[k] >= cutoff ? std::exp((row[k] - mx) / o.temperature) : 0.0;
      double u = uniform_from_word(philox4x32(o.seed, static_cast<uint64_t>(i)).v[0]) * total;
      // The last candidate catches u left over by rounding.
      for (int64_t k = 0; k < V; ++k)
        if (p[k] > 0) {
          next = k;
          if ((u -= p[k]) < 0) break;
        }
    }
    ids.push_back(next);
    out.push_back(vocab[next]);
  }
  return out;
}

}  // namespace ft::train
