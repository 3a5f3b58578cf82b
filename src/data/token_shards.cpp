// llm.c token shards: validation on open, zero-copy access, windows, the writer and the dataset.
#include "fasttrain/token_shards.h"

#include <glob.h>

#include <algorithm>
#include <cstring>

#include "data/mapped_file.h"
#include "data/sample_fields.h"
#include "fasttrain/atomic_file.h"

namespace ft::data {

TokenShard::TokenShard(const std::string& path) : file_(map_file(path)) {
  FT_CHECK(static_cast<int64_t>(file_->size) >= kTokenShardHeaderBytes, path, ": truncated token shard: ", file_->size,
           " bytes, shorter than the ", kTokenShardHeaderBytes, "-byte header");
  int32_t header[3];  // magic, version, token count (the rest of the 256 is unused)
  std::memcpy(header, file_->data, sizeof(header));
  FT_CHECK(header[0] == kTokenShardMagic || header[0] == kTokenShardMagic32, path, ": not a token shard: magic ",
           header[0], " (expected ", kTokenShardMagic, " for uint16 tokens or ", kTokenShardMagic32,
           " for uint32 tokens)");
  const bool wide = header[0] == kTokenShardMagic32;
  const int32_t version = wide ? kTokenShardVersion32 : kTokenShardVersion;
  FT_CHECK(header[1] == version, path, ": unsupported token shard version ", header[1], " (magic ", header[0],
           " expects version ", version, ")");
  width_ = wide ? 4 : 2;
  const int64_t payload = static_cast<int64_t>(file_->size) - kTokenShardHeaderBytes;
  FT_CHECK(header[2] >= 0 && width_ * static_cast<int64_t>(header[2]) == payload, path, ": header says ", header[2],
           " tokens (", width_ * static_cast<int64_t>(header[2]), " bytes) but the file holds ", payload,
           " bytes after the header");
  count_ = header[2];
  // The mapping is page-aligned and the header is 1024 bytes, so the tokens are aligned.
  tokens_ = file_->data + kTokenShardHeaderBytes;
}

const std::string& TokenShard::path() const { return file_->path; }

const uint16_t* TokenShard::tokens() const {
  FT_CHECK(width_ == 2, path(), ": holds uint32 tokens (version ", kTokenShardVersion32, "); read it with tokens32()");
  return static_cast<const uint16_t*>(tokens_);
}

const uint32_t* TokenShard::tokens32() const {
  FT_CHECK(width_ == 4, path(), ": holds uint16 tokens (version ", kTokenShardVersion, "); read it with tokens()");
  return static_cast<const uint32_t*>(tokens_);
}

std::pair<uint32_t, int64_t> TokenShard::max_token() const {
  std::pair<uint32_t, int64_t> top{0, -1};
  file_->read([&] {
    for (int64_t i = 0; i < count_; ++i)
      if (top.second < 0 || token(i) > top.first) top = {token(i), i};
  });
  return top;
}

Tensor TokenShard::token_bytes() const {
  auto keep = file_;
  return from_blob(const_cast<void*>(tokens_), Shape{width_ * count_}, TensorOptions(DType::U8),
                   [keep](void*) mutable { keep.reset(); });
}

void TokenShard::copy_window(int64_t start, int64_t count, int64_t* out) const {
  FT_CHECK(start >= 0 && count >= 0 && start + count <= count_, path(), ": token window [", start, ", ", start + count,
           ") is outside the shard's ", count_, " tokens");
  file_->read([&] {
    if (width_ == 2) {
      const uint16_t* src = static_cast<const uint16_t*>(tokens_) + start;
      for (int64_t i = 0; i < count; ++i) out[i] = src[i];
    } else {
      const uint32_t* src = static_cast<const uint32_t*>(tokens_) + start;
      for (int64_t i = 0; i < count; ++i) out[i] = src[i];
    }
  });
}

Tensor TokenShard::window(int64_t start, int64_t count) const {
  FT_CHECK(count >= 0, path(), ": token window length must be non-negative, found ", count);
  Tensor t = empty(Shape{count}, DType::I64);
  copy_window(start, count, t.data<int64_t>());
  return t;
}

std::vector<TokenShard> open_token_shards(const std::string& pattern) {
  glob_t g{};
  int rc = ::glob(pattern.c_str(), 0, nullptr, &g);  // glob(3) sorts the matches
  std::vector<std::string> paths;
  if (rc == 0) paths.assign(g.gl_pathv, g.gl_pathv + g.gl_pathc);
  ::globfree(&g);
  FT_CHECK(rc != GLOB_NOSPACE && rc != GLOB_ABORTED, "token shards: cannot expand pattern '", pattern, "'");
  FT_CHECK(!paths.empty(), "token shards: no file matches '", pattern, "'");
  std::vector<TokenShard> shards;
  shards.reserve(paths.size());
  for (const auto& p : paths) shards.emplace_back(p);
  return shards;
}

namespace {

template <class T>
void write_shard(const std::string& path, const std::vector<T>& tokens, int32_t magic, int32_t version) {
  FT_CHECK(tokens.size() <= 0x7fffffffu, path, ": a token shard holds at most 2147483647 tokens, found ",
           tokens.size());
  int32_t header[kTokenShardHeaderBytes / 4] = {};
  header[0] = magic;
  header[1] = version;
  header[2] = static_cast<int32_t>(tokens.size());
  AtomicFileWriter f(path);
  f.write(header, sizeof(header));
  f.write(tokens.data(), tokens.size() * sizeof(T));
  f.commit();
}

}  // namespace

void write_token_shard(const std::string& path, const std::vector<uint16_t>& tokens) {
  write_shard(path, tokens, kTokenShardMagic, kTokenShardVersion);
}

void write_token_shard_u32(const std::string& path, const std::vector<uint32_t>& tokens) {
  write_shard(path, tokens, kTokenShardMagic32, kTokenShardVersion32);
}

int32_t document_start_token(const Tokenizer& t) { return t.bos_token() >= 0 ? t.bos_token() : t.eos_token(); }

void document_ids(const int64_t* tokens, int64_t n, int64_t doc_start, int32_t* ids) {
  int32_t id = 0;
  for (int64_t t = 0; t < n; ++t) {
    id += tokens[t] == doc_start;
    ids[t] = id;
  }
}

Tensor document_ids(const Tensor& tokens, int64_t doc_start) {
  FT_CHECK(tokens.defined() && is_integral(tokens.dtype()) && tokens.dtype() != DType::Bool,
           "document_ids: tokens must be an integer tensor, found ",
           tokens.defined() ? dtype_name(tokens.dtype()) : "undefined");
  FT_CHECK(tokens.device().is_cpu(),
           "document_ids: tokens must be on the CPU (the loader's batches, before they move "
           "to a device), found ",
           tokens.device().str());
  FT_CHECK(tokens.dim() >= 1, "document_ids: tokens must have a last dimension (the window), found a scalar");
  const int64_t T = tokens.size(-1), rows = T > 0 ? tokens.numel() / T : 0;
  const Tensor t64 = tokens.to(DType::I64).contiguous();
  Tensor ids = empty(tokens.shape(), TensorOptions(DType::I32));
  for (int64_t r = 0; r < rows; ++r)
    document_ids(t64.data<int64_t>() + r * T, T, doc_start, ids.data<int32_t>() + r * T);
  return ids;
}

TokenWindowDataset::TokenWindowDataset(std::vector<TokenShard> shards, int64_t context, int64_t doc_start)
    : shards_(std::move(shards)), context_(context), doc_start_(doc_start) {
  FT_CHECK(context_ > 0, "TokenWindowDataset: context must be positive, found ", context_);
  FT_CHECK(!shards_.empty(), "TokenWindowDataset: expected at least one shard");
  spec_ = {{"tokens", Shape{context_}, DType::I64}, {"targets", Shape{context_}, DType::I64}};
  if (doc_start_ >= 0) spec_.push_back({"doc_ids", Shape{context_}, DType::I32});
  first_window_.assign(1, 0);
  for (const auto& s : shards_) {
    // The last window needs one token past its end for the final target.
    int64_t windows = s.size() > 0 ? (s.size() - 1) / context_ : 0;
    first_window_.push_back(first_window_.back() + windows);
  }
}

TokenWindowDataset::TokenWindowDataset(const std::string& pattern, int64_t context, int64_t doc_start)
    : TokenWindowDataset(open_token_shards(pattern), context, doc_start) {}

void TokenWindowDataset::read(int64_t index, uint64_t, const std::vector<Tensor>& fields) const {
  FT_CHECK(index >= 0 && index < size(), "TokenWindowDataset: sample ", index, " out of range [0, ", size(), ")");
  check_sample_fields("TokenWindowDataset", spec_, fields);
  // The shard holding window `index`: the last s with first_window_[s] <= index.
  size_t s = std::upper_bound(first_window_.begin(), first_window_.end(), index) - first_window_.begin() - 1;
  int64_t start = (index - first_window_[s]) * context_;
  shards_[s].copy_window(start, context_, fields[0].data<int64_t>());
  shards_[s].copy_window(start + 1, context_, fields[1].data<int64_t>());
  if (doc_start_ >= 0) document_ids(fields[0].data<int64_t>(), context_, doc_start_, fields[2].data<int32_t>());
}

}  // namespace ft::data
