// libFuzzer target: the GPT-2 tokenizer. The first input byte picks what the rest is:
//   0: text for a small fixed vocabulary: encode must not crash, its words must concatenate back
//      to the text and decode(encode(text)) must be the text, for any bytes;
//   1: a merges file (vocab.bpe) read with that vocabulary;
//   2: an encoder.json read with those merges.
// Only ft::Error may escape the loader; a round-trip failure traps.
#include <string>
#include <string_view>

#include "fasttrain/error.h"
#include "fasttrain/tokenizer.h"
#include "fuzz_file.h"

namespace {

// A byte token per byte, a few merges (letters, spaces, a multi-byte character, a long-word
// chain) and <|endoftext|>, written in GPT-2's byte alphabet.
struct Toy {
  std::string encoder_path, merges_path;
  ft::data::Gpt2Tokenizer tokenizer;
};

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

const Toy& toy() {
  static const Toy t = [] {
    const std::pair<const char*, const char*> merges[] = {{" ", "t"},   {"h", "e"},       {" t", "he"}, {"a", "a"},
                                                          {"aa", "aa"}, {"\xc3", "\xa9"}, {" ", " "},   {"\n", "\n"}};
    std::string enc = "{", bpe = "#version: 0.2\n";
    int id = 0;
    for (int b = 0; b < 256; ++b)
      enc += quoted(written(std::string(1, static_cast<char>(b)))) + ": " + std::to_string(id++) + ", ";
    for (const auto& [a, b] : merges) {
      enc += quoted(written(std::string(a) + b)) + ": " + std::to_string(id++) + ", ";
      bpe += written(a) + " " + written(b) + "\n";
    }
    enc += "\"<|endoftext|>\": " + std::to_string(id) + "}";
    Toy out{ft::fuzz::write_input("gpt2_toy_encoder", reinterpret_cast<const uint8_t*>(enc.data()), enc.size()),
            ft::fuzz::write_input("gpt2_toy_merges", reinterpret_cast<const uint8_t*>(bpe.data()), bpe.size()),
            {}};
    out.tokenizer = ft::data::Gpt2Tokenizer::from_files(out.encoder_path, out.merges_path);
    return out;
  }();
  return t;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const Toy& t = toy();
  const std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  switch (data[0] % 3) {
    case 0: {
      std::string joined;
      for (std::string_view w : ft::data::gpt2_pretokenize(rest)) joined += w;
      if (joined != rest) __builtin_trap();
      if (t.tokenizer.decode(t.tokenizer.encode(rest)) != rest) __builtin_trap();
      break;
    }
    case 1:
    case 2: {
      const bool merges = data[0] % 3 == 1;
      const std::string path = ft::fuzz::write_input("gpt2_input", data + 1, size - 1);
      try {
        ft::data::Gpt2Tokenizer u = merges ? ft::data::Gpt2Tokenizer::from_files(t.encoder_path, path)
                                           : ft::data::Gpt2Tokenizer::from_files(path, t.merges_path);
        const std::string text = "the \xc3\xa9t\xc3\xa9 aaaaa  \n\n x";
        if (u.decode(u.encode(text)) != text) __builtin_trap();
      } catch (const ft::Error&) {
      }
      break;
    }
  }
  return 0;
}
