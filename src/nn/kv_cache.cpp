// The key/value cache, the attention step that reads it, and CausalDecoder's checks around a
// model's cached forward (kv_cache.h).
#include "fasttrain/kv_cache.h"

#include "fasttrain/autograd.h"
#include "fasttrain/ops.h"

namespace ft::nn {

KvCache::KvCache(int64_t layers, int64_t batch, int64_t kv_heads, int64_t capacity, int64_t head_dim,
                 TensorOptions options) {
  FT_CHECK(layers > 0 && batch > 0 && kv_heads > 0 && capacity > 0 && head_dim > 0,
           "KvCache: layers, batch, kv_heads, capacity and head_dim must be positive, found ", layers, ", ", batch,
           ", ", kv_heads, ", ", capacity, ", ", head_dim);
  FT_CHECK(is_floating(options.dtype), "KvCache: expected a floating dtype, found ", dtype_name(options.dtype));
  options.requires_grad = false;
  for (int64_t i = 0; i < layers; ++i) {
    // Never read before written (reads stop at length()), so no fill.
    keys_.push_back(empty({batch, kv_heads, capacity, head_dim}, options));
    values_.push_back(empty({batch, kv_heads, capacity, head_dim}, options));
  }
}

int64_t KvCache::batch() const { return keys_.empty() ? 0 : keys_[0].size(0); }
int64_t KvCache::kv_heads() const { return keys_.empty() ? 0 : keys_[0].size(1); }
int64_t KvCache::capacity() const { return keys_.empty() ? 0 : keys_[0].size(2); }
int64_t KvCache::head_dim() const { return keys_.empty() ? 0 : keys_[0].size(3); }
TensorOptions KvCache::options() const { return keys_.empty() ? TensorOptions() : keys_[0].options(); }

void KvCache::check_layer(int64_t layer) const {
  FT_CHECK(layer >= 0 && layer < layers(), "KvCache: expected a layer in [0, ", layers(), "), found ", layer);
}

void KvCache::check_positions(int64_t positions) const {
  FT_CHECK(positions >= 0 && positions <= capacity(), "KvCache: expected at most its capacity of ", capacity(),
           " positions, found ", positions);
}

Tensor KvCache::keys(int64_t layer, std::optional<int64_t> positions) const {
  check_layer(layer);
  check_positions(positions.value_or(length_));
  return keys_[layer].narrow(2, 0, positions.value_or(length_));
}

Tensor KvCache::values(int64_t layer, std::optional<int64_t> positions) const {
  check_layer(layer);
  check_positions(positions.value_or(length_));
  return values_[layer].narrow(2, 0, positions.value_or(length_));
}

void KvCache::store(int64_t layer, const Tensor& k, const Tensor& v) {
  check_layer(layer);
  const Shape expected{batch(), kv_heads(), k.defined() && k.dim() == 4 ? k.size(2) : 0, head_dim()};
  for (const Tensor* t : {&k, &v})
    FT_CHECK(t->defined() && t->shape() == expected, "KvCache::store: expected keys and values [", batch(), ", ",
             kv_heads(), ", T, ", head_dim(), "], found ", t->defined() ? t->shape().str() : "undefined");
  const int64_t T = k.size(2);
  FT_CHECK(length_ + T <= capacity(), "KvCache: ", T, " positions after the ", length_,
           " it holds pass its capacity of ", capacity());
  // A strided copy into the buffer (k and v usually arrive as transposed views of a projection).
  keys_[layer].narrow(2, length_, T).copy_(k);
  values_[layer].narrow(2, length_, T).copy_(v);
}

void KvCache::advance(int64_t positions) {
  FT_CHECK(positions >= 0 && length_ + positions <= capacity(), "KvCache::advance: expected at most ",
           capacity() - length_, " positions (capacity ", capacity(), ", length ", length_, "), found ", positions);
  length_ += positions;
}

Tensor cached_attention(const Tensor& q, const Tensor& k, const Tensor& v, KvCache& cache, int64_t layer) {
  FT_CHECK(q.defined() && q.dim() == 4 && k.defined() && k.dim() == 4 && q.size(2) == k.size(2),
           "cached_attention: expected q [B, H, T, D] and k, v [B, Hkv, T, D] with one T, found q ",
           q.defined() ? q.shape().str() : "undefined", " and k ", k.defined() ? k.shape().str() : "undefined");
  cache.store(layer, k, v);
  const int64_t past = cache.length(), T = q.size(2);
  // The prompt, nothing cached before it: the uncached forward's attention, on the fresh k and v.
  if (past == 0) return scaled_dot_product_attention(q, k, v, /*causal=*/true);
  // Every position up to the new ones: strided views of the buffers, read in place by the kernels;
  // a cache kept in another dtype than the queries' (a bf16 cache of an f32 model, or under
  // autocast) is converted for the product.
  Tensor keys = cache.keys(layer, past + T), values = cache.values(layer, past + T);
  if (keys.dtype() != q.dtype()) keys = keys.to(q.dtype()), values = values.to(q.dtype());
  // One new token (the decoding step): its row sees every key, so no mask.
  if (T == 1) return scaled_dot_product_attention(q, keys, values, /*causal=*/false);
  // Several new tokens after cached ones (a prompt fed in chunks). The op's causal mask is aligned
  // at the top left (query i sees keys 0..i, as torch's is_causal), but query i sits at position
  // past + i here: each row attends over its own prefix instead. generate() never comes here: its
  // prefills start from an empty cache.
  std::vector<Tensor> rows;
  rows.reserve(T);
  for (int64_t i = 0; i < T; ++i)
    rows.push_back(scaled_dot_product_attention(q.narrow(2, i, 1), keys.narrow(2, 0, past + i + 1),
                                                values.narrow(2, 0, past + i + 1), /*causal=*/false));
  return cat(rows, 2);
}

KvCache CausalDecoder::make_cache(int64_t batch, int64_t capacity, std::optional<DType> dtype) const {
  const CacheShape s = cache_shape();
  const std::vector<Tensor> params = parameters();
  FT_CHECK(!params.empty(), type_name(), "::make_cache: the model has no parameters");
  const int64_t positions = capacity > 0 ? capacity : context_length();
  FT_CHECK(positions <= context_length(), type_name(), "::make_cache: expected a capacity of at most the ",
           context_length(), " positions the model has, found ", positions);
  return KvCache(s.layers, batch, s.kv_heads, positions, s.head_dim,
                 TensorOptions(dtype.value_or(params[0].dtype()), params[0].device()));
}

Tensor CausalDecoder::forward_cached(const Tensor& ids, KvCache& cache) {
  const CacheShape s = cache_shape();
  const std::string name = type_name();
  FT_CHECK(cache.layers() == s.layers && cache.kv_heads() == s.kv_heads && cache.head_dim() == s.head_dim, name,
           "::forward_cached: expected a cache of ", s.layers, " layers of ", s.kv_heads, " key/value heads of size ",
           s.head_dim, " (make_cache), found ", cache.layers(), " layers of ", cache.kv_heads(), " heads of size ",
           cache.head_dim());
  FT_CHECK(ids.defined() && ids.dim() == 2, name, "::forward_cached: token ids must be [B, T], found ",
           ids.defined() ? "shape " + ids.shape().str() : std::string("an undefined tensor"));
  FT_CHECK(ids.size(0) == cache.batch(), name, "::forward_cached: the cache holds ", cache.batch(),
           " sequences, the ids ", ids.size(0));
  const int64_t T = ids.size(1), end = cache.length() + T;
  FT_CHECK(T >= 1, name, "::forward_cached: expected at least one token, found none");
  FT_CHECK(end <= cache.capacity() && end <= context_length(), name, "::forward_cached: ", T,
           " tokens after the cache's ", cache.length(), " pass its capacity (", cache.capacity(),
           ") or the model's context (", context_length(),
           "); slide the window: clear the cache and run the last tokens again");
  autograd::InferenceMode guard;
  Tensor logits = decode(ids, cache);
  cache.advance(T);
  return logits;
}

}  // namespace ft::nn
