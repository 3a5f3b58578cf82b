// bf16 3x3 convolutions (stride 1, padding 1) by Winograd's minimal filtering F(2x2, 3x3), on
// AVX512-BF16, for channels-last (NHWC) and channel-blocked (nChw16c) activations.
//
// Each 2x2 block of outputs ("tile") of output channel o is
//
//   Y = A^T [ sum_c (G g[o, c] G^T) . (B^T d[c] B) ] A
//
// where d[c] is the 4x4 input patch under the tile, g[o, c] the 3x3 filter, . the elementwise
// product, and
//
//   B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1],  G = [1 0 0; 1/2 1/2 1/2; 1/2 -1/2 1/2; 0 0 1],
//   A^T = [1 1 1 0; 0 1 -1 -1].
//
// So a tile costs 16 products per (o, c) instead of the direct sum's 36: for each of the 16
// elements e of the 4x4 transform, M_e[tile, o] = sum_c V_e[tile, c] U_e[c, o] is a matrix
// product, run here on vdpbf16ps (channel pairs, f32 sums) with the tiles broadcast and 32 output
// channels per register block. The transforms are exact in f32 (sums of at most four inputs,
// halves of the filter), then rounded to bf16 for the products: one rounding of V and U each,
// which is all that Winograd adds to the direct bf16 sum's error (tests/test_conv.cpp measures
// both against an f64 reference). F(2x2, 3x3) keeps the transforms' entries at 0, +-1 and +-1/2;
// larger tiles (F(4x4, 3x3): 4x fewer products) have entries up to 8 and lose too much in bf16.
//
// The backward-data pass of such a convolution is the same convolution of the output gradient
// with the filters transposed (in <-> out) and rotated by 180 degrees, so one kernel serves both.
// conv.h's ConvAlgorithm rule says where it runs.
#pragma once
#include <cstdint>

#include "backend/cpu/conv_weight_grad.h"  // ChannelBlockedLayout
#include "backend/kernel_params.h"

namespace ft::cpu {

// Filter element (out, in, p, q) at base + out * out + in * in + p * p + q * q, in elements;
// strides may be negative (a rotated filter).
struct FilterStrides {
  int64_t out = 0, in = 0, p = 0, q = 0;
};
struct FilterView {
  const uint16_t* base = nullptr;
  FilterStrides strides;
};

// Whether the kernels take this convolution's shape: 3x3, stride 1, padding 1, no dilation, one
// group, C and O multiples of 16 with C * O <= 2^26 (2 GiB of transformed filters). conv.h's
// rule and winograd_bf16_supported() both ask this one predicate.
bool winograd_bf16_shape(const backend::ConvParams& p);
// Whether the kernels run this convolution's passes on this CPU: its shape, and AVX512-BF16 at
// the kernel table's level (isa.h). bf16 storage is the caller's business.
bool winograd_bf16_supported(const backend::ConvParams& p);

// y[n, o, h, w] = bias[o] + sum_{c, p, q} w(o, c, p, q) * x[n, c, h - 1 + p, w - 1 + q] (zero
// outside the image), for inputs x: [N, C, H, W] and outputs y: [N, O, H, W], bf16 in the given
// layouts; bias: bf16 [O] or null. y is overwritten.
void winograd_bf16_conv3x3(int64_t N, int64_t C, int64_t O, int64_t H, int64_t W, const uint16_t* x,
                           ChannelBlockedLayout x_layout, FilterView w, const uint16_t* bias, uint16_t* y,
                           ChannelBlockedLayout y_layout);

// The weight and bias gradients of the same convolution: gw(o, c, p, q) = sum over n, h, w of
// gy[n, o, h, w] * x[n, c, h - 1 + p, w - 1 + q], gb[o] = sum of gy[n, o, h, w]. Per tile (the
// forward's 2x2 output blocks and 4x4 input patches), gw gains the 3x3 correlation of the patch
// d with the tile's 2x2 gradient g, by F(3x3, 2x2):
//
//   A'^T [ (G' g G'^T) . (B^T d B) ] A',  G' = [1 0; 1/2 1/2; 1/2 -1/2; 0 1],
//   A'^T = [1 1 1 0; 0 1 -1 0; 0 1 1 -1],
//
// with the forward's B. The sums over tiles come before A': M_e[o, c] = sum over tiles of
// Z_e[tile, o] V_e[tile, c], products over tiles fed to vdpbf16ps two tiles at a time (as
// conv_weight_grad.cpp pairs images), 16 per tile where the direct sum takes 36. gw (bf16,
// element (o, c, p, q) at gw + the strides) and gb (bf16 [O], or null) are overwritten.
void winograd_bf16_weight_grad3x3(int64_t N, int64_t C, int64_t O, int64_t H, int64_t W, const uint16_t* x,
                                  ChannelBlockedLayout x_layout, const uint16_t* gy, ChannelBlockedLayout gy_layout,
                                  uint16_t* gw, FilterStrides gw_strides, uint16_t* gb);

}  // namespace ft::cpu
