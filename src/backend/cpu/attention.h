// Tiled scaled dot-product attention on the CPU (FlashAttention forward, FlashAttention-2 style
// backward).
//
// Forward, for each (batch, head, block of Bq queries), with the key/value sequence walked in
// blocks of Bk rows:
//   S = scale * Q_blk K_blk^T              (Bq x Bk, one small GEMM)
//   m' = max(m, rowmax S); P = exp(S - m'); l = l * exp(m - m') + rowsum P
//   O  = O * exp(m - m') + dropout(P) V_blk (second small GEMM)
// and at the end O /= l and L = m + log(l) (the row's logsumexp). Only O and L are written.
// Backward recomputes P = exp(S - L) tile by tile instead of reading a stored probability
// matrix, so neither pass ever holds more than a Bq x Bk score tile per thread: memory is
// O(T * D) instead of O(T^2), and the traffic is O(T^2 * D / B) reads of K/V (forward) or Q/dO
// (backward) from cache-sized tiles against O(T^2 * D) flops, so the GEMMs run from L1/L2.
//
// Grouped-query attention: k and v have Hkv heads, q has H (a multiple); query head h reads KV
// head h / (H / Hkv) in place. The backward runs one task per (b, KV head, group of key blocks),
// which owns those dK/dV rows and sums its query heads into them one after another, so the sum
// needs no atomics and its order, hence the result, does not depend on the thread count.
//
// Causal masking is top-left aligned (key j is visible to query i iff j <= i, torch's
// is_causal); key blocks entirely above the diagonal are skipped, halving the work.
//
// Document masking (AttentionParams::doc_starts/doc_ends, self-attention): query i sees keys
// [start_i, i], key j is seen by queries [j, end_j). Bounds never decrease along T, so the forward
// starts each query block at the key block holding its first row's start (earlier blocks lie in
// earlier documents for every row of it), and the backward ends each key block's query loop at
// its last key's end (later queries lie in later documents). Inside a kept tile a row's visible
// keys are one contiguous run, masked by two bounds as the diagonal is. The saving is in whole
// tiles (64 queries by 128 keys forward, 64 by 64 backward), so it approaches the masked share of
// the scores only for documents several tiles long (bench/micro_cases.json: gqa_1024_docs*).
//
// Dropout is applied to the normalised probabilities (PyTorch semantics: the softmax
// normaliser uses the undropped P). The keep decision of element (b, h, i, j) is
//   uniform_from_word(philox_word(seed, base, ((b*H + h)*Tq + i)*Tk + j)) < 1 - p
// (the rule bernoulli_mask uses), so the backward pass regenerates exactly the forward mask
// from the counters alone, whatever the tiling or the number of threads.
#pragma once
#include <cstdint>
#include "backend/cpu/kernel_decls.h"
#include "backend/kernel_params.h"

#include "fasttrain/tensor.h"

namespace ft::cpu {

using backend::AttentionParams;

// attention_forward: q [B, H, Tq, D], k and v [B, Hkv, Tk, D] (H % Hkv == 0), any strides, all of
// one floating dtype.
// out: [B, H, Tq, D] contiguous, q's dtype. lse: [B, H, Tq] contiguous, f64 for f64 inputs and
// f32 otherwise (the dtype the kernel computes in). out_f32, when defined (bf16/f16 inputs
// whose gradient is needed), receives the output before rounding, contiguous f32.

// attention_backward: Gradients given the forward's output and lse and the upstream gradient dout (any strides).
// `out` is the forward output, or for bf16/f16 preferably its unrounded f32 version: it only
// enters through Di = rowsum(dO * O), which subtracts from dP and so turns the output's
// rounding error (2^-9 relative in bf16) into errors of dq and dk comparable to their size.
// dq, dk, dv: contiguous, shaped and typed like q, k, v.

// attention_document_bounds: doc_ids dense i32 [B, T] -> starts, ends dense i32 [B, T] (the first
// and one past the last position of each token's document: its run of equal ids); throws
// decreasing(id - previous, flat position) at the first id below its predecessor.

// Overrides the tile sizes (0 restores the automatic choice). For tests, which use tiles smaller
// than T to exercise multi-tile paths and the causal block skip; not thread-safe.
void set_attention_block_sizes_for_testing(int64_t block_q, int64_t block_k);

}  // namespace ft::cpu
