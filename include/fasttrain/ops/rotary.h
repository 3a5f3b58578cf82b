// Rotary position embedding (RoPE, Su et al. 2021) in Hugging Face Llama's layout, and the cos/sin
// tables it reads, with Llama 3's frequency scaling. Implemented in src/ops/rotary.cpp.
//
// Head dim D holds D/2 pairs (i, i + D/2) (HF's rotate_half, the layout HF checkpoints store q and
// k projections in, not the interleaved (2i, 2i + 1) pairs of the original paper). Pair i at
// position t turns by the angle t * inv_freq[i], inv_freq[i] = theta^(-2i / D):
//   out[i]       = x[i] cos - x[i + D/2] sin
//   out[i + D/2] = x[i + D/2] cos + x[i] sin
#pragma once
#include <cstdint>
#include <vector>

#include "fasttrain/tensor.h"

namespace ft {

// config.json's rope_scaling. Llama3 (rope_type "llama3", Llama 3.1 and 3.2): with wavelengths
// w = 2 pi / inv_freq and L = original_max_position_embeddings, frequencies with w < L /
// high_freq_factor are kept, those with w > L / low_freq_factor are divided by factor, and those
// between blend the two: inv_freq ((1 - a) / factor + a) with a = (L / w - low_freq_factor) /
// (high_freq_factor - low_freq_factor) (transformers' _compute_llama3_parameters; its attention
// factor is 1, so the tables are plain cos and sin).
struct RopeScaling {
  enum class Type { None, Llama3 };
  Type type = Type::None;
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

// inv_freq[i] for i < head_dim / 2, theta being config.json's rope_theta.
std::vector<double> rope_inverse_frequencies(int64_t head_dim, double theta = 10000.0, const RopeScaling& scaling = {});

// cos and sin of t * inv_freq[i]: [positions, head_dim / 2] each, one angle per pair.
struct RopeTables {
  Tensor cos, sin;
};
// Angles and their cos/sin are computed in f64 and rounded once to options' dtype (f32 by default;
// f64 for f64 models and checks). Hugging Face forms t * inv_freq in f32, whose error grows with t
// (about t * 2^-24 radians: 5e-4 at t = 8192, where a pair's rotation between neighbouring tokens
// can be that small); tables made once per model cost nothing to make exactly.
RopeTables rope_tables(int64_t positions, int64_t head_dim, double theta = 10000.0, const RopeScaling& scaling = {},
                       TensorOptions options = {});

// x [B, T, H, D] (D even; the last dim dense, the other strides arbitrary: q or k straight from a
// projection viewed as heads, a slice of a fused qkv output included; a non-dense last dim is
// copied first), cos and sin [T, D/2] (rope_tables, or rows of it: position t of x reads row t, so
// a decoding step at position p passes rows [p, p + T)). The tables are f32 for every x dtype, or
// f64 for f64 x; bf16 and f16 compute in f32. Returns a contiguous [B, T, H, D] tensor of x's
// dtype. The gradient is the inverse rotation of the output's gradient; the tables get none.
Tensor rotary_embedding(const Tensor& x, const Tensor& cos, const Tensor& sin);

}  // namespace ft
