// Decoding with a key/value cache: the cache (per layer K and V, allocated once), the attention
// step a decoder layer runs with it, and the interface the decoders of models.h (GPT, Llama)
// share for it. A prompt runs through the model in one forward (the prefill); then each new token
// runs alone and attends over the keys and values kept for every earlier position, instead of the
// whole window running again for every token. generation.h's generate() is the loop on top.
// Implemented in src/nn/kv_cache.cpp.
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

#include "fasttrain/nn.h"
#include "fasttrain/tensor.h"

namespace ft::nn {

// The keys and values of the positions a decoder has seen, per layer: [batch, kv_heads, capacity,
// head_dim] buffers allocated once and filled from position 0 up to length(), as Hugging Face's
// StaticCache and llama.cpp's KV buffer. A grouped-query model keeps its kv_heads heads, never
// repeated to the query heads (the attention kernels share each among its group). A cache serves
// one batch of sequences of one model; clear() starts new sequences in the same buffers.
class KvCache {
 public:
  KvCache() = default;
  KvCache(int64_t layers, int64_t batch, int64_t kv_heads, int64_t capacity, int64_t head_dim,
          TensorOptions options = {});

  int64_t layers() const { return static_cast<int64_t>(keys_.size()); }
  int64_t batch() const;
  int64_t kv_heads() const;
  int64_t capacity() const;  // the most positions it holds
  int64_t head_dim() const;
  int64_t length() const { return length_; }  // positions filled: the next token's position
  TensorOptions options() const;
  // [batch, kv_heads, P, head_dim] views of `layer`'s first P = `positions` positions (default
  // length(): the filled ones; past it, up to capacity(), what store() wrote since advance()).
  Tensor keys(int64_t layer, std::optional<int64_t> positions = std::nullopt) const;
  Tensor values(int64_t layer, std::optional<int64_t> positions = std::nullopt) const;
  // Forgets every position (the buffers stay allocated).
  void clear() { length_ = 0; }

  // For a decoder's attention layers (cached_attention does both): stores k and v [batch,
  // kv_heads, T, head_dim] at positions [length(), length() + T) of `layer`. length() moves only
  // with advance(T), which the decoder calls once every layer has stored its T positions.
  void store(int64_t layer, const Tensor& k, const Tensor& v);
  void advance(int64_t positions);

 private:
  void check_layer(int64_t layer) const;
  void check_positions(int64_t positions) const;
  std::vector<Tensor> keys_, values_;
  int64_t length_ = 0;
};

// The attention of a decoder layer decoding with a cache: stores k and v [B, Hkv, T, D] in
// `layer` at positions [cache.length(), cache.length() + T), and returns the causal attention of
// q [B, H, T, D] (those same positions) over every position the cache holds up to each query's own:
// what scaled_dot_product_attention(q, k, v, causal=true) computes over the whole sequence,
// for the last T rows only. Grouped-query as that op (H a multiple of Hkv).
Tensor cached_attention(const Tensor& q, const Tensor& k, const Tensor& v, KvCache& cache, int64_t layer);

// A decoder-only language model (GPT, Llama): ids [B, T] -> next-token logits [B, T, vocab_size],
// which also decodes incrementally with a KvCache.
class CausalDecoder : public UnaryModule {
 public:
  virtual int64_t vocab_size() const = 0;
  // The positions the model has: rows of GPT's position embedding, of Llama's rotary tables.
  virtual int64_t context_length() const = 0;

  // An empty cache for `batch` sequences of up to `capacity` positions (0: context_length()), on
  // the parameters' device, in their dtype unless `dtype` is given. Size it to the window the
  // generation uses: a cache of context_length() positions of Llama 3.2's 131072 would take GiBs.
  KvCache make_cache(int64_t batch = 1, int64_t capacity = 0, std::optional<DType> dtype = std::nullopt) const;

  // The logits [B, T, vocab_size] of ids [B, T] placed at positions cache.length() .. +T-1 after
  // the cache's: the last T rows of forward(every id so far), computed from the cache instead of
  // the earlier ids. Stores the ids' keys and values and advances the cache by T. Inference only:
  // runs under autograd::InferenceMode and without dropout, whatever the module's mode (Hugging
  // Face's generate runs under no_grad in eval mode). ft::Error when B is not the cache's batch,
  // the cache was made for another shape of model, or the positions would pass the cache's
  // capacity or context_length(): then slide the window (clear the cache and run the last tokens
  // again; generate() does).
  Tensor forward_cached(const Tensor& ids, KvCache& cache);

 protected:
  struct CacheShape {
    int64_t layers = 0, kv_heads = 0, head_dim = 0;
  };
  virtual CacheShape cache_shape() const = 0;
  // forward_cached after its checks of the cache, under InferenceMode: the ids' logits, their
  // positions starting at cache.length(), each attention layer storing its keys and values
  // (cached_attention). The ids are the model's to check, as in forward. forward_cached advances
  // the cache afterwards.
  virtual Tensor decode(const Tensor& ids, KvCache& cache) = 0;
};

}  // namespace ft::nn
