// Small GPT-2 vocabularies written by tests: encoder.json and vocab.bpe in GPT-2's formats, with
// the 256 byte tokens, one token per new merge result and <|endoftext|>.
#pragma once
#include <fstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "fasttrain/tokenizer.h"

namespace ft::test {

inline std::string utf8(char32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

// A token's bytes written in GPT-2's byte alphabet, as encoder.json and vocab.bpe write them.
inline std::string gpt2_written(std::string_view bytes) {
  std::string s;
  for (unsigned char b : bytes) s += utf8(data::gpt2_byte_to_unicode()[b]);
  return s;
}

// Ids 0-255 are the bytes in byte order, then each merge result not seen before, then
// <|endoftext|>. `merges` are (left, right) as bytes, highest priority first.
inline void write_toy_gpt2_vocab(const std::string& encoder_path, const std::string& merges_path,
                                 const std::vector<std::pair<std::string, std::string>>& merges) {
  nlohmann::json enc = nlohmann::json::object();
  int id = 0;
  for (int b = 0; b < 256; ++b) enc[gpt2_written(std::string(1, static_cast<char>(b)))] = id++;
  std::string bpe = "#version: 0.2\n";
  for (const auto& [a, b] : merges) {
    if (!enc.contains(gpt2_written(a + b))) enc[gpt2_written(a + b)] = id++;
    bpe += gpt2_written(a) + " " + gpt2_written(b) + "\n";
  }
  enc["<|endoftext|>"] = id++;
  std::ofstream(encoder_path, std::ios::binary) << enc.dump();
  std::ofstream(merges_path, std::ios::binary) << bpe;
}

}  // namespace ft::test
