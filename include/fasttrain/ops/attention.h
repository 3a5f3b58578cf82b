// Scaled dot-product attention computed in tiles with an online softmax, so the [T, T] score
// matrix is never materialised (FlashAttention's algorithm). Implemented in src/ops/attention.cpp.
#pragma once
#include <optional>

#include "fasttrain/random.h"
#include "fasttrain/tensor.h"

namespace ft {

// q [B, H, Tq, D], k and v [B, Hkv, Tk, D] -> [B, H, Tq, D], with H a multiple of Hkv: grouped-query
// attention, query head h attending with key/value head h / (H / Hkv) (Hkv == H: multi-head,
// Hkv == 1: multi-query), as torch's enable_gqa=True; K and V are read in place, never repeated.
// scale defaults to 1/sqrt(D). causal masks key j > query i (aligned at the top-left, as torch's
// is_causal).
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal = false,
                                    double dropout_p = 0.0, std::optional<double> scale = std::nullopt,
                                    Generator* gen = nullptr);

// The block-diagonal causal mask of documents packed into one window (Llama 3's pretraining mask):
// query i sees key j iff j <= i and both lie in the same document. doc_ids is [B, T], i32 or i64,
// on q's device, non-decreasing along T: a document is a run of equal ids (document_ids in
// token_shards.h makes them from tokens). Self-attention only: Tq == Tk == T.
struct DocumentMask {
  Tensor doc_ids;
};

// Attention under a DocumentMask: the same op as above with `causal` replaced by the document
// mask, forward and backward in the same tiled kernels (no [T, T] mask is ever formed). Tiles of
// keys that lie wholly in earlier documents than every query of a tile are skipped, so the work
// saved grows as the documents get shorter, in whole tiles of 64 queries (docs/ARCHITECTURE.md,
// "Document mask"). Ids that decrease along T are refused (on a GPU at the next host
// synchronisation, as index checks are).
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const DocumentMask& mask,
                                    double dropout_p = 0.0, std::optional<double> scale = std::nullopt,
                                    Generator* gen = nullptr);

}  // namespace ft
