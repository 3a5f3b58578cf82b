// bf16 Winograd convolutions (conv_winograd.h): F(2x2, 3x3) for forward and backward-data,
// F(3x3, 2x2) for the weight gradient.
//
// Forward: work is split in blocks of kTiles tiles (2x2 outputs each; tiles run across images),
// one block at a time per thread. For a block, a thread
// 1. transforms the inputs of its tiles, all channels, into V[e][tile][c] (bf16, in L1/L2);
// 2. for each block of 32 output channels: for each of the 16 elements e, sums the products
//    V_e[tile, :] . U_e[:, o] in registers (kTiles x 32 f32 sums, channel pairs fed to vdpbf16ps)
//    into M[e][tile][o], then transforms M back into the tiles' 2x2 outputs and stores them.
// The filters are transformed once per call, U[e][c / 2][o][c % 2], shared by all threads.
//
// Weight gradient: chunks of tiles (a fixed size, whatever the thread count) in order. The threads
// first transform a chunk's tile pairs, x into V[tile][e][c] and gy into pairs Z[pair][e][o];
// then jobs (element e, 12 output channels) add the chunk's products into M[e][o][c] (f32), 32
// input channels at a time, the two tiles of a pair interleaved in registers as the paired kernel
// interleaves images. After the last chunk, A'^T M A' gives the 3x3 gradients.
//
// Every output is summed by one thread in a fixed order, so results do not depend on the thread
// count.
#include "backend/cpu/conv_winograd.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <utility>
#include <vector>

#include "backend/cpu/avx512_kernel.h"
#include "backend/cpu/bf16_pairs.h"
#include "backend/cpu/isa.h"
#include "fasttrain/dtype.h"
#include "fasttrain/parallel.h"
#include "fasttrain/tensor.h"

namespace ft::cpu {

namespace {

constexpr int kTiles = 12;  // tiles per block: the broadcast rows of a register block
constexpr int kElements = 16;
// The transformed filters take 32 C O bytes, 2 GiB at this bound (forced FT_CONV_ALGO=winograd
// can ask for any layer): beyond it, the layer stays direct.
constexpr int64_t kMaxFilterPairs = int64_t{1} << 26;

struct Plan {
  int64_t N, C, O, H, W;
  int64_t tile_rows, tile_cols, tiles;  // tile grid per image; tiles of all images
  ChannelBlockedLayout x, y;
};

FT_AVX512_KERNEL inline __m512 widen(const uint16_t* p) {
  const __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
}

// G g G^T for one filter g (3x3 taps d[3 p + q], any values in lanes): the rows G g, then the
// columns (G g) G^T, G's rows being (1 0 0), (1/2 1/2 1/2), (1/2 -1/2 1/2), (0 0 1). Element
// e = 4 i + j of u is row i, column j. Sums of at most three terms and halves: exact in f32 for
// bf16 inputs of similar magnitude.
// One product with G: (a, (a + b + c) / 2, (a - b + c) / 2, c). A function rather than a lambda
// in filter_transform because GCC gives lambdas none of the enclosing function's target options:
// a build without -march=native would not compile it.
FT_AVX512_KERNEL inline void apply_g(__m512 a, __m512 b, __m512 c, __m512 (&out)[4]) {
  const __m512 half = _mm512_set1_ps(0.5f);
  const __m512 ac = _mm512_add_ps(a, c);
  out[0] = a;
  out[1] = _mm512_mul_ps(_mm512_add_ps(ac, b), half);
  out[2] = _mm512_mul_ps(_mm512_sub_ps(ac, b), half);
  out[3] = c;
}

FT_AVX512_KERNEL inline void filter_transform(const __m512 (&d)[9], __m512 (&u)[kElements]) {
  __m512 rows[3][4];  // rows[q][i] = (G g)[i][q]
  for (int q = 0; q < 3; ++q) apply_g(d[q], d[3 + q], d[6 + q], rows[q]);
  for (int i = 0; i < 4; ++i) {
    __m512 out[4];
    apply_g(rows[0][i], rows[1][i], rows[2][i], out);
    for (int j = 0; j < 4; ++j) u[4 * i + j] = out[j];
  }
}

// GCC 12 warns that the intrinsics' own _mm512_undefined_* placeholders are used uninitialized
// once inlined here (GCC bug 105593, fixed in 13): a false positive, silenced for this function.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
// U[e][c / 2][o][c % 2] = (G g[o, c] G^T)[e / 4][e % 4], rounded to bf16, for 16 output channels
// from o0 and 16 input channels from c0, with the output channels in lanes: each (e, channel
// pair) is then one 64-byte row of U. The block's taps are first copied into g, output channels
// innermost, whatever the view's strides (a forward's OIHW or OHWI weights, backward-data's
// transposed and rotated ones).
FT_BF16_KERNEL void transform_filter_block(const Plan& P, FilterView w, int64_t o0, int64_t c0, uint16_t* U) {
  alignas(64) uint16_t g[16][9][16];  // [input channel][tap][output channel]
  for (int i = 0; i < 16; ++i)
    for (int c = 0; c < 16; ++c) {
      const uint16_t* f = w.base + (o0 + i) * w.strides.out + (c0 + c) * w.strides.in;
      for (int p = 0; p < 3; ++p)
        for (int q = 0; q < 3; ++q) g[c][3 * p + q][i] = f[p * w.strides.p + q * w.strides.q];
    }
  auto* rows = reinterpret_cast<uint32_t*>(U);  // 32-bit channel pairs, [e][C / 2][O]
  const int64_t element_stride = P.C / 2 * P.O;
  for (int c = 0; c < 16; c += 2) {
    __m512i halves[2][kElements];  // bf16 results of channels c and c + 1, widened to 32 bits
    for (int h = 0; h < 2; ++h) {
      __m512 d[9], u[kElements];
      for (int t = 0; t < 9; ++t) d[t] = widen(g[c + h][t]);
      filter_transform(d, u);
      for (int e = 0; e < kElements; ++e) halves[h][e] = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(u[e]));
    }
    uint32_t* row = rows + (c0 + c) / 2 * P.O + o0;  // 64-byte aligned: U is, and O, o0 are multiples of 16
    // Streaming stores: U (2 MB at 256 x 256 channels) is written once here and read later, so
    // ordinary stores' reads of each line before writing it only cost (256 -> 256 on 14x14, the
    // forward: 2.79 -> 2.52 ms; docs/PERF.md).
    for (int e = 0; e < kElements; ++e)
      _mm512_stream_si512(reinterpret_cast<__m512i*>(row + e * element_stride),
                          _mm512_or_si512(halves[0][e], _mm512_slli_epi32(halves[1][e], 16)));
  }
}
#pragma GCC diagnostic pop

void transform_filters(const Plan& P, FilterView w, uint16_t* U) {
  const int64_t c_blocks = P.C / 16;
  parallel_for(0, P.O / 16 * c_blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) transform_filter_block(P, w, b / c_blocks * 16, b % c_blocks * 16, U);
    _mm_sfence();  // the streaming stores reach memory before other threads read U
  });
}

struct TilePos {
  int64_t n, h0, w0;  // image, and the row and column of the tile's first output
};
TilePos tile_position(const Plan& P, int64_t tile) {
  const int64_t per_image = P.tile_rows * P.tile_cols, r = tile % per_image;
  return {tile / per_image, 2 * (r / P.tile_cols), 2 * (r % P.tile_cols)};
}

// The input transform of one tile's 16 channels from c0 (at[r][s]: the patch's positions, or
// null outside the image unless kInterior), into V[e][t][c0, c0 + 16). B^T d B runs as (B^T d) B,
// one patch row at a time, so that 16 vectors stay live (a whole patch in registers spills).
template <bool kInterior>
FT_BF16_KERNEL __attribute__((always_inline)) inline void transform_patch(const uint16_t* const (&at)[4][4],
                                                                          int64_t offset, uint16_t* V,
                                                                          int64_t v_stride) {
  __m512 a[4][4];  // (B^T d)[r][s], summed row by row
#pragma GCC unroll 4
  for (int r = 0; r < 4; ++r) {
    __m512 d[4];
    for (int s = 0; s < 4; ++s) d[s] = kInterior || at[r][s] ? widen(at[r][s] + offset) : _mm512_setzero_ps();
    // Row r's share of B^T d = (d0 - d2, d1 + d2, d2 - d1, d1 - d3).
    for (int s = 0; s < 4; ++s) {
      if (r == 0) a[0][s] = d[s];
      if (r == 1) a[1][s] = d[s], a[3][s] = d[s];
      if (r == 2) {
        a[0][s] = _mm512_sub_ps(a[0][s], d[s]);
        a[2][s] = _mm512_sub_ps(d[s], a[1][s]);
        a[1][s] = _mm512_add_ps(a[1][s], d[s]);
      }
      if (r == 3) a[3][s] = _mm512_sub_ps(a[3][s], d[s]);
    }
  }
  for (int r = 0; r < 4; ++r) {  // (B^T d) B
    const __m512 v[4] = {_mm512_sub_ps(a[r][0], a[r][2]), _mm512_add_ps(a[r][1], a[r][2]),
                         _mm512_sub_ps(a[r][2], a[r][1]), _mm512_sub_ps(a[r][1], a[r][3])};
    for (int s = 0; s < 4; ++s)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(V + (4 * r + s) * v_stride), (__m256i)_mm512_cvtneps_pbh(v[s]));
  }
}

// The input transform of one tile, all channels: v + e * v_stride holds element e's row.
FT_BF16_KERNEL void transform_tile_input(const Plan& P, const uint16_t* x, int64_t tile, uint16_t* v,
                                         int64_t v_stride) {
  const ChannelBlockedLayout& L = P.x;
  const TilePos tp = tile_position(P, tile);
  const uint16_t* at[4][4];  // the patch's 16 positions, null outside the image (zero padding)
  bool interior = true;
  for (int r = 0; r < 4; ++r)
    for (int s = 0; s < 4; ++s) {
      const int64_t h = tp.h0 - 1 + r, w = tp.w0 - 1 + s;
      const bool inside = h >= 0 && h < P.H && w >= 0 && w < P.W;
      at[r][s] = inside ? x + tp.n * L.n_stride + h * L.h_stride + w * L.w_stride : nullptr;
      interior = interior && inside;
    }
  for (int64_t cb = 0; cb < P.C / 16; ++cb) {
    if (interior)
      transform_patch<true>(at, cb * L.block_stride, v + 16 * cb, v_stride);
    else
      transform_patch<false>(at, cb * L.block_stride, v + 16 * cb, v_stride);
  }
}

// V[e][t][c] = (B^T d B)[e / 4][e % 4] for tile `first + t` (t < count), rounded to bf16; rows of
// tiles past `count` are zero.
FT_BF16_KERNEL void transform_inputs(const Plan& P, const uint16_t* x, int64_t first, int count, uint16_t* V) {
  for (int t = 0; t < count; ++t) transform_tile_input(P, x, first + t, V + t * P.C, kTiles * P.C);
  for (int e = 0; e < kElements; ++e)
    std::memset(V + (e * kTiles + count) * P.C, 0, sizeof(uint16_t) * (kTiles - count) * P.C);
}

// M[t][o] (row stride 32) = sum over c of V[t][c] U[c][o] for kTiles tiles and NV * 16 output
// channels: V is one element's [kTiles][C], U its [C / 2][O][2] from the block's first channel.
template <int NV>
FT_BF16_KERNEL void multiply(const uint16_t* V, const uint16_t* U, int64_t C, int64_t O, float* M) {
  __m512 s[kTiles][NV];
#pragma GCC unroll 16
  for (int t = 0; t < kTiles; ++t)
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) s[t][v] = _mm512_setzero_ps();
  for (int64_t k = 0; k < C / 2; ++k) {
    __m512bh u[NV];
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) u[v] = (__m512bh)_mm512_loadu_si512(U + (k * O + 16 * v) * 2);
#pragma GCC unroll 16
    for (int t = 0; t < kTiles; ++t) {
      uint32_t pair;
      std::memcpy(&pair, V + t * C + 2 * k, sizeof pair);
      const __m512bh a = (__m512bh)_mm512_set1_epi32(static_cast<int>(pair));
#pragma GCC unroll 2
      for (int v = 0; v < NV; ++v) s[t][v] = _mm512_dpbf16_ps(s[t][v], a, u[v]);
    }
  }
#pragma GCC unroll 16
  for (int t = 0; t < kTiles; ++t)
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(M + t * 32 + 16 * v, s[t][v]);
}

// The 2x2 outputs of tiles [first, first + count), channels [o0, o0 + 16 NV): A^T M A (+ bias),
// from M[e][t][32], rounded to bf16; outputs past the image's last row or column are dropped.
template <int NV>
FT_BF16_KERNEL void transform_outputs(const Plan& P, const float* M, int64_t first, int count, int64_t o0,
                                      const uint16_t* bias, uint16_t* y) {
  const ChannelBlockedLayout& L = P.y;
  for (int t = 0; t < count; ++t) {
    const TilePos tp = tile_position(P, first + t);
    for (int v = 0; v < NV; ++v) {
      __m512 m[4][4];
      for (int e = 0; e < kElements; ++e) m[e / 4][e % 4] = _mm512_loadu_ps(M + (e * kTiles + t) * 32 + 16 * v);
      __m512 b[2][4];  // A^T M
      for (int s = 0; s < 4; ++s) {
        b[0][s] = _mm512_add_ps(_mm512_add_ps(m[0][s], m[1][s]), m[2][s]);
        b[1][s] = _mm512_sub_ps(_mm512_sub_ps(m[1][s], m[2][s]), m[3][s]);
      }
      const __m512 add = bias ? widen(bias + o0 + 16 * v) : _mm512_setzero_ps();
      for (int i = 0; i < 2 && tp.h0 + i < P.H; ++i) {
        const __m512 out[2] = {_mm512_add_ps(_mm512_add_ps(_mm512_add_ps(b[i][0], b[i][1]), b[i][2]), add),
                               _mm512_add_ps(_mm512_sub_ps(_mm512_sub_ps(b[i][1], b[i][2]), b[i][3]), add)};
        for (int j = 0; j < 2 && tp.w0 + j < P.W; ++j) {
          uint16_t* dst = y + tp.n * L.n_stride + (tp.h0 + i) * L.h_stride + (tp.w0 + j) * L.w_stride +
                          (o0 / 16 + v) * L.block_stride;
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), (__m256i)_mm512_cvtneps_pbh(out[j]));
        }
      }
    }
  }
}

// Tiles [first, first + count) (count <= kTiles), all output channels, with this thread's buffers.
template <int NV>
FT_BF16_KERNEL void output_block(const Plan& P, const uint16_t* V, const uint16_t* U, int64_t first, int count,
                                 int64_t o0, const uint16_t* bias, float* M, uint16_t* y) {
  const int64_t element_stride = (P.C / 2) * P.O * 2;
  for (int e = 0; e < kElements; ++e)
    multiply<NV>(V + e * kTiles * P.C, U + e * element_stride + o0 * 2, P.C, P.O, M + e * kTiles * 32);
  transform_outputs<NV>(P, M, first, count, o0, bias, y);
}

// ---- Weight gradient, F(3x3, 2x2) (conv_winograd.h) ----

constexpr int kGradRows = 12;  // output channels per register block: broadcast pairs of Z
// V and Z of a chunk of tiles: large enough that the parallel regions per chunk are few, small
// enough to stay in L3 while every job sweeps its share.
constexpr int64_t kGradChunkBytes = 2 << 20;

// One call's buffers, shared by the threads.
struct GradWork {
  Plan P;
  const uint16_t* x;
  const uint16_t* gy;
  int64_t chunk;  // tiles per chunk, even and independent of the thread count
  // Tile-major, so that the transforms write one stream per tile: laid out element-major ([e][tile]),
  // a tile's 16 rows were 16 write streams, and the transforms ran 1.5-3x slower than this in some
  // processes (with 16 rows a power of two apart, always).
  uint16_t* V;  // [tile][e][C]: the inputs' transform (B^T d B)
  uint32_t* Z;  // [pair][e][O]: the gradients' transform (G' g G'^T), two tiles per pair
  float* M;     // [e][O][C]: sums over the tiles so far
};

// Z_e of tile `tile` for all output channels, as 16 rows of bf16 ([e][O], row stride O) in z.
FT_BF16_KERNEL void transform_gradient(const Plan& P, const uint16_t* gy, int64_t tile, uint16_t* z) {
  const ChannelBlockedLayout& L = P.y;
  const TilePos tp = tile_position(P, tile);
  const uint16_t* at[2][2];  // the tile's outputs, null past the image's last row or column
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j)
      at[i][j] = tp.h0 + i < P.H && tp.w0 + j < P.W
                     ? gy + tp.n * L.n_stride + (tp.h0 + i) * L.h_stride + (tp.w0 + j) * L.w_stride
                     : nullptr;
  const __m512 half = _mm512_set1_ps(0.5f);
  for (int64_t ob = 0; ob < P.O / 16; ++ob) {
    __m512 g[2][2];
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 2; ++j) g[i][j] = at[i][j] ? widen(at[i][j] + ob * L.block_stride) : _mm512_setzero_ps();
    for (int r = 0; r < 4; ++r) {  // row r of G' g, then times G'^T
      __m512 t[2];
      for (int j = 0; j < 2; ++j)
        t[j] = r == 0   ? g[0][j]
               : r == 3 ? g[1][j]
               : r == 1 ? _mm512_mul_ps(half, _mm512_add_ps(g[0][j], g[1][j]))
                        : _mm512_mul_ps(half, _mm512_sub_ps(g[0][j], g[1][j]));
      const __m512 row[4] = {t[0], _mm512_mul_ps(half, _mm512_add_ps(t[0], t[1])),
                             _mm512_mul_ps(half, _mm512_sub_ps(t[0], t[1])), t[1]};
      for (int s = 0; s < 4; ++s)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(z + (4 * r + s) * P.O + 16 * ob),
                            (__m256i)_mm512_cvtneps_pbh(row[s]));
    }
  }
}

// The transforms of tile pair `pair` of the chunk starting at tile `first` (count tiles; a tile
// past them, pairing an odd last one, is zero).
FT_BF16_KERNEL void transform_tile_pair(const GradWork& w, int64_t first, int64_t count, int64_t pair) {
  const Plan& P = w.P;
  uint16_t* v_rows = w.V + 2 * pair * kElements * P.C;
  thread_local std::vector<uint16_t> z_rows;  // [tile of the pair][e][O]
  z_rows.resize(2 * kElements * P.O);
  for (int half = 0; half < 2; ++half) {
    const int64_t t = 2 * pair + half;
    uint16_t* v = v_rows + half * kElements * P.C;  // element e's row at + e * C
    uint16_t* z = z_rows.data() + half * kElements * P.O;
    if (t >= count) {  // the partner of an odd last tile
      std::memset(v, 0, sizeof(uint16_t) * kElements * P.C);
      std::memset(z, 0, sizeof(uint16_t) * kElements * P.O);
      continue;
    }
    transform_tile_input(P, w.x, first + t, v, P.C);
    transform_gradient(P, w.gy, first + t, z);
  }
  const __m512i idx = pair_indices();
  for (int e = 0; e < kElements; ++e)
    for (int64_t ob = 0; ob < P.O / 16; ++ob) {
      const uint16_t* a = z_rows.data() + e * P.O + 16 * ob;
      _mm512_storeu_si512(w.Z + (pair * kElements + e) * P.O + 16 * ob, pair_up(a, a + kElements * P.O, idx));
    }
}

// M_e[o0 + r, c0 + 16 v] (+)= sum over the chunk's tile pairs of Z_e[pair, o0 + r] V_e[pair, c0 + 16 v],
// for R output channels and NV vectors of 16 input channels; the first chunk stores, later ones add.
template <int R, int NV>
FT_BF16_KERNEL void gradient_sums(const GradWork& w, int e, int64_t o0, int64_t c0, int64_t pairs, bool first) {
  const Plan& P = w.P;
  __m512 s[R][NV];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) s[r][v] = _mm512_setzero_ps();
  const int64_t tile_stride = kElements * P.C;
  const uint16_t* rows = w.V + e * P.C + c0;
  const uint32_t* z = w.Z + e * P.O + o0;
  for (int64_t k = 0; k < pairs; ++k) {
    __m512i b[NV];
    const uint16_t* a = rows + 2 * k * tile_stride;
    if constexpr (NV == 2) {  // in-lane pairs; the order is restored once at the end
      const __m512i va = _mm512_loadu_si512(a), vb = _mm512_loadu_si512(a + tile_stride);
      b[0] = _mm512_unpacklo_epi16(va, vb);
      b[1] = _mm512_unpackhi_epi16(va, vb);
    } else {
      b[0] = pair_up(a, a + tile_stride, pair_indices());
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512bh zr = (__m512bh)_mm512_set1_epi32(static_cast<int>(z[k * kElements * P.O + r]));
#pragma GCC unroll 2
      for (int v = 0; v < NV; ++v) s[r][v] = _mm512_dpbf16_ps(s[r][v], zr, (__m512bh)b[v]);
    }
  }
  if constexpr (NV == 2)
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) restore_channel_order(s[r][0], s[r][1]);
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) {
      float* m = w.M + (e * P.O + o0 + r) * P.C + c0 + 16 * v;
      _mm512_storeu_ps(m, first ? s[r][v] : _mm512_add_ps(_mm512_loadu_ps(m), s[r][v]));
    }
}

using GradSumsFn = void (*)(const GradWork&, int, int64_t, int64_t, int64_t, bool);
template <int NV, size_t... R>
constexpr std::array<GradSumsFn, sizeof...(R)> gradient_sums_of_width(std::index_sequence<R...>) {
  return {&gradient_sums<static_cast<int>(R) + 1, NV>...};
}
// kGradientSums[NV - 1][R - 1]
constexpr std::array<std::array<GradSumsFn, kGradRows>, 2> kGradientSums = {
    gradient_sums_of_width<1>(std::make_index_sequence<kGradRows>{}),
    gradient_sums_of_width<2>(std::make_index_sequence<kGradRows>{})};

// gw(o, c, p, q) = (A'^T M[o, c] A')[p][q] for 16 input channels from c0, rounded to bf16.
FT_BF16_KERNEL void finish_weight_gradient(const GradWork& w, int64_t o, int64_t c0, uint16_t* gw, FilterStrides st) {
  const Plan& P = w.P;
  __m512 m[4][4];
  for (int e = 0; e < kElements; ++e) m[e / 4][e % 4] = _mm512_loadu_ps(w.M + (e * P.O + o) * P.C + c0);
  __m512 a[3][4];  // A'^T M
  for (int s = 0; s < 4; ++s) {
    a[0][s] = _mm512_add_ps(_mm512_add_ps(m[0][s], m[1][s]), m[2][s]);
    a[1][s] = _mm512_sub_ps(m[1][s], m[2][s]);
    a[2][s] = _mm512_sub_ps(_mm512_add_ps(m[1][s], m[2][s]), m[3][s]);
  }
  for (int p = 0; p < 3; ++p) {
    const __m512 out[3] = {_mm512_add_ps(_mm512_add_ps(a[p][0], a[p][1]), a[p][2]), _mm512_sub_ps(a[p][1], a[p][2]),
                           _mm512_sub_ps(_mm512_add_ps(a[p][1], a[p][2]), a[p][3])};
    for (int q = 0; q < 3; ++q) {
      alignas(32) uint16_t b[16];
      _mm256_store_si256(reinterpret_cast<__m256i*>(b), (__m256i)_mm512_cvtneps_pbh(out[q]));
      uint16_t* dst = gw + o * st.out + c0 * st.in + p * st.p + q * st.q;
      for (int i = 0; i < 16; ++i) dst[i * st.in] = b[i];
    }
  }
}

// gb[o] = the sum of gy over all positions, 16 channels from o0, in a fixed order.
FT_BF16_KERNEL void bias_gradient(const Plan& P, const uint16_t* gy, int64_t o0, uint16_t* gb) {
  const ChannelBlockedLayout& L = P.y;
  __m512 sum = _mm512_setzero_ps();
  for (int64_t n = 0; n < P.N; ++n)
    for (int64_t h = 0; h < P.H; ++h) {
      __m512 row = _mm512_setzero_ps();
      for (int64_t c = 0; c < P.W; ++c)
        row =
            _mm512_add_ps(row, widen(gy + n * L.n_stride + h * L.h_stride + c * L.w_stride + o0 / 16 * L.block_stride));
      sum = _mm512_add_ps(sum, row);
    }
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(gb + o0), (__m256i)_mm512_cvtneps_pbh(sum));
}

}  // namespace

bool winograd_bf16_shape(const backend::ConvParams& p) {
  return p.kH == 3 && p.kW == 3 && p.stride[0] == 1 && p.stride[1] == 1 && p.padding[0] == 1 && p.padding[1] == 1 &&
         p.dilation[0] == 1 && p.dilation[1] == 1 && p.groups == 1 && p.C % 16 == 0 && p.O % 16 == 0 && p.C > 0 &&
         p.O > 0 && p.N > 0 && p.H > 0 && p.W > 0 && p.C * p.O <= kMaxFilterPairs;
}

bool winograd_bf16_supported(const backend::ConvParams& p) {
  return selected_cpu_isa() >= CpuIsa::Avx512Bf16 && winograd_bf16_shape(p);
}

void winograd_bf16_conv3x3(int64_t N, int64_t C, int64_t O, int64_t H, int64_t W, const uint16_t* x,
                           ChannelBlockedLayout x_layout, FilterView w, const uint16_t* bias, uint16_t* y,
                           ChannelBlockedLayout y_layout) {
  const int64_t tile_rows = (H + 1) / 2, tile_cols = (W + 1) / 2;
  const Plan P{N, C, O, H, W, tile_rows, tile_cols, N * tile_rows * tile_cols, x_layout, y_layout};
  Tensor filters = empty({kElements * C * O}, TensorOptions(DType::BF16));
  auto* U = static_cast<uint16_t*>(filters.raw_data());
  transform_filters(P, w, U);
  const int64_t blocks = (P.tiles + kTiles - 1) / kTiles;
  parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    thread_local std::vector<uint16_t> V;
    thread_local std::vector<float> M;
    V.resize(kElements * kTiles * C);
    M.resize(kElements * kTiles * 32);
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t first = b * kTiles;
      const int count = static_cast<int>(std::min<int64_t>(kTiles, P.tiles - first));
      transform_inputs(P, x, first, count, V.data());
      int64_t o0 = 0;
      for (; o0 + 32 <= O; o0 += 32) output_block<2>(P, V.data(), U, first, count, o0, bias, M.data(), y);
      if (o0 < O) output_block<1>(P, V.data(), U, first, count, o0, bias, M.data(), y);
    }
  });
}

void winograd_bf16_weight_grad3x3(int64_t N, int64_t C, int64_t O, int64_t H, int64_t W, const uint16_t* x,
                                  ChannelBlockedLayout x_layout, const uint16_t* gy, ChannelBlockedLayout gy_layout,
                                  uint16_t* gw, FilterStrides gw_strides, uint16_t* gb) {
  const int64_t tile_rows = (H + 1) / 2, tile_cols = (W + 1) / 2;
  const Plan P{N, C, O, H, W, tile_rows, tile_cols, N * tile_rows * tile_cols, x_layout, gy_layout};
  const int64_t chunk = std::max<int64_t>(2, kGradChunkBytes / (kElements * 2 * (C + O)) / 2 * 2);
  Tensor v = empty({kElements * chunk * C}, TensorOptions(DType::BF16));
  Tensor z = empty({kElements * chunk / 2 * O}, TensorOptions(DType::F32));  // 32-bit pairs
  Tensor m = empty({kElements * O * C}, TensorOptions(DType::F32));
  const GradWork w{
      P, x, gy, chunk, static_cast<uint16_t*>(v.raw_data()), static_cast<uint32_t*>(z.raw_data()), m.data<float>()};
  const int64_t o_blocks = (O + kGradRows - 1) / kGradRows, jobs = kElements * o_blocks;
  for (int64_t first = 0; first < P.tiles; first += chunk) {
    const int64_t count = std::min(chunk, P.tiles - first), pairs = (count + 1) / 2;
    parallel_for(0, pairs, 4, [&](int64_t p0, int64_t p1) {
      for (int64_t pair = p0; pair < p1; ++pair) transform_tile_pair(w, first, count, pair);
    });
    // Jobs (element, block of output channels): each sums its own part of M, chunk after chunk.
    parallel_for(0, jobs, 1, [&](int64_t j0, int64_t j1) {
      for (int64_t job = j0; job < j1; ++job) {
        const int e = static_cast<int>(job / o_blocks);
        const int64_t o0 = job % o_blocks * kGradRows;
        const int R = static_cast<int>(std::min<int64_t>(kGradRows, O - o0));
        for (int64_t c0 = 0; c0 < C; c0 += 32) {
          const int NV = C - c0 >= 32 ? 2 : 1;
          kGradientSums[NV - 1][R - 1](w, e, o0, c0, pairs, first == 0);
        }
      }
    });
  }
  parallel_for(0, O, 1, [&](int64_t o0, int64_t o1) {
    for (int64_t o = o0; o < o1; ++o)
      for (int64_t c0 = 0; c0 < C; c0 += 16) finish_weight_gradient(w, o, c0, gw, gw_strides);
  });
  if (gb)
    parallel_for(0, O / 16, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) bias_gradient(P, gy, 16 * b, gb);
    });
}

}  // namespace ft::cpu
