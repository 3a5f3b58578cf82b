// The weight gradient of bf16 convolutions on AVX512-BF16, for channels-last (NHWC) and
// channel-blocked (nChw16c) activations:
//
//   gw[o, c, p, q] = sum_{n, i, j} gy[n, o, i, j] * x[n, c, i*sh - ph + p, j*sw - pw + q]
//
// vdpbf16ps sums products in pairs, so the sum over (n, i, j) must be fed two terms at a time.
// Pairing neighbouring positions would tie the pairs to the tap (q shifts which two columns of x
// meet), so this kernel pairs images n and n+1 at the same position instead (an odd last image is
// paired with zeros): every tap reads the same pairs, only shifted. The gradient gy is repacked
// into those pairs (4 bytes each) and broadcast, 12 output channels at a time; the matching x
// pairs are interleaved in registers from the two images' rows, 32 input channels (two vectors) at
// a time. Sums are f32, rounded to bf16 once at the end, as oneDNN's are. The bias gradient, when
// asked for, is summed from the same repacked pairs.
//
// oneDNN 2.6's jit_bf16 kernel for this pass reached 48-78% of the bf16 peak on the BENCH.md
// shapes of a machine without AMX, against about 90% for the forward and backward-data passes;
// conv.h's WeightGradPath says where each kernel is used, and docs/PERF.md has the figures.
#pragma once
#include <cstdint>

#include "backend/kernel_params.h"

namespace ft::cpu {

using backend::ConvParams;

// Where activation element (n, c, h, w) lives, in elements: n * n_stride + h * h_stride +
// w * w_stride + (c / 16) * block_stride + c % 16. NHWC and nChw16c are both of this form.
struct ChannelBlockedLayout {
  int64_t n_stride = 0, h_stride = 0, w_stride = 0, block_stride = 0;
};
ChannelBlockedLayout nhwc_layout(int64_t C, int64_t H, int64_t W);
ChannelBlockedLayout nchw16c_layout(int64_t C, int64_t H, int64_t W);

// Whether the kernel takes this convolution on this CPU: AVX512-BF16 at the kernel table's level
// (isa.h), one group, no dilation, C and O multiples of 16.
bool paired_weight_grad_supported(const ConvParams& p);

// gy: [N, O, OH, OW] and x: [N, C, H, W], bf16 in the given layouts; gw: bf16, dense OIHW, or OHWI
// when p.weight_channels_last; gb: bf16 [O] or null. Outputs are overwritten.
void paired_weight_grad(const ConvParams& p, const uint16_t* gy, ChannelBlockedLayout gy_layout, const uint16_t* x,
                        ChannelBlockedLayout x_layout, uint16_t* gw, uint16_t* gb);

}  // namespace ft::cpu
