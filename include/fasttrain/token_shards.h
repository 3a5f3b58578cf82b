// llm.c token shards (.bin): a 1024-byte header of 256 little-endian int32 — magic, version, token
// count — then that many tokens: magic 20240520 version 1 holds uint16 tokens (GPT-2-sized
// vocabularies), magic 20240801 version 7 holds uint32 tokens (llm.c's "llama-3" shards, for
// vocabularies past 65536 ids such as Llama 3's 128256). The header decides; any other pair is an
// error. Shards are read by memory map: the tokens are never copied until a window is written into
// a batch row.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fasttrain/dataset.h"
#include "fasttrain/tensor.h"
#include "fasttrain/tokenizer.h"

namespace ft::data {

struct MappedFile;

constexpr int32_t kTokenShardMagic = 20240520;  // uint16 tokens
constexpr int32_t kTokenShardVersion = 1;
constexpr int32_t kTokenShardMagic32 = 20240801;  // uint32 tokens (llm.c's data_common.py: "llama-3")
constexpr int32_t kTokenShardVersion32 = 7;
constexpr int64_t kTokenShardHeaderBytes = 1024;

// One mapped shard. Errors name the file and the offending value: a file shorter than the
// header, wrong magic, a version that is not the magic's, a token count that disagrees with the
// file size.
class TokenShard {
 public:
  explicit TokenShard(const std::string& path);

  const std::string& path() const;
  int token_width() const { return width_; }  // bytes per token: 2 (uint16) or 4 (uint32)
  // The tokens, pointing into the mapping; asking for the width the shard does not have is an error.
  const uint16_t* tokens() const;
  const uint32_t* tokens32() const;
  int64_t size() const { return count_; }  // number of tokens
  uint32_t token(int64_t i) const {        // token i, whatever the width
    return width_ == 2 ? static_cast<const uint16_t*>(tokens_)[i] : static_cast<const uint32_t*>(tokens_)[i];
  }
  // The largest token and its position (0 and -1 for an empty shard).
  std::pair<uint32_t, int64_t> max_token() const;
  // The token bytes as a zero-copy U8 CPU tensor [token_width() * size()] over the mapping (the
  // engine has no u16/u32 dtype); the tensor keeps the mapping alive.
  Tensor token_bytes() const;
  // Tokens [start, start + count) widened into `out` (int64, `count` elements).
  void copy_window(int64_t start, int64_t count, int64_t* out) const;
  // The same window as a new I64 CPU tensor [count].
  Tensor window(int64_t start, int64_t count) const;

 private:
  std::shared_ptr<const MappedFile> file_;
  const void* tokens_ = nullptr;
  int width_ = 2;
  int64_t count_ = 0;
};

// Every shard matching a glob(3) pattern, in sorted path order. Throws when nothing matches.
std::vector<TokenShard> open_token_shards(const std::string& pattern);

// Writes a shard atomically (atomic_file.h). At most 2^31 - 1 tokens (the header's int32 count).
// write_token_shard writes uint16 tokens (version 1), write_token_shard_u32 uint32 tokens
// (magic 20240801, version 7).
void write_token_shard(const std::string& path, const std::vector<uint16_t>& tokens);
void write_token_shard_u32(const std::string& path, const std::vector<uint32_t>& tokens);

// Byte-level tokenisation (token = byte value, vocabulary of 256) of a text file, of every
// regular file directly inside a folder, or of every file a glob(3) pattern matches (sorted by
// name, concatenated), into shards of at most `shard_tokens` tokens written atomically as
// <out_dir>/<prefix>_000000.bin, _000001.bin, ... Creates out_dir. Returns what it wrote, in order.
// Throws when the input is missing or empty.
// With val_tokens > 0, the first val_tokens tokens of the stream (cut wherever that count is
// reached, as llm.c's tinyshakespeare split is) go to <prefix>_val_000000.bin, ... and the rest to
// <prefix>_train_000000.bin, ...; a split that leaves no training token is an error.
struct WrittenShard {
  std::string path;
  int64_t tokens;
  bool val = false;  // part of the validation split
};
std::vector<WrittenShard> write_byte_token_shards(const std::string& input, const std::string& out_dir,
                                                  const std::string& prefix, int64_t shard_tokens,
                                                  int64_t val_tokens = 0);

// Char-level tokenisation of the same input: the vocabulary is the distinct Unicode code points of
// the whole input (every file), sorted by code point, with ids 0..V-1 stored as uint16 (so V must
// be at most 65536). Writes the shards as write_byte_token_shards does, then <out_dir>/vocab.json:
// {"mode": "char", "vocab_size": V, "tokens": [the UTF-8 text of id 0, id 1, ...]}. Invalid UTF-8
// (a stray continuation byte, an overlong form, a surrogate, a code point past U+10FFFF, a sequence
// cut off by the end of a file) is an error naming the file and the byte offset of the sequence.
struct CharTokenShards {
  std::vector<WrittenShard> shards;
  std::vector<std::string> vocab;  // the UTF-8 text of each id
  std::string vocab_path;
};
CharTokenShards write_char_token_shards(const std::string& input, const std::string& out_dir, const std::string& prefix,
                                        int64_t shard_tokens, int64_t val_tokens = 0);

// GPT-2 BPE tokenisation (tokenizer.h) of the same input, read from encoder.json/vocab.bpe (or
// Hugging Face's vocab.json/merges.txt). A document is one input file, and within a file the text
// between two occurrences of the literal "<|endoftext|>" (GPT-2's own document separator, which is
// dropped). Each non-empty document is written as the end-of-text token (50256) followed by its
// tokens, llm.c's layout, so the tokens equal GPT-2 encoding "<|endoftext|>" + document with the
// special token allowed. Shards and the validation split as write_byte_token_shards; then the
// tokenizer is written beside them so the shards can be decoded: <out_dir>/encoder.json and
// vocab.bpe (copies of the files given) and <out_dir>/vocab.json: {"mode": "gpt2", "vocab_size":
// 50257, "eot_token": 50256, "encoder": "encoder.json", "merges": "vocab.bpe"}. Files are read in
// chunks, cut at word boundaries, so a corpus is never held in memory.
struct Gpt2TokenShards {
  std::vector<WrittenShard> shards;
  int64_t documents = 0;
  int64_t vocab_size = 0;
  int32_t eot_token = -1;
  std::string vocab_path;  // <out_dir>/vocab.json
};
Gpt2TokenShards write_gpt2_token_shards(const std::string& input, const std::string& encoder_path,
                                        const std::string& merges_path, const std::string& out_dir,
                                        const std::string& prefix, int64_t shard_tokens, int64_t val_tokens = 0);

// Hugging Face tokenizer.json tokenisation (JsonTokenizer, tokenizer.h) of the same input. Documents
// as write_gpt2_token_shards's (a file, or the text between two literal "<|endoftext|>"); added
// tokens elsewhere in the text are matched as `tokenizers` matches them. Each non-empty document is
// written as Llama 3's pretraining stream has it: the begin-of-text token, its tokens, the
// end-of-text token (bos_token()/eos_token(): Llama 3's 128000 and 128001); a tokenizer with only
// one of the two, or one token for both (SmolLM), writes it once before each document (llm.c's
// layout). Vocabularies past 65536 ids write uint32 shards (llm.c's version 7), others uint16.
// Files are read in chunks cut at a space between an ASCII letter or digit and an ASCII letter,
// where the pre-tokenisers of GPT-2, Llama 3, SmolLM and Qwen2 end a word. Then the tokenizer is
// copied beside the shards: <out_dir>/tokenizer.json and <out_dir>/vocab.json: {"mode":
// "tokenizer.json", "vocab_size": V, "bos_token": B, "eos_token": E, "token_bytes": 2 or 4,
// "tokenizer": "tokenizer.json"}.
struct JsonTokenShards {
  std::vector<WrittenShard> shards;
  int64_t documents = 0;
  int64_t vocab_size = 0;
  int32_t bos_token = -1, eos_token = -1;
  int token_bytes = 2;
  std::string vocab_path;  // <out_dir>/vocab.json
};
JsonTokenShards write_json_token_shards(const std::string& input, const std::string& tokenizer_path,
                                        const std::string& out_dir, const std::string& prefix, int64_t shard_tokens,
                                        int64_t val_tokens = 0);

// The tokenizer a tokenizer.json vocab.json (as written above) names, relative to its folder.
JsonTokenizer read_json_tokenizer(const std::string& vocab_json_path);

// The tokenizer a GPT-2 vocab.json (as written above) describes, with its file names taken
// relative to the vocab.json's folder; errors name the file and what is wrong.
Gpt2Tokenizer read_gpt2_tokenizer(const std::string& vocab_json_path);

// The vocabulary a char-level vocab.json holds (id -> UTF-8 text); errors name the file and what
// is wrong (not JSON, mode other than "char", vocab_size disagreeing with the token list).
std::vector<std::string> read_char_vocabulary(const std::string& vocab_json_path);

// --- documents inside packed windows (attention's DocumentMask, ops/attention.h) ---
// The boundary rule: a document begins AT each document-start token, the token that `fasttrain
// data` (and llm.c) writes before every document: GPT-2's <|endoftext|> (shards [EOT doc EOT doc
// ...]), or a tokenizer.json's begin-of-text token (Llama 3's [BOS doc EOS BOS doc EOS ...], so a
// boundary also falls right after each EOS), or its one token where it has only one (SmolLM). The
// start token belongs to the document it opens: a document's first prediction (made at its start
// token) sees that token alone, as a prompt that begins with <|endoftext|> or <|begin_of_text|>
// does, and the end-of-text of Llama 3's layout closes its own document. Cutting before the start
// token rather than after an end-of-text token is what makes one rule fit both layouts: in
// GPT-2's, "after <|endoftext|>" would leave each document's first prediction looking at the
// previous document.

// The token that begins every document of shards written with tokenizer `t`: its begin-of-text
// token where it has one, else its end-of-text token (GPT-2: 50256); -1 when it has neither.
int32_t document_start_token(const Tokenizer& t);

// Document ids of windows of tokens: id[..., t] = the number of doc_start tokens at positions
// <= t of its window (the last dimension), so tokens before the window's first start token
// continue a document begun in an earlier window (id 0) and ids never decrease along a window.
// tokens: integer CPU tensor [..., T] (a batch [B, T] or one window [T]) -> i32 [..., T], CPU.
Tensor document_ids(const Tensor& tokens, int64_t doc_start);
// The same on n tokens in memory (what TokenWindowDataset writes into its batch rows).
void document_ids(const int64_t* tokens, int64_t n, int64_t doc_start, int32_t* ids);

// Next-token windows over shards: sample i is `context` tokens and the `context` tokens that
// follow each of them, fields "tokens" [context] i64 and "targets" [context] i64. Windows never
// straddle two shards: a shard of n tokens holds (n - 1) / context windows, non-overlapping,
// numbered shard by shard. With doc_start >= 0 a third field "doc_ids" [context] i32 holds the
// window's document_ids(tokens, doc_start) (the lm task's --doc-mask).
class TokenWindowDataset : public Dataset {
 public:
  TokenWindowDataset(std::vector<TokenShard> shards, int64_t context, int64_t doc_start = -1);
  TokenWindowDataset(const std::string& pattern, int64_t context, int64_t doc_start = -1);

  int64_t size() const override { return first_window_.back(); }
  SampleSpec spec() const override { return spec_; }
  void read(int64_t index, uint64_t epoch, const std::vector<Tensor>& fields) const override;
  const std::vector<TokenShard>& shards() const { return shards_; }

 private:
  std::vector<TokenShard> shards_;
  int64_t context_;
  int64_t doc_start_;  // -1: no "doc_ids" field
  SampleSpec spec_;
  std::vector<int64_t> first_window_;  // first_window_[s] = windows in shards before s; back() = total
};

// Next-token windows read as a stream (an IterableDataset): the shards are concatenated into one
// token stream and sample i is tokens [i * context, (i + 1) * context) with, as targets, the tokens
// one further on — contiguous windows that, unlike TokenWindowDataset's, run on across shard
// boundaries, so no token is lost at the end of a shard. Fields as TokenWindowDataset's. Shards are
// split between ranks: rank r of world_size streams shards r, r + world_size, ... (sorted order),
// so each rank reads only its own files (ranks may then see different numbers of windows). The
// same windows every epoch; skipping is O(1).
class TokenStreamDataset : public IterableDataset {
 public:
  TokenStreamDataset(std::vector<TokenShard> shards, int64_t context, int64_t rank = 0, int64_t world_size = 1);
  TokenStreamDataset(const std::string& pattern, int64_t context, int64_t rank = 0, int64_t world_size = 1);

  SampleSpec spec() const override { return spec_; }
  std::unique_ptr<SampleStream> open(uint64_t epoch, int64_t start) const override;
  int64_t windows() const { return windows_; }                       // samples in this rank's stream
  const std::vector<TokenShard>& shards() const { return shards_; }  // this rank's, in stream order
  // Stream tokens [start, start + count) widened into `out`, across shard boundaries.
  void copy_tokens(int64_t start, int64_t count, int64_t* out) const;

 private:
  std::vector<TokenShard> shards_;
  int64_t context_;
  SampleSpec spec_;
  std::vector<int64_t> first_token_;  // first_token_[s] = tokens in shards before s; back() = total
  int64_t windows_ = 0;
};

}  // namespace ft::data
