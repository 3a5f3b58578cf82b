// The generated datasets: the Markov text source's analytic entropy against an empirical
// estimate, determinism, vocabulary and windows; the shapes images' determinism and labels.
#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "fasttrain/data.h"
#include "fasttrain/ops.h"
#include "support/expect_error.h"

using namespace ft;
using namespace ft::data;

TEST(MarkovText, EntropyOfADeterministicCycleIsZero) {
  // "abc" read cyclically: every bigram has exactly one successor.
  MarkovText m = MarkovText::from_seed_text("abc");
  EXPECT_EQ(m.alphabet(), "abc");
  EXPECT_DOUBLE_EQ(m.entropy_rate(), 0.0);
  EXPECT_DOUBLE_EQ(m.first_order_entropy(), 0.0);
}

TEST(MarkovText, EntropyOfATwoWayBranchIsLog2) {
  // "aab" + "aac" cyclically: after "aa" the next character is b or c with equal counts; every
  // other bigram is deterministic. States: aa (2 of 6), ab, ba, ac, ca (1 each): H = 2/6 log 2.
  MarkovText m = MarkovText::from_seed_text("aabaac");
  EXPECT_NEAR(m.entropy_rate(), 2.0 / 6.0 * std::log(2.0), 1e-12);
}

TEST(MarkovText, AnalyticEntropyMatchesAnEmpiricalEstimate) {
  const MarkovText& m = MarkovText::builtin();
  const std::string text = m.generate(2'000'000, 7);
  // Plug-in estimate of H(X_t | X_t-2, X_t-1) from the sample's trigram and bigram counts, over
  // the alphabet's indices (dense arrays: a map of substrings took 15 s of an ASan run).
  const std::string& alphabet = m.alphabet();
  const size_t v = alphabet.size();
  std::vector<size_t> index(256, v);
  for (size_t c = 0; c < v; ++c) index[static_cast<unsigned char>(alphabet[c])] = c;
  std::vector<int64_t> tri(v * v * v), bi(v * v);
  for (size_t i = 0; i + 2 < text.size(); ++i) {
    const size_t a = index[static_cast<unsigned char>(text[i])], b = index[static_cast<unsigned char>(text[i + 1])],
                 c = index[static_cast<unsigned char>(text[i + 2])];
    ASSERT_LT(std::max({a, b, c}), v) << "a character outside the alphabet at " << i;
    tri[(a * v + b) * v + c]++;
    bi[a * v + b]++;
  }
  const double n = static_cast<double>(text.size() - 2);
  double h = 0;
  for (size_t t = 0; t < tri.size(); ++t)
    if (tri[t] > 0) h -= tri[t] / n * std::log(static_cast<double>(tri[t]) / bi[t / v]);
  EXPECT_GT(m.entropy_rate(), 0.3);
  EXPECT_NEAR(h, m.entropy_rate(), 0.01);
  // The floor of a window mixes the first-order entropy of its first prediction with H.
  EXPECT_GT(m.first_order_entropy(), m.entropy_rate());
  EXPECT_NEAR(m.window_floor(1), m.first_order_entropy(), 1e-12);
  EXPECT_NEAR(m.window_floor(64), (m.first_order_entropy() + 63 * m.entropy_rate()) / 64, 1e-12);
}

TEST(MarkovText, GenerationIsDeterministicInTheSeed) {
  const MarkovText& m = MarkovText::builtin();
  EXPECT_EQ(m.generate(1000, 3), m.generate(1000, 3));
  EXPECT_NE(m.generate(1000, 3), m.generate(1000, 4));
}

TEST(MarkovText, RejectsBadInput) {
  test::expect_error([] { MarkovText::from_seed_text("ab"); }, "at least 3 characters");
  test::expect_error([] { MarkovText::builtin().generate(1, 0); }, "at least 2 characters");
  test::expect_error([] { MarkovText::builtin().window_floor(0); }, "context of at least 1");
}

TEST(CharCorpus, SplitsVocabularyAndWindows) {
  CharCorpus c(MarkovText::builtin(), 5000, 1000, 1);
  EXPECT_EQ(c.train().size(), 5000u);
  EXPECT_EQ(c.val().size(), 1000u);
  EXPECT_EQ(c.vocab(), MarkovText::builtin().alphabet());
  EXPECT_EQ(c.decode(c.encode("the loss")), "the loss");
  test::expect_error([&] { c.encode("loss~"); }, "character '~'");
  test::expect_error([&] { c.decode({999}); }, "token id 999");

  std::vector<int64_t> starts = random_window_starts(5000, 16, 8, 42, 3);
  EXPECT_EQ(starts, random_window_starts(5000, 16, 8, 42, 3));
  EXPECT_NE(starts, random_window_starts(5000, 16, 8, 42, 4));
  Tensor x, y;
  char_windows(c.train(), starts, 16, x, y);
  EXPECT_EQ(x.shape(), Shape({8, 16}));
  std::vector<double> xv = x.to_vector(), yv = y.to_vector();
  for (int64_t i = 0; i < 8; ++i)
    for (int64_t t = 0; t < 16; ++t) {
      EXPECT_EQ(xv[i * 16 + t], c.train()[starts[i] + t]);
      EXPECT_EQ(yv[i * 16 + t], c.train()[starts[i] + t + 1]);
    }
  test::expect_error([&] { char_windows(c.train(), {4990}, 16, x, y); }, "outside the 5000 tokens");
}

TEST(Shapes, DeterministicBalancedAndNormalised) {
  ShapesOptions o;
  o.image_size = 16;
  ImageSet a = make_shapes(600, 5, o), b = make_shapes(600, 5, o), c = make_shapes(600, 6, o);
  EXPECT_EQ(a.images.shape(), Shape({600, 3, 16, 16}));
  EXPECT_EQ(a.images.to_vector(), b.images.to_vector());
  EXPECT_NE(a.images.to_vector(), c.images.to_vector());
  std::map<int64_t, int> per_class;
  for (double l : a.labels.to_vector()) per_class[static_cast<int64_t>(l)]++;
  EXPECT_EQ(per_class.size(), 6u);
  for (const auto& [cls, k] : per_class) EXPECT_GT(k, 60) << "class " << cls;
  EXPECT_LT(std::fabs(mean(a.images).item<double>()), 0.3);
  // Every pixel finite, over enough pixels (4M) that an edge case of the noise draw would show.
  ImageSet big = make_shapes(5000, 11, ShapesOptions{16, 6, 0.5});
  for (double v : big.images.to_vector()) ASSERT_TRUE(std::isfinite(v));
  test::expect_error([] { make_shapes(4, 0, ShapesOptions{32, 9, 0.1}); }, "expected 2 to 6 classes, found 9");
  test::expect_error([] { make_shapes(0, 0); }, "at least one image");
}
