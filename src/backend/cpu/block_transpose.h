// 16-bit (bf16, f16) activations between plain NCHW and oneDNN's channel-blocked layout nChw16c,
// where each group of 16 channels is stored position by position: y[n][c / 16][s][c % 16] =
// x[n][c][s] for the S = H*W positions. Both directions are 16 x 16 transposes of (channel,
// position) tiles; conv_onednn.cpp uses them instead of oneDNN's reorder for the activations of
// bf16 NCHW convolutions, which oneDNN runs on nChw16c: they are faster there than oneDNN's
// reorder, while for f32 they measured no faster, so f32 keeps it (docs/PERF.md has both). Pure
// data movement: bit-identical to oneDNN's reorder.
#pragma once
#include <cstdint>

namespace ft::cpu {

// Whether this CPU runs the transposes (AVX-512 with byte/word instructions, at the kernel table's
// selected level: isa.h); callers fall back to oneDNN's reorder otherwise.
bool block_transpose_available();

// x: [N, C, S] dense, y: [N, C / 16, S, 16] dense, 2-byte elements; C must be a multiple of 16.
// Split over the thread pool by (image, channel block).
void nchw_to_blocked16(const void* x, void* y, int64_t N, int64_t C, int64_t S);
void blocked16_to_nchw(const void* y, void* x, int64_t N, int64_t C, int64_t S);

}  // namespace ft::cpu
