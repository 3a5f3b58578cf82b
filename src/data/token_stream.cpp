// TokenStreamDataset: contiguous next-token windows streamed across a rank's shards.
#include <algorithm>

#include "data/sample_fields.h"
#include "fasttrain/token_shards.h"

namespace ft::data {

namespace {

std::vector<TokenShard> rank_shards(std::vector<TokenShard> all, int64_t rank, int64_t world_size) {
  FT_CHECK(world_size >= 1 && rank >= 0 && rank < world_size,
           "TokenStreamDataset: expected 0 <= rank < world_size, found rank ", rank, " of world_size ", world_size);
  FT_CHECK(static_cast<int64_t>(all.size()) >= world_size, "TokenStreamDataset: ", all.size(),
           " shard(s) cannot be split between ", world_size, " ranks (each rank needs at least one)");
  std::vector<TokenShard> mine;
  for (size_t s = static_cast<size_t>(rank); s < all.size(); s += static_cast<size_t>(world_size))
    mine.push_back(std::move(all[s]));
  return mine;
}

// A window counter: the stream itself is stateless beyond the next window's number.
class TokenStream : public SampleStream {
 public:
  TokenStream(const TokenStreamDataset& data, int64_t context, int64_t next)
      : data_(data), context_(context), next_(std::min(next, data.windows())) {}

  bool next(const std::vector<Tensor>& fields) override {
    if (next_ >= data_.windows()) return false;
    check_sample_fields("TokenStreamDataset", data_.spec(), fields);
    const int64_t start = next_ * context_;
    data_.copy_tokens(start, context_, fields[0].data<int64_t>());
    data_.copy_tokens(start + 1, context_, fields[1].data<int64_t>());
    ++next_;
    return true;
  }

  int64_t skip(int64_t n) override {
    FT_CHECK(n >= 0, "TokenStreamDataset: cannot skip a negative number of windows (", n, ")");
    const int64_t passed = std::min(n, data_.windows() - next_);
    next_ += passed;
    return passed;
  }

 private:
  const TokenStreamDataset& data_;  // the loader keeps the dataset alive while streams exist
  int64_t context_;
  int64_t next_;
};

}  // namespace

TokenStreamDataset::TokenStreamDataset(std::vector<TokenShard> shards, int64_t context, int64_t rank,
                                       int64_t world_size)
    : shards_(rank_shards(std::move(shards), rank, world_size)), context_(context) {
  FT_CHECK(context_ > 0, "TokenStreamDataset: context must be positive, found ", context_);
  spec_ = {{"tokens", Shape{context_}, DType::I64}, {"targets", Shape{context_}, DType::I64}};
  first_token_.assign(1, 0);
  for (const auto& s : shards_) first_token_.push_back(first_token_.back() + s.size());
  // The last window needs one token past its end for the final target.
  windows_ = first_token_.back() > 0 ? (first_token_.back() - 1) / context_ : 0;
}

TokenStreamDataset::TokenStreamDataset(const std::string& pattern, int64_t context, int64_t rank, int64_t world_size)
    : TokenStreamDataset(open_token_shards(pattern), context, rank, world_size) {}

std::unique_ptr<SampleStream> TokenStreamDataset::open(uint64_t, int64_t start) const {
  FT_CHECK(start >= 0, "TokenStreamDataset: expected a start window >= 0, found ", start);
  return std::make_unique<TokenStream>(*this, context_, start);
}

void TokenStreamDataset::copy_tokens(int64_t start, int64_t count, int64_t* out) const {
  FT_CHECK(start >= 0 && count >= 0 && start + count <= first_token_.back(), "TokenStreamDataset: tokens [", start,
           ", ", start + count, ") are outside the stream's ", first_token_.back(), " tokens");
  // The shard holding `start`: the last s with first_token_[s] <= start (empty shards are passed).
  size_t s = std::upper_bound(first_token_.begin(), first_token_.end(), start) - first_token_.begin() - 1;
  while (count > 0) {
    const int64_t offset = start - first_token_[s];
    const int64_t n = std::min(count, shards_[s].size() - offset);
    shards_[s].copy_window(offset, n, out);
    out += n;
    start += n;
    count -= n;
    ++s;
  }
}

}  // namespace ft::data
