// Causal self-attention, GPT-2 layout. The q, k and v heads are strided views into the fused
// projection's output ([B, T, 3C] viewed as [B, H, T, D] each): no copies before the fused
// attention kernel, which reads strided inputs. The one copy is the [B, H, T, D] -> [B, T, C]
// merge of the heads that c_proj's GEMM needs as dense rows.
#include "fasttrain/kv_cache.h"
#include "fasttrain/nn.h"

namespace ft::nn {

CausalSelfAttention::CausalSelfAttention(int64_t dim, int64_t heads, double dropout, Generator* gen)
    : heads(heads), dropout(dropout) {
  FT_CHECK(dim > 0 && heads > 0 && dim % heads == 0, "CausalSelfAttention: width ", dim,
           " must be a positive multiple of the number of heads ", heads);
  FT_CHECK(dropout >= 0 && dropout < 1, "CausalSelfAttention: dropout must be in [0, 1), found ", dropout);
  c_attn = register_module("c_attn", std::make_shared<Linear>(dim, 3 * dim, true, gen));
  c_proj = register_module("c_proj", std::make_shared<Linear>(dim, dim, true, gen));
}

Tensor CausalSelfAttention::forward(const Tensor& x) { return attend(x, Tensor(), nullptr, 0); }

// Called as this module here (operator() does that for forward(x)).
Tensor CausalSelfAttention::forward(const Tensor& x, const Tensor& doc_ids) {
  return call_as_this([&] { return attend(x, doc_ids, nullptr, 0); });
}

Tensor CausalSelfAttention::forward_cached(const Tensor& x, KvCache& cache, int64_t layer) {
  return call_as_this([&] { return attend(x, Tensor(), &cache, layer); });
}

Tensor CausalSelfAttention::attend(const Tensor& x, const Tensor& doc_ids, KvCache* cache, int64_t layer) {
  const int64_t C = c_proj->weight.size(0);
  FT_CHECK(x.dim() == 3 && x.size(2) == C, "CausalSelfAttention: expected input [B, T, ", C, "], found shape ",
           x.shape().str());
  const int64_t B = x.size(0), T = x.size(1), D = C / heads;
  // [B, T, 3C] viewed as [B, T, 3, H, D] and split in three: backward joins dq, dk and dv (each a
  // transposed view of the kernel's [B, H, T, D] output) with one strided cat straight into the
  // [B, T, 3C] gradient. (Three narrows would each scatter into a zeroed [B, T, 3C] buffer and
  // the engine would add the three up.)
  std::vector<Tensor> qkv = split((*c_attn)(x).view({B, T, 3, heads, D}), 1, 2);
  auto head_view = [&](int64_t i) { return qkv[i].squeeze(2).transpose(1, 2); };  // [B, H, T, D]
  // Decoding with a cache is inference: no dropout.
  const bool drop = training_ && !cache;
  const double p = drop ? dropout : 0.0;
  Tensor y = cache ? cached_attention(head_view(0), head_view(1), head_view(2), *cache, layer)
             : doc_ids.defined()
                 ? scaled_dot_product_attention(head_view(0), head_view(1), head_view(2), DocumentMask{doc_ids}, p)
                 : scaled_dot_product_attention(head_view(0), head_view(1), head_view(2), /*causal=*/true, p);
  y = y.transpose(1, 2).reshape({B, T, C});
  return ft::dropout((*c_proj)(y), p, drop);
}

}  // namespace ft::nn
