// Generation with a key/value cache (kv_cache.h, generation.h), for GPT and a grouped-query Llama:
// the cached logits of every position equal the full forward's, past a slide of the window too;
// generated tokens equal those of the uncached loop `fasttrain sample` ran before the cache
// (written out below as the reference); temperature, top-k and top-p equal Hugging Face's warpers
// written out in PyTorch (tests/support/hf_sampling.py); generation stops at the end-of-text
// token; bad options and misused caches are refused with messages naming what was expected.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "fasttrain/fasttrain.h"
#include "support/expect_error.h"
#include "support/torch_scripts.h"
#include "support/trainer_configs.h"

using namespace ft;
namespace fs = std::filesystem;
using test::expect_error;

namespace {

constexpr int64_t kVocab = 50;  // GPT pads it to 64: the cached head must skip the padding as forward does
constexpr int64_t kContext = 12;
// f32 logits of order 1: the cached step attends over the same keys in another order of sums.
constexpr test::Tolerance kTight{2e-5, 1e-5};

// Every parameter redrawn larger than the models' N(0, 0.02) initialisation, so that logits are of
// order 1 and a wrong position, rotation or cache row changes them far beyond the tolerance.
void spread_weights(nn::Module& m, uint64_t seed) {
  Generator gen(seed);
  autograd::NoGradGuard ng;
  for (Tensor p : m.parameters()) nn::init::normal_(p, 0.0, p.dim() == 1 ? 0.5 : 0.3, &gen);
}

std::shared_ptr<nn::CausalDecoder> make_gpt() {
  nn::GPTConfig c;
  c.vocab_size = kVocab, c.context = kContext, c.layers = 2, c.dim = 32, c.heads = 4;
  auto m = std::make_shared<nn::GPT>(c);
  spread_weights(*m, 1);
  m->eval();
  return m;
}

// Grouped-query attention: 4 query heads share 2 key/value heads; an untied head.
std::shared_ptr<nn::CausalDecoder> make_llama() {
  nn::LlamaConfig c;
  c.vocab_size = kVocab, c.context = kContext, c.layers = 2, c.dim = 32, c.heads = 4, c.kv_heads = 2;
  c.ffn_dim = 48, c.tie_embeddings = false;
  auto m = std::make_shared<nn::Llama>(c);
  spread_weights(*m, 2);
  m->eval();
  return m;
}

struct ModelCase {
  const char* name;
  std::function<std::shared_ptr<nn::CausalDecoder>()> make;
};

std::string case_name(const ::testing::TestParamInfo<ModelCase>& info) { return info.param.name; }
void PrintTo(const ModelCase& c, std::ostream* os) { *os << c.name; }

Tensor ids_tensor(const std::vector<int64_t>& ids, int64_t begin, int64_t end) {
  return from_vector(std::vector<double>(ids.begin() + begin, ids.begin() + end), {1, end - begin}, DType::I64);
}

std::vector<int64_t> random_ids(int64_t n, uint64_t seed) {
  Generator gen(seed);
  std::vector<int64_t> ids;
  for (double x : randint(0, kVocab, {n}, DType::I64, &gen).to_vector()) ids.push_back(static_cast<int64_t>(x));
  return ids;
}

// The logits forward gives for the last id of ids[begin, end): what the uncached loop read.
Tensor full_forward_last(nn::CausalDecoder& m, const std::vector<int64_t>& ids, int64_t begin, int64_t end) {
  autograd::InferenceMode guard;
  return m(ids_tensor(ids, begin, end)).select(0, 0).select(0, end - begin - 1);
}

void expect_equal_logits(const Tensor& actual, const Tensor& expected, const std::string& what) {
  const std::string msg = test::compare(actual, expected, kTight);
  EXPECT_TRUE(msg.empty()) << what << ": " << msg;
}

// `fasttrain sample` before the cache: the whole window (the last `window` ids) runs for every
// token, and the token is picked as it was picked there: argmax, or a softmax at the temperature
// over the top k and one uniform draw per token. The reference the cached generation must equal.
std::vector<int64_t> uncached_sample(nn::CausalDecoder& model, std::vector<int64_t> ids, int64_t tokens, int64_t window,
                                     double temperature, int64_t top_k, uint64_t seed) {
  autograd::InferenceMode guard;
  const int64_t V = model.vocab_size();
  std::vector<int64_t> out;
  std::vector<double> p(V);
  for (int64_t i = 0; i < tokens; ++i) {
    const int64_t t = std::min<int64_t>(window, static_cast<int64_t>(ids.size()));
    std::vector<double> row = full_forward_last(model, ids, ids.size() - t, ids.size()).to_vector();
    int64_t next = 0;
    if (temperature == 0) {
      next = std::max_element(row.begin(), row.end()) - row.begin();
    } else {
      double cutoff = -INFINITY;
      if (top_k > 0) {
        std::vector<double> sorted = row;
        std::nth_element(sorted.begin(), sorted.begin() + (top_k - 1), sorted.end(), std::greater<>());
        cutoff = sorted[top_k - 1];
      }
      const double mx = *std::max_element(row.begin(), row.end());
      double total = 0;
      for (int64_t k = 0; k < V; ++k) total += p[k] = row[k] >= cutoff ? std::exp((row[k] - mx) / temperature) : 0.0;
      double u = uniform_from_word(philox4x32(seed, static_cast<uint64_t>(i)).v[0]) * total;
      for (int64_t k = 0; k < V; ++k)
        if (p[k] > 0) {
          next = k;
          if ((u -= p[k]) < 0) break;
        }
    }
    ids.push_back(next);
    out.push_back(next);
  }
  return out;
}

class Cached : public ::testing::TestWithParam<ModelCase> {};

// Prefill, then one token at a time up to the context: every row equals the full forward's.
TEST_P(Cached, LogitsOfEveryPositionEqualTheFullForward) {
  auto model = GetParam().make();
  const std::vector<int64_t> ids = random_ids(kContext, 11);
  nn::KvCache cache = model->make_cache();
  EXPECT_EQ(cache.capacity(), kContext);
  const int64_t prompt = 5;
  const Tensor prefill = model->forward_cached(ids_tensor(ids, 0, prompt), cache);
  EXPECT_EQ(cache.length(), prompt);
  {
    autograd::InferenceMode guard;
    expect_equal_logits(prefill, (*model)(ids_tensor(ids, 0, prompt)), "prefill");
  }
  for (int64_t n = prompt + 1; n <= kContext; ++n) {
    const Tensor row = model->forward_cached(ids_tensor(ids, n - 1, n), cache).select(0, 0).select(0, 0);
    expect_equal_logits(row, full_forward_last(*model, ids, 0, n), "position " + std::to_string(n - 1));
    // The cache matters: the token alone gives other logits (so the comparison above would see a
    // cache row that is wrong or not read).
    const Tensor at_start = full_forward_last(*model, ids, n - 1, n);
    EXPECT_GT(max(abs(row - at_start)).item<double>(), 1e-2) << "position " << n - 1;
  }
  EXPECT_EQ(cache.length(), kContext);
  expect_error([&] { model->forward_cached(ids_tensor(ids, 0, 1), cache); },
               "slide the window: clear the cache and run the last tokens again");
  // clear() starts again in the same buffers.
  cache.clear();
  expect_equal_logits(model->forward_cached(ids_tensor(ids, 3, 4), cache).select(0, 0).select(0, 0),
                      full_forward_last(*model, ids, 3, 4), "after clear");
}

// A prompt fed in chunks (several new positions after cached ones: each row attends over its own
// prefix) and a batch of two sequences.
TEST_P(Cached, ChunksAndBatchesEqualTheFullForward) {
  auto model = GetParam().make();
  const std::vector<int64_t> ids = random_ids(kContext, 12);
  nn::KvCache cache = model->make_cache(1, 10);
  model->forward_cached(ids_tensor(ids, 0, 3), cache);
  const Tensor chunk = model->forward_cached(ids_tensor(ids, 3, 7), cache);
  const Tensor last = model->forward_cached(ids_tensor(ids, 7, 8), cache);
  autograd::InferenceMode guard;
  const Tensor full = (*model)(ids_tensor(ids, 0, 8));
  expect_equal_logits(chunk, full.narrow(1, 3, 4), "chunk of 4 after 3");
  expect_equal_logits(last, full.narrow(1, 7, 1), "token after the chunk");

  const std::vector<int64_t> other = random_ids(kContext, 13);
  std::vector<double> both(ids.begin(), ids.begin() + 6);
  both.insert(both.end(), other.begin(), other.begin() + 6);
  const Tensor pair = from_vector(both, {2, 6}, DType::I64);
  nn::KvCache batch = model->make_cache(2);
  EXPECT_EQ(batch.batch(), 2);
  const Tensor first = model->forward_cached(pair.narrow(1, 0, 4), batch);
  const Tensor next = model->forward_cached(pair.narrow(1, 4, 1), batch);
  const Tensor then = model->forward_cached(pair.narrow(1, 5, 1), batch);
  const Tensor reference = (*model)(pair);
  expect_equal_logits(first, reference.narrow(1, 0, 4), "batch prefill");
  expect_equal_logits(next, reference.narrow(1, 4, 1), "batch position 4");
  expect_equal_logits(then, reference.narrow(1, 5, 1), "batch position 5");
}

// generate()'s logits for every token, with a window smaller than the context and a prompt longer
// than it, past several slides: each row equals the full forward of the window the token was
// predicted from. That window is followed here as generation.h defines it: the last `window` ids
// for the prefill; one id more per token while the cache has room; when it is full, the last
// `keep` ids (the new one included) run again.
TEST_P(Cached, GeneratedLogitsEqualTheFullForwardPastTheSlide) {
  auto model = GetParam().make();
  const std::vector<int64_t> prompt = random_ids(10, 14);
  const int64_t window = 8;
  for (int64_t keep : {0, 3, 8}) {
    for (double temperature : {0.0, 1.0}) {
      SCOPED_TRACE("keep " + std::to_string(keep) + ", temperature " + std::to_string(temperature));
      nn::GenerationOptions o;
      o.max_new_tokens = 25;
      o.window = window;
      o.slide_keep = keep;
      o.sampling.temperature = temperature;
      o.seed = 5;
      o.output_logits = true;
      const nn::GenerationOutput g = nn::generate(*model, prompt, o);
      ASSERT_EQ(g.tokens.size(), 25u);
      ASSERT_EQ(g.logits.size(), 25u);
      std::vector<int64_t> ids = prompt;
      const int64_t kept = keep > 0 ? keep : window;
      int64_t cached = std::min<int64_t>(window, ids.size()), start = ids.size() - cached, slides = 0;
      for (size_t i = 0; i < g.tokens.size(); ++i) {
        if (i > 0) {
          ids.push_back(g.tokens[i - 1]);
          if (cached < window) {
            ++cached;
          } else {
            start = static_cast<int64_t>(ids.size()) - kept;
            cached = kept;
            ++slides;
          }
        }
        expect_equal_logits(from_vector(g.logits[i], {kVocab}), full_forward_last(*model, ids, start, ids.size()),
                            "token " + std::to_string(i));
      }
      EXPECT_GE(slides, 3);
    }
  }
}

// Greedy and sampled (temperature, top-k) tokens equal the uncached loop's, past the context.
TEST_P(Cached, TokensEqualTheUncachedLoop) {
  auto model = GetParam().make();
  const std::vector<int64_t> prompt = random_ids(4, 15);
  struct Sampling {
    double temperature;
    int64_t top_k;
  };
  for (Sampling s : {Sampling{0, 0}, Sampling{1.0, 0}, Sampling{0.7, 5}}) {
    SCOPED_TRACE("temperature " + std::to_string(s.temperature) + ", top_k " + std::to_string(s.top_k));
    nn::GenerationOptions o;
    o.max_new_tokens = 3 * kContext;
    o.sampling.temperature = s.temperature;
    o.sampling.top_k = s.top_k;
    o.seed = 9;
    const std::vector<int64_t> expected =
        uncached_sample(*model, prompt, o.max_new_tokens, kContext, s.temperature, s.top_k, o.seed);
    EXPECT_EQ(nn::generate(*model, prompt, o).tokens, expected);
  }
}

// Generation stops once the end-of-text token comes, which is returned.
TEST_P(Cached, StopsAtTheEndOfTextToken) {
  auto model = GetParam().make();
  const std::vector<int64_t> prompt = random_ids(3, 16);
  nn::GenerationOptions o;
  o.max_new_tokens = 20;
  o.seed = 3;
  const std::vector<int64_t> all = nn::generate(*model, prompt, o).tokens;
  ASSERT_EQ(all.size(), 20u);
  // The first token (after the first) that had not come before.
  size_t j = 1;
  while (j < all.size() && std::find(all.begin(), all.begin() + j, all[j]) != all.begin() + j) ++j;
  ASSERT_LT(j, all.size()) << "sampling repeated one token";
  o.eos_token = all[j];
  EXPECT_EQ(nn::generate(*model, prompt, o).tokens, std::vector<int64_t>(all.begin(), all.begin() + j + 1));
}

INSTANTIATE_TEST_SUITE_P(Models, Cached,
                         ::testing::Values(ModelCase{"Gpt", make_gpt}, ModelCase{"LlamaGqa", make_llama}), case_name);

// The Llama cache holds its kv_heads heads of head_size, never repeated to the query heads.
TEST(KvCache, HoldsTheKeyValueHeadsOnly) {
  auto llama = make_llama();
  const nn::KvCache cache = llama->make_cache(1, 7);
  EXPECT_EQ(cache.layers(), 2);
  EXPECT_EQ(cache.kv_heads(), 2);
  EXPECT_EQ(cache.head_dim(), 8);
  EXPECT_EQ(cache.capacity(), 7);
  EXPECT_EQ(cache.keys(0).shape(), Shape({1, 2, 0, 8}));
  EXPECT_EQ(cache.options().dtype, DType::F32);
  EXPECT_EQ(make_gpt()->make_cache().kv_heads(), 4);
}

// A cache kept in bf16 for an f32 model (half the memory): the logits are those of the f32 model
// to bf16's precision.
TEST(KvCache, Bf16CacheOfAnF32Model) {
  auto llama = make_llama();
  nn::KvCache cache = llama->make_cache(1, 0, DType::BF16);
  EXPECT_EQ(cache.options().dtype, DType::BF16);
  const std::vector<int64_t> ids = random_ids(8, 17);
  llama->forward_cached(ids_tensor(ids, 0, 4), cache);
  for (int64_t n = 5; n <= 8; ++n) {
    const Tensor row = llama->forward_cached(ids_tensor(ids, n - 1, n), cache).select(0, 0).select(0, 0);
    EXPECT_EQ(row.dtype(), DType::F32);
    const std::string msg = test::compare(row, full_forward_last(*llama, ids, 0, n), {0.1, 0.05});
    EXPECT_TRUE(msg.empty()) << "position " << n - 1 << ": " << msg;
  }
}

TEST(KvCache, MisuseIsRefused) {
  auto gpt = make_gpt();
  auto llama = make_llama();
  const Tensor two = from_vector({1, 2}, {1, 2}, DType::I64);
  nn::KvCache gpt_cache = gpt->make_cache(1, 4);
  expect_error([&] { llama->forward_cached(two, gpt_cache); },
               "Llama::forward_cached: expected a cache of 2 layers of 2 key/value heads of size 8 (make_cache), "
               "found 2 layers of 4 heads of size 8");
  nn::KvCache pair = gpt->make_cache(2);
  expect_error([&] { gpt->forward_cached(two, pair); }, "GPT::forward_cached: the cache holds 2 sequences, the ids 1");
  gpt->forward_cached(two, gpt_cache);
  gpt->forward_cached(two, gpt_cache);
  expect_error([&] { gpt->forward_cached(two, gpt_cache); },
               "GPT::forward_cached: 2 tokens after the cache's 4 pass its capacity (4) or the model's context (12)");
  EXPECT_EQ(gpt_cache.length(), 4) << "a refused forward moved the cache";
  expect_error([&] { gpt->make_cache(1, kContext + 1); },
               "GPT::make_cache: expected a capacity of at most the 12 positions the model has, found 13");
  gpt_cache.clear();
  expect_error(
      [&] {
        gpt->forward_cached(from_vector({0.5}, {1, 1}), gpt_cache);
      },
      "GPT: token ids must be an integer tensor, found f32");
  expect_error(
      [&] {
        gpt->forward_cached(from_vector({60}, {1, 1}, DType::I64), gpt_cache);
      },
      "GPT: token id 60 is out of range for a vocabulary of 50");
  expect_error([&] { nn::KvCache(1, 1, 2, 0, 8); },
               "KvCache: layers, batch, kv_heads, capacity and head_dim must be positive");
  expect_error([&] { nn::KvCache(1, 1, 2, 4, 8, DType::I64); }, "KvCache: expected a floating dtype, found i64");
  nn::KvCache c(1, 1, 2, 4, 8);
  expect_error(
      [&] {
        c.store(0, zeros({1, 4, 1, 8}), zeros({1, 4, 1, 8}));
      },
      "KvCache::store: expected keys and values [1, 2, T, 8], found [1, 4, 1, 8]");
  expect_error(
      [&] {
        c.store(1, zeros({1, 2, 1, 8}), zeros({1, 2, 1, 8}));
      },
      "KvCache: expected a layer in [0, 1), found 1");
  expect_error(
      [&] {
        c.store(0, zeros({1, 2, 5, 8}), zeros({1, 2, 5, 8}));
      },
      "KvCache: 5 positions after the 0 it holds pass its capacity of 4");
}

// ---------------------------------------------------------------- sampling

std::vector<double> softmax(const std::vector<double>& s) {
  const double top = *std::max_element(s.begin(), s.end());
  std::vector<double> p;
  double z = 0;
  for (double x : s) z += std::exp(x - top);
  for (double x : s) p.push_back(std::exp(x - top) / z);
  return p;
}

std::vector<bool> kept(const std::vector<double>& filtered) {
  std::vector<bool> k;
  for (double x : filtered) k.push_back(x > -INFINITY);
  return k;
}

TEST(Sampling, FiltersKeepWhatTheirDefinitionsSay) {
  // Probabilities 0.5, 0.3, 0.15, 0.05 (in another order, so that id order is not rank order).
  const std::vector<double> logits = {std::log(0.15), std::log(0.5), std::log(0.05), std::log(0.3)};
  using K = std::vector<bool>;
  EXPECT_EQ(kept(nn::filter_logits(logits, 1, 0, 1)), K({true, true, true, true}));
  EXPECT_EQ(kept(nn::filter_logits(logits, 1, 2, 1)), K({false, true, false, true}));
  EXPECT_EQ(kept(nn::filter_logits(logits, 1, 4, 1)), K({true, true, true, true}));
  // top-p: the most likely tokens until their probability reaches p.
  EXPECT_EQ(kept(nn::filter_logits(logits, 1, 0, 0.4)), K({false, true, false, false}));
  EXPECT_EQ(kept(nn::filter_logits(logits, 1, 0, 0.75)), K({false, true, false, true}));
  EXPECT_EQ(kept(nn::filter_logits(logits, 1, 0, 0.85)), K({true, true, false, true}));
  EXPECT_EQ(kept(nn::filter_logits(logits, 1, 0, 0.99)), K({true, true, true, true}));
  // The most likely token always stays, however small p.
  EXPECT_EQ(kept(nn::filter_logits(logits, 1, 0, 1e-9)), K({false, true, false, false}));
  // top-p after top-k: the probabilities renormalised over the two kept (0.625, 0.375).
  EXPECT_EQ(kept(nn::filter_logits(logits, 1, 2, 0.6)), K({false, true, false, false}));
  EXPECT_EQ(kept(nn::filter_logits(logits, 1, 2, 0.65)), K({false, true, false, true}));
  // top-p after temperature: at 2 the probabilities flatten (about 0.40, 0.31, 0.22, 0.07).
  EXPECT_EQ(kept(nn::filter_logits(logits, 2, 0, 0.75)), K({true, true, false, true}));
  // The temperature divides the kept logits.
  const std::vector<double> t = nn::filter_logits(logits, 2, 0, 1);
  for (size_t i = 0; i < logits.size(); ++i) EXPECT_DOUBLE_EQ(t[i], logits[i] / 2);
  // Ties with the last token kept stay (top-k as Hugging Face's; top-p so that the result does not
  // depend on the order of the vocabulary).
  const std::vector<double> tied = {1, 3, 3, 0};
  EXPECT_EQ(kept(nn::filter_logits(tied, 1, 1, 1)), K({false, true, true, false}));
  EXPECT_EQ(kept(nn::filter_logits(tied, 1, 0, 0.2)), K({false, true, true, false}));
}

TEST(Sampling, ChoosesByTheCumulativeDistributionInIdOrder) {
  const std::vector<double> logits = {std::log(0.15), std::log(0.5), std::log(0.05), std::log(0.3)};
  nn::SamplingOptions greedy{0, 0, 1};
  EXPECT_EQ(nn::choose_token(logits, greedy, 0.99), 1);
  EXPECT_EQ(nn::choose_token(std::vector<double>{1, 4, 4}, greedy, 0), 1);  // the first of equals
  nn::SamplingOptions all{1, 0, 1};
  // Cumulative in id order: 0.15, 0.65, 0.70, 1.
  EXPECT_EQ(nn::choose_token(logits, all, 0.0), 0);
  EXPECT_EQ(nn::choose_token(logits, all, 0.149), 0);
  EXPECT_EQ(nn::choose_token(logits, all, 0.151), 1);
  EXPECT_EQ(nn::choose_token(logits, all, 0.68), 2);
  EXPECT_EQ(nn::choose_token(logits, all, 0.71), 3);
  EXPECT_EQ(nn::choose_token(logits, all, 0.9999999), 3);
  // Among the nucleus of p = 0.75 (ids 1 and 3: 0.625, 0.375 after renormalising).
  nn::SamplingOptions nucleus{1, 0, 0.75};
  EXPECT_EQ(nn::choose_token(logits, nucleus, 0.0), 1);
  EXPECT_EQ(nn::choose_token(logits, nucleus, 0.62), 1);
  EXPECT_EQ(nn::choose_token(logits, nucleus, 0.63), 3);
}

// filter_logits and choose_token against Hugging Face's warpers and an inverse-CDF draw written in
// PyTorch, on random logits with every combination of the filters.
TEST(Sampling, MatchesHuggingFaceWarpersInTorch) {
  const fs::path dir = test::scratch_dir("ft_generation", "hf_sampling");
  fs::create_directories(dir);
  const int64_t V = 300;
  Generator gen(21);
  std::vector<double> temperature, top_p, u, top_k;
  for (double t : {0.3, 1.0, 1.7})
    for (int64_t k : {0, 1, 7, 40, 300})
      for (double p : {1.0, 0.9, 0.5, 0.05})
        for (int draw = 0; draw < 2; ++draw) {
          temperature.push_back(t), top_k.push_back(static_cast<double>(k)), top_p.push_back(p);
          u.push_back(rand({1}, {}, &gen).item<double>());
        }
  const auto N = static_cast<int64_t>(u.size());
  // Logits of a trained model's spread: a few likely tokens, a long tail.
  const Tensor logits = mul(randn({N, V}, DType::F64, &gen), 3.0);
  const Tensor t_temperature = from_vector(temperature, {N}, DType::F64), t_top_k = from_vector(top_k, {N}, DType::I64);
  save_safetensors((dir / "in.safetensors").string(), {{"logits", logits},
                                                       {"temperature", t_temperature},
                                                       {"top_k", t_top_k},
                                                       {"top_p", from_vector(top_p, {N}, DType::F64)},
                                                       {"u", from_vector(u, {N}, DType::F64)}});
  const int rc = test::run_torch_script("hf_sampling.py",
                                        (dir / "in.safetensors").string() + " " + (dir / "out.safetensors").string());
  if (rc == test::kNoTorch) {
    fs::remove_all(dir);
    GTEST_SKIP() << "python3-torch not installed: sampling not compared with Hugging Face's warpers in PyTorch";
  }
  ASSERT_EQ(rc, 0) << "tests/support/hf_sampling.py failed";
  const TensorMap ref = load_safetensors((dir / "out.safetensors").string()).tensors;
  const Tensor filtered = test::named(ref, "filtered");
  const std::vector<double> tokens = test::named(ref, "token").to_vector();
  int64_t nucleus_removed = 0;
  for (int64_t i = 0; i < N; ++i) {
    SCOPED_TRACE("case " + std::to_string(i) + ": temperature " + std::to_string(temperature[i]) + ", top_k " +
                 std::to_string(top_k[i]) + ", top_p " + std::to_string(top_p[i]));
    const std::vector<double> row = logits.select(0, i).to_vector();
    const std::vector<double> expected = filtered.select(0, i).to_vector();
    const std::vector<double> ours = nn::filter_logits(row, temperature[i], static_cast<int64_t>(top_k[i]), top_p[i]);
    ASSERT_EQ(kept(ours), kept(expected));
    for (int64_t j = 0; j < V; ++j) {
      if (expected[j] > -INFINITY) EXPECT_NEAR(ours[j], expected[j], 1e-12);
    }
    if (top_p[i] < 1 && std::count(expected.begin(), expected.end(), -INFINITY) >
                            (top_k[i] > 0 ? V - static_cast<int64_t>(top_k[i]) : 0))
      ++nucleus_removed;
    const nn::SamplingOptions o{temperature[i], static_cast<int64_t>(top_k[i]), top_p[i]};
    EXPECT_EQ(nn::choose_token(row, o, u[i]), static_cast<int64_t>(tokens[i]));
  }
  // The cases exercise the nucleus: in most of those with p < 1 it removed tokens top-k left.
  EXPECT_GT(nucleus_removed, N / 3);
  fs::remove_all(dir);
}

TEST(Sampling, BadOptionsAreRefused) {
  const std::vector<double> row = {1, 2, 3};
  expect_error([&] { nn::filter_logits(row, 1, 0, 0); }, "filter_logits: expected top_p in (0, 1], found 0");
  expect_error([&] { nn::filter_logits(row, 1, 0, 1.5); }, "filter_logits: expected top_p in (0, 1], found 1.5");
  expect_error([&] { nn::filter_logits(row, 1, 0, NAN); }, "filter_logits: expected top_p in (0, 1], found nan");
  expect_error([&] { nn::filter_logits(row, 1, 4, 1); },
               "filter_logits: expected top_k in [0, 3] (the vocabulary size), found 4");
  expect_error([&] { nn::filter_logits(row, 1, -1, 1); }, "expected top_k in [0, 3]");
  expect_error([&] { nn::filter_logits(row, -1, 0, 1); },
               "filter_logits: expected a finite temperature >= 0, found -1");
  expect_error([&] { nn::filter_logits(row, 0, 0, 1); },
               "filter_logits: expected a temperature > 0 (0 is greedy: no filtering), found 0");
  expect_error([&] { nn::filter_logits({}, 1, 0, 1); }, "filter_logits: expected logits for at least one token");
  expect_error(
      [&] {
        nn::choose_token(row, {1, 0, 1}, 1.0);
      },
      "choose_token: expected a uniform draw in [0, 1), found 1");

  auto gpt = make_gpt();
  const std::vector<int64_t> prompt = {1, 2};
  auto refused = [&](const std::function<void(nn::GenerationOptions&)>& set, const std::string& message) {
    nn::GenerationOptions o;
    set(o);
    expect_error([&] { nn::generate(*gpt, prompt, o); }, message);
  };
  refused([](auto& o) { o.sampling.top_p = 0; }, "sampling: expected top_p in (0, 1], found 0");
  refused([](auto& o) { o.sampling.top_k = 51; },
          "sampling: expected top_k in [0, 50] (the vocabulary size), found 51");
  refused([](auto& o) { o.sampling.temperature = INFINITY; },
          "sampling: expected a finite temperature >= 0, found inf");
  refused([](auto& o) { o.max_new_tokens = -1; }, "generate: expected max_new_tokens >= 0, found -1");
  refused([](auto& o) { o.eos_token = 50; }, "generate: expected eos_token in [-1, 50), found 50");
  refused([](auto& o) { o.window = 13; }, "generate: expected a window in [0, 12] (0: the model's context), found 13");
  refused(
      [](auto& o) {
        o.window = 6;
        o.slide_keep = 7;
      },
      "generate: expected slide_keep in [0, 6] (the window; 0: all of it), found 7");
  nn::GenerationOptions o;
  expect_error([&] { nn::generate(*gpt, {}, o); }, "generate: the prompt must hold at least one token");
  expect_error([&] { nn::generate(*gpt, {3, 50}, o); }, "generate: expected prompt ids in [0, 50), found 50");
  o.max_new_tokens = 0;
  EXPECT_TRUE(nn::generate(*gpt, prompt, o).tokens.empty());
}

}  // namespace
