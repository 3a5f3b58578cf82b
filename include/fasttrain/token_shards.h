// llm.c token shards (.bin): a 1024-byte header of 256 little-endian int32 — magic 20240520,
// version 1, token count — then that many uint16 tokens. Shards are read by memory map: the
// tokens are never copied until a window is written into a batch row.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fasttrain/dataset.h"
#include "fasttrain/tensor.h"

namespace ft::data {

struct MappedFile;

constexpr int32_t kTokenShardMagic = 20240520;
constexpr int32_t kTokenShardVersion = 1;
constexpr int64_t kTokenShardHeaderBytes = 1024;

// One mapped shard. Errors name the file and the offending value: a file shorter than the
// header, wrong magic, unsupported version, a token count that disagrees with the file size.
class TokenShard {
 public:
  explicit TokenShard(const std::string& path);

  const std::string& path() const;
  const uint16_t* tokens() const { return tokens_; }  // points into the mapping
  int64_t size() const { return count_; }             // number of tokens
  // The token bytes as a zero-copy U8 CPU tensor [2 * size()] over the mapping (the engine has no
  // u16 dtype); the tensor keeps the mapping alive.
  Tensor token_bytes() const;
  // Tokens [start, start + count) widened into `out` (int64, `count` elements).
  void copy_window(int64_t start, int64_t count, int64_t* out) const;
  // The same window as a new I64 CPU tensor [count].
  Tensor window(int64_t start, int64_t count) const;

 private:
  std::shared_ptr<const MappedFile> file_;
  const uint16_t* tokens_ = nullptr;
  int64_t count_ = 0;
};

// Every shard matching a glob(3) pattern, in sorted path order. Throws when nothing matches.
std::vector<TokenShard> open_token_shards(const std::string& pattern);

// Writes a shard atomically (atomic_file.h). At most 2^31 - 1 tokens (the header's int32 count).
void write_token_shard(const std::string& path, const std::vector<uint16_t>& tokens);

// Byte-level tokenisation (token = byte value, vocabulary of 256) of a text file, or of every
// regular file directly inside a folder (sorted by name, concatenated), into shards of at most
// `shard_tokens` tokens written atomically as <out_dir>/<prefix>_000000.bin, _000001.bin, ...
// Creates out_dir. Returns what it wrote, in order. Throws when the input is missing or empty.
struct WrittenShard {
  std::string path;
  int64_t tokens;
};
std::vector<WrittenShard> write_byte_token_shards(const std::string& input, const std::string& out_dir,
                                                  const std::string& prefix, int64_t shard_tokens);

// Next-token windows over shards: sample i is `context` tokens and the `context` tokens that
// follow each of them, fields "tokens" [context] i64 and "targets" [context] i64. Windows never
// straddle two shards: a shard of n tokens holds (n - 1) / context windows, non-overlapping,
// numbered shard by shard.
class TokenWindowDataset : public Dataset {
 public:
  TokenWindowDataset(std::vector<TokenShard> shards, int64_t context);
  TokenWindowDataset(const std::string& pattern, int64_t context);

  int64_t size() const override { return first_window_.back(); }
  SampleSpec spec() const override { return spec_; }
  void read(int64_t index, uint64_t epoch, const std::vector<Tensor>& fields) const override;
  const std::vector<TokenShard>& shards() const { return shards_; }

 private:
  std::vector<TokenShard> shards_;
  int64_t context_;
  SampleSpec spec_;
  std::vector<int64_t> first_window_;  // first_window_[s] = windows in shards before s; back() = total
};

}  // namespace ft::data
