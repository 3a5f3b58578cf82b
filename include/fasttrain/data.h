// Datasets the project generates itself (nothing is downloaded): a character corpus from a text
// source whose entropy is known exactly, and a procedurally drawn shapes image set. Both are
// deterministic functions of a seed. Implemented in src/data/.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fasttrain/tensor.h"

namespace ft::data {

// An order-2 Markov chain over characters ("trigram chain") whose transition table is the
// trigram counts of a seed text read cyclically. Reading the text cyclically makes the counts a
// flow, so the chain's stationary distribution is exactly the text's bigram frequencies and its
// entropy rate has a closed form:
//   H = -sum_{abc} n(abc)/N * log(n(abc) / n(ab))       (nats per character)
// No model can predict text drawn from the chain with a lower mean cross-entropy: H is the floor
// the char-level task reports its loss against.
class MarkovText {
 public:
  // Builds the chain from `seed_text` (at least 3 characters, at most 128 distinct ones).
  static MarkovText from_seed_text(std::string_view seed_text);
  // The chain of the project's built-in seed text (src/data/seed_text.cpp).
  static const MarkovText& builtin();

  const std::string& alphabet() const { return alphabet_; }  // sorted distinct characters
  double entropy_rate() const { return entropy_rate_; }      // H(X_t | X_t-2, X_t-1), nats
  double first_order_entropy() const { return h1_; }         // H(X_1 | X_0), nats
  // The lowest mean loss achievable on windows of `context` next-character predictions that start
  // at a stationary point: the first prediction sees one character of context, the rest two or
  // more, so the floor is (H(X1|X0) + (context - 1) * H) / context.
  double window_floor(int64_t context) const;
  // `n` characters drawn from the chain, starting from a bigram drawn from the stationary
  // distribution (so every position is distributed as in the long run). Deterministic in `seed`.
  std::string generate(int64_t n, uint64_t seed) const;

 private:
  std::string alphabet_;
  int vocab_ = 0;
  // Successors of each bigram state (a * vocab + b): first_[s] .. first_[s + 1] index into
  // next_char_ / next_cum_ (cumulative counts); state_count_[s] = n(ab).
  std::vector<int64_t> first_;
  std::vector<uint8_t> next_char_;
  std::vector<int64_t> next_cum_;
  std::vector<int64_t> state_count_;
  std::vector<int64_t> state_cum_;  // cumulative n(ab) over states, for the stationary start
  int64_t total_ = 0;               // N, the seed text's length
  double entropy_rate_ = 0, h1_ = 0;
};

// A character corpus split into a training and a validation part, with its vocabulary.
class CharCorpus {
 public:
  // Draws train_chars + val_chars characters from `source` with `seed`; the validation part is
  // a separate draw (disjoint text, same distribution).
  CharCorpus(const MarkovText& source, int64_t train_chars, int64_t val_chars, uint64_t seed);

  const std::string& vocab() const { return vocab_; }  // character of each token id
  int64_t vocab_size() const { return static_cast<int64_t>(vocab_.size()); }
  const std::vector<uint8_t>& train() const { return train_; }
  const std::vector<uint8_t>& val() const { return val_; }

  // Token ids of `text`; a character outside the vocabulary is an error naming it.
  std::vector<int64_t> encode(std::string_view text) const;
  std::string decode(const std::vector<int64_t>& ids) const;

 private:
  std::string vocab_;
  std::vector<uint8_t> train_, val_;
};

// Token ids of `text` under `vocab` (the character of each id); used by the corpus and by
// `fasttrain sample`, which reads the vocabulary back from a run folder.
std::vector<int64_t> encode_chars(std::string_view vocab, std::string_view text);

// Next-character windows: x [batch, context] and y (x shifted by one) as i64, from windows
// starting at `starts` (each start + context + 1 <= tokens.size()).
void char_windows(const std::vector<uint8_t>& tokens, const std::vector<int64_t>& starts, int64_t context, Tensor& x,
                  Tensor& y);
// `batch` window starts drawn uniformly for training batch number `index` of a run with
// `seed`: a pure function of its arguments, so a resumed run draws the same batches.
std::vector<int64_t> random_window_starts(int64_t tokens, int64_t context, int64_t batch, uint64_t seed, int64_t index);
// Row `row` of random_window_starts(tokens, context, batch, seed, index), drawn on its own (no
// allocation), so a loader worker can fill one sample at a time.
int64_t random_window_start(int64_t tokens, int64_t context, int64_t batch, uint64_t seed, int64_t index, int64_t row);

// Procedurally drawn shapes: each image one filled or outlined shape of random position, size,
// rotation and colour on a noisy background of another colour.
struct ShapesOptions {
  int64_t image_size = 32;  // square images, RGB
  int64_t classes = 6;      // the first `classes` of shape_class_names()
  double noise = 0.08;      // std of per-pixel Gaussian noise (image values in [0, 1] before it)
};
const std::vector<std::string>& shape_class_names();  // disk, square, triangle, cross, ring, frame
struct ImageSet {
  Tensor images;  // f32 [n, 3, size, size], normalised to about [-1, 1]
  Tensor labels;  // i64 [n]
};
// Image i depends only on (seed, i): sets drawn with different seeds are disjoint splits.
ImageSet make_shapes(int64_t n, uint64_t seed, const ShapesOptions& options = {});

}  // namespace ft::data
