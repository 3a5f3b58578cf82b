// Attention and dropout on a part of a layer (tensor parallelism: a rank's heads, or under
// sequence parallelism its positions) drawing that part of the whole layer's dropout mask, so a
// split layer drops what one process drops. Library-internal: tensor_parallel.cpp calls them.
//
// Attention over heads [first, first + H) of `total`: the whole layer's mask numbers score element (b, h, i, j) e = ((b
// total + h) Tq + i) Tk + j and draws it from word e % 4 of Philox counter block base + e / 4 (the kernels' rule). For
// one batch row b the part's heads are the contiguous elements from e_b = (b total + first) Tq Tk, so the part is
// computed one batch row at a time with the kernel's counters starting at block base + e_b / 4: exact when total Tq Tk
// and first Tq Tk are multiples of 4 (T even suffices for self-attention), refused otherwise. The generator advances by
// the whole mask's blocks, as one process's does, so every later draw matches too. Without dropout (or with every head)
// it is the ordinary op.
#pragma once
#include <cstdint>

#include "fasttrain/ops/attention.h"

namespace ft::ops {

struct AttentionHeads {
  int64_t first = 0, total = 0;  // q's heads are heads [first, first + H) of `total`
};

// scaled_dot_product_attention(q, k, v, causal or *mask, dropout_p) over those heads.
Tensor attention_of_heads(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, const DocumentMask* mask,
                          double dropout_p, AttentionHeads heads, Generator* gen = nullptr);

// Dropout of x [B, n, ...], positions [first, first + n) along dimension 1 of a tensor of
// `total` positions (sequence parallelism: a rank's part of the sequence), drawing that part of
// the whole tensor's mask by the same per-batch-row rule as above; the generator advances by the
// whole mask. Refused unless first and total times the values per position are multiples of 4.
Tensor dropout_of_part(const Tensor& x, double p, bool training, int64_t first, int64_t total,
                       Generator* gen = nullptr);

}  // namespace ft::ops
