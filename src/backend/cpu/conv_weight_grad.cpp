// bf16 convolution weight gradients with images paired (conv_weight_grad.h).
//
// Work is split in three levels:
// - Jobs: one (block of up to 12 output channels, tap) each, ordered by block, so the jobs a
//   thread takes cover one range of output channels, and their sums never meet another thread's.
// - Chunks: output rows of all image pairs, walked in order. For each chunk a thread packs the
//   gradient pairs of its channels into a buffer sized to stay in L2, then runs all its jobs over
//   it, 32 input channels at a time, prefetching the input slice the next pass will read.
// - Register tiles: 12 output channels x 32 input channels (24 f32 accumulators of 16 lanes)
//   summed over the chunk's positions. Per position a tile loads the 32 x channels of each image
//   and interleaves them into pairs in-lane (vpunpcklwd / vpunpckhwd, which leave the channels
//   of the two vectors in the order 0-3, 8-11, 16-19, 24-27 | 4-7, 12-15, ...: the tile restores
//   it once at its end), then issues 24 vdpbf16ps with broadcast gradient pairs. A tile of 16
//   input channels interleaves with one vpermt2w instead. Between chunks the sums wait in f32;
//   the last chunk rounds them to bf16 and writes them into the gradient (OHWI; OIHW is permuted
//   from it afterwards).
// Chunk boundaries do not depend on the thread count, so neither does any sum's order.
#include "backend/cpu/conv_weight_grad.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <utility>
#include <vector>

#include "backend/cpu/avx512_kernel.h"
#include "backend/cpu/bf16_pairs.h"
#include "backend/cpu/isa.h"
#include "fasttrain/dtype.h"
#include "fasttrain/error.h"
#include "fasttrain/parallel.h"
#include "fasttrain/tensor.h"

namespace ft::cpu {

namespace {

constexpr int kTileRows = 12;    // output channels per register tile (broadcast operands)
constexpr int kTileVectors = 2;  // 16-channel input vectors per register tile
constexpr int64_t kChunkPairBytes = 512 << 10, kChunkInputBytes = 128 << 10;

// Sixteen zero channels: the partner of the last image when N is odd, read with zero strides.
alignas(64) constexpr uint16_t kZeros[16] = {};

struct Geometry {
  int64_t N, C, H, W, O, OH, OW, kH, kW, sh, sw, ph, pw;
  ChannelBlockedLayout x;
};

// Packs gy's 16 channels from o at row u, column j of an image pair into out; with bias, adds
// both halves of each pair into it.
FT_AVX512_KERNEL inline void pack_pair_vector(const Geometry& g, const uint16_t* gy, ChannelBlockedLayout l, int64_t u,
                                              int64_t j, int64_t o, __m512i idx, uint32_t* out, float* bias) {
  const int64_t n = 2 * (u / g.OH);
  const uint16_t* a = gy + n * l.n_stride + (u % g.OH) * l.h_stride + j * l.w_stride + (o / 16) * l.block_stride;
  const __m512i v = pair_up(a, n + 1 < g.N ? a + l.n_stride : kZeros, idx);
  _mm512_storeu_si512(out, v);
  if (bias) {
    const __m512i high = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
    const __m512 sum = _mm512_add_ps(_mm512_loadu_ps(bias), _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)));
    _mm512_storeu_ps(bias, _mm512_add_ps(sum, _mm512_castsi512_ps(_mm512_and_si512(v, high))));
  }
}

// A chunk's gradient pairs, for the output channels [o_begin, o_end) (multiples of 16):
// out[(u - u0) * OW + j][o - o_begin] = (gy[2 pair, o, i, j], gy[2 pair + 1, o, i, j]), low half
// first, for the chunk's rows u = pair * OH + i. With bias (f32, indexed from o_begin), also adds
// both halves of every pair into it.
FT_AVX512_KERNEL void pack_pairs(const Geometry& g, const uint16_t* gy, ChannelBlockedLayout l, int64_t u0, int64_t u1,
                                 int64_t o_begin, int64_t o_end, uint32_t* out, float* bias) {
  const __m512i idx = pair_indices();
  const int64_t width = o_end - o_begin;
  // Read gy in its memory order: channels innermost for NHWC, positions innermost for nChw16c.
  const bool channels_inner = l.block_stride == 16;
  const int64_t positions = (u1 - u0) * g.OW, blocks = width / 16;
  for (int64_t outer = 0; outer < (channels_inner ? positions : blocks); ++outer)
    for (int64_t inner = 0; inner < (channels_inner ? blocks : positions); ++inner) {
      const int64_t k = channels_inner ? outer : inner, o = 16 * (channels_inner ? inner : outer);
      pack_pair_vector(g, gy, l, u0 + k / g.OW, k % g.OW, o_begin + o, idx, out + k * width + o,
                       bias ? bias + o : nullptr);
    }
}

// Prefetches into L2 the part [begin, end) (of `parts`) of the input slice that register tiles
// with first input channel c0 read for output rows [u0, u1): every input row those rows touch,
// both images of each pair, 16 * kTileVectors channels per position.
FT_AVX512_KERNEL void prefetch_input_slice(const Geometry& g, const uint16_t* x, int64_t u0, int64_t u1, int64_t c0,
                                           int64_t part, int64_t parts) {
  if (u0 >= u1) return;
  // Input rows [h0, h1) of each pair touched by output rows [u0, u1) (whole pairs approximated).
  const int64_t span = (std::min<int64_t>(u1 - u0, g.OH) - 1) * g.sh + g.kH;
  const int64_t first_pair = u0 / g.OH, last_pair = (u1 - 1) / g.OH;
  const int64_t lines = (last_pair - first_pair + 1) * 2 * span * g.W;
  const int64_t begin = lines * part / parts, end = lines * (part + 1) / parts;
  // Position k of the slice is column k % W of row (k / W) % span of image (k / W / span) % 2 of
  // pair first_pair + k / W / span / 2: decomposed once, then stepped.
  int64_t w = begin % g.W, r = begin / g.W % span, image = begin / g.W / span % 2;
  int64_t pair = first_pair + begin / g.W / span / 2;
  for (int64_t k = begin; k < end; ++k) {
    const int64_t n = 2 * pair + image;
    const int64_t h = (pair == first_pair ? u0 % g.OH : 0) * g.sh - g.ph + r;
    if (n < g.N && h >= 0 && h < g.H) {
      const char* a = reinterpret_cast<const char*>(x + n * g.x.n_stride + h * g.x.h_stride + w * g.x.w_stride +
                                                    (c0 / 16) * g.x.block_stride);
      for (int v = 0; v < kTileVectors && c0 + 16 * v < g.C; ++v)
        _mm_prefetch(a + v * g.x.block_stride * 2, _MM_HINT_T1);
    }
    if (++w < g.W) continue;
    w = 0;
    if (++r < span) continue;
    r = 0;
    if (++image < 2) continue;
    image = 0;
    ++pair;
  }
}

// Valid range [lo, hi) of output index j for tap q: input column j*s - pad + q inside [0, size).
std::pair<int64_t, int64_t> valid_outputs(int64_t q, int64_t s, int64_t pad, int64_t size, int64_t out) {
  const int64_t first = pad - q;  // j*s >= first
  const int64_t lo = first <= 0 ? 0 : (first + s - 1) / s;
  const int64_t last = size - 1 + pad - q;  // j*s <= last
  const int64_t hi = last < 0 ? 0 : std::min(out, last / s + 1);
  return {lo, std::max(lo, hi)};
}

struct Tile {
  int64_t p, q;           // tap
  int64_t c0;             // first input channel
  int64_t u0, u1;         // output rows [u0, u1) of all image pairs: row u is row u % OH of pair u / OH
  const uint32_t* pairs;  // the tile's first output channel in the chunk's packed pairs
  int64_t pair_stride;    // elements between positions there
  // Sums of earlier chunks (row stride C): read unless this is the first chunk, written unless it
  // is the last; the last writes the finished sums as bf16 to out instead (row stride out_stride).
  float* partial;
  uint16_t* out;
  int64_t out_stride;
  bool first, last;
};

// The positions of one output row for a register tile: s[r][v] += the products of n positions,
// from x at xa (and the partner image at xb) and the packed gradient pairs at d. Whether there is
// a partner and whether the 32 channels are consecutive (NHWC) are template arguments, decided
// once per row by the caller: tested per position, they cost 2-7% of the tile's time.
template <int R, int V, bool kPartner, bool kNhwc>
FT_BF16_KERNEL __attribute__((always_inline)) inline void row_sum(__m512 (&s)[R][V], const uint16_t* xa,
                                                                  const uint16_t* xb, const uint32_t* d, int64_t n,
                                                                  int64_t step, int64_t pair_stride,
                                                                  int64_t block_stride) {
  for (int64_t j = 0; j < n; ++j) {
    __m512i b[V];
    if constexpr (V == 2) {
      const __m512i va = load_32_channels(xa, kNhwc ? 16 : block_stride);
      const __m512i vb = kPartner ? load_32_channels(xb, kNhwc ? 16 : block_stride) : _mm512_setzero_si512();
      b[0] = _mm512_unpacklo_epi16(va, vb);
      b[1] = _mm512_unpackhi_epi16(va, vb);
    } else {
      b[0] = pair_up(xa, xb, pair_indices());  // a constant load, hoisted
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512bh a = (__m512bh)_mm512_set1_epi32(static_cast<int>(d[r]));
#pragma GCC unroll 16
      for (int v = 0; v < V; ++v) s[r][v] = _mm512_dpbf16_ps(s[r][v], a, (__m512bh)b[v]);
    }
    xa += step;
    if constexpr (kPartner) xb += step;
    d += pair_stride;
  }
}

// Sums one register tile of R output channels x V vectors of input channels over a chunk's
// positions, on top of the earlier chunks' sums.
template <int R, int V>
FT_BF16_KERNEL void tile_sum(const Geometry& g, const Tile& t, const uint16_t* x) {
  __m512 s[R][V];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int v = 0; v < V; ++v) s[r][v] = _mm512_setzero_ps();
  const auto [j0, j1] = valid_outputs(t.q, g.sw, g.pw, g.W, g.OW);
  const int64_t step = g.sw * g.x.w_stride;
  for (int64_t u = t.u0; u < t.u1; ++u) {
    const int64_t i = u % g.OH, n = 2 * (u / g.OH);
    const int64_t h = i * g.sh - g.ph + t.p;
    if (h < 0 || h >= g.H || j0 == j1) continue;
    const uint16_t* xa = x + n * g.x.n_stride + h * g.x.h_stride + (j0 * g.sw - g.pw + t.q) * g.x.w_stride +
                         (t.c0 / 16) * g.x.block_stride;
    const bool partner = n + 1 < g.N;
    const uint16_t* xb = partner ? xa + g.x.n_stride : kZeros;  // the last image of an odd batch: zeros
    const uint32_t* d = t.pairs + ((u - t.u0) * g.OW + j0) * t.pair_stride;
    const int64_t count = j1 - j0, bs = g.x.block_stride;
    const bool nhwc = bs == 16;
    if (partner && nhwc)
      row_sum<R, V, true, true>(s, xa, xb, d, count, step, t.pair_stride, bs);
    else if (partner)
      row_sum<R, V, true, false>(s, xa, xb, d, count, step, t.pair_stride, bs);
    else if (nhwc)
      row_sum<R, V, false, true>(s, xa, xb, d, count, step, t.pair_stride, bs);
    else
      row_sum<R, V, false, false>(s, xa, xb, d, count, step, t.pair_stride, bs);
  }
  if constexpr (V == 2)
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) restore_channel_order(s[r][0], s[r][1]);
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int v = 0; v < V; ++v) {
      // partial is null with a single chunk (first and last): no address is formed from it then.
      const __m512 sum = t.first ? s[r][v] : _mm512_add_ps(_mm512_loadu_ps(t.partial + r * g.C + v * 16), s[r][v]);
      if (t.last)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(t.out + r * t.out_stride + v * 16),
                            (__m256i)_mm512_cvtneps_pbh(sum));
      else
        _mm512_storeu_ps(t.partial + r * g.C + v * 16, sum);
    }
}

using TileFn = void (*)(const Geometry&, const Tile&, const uint16_t*);

template <int V, size_t... R>
constexpr std::array<TileFn, sizeof...(R)> tiles_of_width(std::index_sequence<R...>) {
  return {&tile_sum<static_cast<int>(R) + 1, V>...};
}
// kTiles[V - 1][R - 1]: the kernel for R output channels x V input vectors.
constexpr std::array<std::array<TileFn, kTileRows>, kTileVectors> kTiles = {
    tiles_of_width<1>(std::make_index_sequence<kTileRows>{}), tiles_of_width<2>(std::make_index_sequence<kTileRows>{})};

// Output rows per chunk (across image pairs): a thread's share of the chunk's gradient pairs
// (taken as at most 256 channels, so that the chunks, hence the order of the sums, do not depend
// on the thread count) stays in L2 while its jobs sweep it, and so do the input rows that one
// register tile reads (32 channels of both images).
int64_t rows_per_chunk(const Geometry& g) {
  const int64_t pair_bytes = g.OW * std::min<int64_t>(g.O, 256) * 4;
  const int64_t input_bytes = g.sh * g.W * 16 * kTileVectors * 4;
  return std::max<int64_t>(1, std::min(kChunkPairBytes / pair_bytes, kChunkInputBytes / input_bytes));
}

// One call's buffers and sizes, shared by the threads.
struct Work {
  Geometry g;
  const uint16_t* gy;
  ChannelBlockedLayout gy_layout;
  const uint16_t* x;
  int64_t taps, o_blocks, rows, total_rows;
  float* partial;  // f32 sums between chunks, [tap][o][c]; null with a single chunk
  uint16_t* ohwi;  // the finished gradient, [o][tap][c]
  float* bias;     // f32 bias sums, or null
};

// Jobs [job_begin, job_end): job = block * taps + tap, the block of output channels from 12 * block.
// The jobs of one thread cover one range of output channels, whose gradient pairs it packs itself,
// chunk by chunk, into a buffer that stays in L2.
void run_jobs(const Work& w, int64_t job_begin, int64_t job_end) {
  if (job_begin >= job_end) return;
  const Geometry& g = w.g;
  const int64_t o_first = job_begin / w.taps * kTileRows;
  const int64_t o_last = std::min(g.O, ((job_end - 1) / w.taps + 1) * kTileRows);
  const int64_t o_begin = o_first / 16 * 16, o_end = (o_last + 15) / 16 * 16, width = o_end - o_begin;
  thread_local std::vector<uint32_t> packed;
  thread_local std::vector<float> bias_part;
  packed.resize(w.rows * g.OW * width);
  bias_part.assign(w.bias ? width : 0, 0.0f);
  const int64_t jobs = job_end - job_begin;
  for (int64_t u0 = 0; u0 < w.total_rows; u0 += w.rows) {
    const int64_t u1 = std::min(w.total_rows, u0 + w.rows);
    pack_pairs(g, w.gy, w.gy_layout, u0, u1, o_begin, o_end, packed.data(), w.bias ? bias_part.data() : nullptr);
    for (int64_t c0 = 0; c0 < g.C; c0 += 16 * kTileVectors)
      for (int64_t job = job_begin; job < job_end; ++job) {
        // The next input slice (next channels, or the next chunk's first) comes in meanwhile.
        if (c0 + 16 * kTileVectors < g.C)
          prefetch_input_slice(g, w.x, u0, u1, c0 + 16 * kTileVectors, job - job_begin, jobs);
        else
          prefetch_input_slice(g, w.x, u1, std::min(w.total_rows, u1 + w.rows), 0, job - job_begin, jobs);
        const int64_t tap = job % w.taps, o0 = job / w.taps * kTileRows;
        const Tile t{tap / g.kW,
                     tap % g.kW,
                     c0,
                     u0,
                     u1,
                     packed.data() + (o0 - o_begin),
                     width,
                     w.partial ? w.partial + (tap * g.O + o0) * g.C + c0 : nullptr,
                     w.ohwi + (o0 * w.taps + tap) * g.C + c0,
                     w.taps * g.C,
                     u0 == 0,
                     u1 == w.total_rows};
        const int R = static_cast<int>(std::min<int64_t>(kTileRows, g.O - o0));
        const int V = static_cast<int>(std::min<int64_t>(kTileVectors, (g.C - c0) / 16));
        kTiles[V - 1][R - 1](g, t, w.x);
      }
  }
  // A block's bias sums are kept by the thread holding its first tap (blocks may be split).
  const int64_t bias_begin = (job_begin + w.taps - 1) / w.taps * kTileRows;
  for (int64_t o = bias_begin; w.bias && o < o_last; ++o) w.bias[o] = bias_part[o - o_begin];
}

// The first job of thread t of n when the jobs are split by work (a job's output channels, as the
// last block may be narrower than 12) rather than by count; first_job(n, n) is the job count.
int64_t first_job(const Work& w, int64_t t, int64_t n) {
  const int64_t work = t * w.taps * w.g.O / n;  // in (tap, output channel) units, block-major
  const int64_t block = std::min(work / (w.taps * kTileRows), w.o_blocks - 1);
  const int64_t width = std::min<int64_t>(kTileRows, w.g.O - block * kTileRows);
  const int64_t tap = (work - block * w.taps * kTileRows + width - 1) / width;  // rounded up
  return std::min(w.o_blocks * w.taps, block * w.taps + tap);
}

}  // namespace

void paired_weight_grad(const ConvParams& p, const uint16_t* gy, ChannelBlockedLayout gy_layout, const uint16_t* x,
                        ChannelBlockedLayout x_layout, uint16_t* gw, uint16_t* gb) {
  FT_CHECK(paired_weight_grad_supported(p), "paired bf16 weight gradient: unsupported convolution or CPU");
  const Geometry g{p.N,  p.C,  p.H,         p.W,         p.O,          p.OH,         p.OW,
                   p.kH, p.kW, p.stride[0], p.stride[1], p.padding[0], p.padding[1], x_layout};
  const int64_t taps = g.kH * g.kW, total_rows = (g.N + 1) / 2 * g.OH, rows = rows_per_chunk(g);
  Tensor partial = rows < total_rows ? empty({taps * g.O * g.C}, TensorOptions(DType::F32)) : Tensor();
  // The finished gradient goes out as OHWI; OIHW with several taps is permuted after.
  const bool direct = p.weight_channels_last || taps == 1;
  Tensor ohwi = direct ? Tensor() : empty({g.O * taps * g.C}, TensorOptions(DType::BF16));
  Tensor bias = gb ? empty({g.O}, TensorOptions(DType::F32)) : Tensor();
  const Work w{g,
               gy,
               gy_layout,
               x,
               taps,
               (g.O + kTileRows - 1) / kTileRows,
               rows,
               total_rows,
               partial.defined() ? partial.data<float>() : nullptr,
               direct ? gw : static_cast<uint16_t*>(ohwi.raw_data()),
               gb ? bias.data<float>() : nullptr};
  const int64_t threads = std::min<int64_t>(get_num_threads(), w.o_blocks * taps);
  parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) run_jobs(w, first_job(w, t, threads), first_job(w, t + 1, threads));
  });

  if (!direct)  // OHWI -> OIHW
    parallel_for(0, g.O, 1, [&](int64_t begin, int64_t end) {
      for (int64_t o = begin; o < end; ++o)
        for (int64_t tap = 0; tap < taps; ++tap)
          for (int64_t c = 0; c < g.C; ++c) gw[(o * g.C + c) * taps + tap] = w.ohwi[(o * taps + tap) * g.C + c];
    });
  for (int64_t o = 0; gb && o < g.O; ++o) gb[o] = bf16::from_float(w.bias[o]);
}

ChannelBlockedLayout nhwc_layout(int64_t C, int64_t H, int64_t W) { return {H * W * C, W * C, C, 16}; }
ChannelBlockedLayout nchw16c_layout(int64_t C, int64_t H, int64_t W) { return {C * H * W, W * 16, 16, H * W * 16}; }

bool paired_weight_grad_supported(const ConvParams& p) {
  return selected_cpu_isa() >= CpuIsa::Avx512Bf16 && p.groups == 1 && p.dilation[0] == 1 && p.dilation[1] == 1 &&
         p.C % 16 == 0 && p.O % 16 == 0 && p.N > 0;
}

}  // namespace ft::cpu
