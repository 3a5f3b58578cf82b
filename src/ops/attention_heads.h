// Attention over a part of a layer's heads whose dropout mask is that part of the whole layer's
// mask (tensor parallelism: a rank holds heads [first, first + H) of `total`, and must drop what
// one process drops there). Library-internal: tensor_parallel.cpp's split attention calls it.
//
// The whole layer's mask numbers score element (b, h, i, j) e = ((b total + h) Tq + i) Tk + j and
// draws it from word e % 4 of Philox counter block base + e / 4 (the kernels' rule). For one batch
// row b the part's heads are the contiguous elements from e_b = (b total + first) Tq Tk, so the
// part is computed one batch row at a time with the kernel's counters starting at block
// base + e_b / 4: exact when e_b is a multiple of 4 for every b (Tq Tk even and a multiple of 4,
// or total and first even), refused otherwise. The generator advances by the whole mask's blocks,
// as one process's does, so every later draw matches too. Without dropout (or with every head)
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

}  // namespace ft::ops
