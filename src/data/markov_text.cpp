// The trigram Markov chain of data.h: built from cyclic trigram counts, sampled with Philox.
#include <algorithm>
#include <array>
#include <cmath>

#include "fasttrain/data.h"
#include "fasttrain/random.h"

namespace ft::data {

extern const std::string_view kSeedText;

namespace {

// Index of the first entry of `cum` (cumulative counts, ascending) greater than r.
int64_t pick(const int64_t* cum, int64_t n, int64_t r) { return std::upper_bound(cum, cum + n, r) - cum; }

// A uniform integer in [0, n) from a 32-bit random word (n < 2^32; bias below 2^-32 * n).
int64_t scale_word(uint32_t w, int64_t n) { return static_cast<int64_t>((static_cast<uint64_t>(w) * n) >> 32); }

}  // namespace

MarkovText MarkovText::from_seed_text(std::string_view text) {
  FT_CHECK(text.size() >= 3, "MarkovText: the seed text needs at least 3 characters, found ", text.size());
  MarkovText m;
  std::array<int, 256> id;
  id.fill(-1);
  for (unsigned char c : text) id[c] = 0;
  for (int c = 0; c < 256; ++c)
    if (id[c] == 0) {
      id[c] = static_cast<int>(m.alphabet_.size());
      m.alphabet_.push_back(static_cast<char>(c));
    }
  m.vocab_ = static_cast<int>(m.alphabet_.size());
  FT_CHECK(m.vocab_ <= 128, "MarkovText: expected at most 128 distinct characters in the seed text, found ", m.vocab_);
  const int64_t V = m.vocab_, n = static_cast<int64_t>(text.size());
  auto at = [&](int64_t i) { return id[static_cast<unsigned char>(text[i % n])]; };

  std::vector<int64_t> tri(V * V * V, 0), bi(V * V, 0), uni(V, 0);
  for (int64_t i = 0; i < n; ++i) {
    tri[(at(i) * V + at(i + 1)) * V + at(i + 2)]++;
    bi[at(i) * V + at(i + 1)]++;
    uni[at(i)]++;
  }
  m.total_ = n;
  m.first_.assign(V * V + 1, 0);
  m.state_count_ = bi;
  m.state_cum_.resize(V * V);
  int64_t running = 0;
  for (int64_t s = 0; s < V * V; ++s) {
    m.first_[s] = static_cast<int64_t>(m.next_char_.size());
    int64_t cum = 0;
    for (int64_t c = 0; c < V; ++c)
      if (int64_t k = tri[s * V + c]) {
        cum += k;
        m.next_char_.push_back(static_cast<uint8_t>(c));
        m.next_cum_.push_back(cum);
        m.entropy_rate_ -= static_cast<double>(k) / n * std::log(static_cast<double>(k) / bi[s]);
      }
    running += bi[s];
    m.state_cum_[s] = running;
    if (bi[s]) m.h1_ -= static_cast<double>(bi[s]) / n * std::log(static_cast<double>(bi[s]) / uni[s / V]);
  }
  m.first_[V * V] = static_cast<int64_t>(m.next_char_.size());
  return m;
}

const MarkovText& MarkovText::builtin() {
  static const MarkovText chain = from_seed_text(kSeedText);
  return chain;
}

double MarkovText::window_floor(int64_t context) const {
  FT_CHECK(context >= 1, "MarkovText::window_floor: expected a context of at least 1, found ", context);
  return (h1_ + static_cast<double>(context - 1) * entropy_rate_) / static_cast<double>(context);
}

std::string MarkovText::generate(int64_t n, uint64_t seed) const {
  FT_CHECK(n >= 2, "MarkovText::generate: expected at least 2 characters, found ", n);
  // Word i of the Philox stream drives draw i: counters are consumed in order, four words each.
  Philox4 words{};
  int64_t word_index = 0;
  auto next_word = [&]() {
    if (word_index % 4 == 0) words = philox4x32(seed, static_cast<uint64_t>(word_index / 4));
    return words.v[word_index++ % 4];
  };
  std::string out(n, '\0');
  int64_t state = pick(state_cum_.data(), static_cast<int64_t>(state_cum_.size()), scale_word(next_word(), total_));
  out[0] = alphabet_[state / vocab_];
  out[1] = alphabet_[state % vocab_];
  for (int64_t i = 2; i < n; ++i) {
    const int64_t b = first_[state], e = first_[state + 1];
    const int64_t r = scale_word(next_word(), state_count_[state]);
    const int64_t c = next_char_[b + pick(next_cum_.data() + b, e - b, r)];
    out[i] = alphabet_[c];
    state = (state % vocab_) * vocab_ + c;
  }
  return out;
}

}  // namespace ft::data
