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

}  // namespace ft
