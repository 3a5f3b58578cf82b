// Character corpus: vocabulary, encoding, train/val split and next-character windows.
#include <array>
#include <cstring>

#include "fasttrain/data.h"
#include "fasttrain/random.h"

namespace ft::data {

namespace {

// The validation text is drawn from its own Philox stream (key seed ^ this constant).
constexpr uint64_t kValSeedSalt = 0x9E3779B97F4A7C15ull;

std::vector<uint8_t> to_ids(std::string_view vocab, std::string_view text) {
  std::array<int, 256> id;
  id.fill(-1);
  for (size_t i = 0; i < vocab.size(); ++i) id[static_cast<unsigned char>(vocab[i])] = static_cast<int>(i);
  std::vector<uint8_t> out(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    int v = id[static_cast<unsigned char>(text[i])];
    FT_CHECK(v >= 0, "encode: character '", text[i], "' (code ", static_cast<int>(static_cast<unsigned char>(text[i])),
             ") at position ", i, " is not in the vocabulary of ", vocab.size(), " characters");
    out[i] = static_cast<uint8_t>(v);
  }
  return out;
}

}  // namespace

CharCorpus::CharCorpus(const MarkovText& source, int64_t train_chars, int64_t val_chars, uint64_t seed) {
  FT_CHECK(train_chars >= 2 && val_chars >= 2,
           "CharCorpus: expected at least 2 training and 2 validation characters, found ", train_chars, " and ",
           val_chars);
  // The vocabulary is the source's alphabet: every character the chain can emit, so any prompt
  // made of them encodes even if a particular draw happens to miss one.
  vocab_ = source.alphabet();
  train_ = to_ids(vocab_, source.generate(train_chars, seed));
  val_ = to_ids(vocab_, source.generate(val_chars, seed ^ kValSeedSalt));
}

std::vector<int64_t> encode_chars(std::string_view vocab, std::string_view text) {
  std::vector<uint8_t> ids = to_ids(vocab, text);
  return std::vector<int64_t>(ids.begin(), ids.end());
}

std::vector<int64_t> CharCorpus::encode(std::string_view text) const { return encode_chars(vocab_, text); }

std::string CharCorpus::decode(const std::vector<int64_t>& ids) const {
  std::string out;
  out.reserve(ids.size());
  for (int64_t i : ids) {
    FT_CHECK(i >= 0 && i < vocab_size(), "decode: token id ", i, " is outside the vocabulary [0, ", vocab_size(), ")");
    out.push_back(vocab_[i]);
  }
  return out;
}

void char_windows(const std::vector<uint8_t>& tokens, const std::vector<int64_t>& starts, int64_t context, Tensor& x,
                  Tensor& y) {
  const int64_t b = static_cast<int64_t>(starts.size());
  x = empty({b, context}, DType::I64);
  y = empty({b, context}, DType::I64);
  int64_t* xp = x.data<int64_t>();
  int64_t* yp = y.data<int64_t>();
  for (int64_t i = 0; i < b; ++i) {
    const int64_t s = starts[i];
    FT_CHECK(s >= 0 && s + context + 1 <= static_cast<int64_t>(tokens.size()), "char_windows: window [", s, ", ",
             s + context + 1, ") is outside the ", tokens.size(), " tokens");
    const uint8_t* src = tokens.data() + s;
    for (int64_t t = 0; t < context; ++t) {
      xp[i * context + t] = src[t];
      yp[i * context + t] = src[t + 1];
    }
  }
}

int64_t random_window_start(int64_t tokens, int64_t context, int64_t batch, uint64_t seed, int64_t index, int64_t row) {
  const int64_t range = tokens - context;  // starts in [0, range)
  FT_CHECK(range >= 1, "random_window_starts: ", tokens, " tokens are too few for windows of ", context + 1);
  FT_CHECK(row >= 0 && row < batch, "random_window_start: expected a row in [0, ", batch, "), found ", row);
  // Batch `index` owns Philox counters [index * blocks, (index + 1) * blocks): two words per start.
  const uint64_t blocks = static_cast<uint64_t>((batch + 1) / 2);
  Philox4 w = philox4x32(seed, static_cast<uint64_t>(index) * blocks + static_cast<uint64_t>(row / 2));
  uint64_t r = (static_cast<uint64_t>(w.v[2 * (row % 2)]) << 32) | w.v[2 * (row % 2) + 1];
  return static_cast<int64_t>(r % static_cast<uint64_t>(range));
}

std::vector<int64_t> random_window_starts(int64_t tokens, int64_t context, int64_t batch, uint64_t seed,
                                          int64_t index) {
  std::vector<int64_t> starts(batch);
  for (int64_t i = 0; i < batch; ++i) starts[i] = random_window_start(tokens, context, batch, seed, index, i);
  return starts;
}

}  // namespace ft::data
