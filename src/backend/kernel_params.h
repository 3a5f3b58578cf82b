// Parameter blocks that ops fill in and every backend's kernels read: plain sizes and flags,
// no device assumptions, so src/ops can describe a convolution, pooling window, attention call or
// BatchNorm layout once for the CPU and CUDA kernels alike.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

#include <array>

#include "fasttrain/dtype.h"
#include "fasttrain/fp8.h"
#include "fasttrain/ops/conv.h"  // Pair
#include "fasttrain/random.h"    // PhiloxDraw
#include "fasttrain/tensor.h"

namespace ft::backend {

// The message of a failed index check, from the bad value and its position (the lowest one): the
// op words it, the backend raises it: at once on the CPU; on a GPU, where the check runs on the
// device and nothing waits for it, at the first host synchronisation after it ran.
using IndexErrorText = std::function<std::string(int64_t value, int64_t position)>;

// The residual dtypes row_norm_forward's fused add takes for an input of dtype x: x's own, and
// bf16/f16 for f32 (autocast's f32 residual stream plus a low-precision branch; the sum is f32).
inline bool row_norm_residual_ok(DType x, DType residual) {
  return residual == x || (x == DType::F32 && (residual == DType::BF16 || residual == DType::F16));
}

struct ConvParams {
  int64_t N = 0, C = 0, H = 0, W = 0;  // input
  int64_t O = 0, kH = 0, kW = 0;       // weight [O, C/groups, kH, kW]
  int64_t OH = 0, OW = 0;              // output spatial size
  Pair stride{1, 1}, padding{0, 0}, dilation{1, 1};
  int64_t groups = 1;
  bool channels_last = false;  // x, y, gx, gy are dense NHWC; otherwise dense NCHW
  // w and gw are dense OHWI (a channels-last weight, groups == 1); otherwise dense OIHW.
  bool weight_channels_last = false;
};

struct PoolParams {
  int64_t N = 0, C = 0, H = 0, W = 0, OH = 0, OW = 0;
  int64_t kH = 1, kW = 1, sH = 1, sW = 1, pH = 0, pW = 0, dH = 1, dW = 1;
  bool count_include_pad = true;  // avg_pool2d
  bool channels_last = false;
};

struct AttentionParams {
  bool causal = false;
  double scale = 1.0;
  double dropout_p = 0.0;
  PhiloxDraw philox;  // the mask's counters: element e (flat b, h, i, j) from block base + e / 4
  // Document mask (causal is then set too; Tq == Tk == T): dense i32 [B, T] on the inputs' device,
  // doc_starts[b, i] the first and doc_ends[b, i] one past the last position of token i's document,
  // so query i sees keys [doc_starts[b, i], i] and key j is seen by queries [j, doc_ends[b, j]).
  // Both are non-decreasing along T, which is what lets a kernel bound a whole tile's key (or
  // query) range by the start (end) of its first (last) row. Undefined: no document mask.
  Tensor doc_starts, doc_ends;
};

struct BatchNormLayout {
  int64_t N = 0, C = 0, S = 1;
  bool rows = false;  // MC form: dense [N*S, C]; otherwise dense [N, C, S]
  // batch_norm followed by ReLU: y = max(0, bn(x)), and the backward takes dy as zero where
  // bn(x) <= 0 (recomputed from x and the coefficients, so the output need not be read).
  bool relu = false;
};

// fp8_update_scales: each state row's format (for its largest finite value) and the recipe.
struct Fp8ScaleParams {
  std::array<Fp8Format, kFp8Roles> formats = kFp8RoleFormats;
  int margin = 0;
  Fp8AmaxAlgo algo = Fp8AmaxAlgo::Max;
};

}  // namespace ft::backend
