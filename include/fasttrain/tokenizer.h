// Tokenizers: the interface the engine uses (Tokenizer), GPT-2's byte-level BPE (Gpt2Tokenizer)
// and Hugging Face's tokenizer.json (JsonTokenizer: Llama 3, SmolLM, GPT-2 and other byte-level BPE
// tokenizers).
//
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

// What data preparation, the lm task and `sample` need of a tokenizer, whichever it is.
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Appends the token ids of `text` (any bytes) to `out`, with no begin/end-of-text ids added.
  // Thread-safe.
  virtual void encode(std::string_view text, std::vector<int32_t>& out) const = 0;
  std::vector<int32_t> encode(std::string_view text) const;
  // The bytes the ids stand for; an id outside the vocabulary is an ft::Error.
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  // The bytes of one token (empty for an id no token has).
  virtual std::string_view token_bytes(int32_t id) const = 0;
  // Ids are 0..vocab_size()-1 (some may be unused).
  virtual int64_t vocab_size() const = 0;
  // The ids a document starts and ends with when documents are packed into a token stream; -1 when
  // the tokenizer has none. GPT-2: no begin id, end 50256 ("<|endoftext|>", which llm.c writes
  // before each document); Llama 3: 128000 and 128001.
  virtual int32_t bos_token() const = 0;
  virtual int32_t eos_token() const = 0;
};

class Gpt2Tokenizer : public Tokenizer {
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
  using Tokenizer::encode;
  // The same, appended to `out`.
  void encode(std::string_view text, std::vector<int32_t>& out) const override;
  // The bytes the ids stand for; an id outside the vocabulary is an ft::Error.
  std::string decode(std::span<const int32_t> ids) const override;
  // The bytes of one token (empty for an id no token has).
  std::string_view token_bytes(int32_t id) const override;

  int64_t vocab_size() const override;  // number of tokens, ids 0..vocab_size()-1 (50257 for GPT-2)
  int32_t eot_token() const;            // id of "<|endoftext|>" (50256 for GPT-2)
  int64_t merges() const;               // number of merge rules (50000 for GPT-2)
  int32_t bos_token() const override { return -1; }
  int32_t eos_token() const override { return eot_token(); }

  struct Impl;

 private:
  explicit Gpt2Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

// A tokenizer read from Hugging Face's tokenizer.json (the `tokenizers` library's format), giving
// the ids `tokenizers` gives. Supported, which covers GPT-2, Llama 3, SmolLM and Qwen2-style files:
// - model: "BPE" with vocab, merges ("a b" strings or ["a", "b"] pairs), ignore_merges,
//   byte_fallback and unk_token (never used: the byte-level alphabet covers every byte);
// - pre_tokenizer: "ByteLevel" (add_prefix_space, use_regex), or "Sequence" of "Split" (pattern
//   {"Regex": ...} matched with PCRE2 in UTF + UCP mode, or {"String": ...}; behavior Removed,
//   Isolated, MergedWithPrevious, MergedWithNext or Contiguous; invert) and "Digits"
//   (individual_digits) steps, ending in one "ByteLevel";
// - added_tokens: matched in the text before pre-tokenisation, longest first at the leftmost
//   place, those with normalized false before those with normalized true, honouring lstrip and
//   rstrip;
// - normalizer null; post_processor null, "ByteLevel", "TemplateProcessing" (its single template:
//   special tokens around $A) or a "Sequence" of those; decoder "ByteLevel".
// Anything else is refused on load with an ft::Error naming the file, the field and the value.
class JsonTokenizer : public Tokenizer {
 public:
  JsonTokenizer() = default;  // empty; encode and decode on it are errors
  // How GPT-2's pattern (ByteLevel's use_regex, or a Split with exactly that regex) is matched:
  // the hand-written scan (faster, docs/PERF.md) or PCRE2 like any other pattern (to measure).
  enum class Gpt2Pattern { kHandWritten, kRegex };
  static JsonTokenizer from_file(const std::string& path, Gpt2Pattern gpt2_pattern = Gpt2Pattern::kHandWritten);

  // The ids of `text` with added tokens matched in it, as `tokenizers`' encode(text,
  // add_special_tokens=False).
  using Tokenizer::encode;
  void encode(std::string_view text, std::vector<int32_t>& out) const override;
  // With add_special_tokens, the post-processor's template is applied (Llama 3.1: BOS first).
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const;
  std::string decode(std::span<const int32_t> ids) const override;
  std::string_view token_bytes(int32_t id) const override;
  int64_t vocab_size() const override;  // highest id of the vocabulary and added tokens, plus one
  // The template's token before $A, else an added token named <|begin_of_text|> or <s>; the
  // template's token after $A, else <|end_of_text|>, <|endoftext|> or </s>.
  int32_t bos_token() const override;
  int32_t eos_token() const override;
  // The id of an added token's content or of a vocabulary token written as bytes; -1 if none.
  int32_t token_id(std::string_view bytes) const;
  // Whether the pre-tokeniser is GPT-2's pattern alone, so that the hand-written scan runs it.
  bool uses_gpt2_scan() const;

  struct Impl;

 private:
  explicit JsonTokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

}  // namespace ft::data
