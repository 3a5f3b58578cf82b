// GPT-2's byte-level BPE tokenizer, read from the files OpenAI published (encoder.json and
// vocab.bpe; Hugging Face's vocab.json and merges.txt hold the same) and giving the same token ids
// as GPT-2's own encoder.
//
// How GPT-2 tokenises: the text's bytes are written as printable characters (bytes_to_unicode: a
// fixed bijection of the 256 byte values onto 256 code points, so tokens never hold raw control
// bytes or spaces); the text is cut into words by the pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// and each word, starting as one symbol per byte, is merged pair by pair: the adjacent pair whose
// merge comes first in vocab.bpe is merged everywhere in the word (left to right), until no
// adjacent pair is listed. The final symbols' ids come from encoder.json.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ft::data {

// bytes_to_unicode: the code point GPT-2 writes byte b as. Printable Latin-1 bytes (! to ~, ¡ to ¬,
// ® to ÿ) stand for themselves; the other 68 bytes take U+0100, U+0101, ... in byte order (the
// space byte is U+0120 'Ġ', the newline U+010A 'Ċ').
const std::array<char32_t, 256>& gpt2_byte_to_unicode();

// The words GPT-2's pattern cuts `text` into, as views into it, in order; they concatenate back to
// `text`. Works over UTF-8 code points with the pattern's Unicode classes (\p{L} letters, \p{N}
// numbers, \s = Unicode White_Space, as in Python's `regex` module that GPT-2 ran it with). A byte
// that does not start a valid UTF-8 sequence is one character of class "other" (neither letter,
// number nor space), as U+FFFD would be, so any bytes are tokenised and decode back unchanged.
std::vector<std::string_view> gpt2_pretokenize(std::string_view text);

class Gpt2Tokenizer {
 public:
  // An empty tokenizer (vocab_size() 0); encode and decode on it are errors. Copies are cheap and
  // share the loaded tables.
  Gpt2Tokenizer() = default;

  // Reads the vocabulary (a JSON object token -> id; tokens written with bytes_to_unicode) and the
  // merges (one "left right" pair per line, in priority order; a first line starting with
  // "#version" is skipped). Errors are ft::Error naming the file and what was expected and found:
  // a missing file, malformed JSON, ids other than 0..N-1 for N tokens (each once), a byte
  // without its single-byte token, no "<|endoftext|>", a merge line that is not two tokens, a
  // merge whose parts or result are not in the vocabulary, a merge listed twice.
  static Gpt2Tokenizer from_files(const std::string& encoder_path, const std::string& merges_path);

  // Token ids of `text` (any bytes; no special tokens: "<|endoftext|>" in the text is ordinary
  // text). Thread-safe: a per-thread cache remembers the ids of words seen before.
  std::vector<int32_t> encode(std::string_view text) const;
  // The same, appended to `out`.
  void encode(std::string_view text, std::vector<int32_t>& out) const;
  // The bytes the ids stand for; an id outside the vocabulary is an ft::Error.
  std::string decode(std::span<const int32_t> ids) const;
  // The bytes of one token (empty for an id no token has).
  std::string_view token_bytes(int32_t id) const;

  int64_t vocab_size() const;  // number of tokens, ids 0..vocab_size()-1 (50257 for GPT-2)
  int32_t eot_token() const;   // id of "<|endoftext|>" (50256 for GPT-2)
  int64_t merges() const;      // number of merge rules (50000 for GPT-2)

  struct Impl;

 private:
  explicit Gpt2Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

}  // namespace ft::data
