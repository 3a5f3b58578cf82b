// libFuzzer target: the Hugging Face tokenizer.json tokenizer (JsonTokenizer). The first input
// byte picks what the rest is:
//   0: text for a fixed small tokenizer.json (Llama 3's Split regex, added tokens, ignore_merges):
//      encode must not crash and decode(encode(text)) must be the text, for any bytes;
//   1: text for a second one whose pre-tokeniser cuts with every Split behaviour, invert, Digits and
//      a prefix space, and whose added tokens strip whitespace: encode and decode must not crash;
//   2: a tokenizer.json: only ft::Error may escape the loader, and what loads must encode and
//      decode a fixed text.
#include <string>
#include <string_view>

#include "fasttrain/error.h"
#include "fasttrain/tokenizer.h"
#include "fuzz_file.h"

namespace {

std::string written(std::string_view bytes) {
  std::string s;
  for (unsigned char b : bytes) {
    const char32_t c = ft::data::gpt2_byte_to_unicode()[b];
    if (c < 0x80) {
      s += static_cast<char>(c);
    } else {
      s += static_cast<char>(0xC0 | (c >> 6));
      s += static_cast<char>(0x80 | (c & 0x3F));
    }
  }
  return s;
}

std::string quoted(const std::string& s) {
  std::string q = "\"";
  for (char c : s) q += (c == '"' || c == '\\') ? std::string("\\") + c : std::string(1, c);
  return q + "\"";
}

// A byte token per byte, a few merges, two whole-word tokens (ignore_merges), then `rest` of the
// file (added tokens, pre-tokeniser, ...).
ft::data::JsonTokenizer toy(const char* tag, const std::string& rest) {
  const std::pair<const char*, const char*> merges[] = {{" ", "t"},   {"h", "e"},       {" t", "he"}, {"a", "a"},
                                                        {"aa", "aa"}, {"\xc3", "\xa9"}, {" ", " "},   {"\n", "\n"}};
  std::string vocab = "{", list;
  int id = 0;
  for (int b = 0; b < 256; ++b)
    vocab += quoted(written(std::string(1, static_cast<char>(b)))) + ": " + std::to_string(id++) + ", ";
  for (const auto& [a, b] : merges) {
    vocab += quoted(written(std::string(a) + b)) + ": " + std::to_string(id++) + ", ";
    list += std::string(list.empty() ? "" : ", ") + quoted(written(a) + " " + written(b));
  }
  vocab += quoted(written("word")) + ": " + std::to_string(id) + ", ";
  vocab += quoted(written(" 123")) + ": " + std::to_string(id + 1) + "}";
  const std::string file = "{\"model\": {\"type\": \"BPE\", \"ignore_merges\": true, \"vocab\": " + vocab +
                           ", \"merges\": [" + list + "]}, \"decoder\": {\"type\": \"ByteLevel\"}, " + rest + "}";
  return ft::data::JsonTokenizer::from_file(
      ft::fuzz::write_input(tag, reinterpret_cast<const uint8_t*>(file.data()), file.size()));
}

const ft::data::JsonTokenizer& lossless() {
  static const ft::data::JsonTokenizer t =
      toy("json_toy_lossless",
          R"("added_tokens": [{"id": 300, "content": "<|end|>", "special": true, "normalized": false},
          {"id": 301, "content": "<x>", "special": false, "normalized": true}],
         "pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex":
           "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
           "behavior": "Isolated", "invert": false}, {"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}]})");
  return t;
}

const ft::data::JsonTokenizer& lossy() {
  static const ft::data::JsonTokenizer t =
      toy("json_toy_lossy",
          R"("added_tokens": [{"id": 300, "content": "<m>", "lstrip": true, "rstrip": true, "normalized": false},
          {"id": 301, "content": "a", "lstrip": true, "normalized": true}],
         "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
           {"type": "Split", "pattern": {"String": "-"}, "behavior": "MergedWithNext", "invert": false},
           {"type": "Split", "pattern": {"Regex": "\\s+"}, "behavior": "MergedWithPrevious", "invert": true},
           {"type": "Split", "pattern": {"Regex": "x*"}, "behavior": "Contiguous", "invert": false},
           {"type": "Digits", "individual_digits": false},
           {"type": "Split", "pattern": {"Regex": "\\p{P}"}, "behavior": "Removed", "invert": false},
           {"type": "ByteLevel", "add_prefix_space": true, "use_regex": true}]})");
  return t;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  switch (data[0] % 3) {
    case 0:
      if (lossless().decode(lossless().encode(rest)) != rest) __builtin_trap();
      break;
    case 1: (void)lossy().decode(lossy().encode(rest)); break;
    case 2: {
      const std::string path = ft::fuzz::write_input("json_input", data + 1, size - 1);
      try {
        const ft::data::JsonTokenizer u = ft::data::JsonTokenizer::from_file(path);
        (void)u.decode(u.encode("the \xc3\xa9t\xc3\xa9 aaaaa  \n\n x 12345 <|end|>", true));
      } catch (const ft::Error&) {
      }
      break;
    }
  }
  return 0;
}
