// Convolution on oneDNN's primitives (f32 and bf16).
//
// Why these choices (measured on 2 cores, AVX-512 with BF16, batch 64, 3x3 convs of the cnn-mini
// model; the figures are in docs/PERF.md):
// - Weights are described with format `any` and reordered from the user's OIHW each call: with a
//   plain OIHW weight descriptor oneDNN only offers its reference kernel for NHWC activations
//   (orders of magnitude slower); with `any` it picks the brgemm kernels, several times faster
//   than im2col+sgemm.
// - NHWC (channels-last) activations are used in place: brgconv runs on them directly, and so
//   are channels-last (OHWI) weights and their gradients, which oneDNN reorders from and to as it
//   does OIHW ones (no OIHW copy of each weight per step, nor a copy of its gradient back).
// - NCHW activations are described with `any` too: oneDNN then picks its blocked (nChw16c) JIT
//   kernels, and the reorders in and out cost much less than the plain-NCHW GEMM kernel loses.
// - f32 3x3 stride-1 convolutions ask for oneDNN's Winograd kernels (conv.h's rule, FT_CONV_ALGO),
//   on its blocked layouts whatever the activations' format; the backward passes follow the
//   forward's algorithm, falling back to direct where oneDNN has no Winograd kernel for them.
// - bf16 weight and bias gradients are produced in f32 and rounded once by the reorder that stores
//   them in the user's layout.
// - Primitive descriptors and primitives are cached per configuration (shape, dtype, layout,
//   bias), so a training step creates nothing after the first.
// - A configuration for which oneDNN would only run a reference (`ref:`) kernel is declined, and the
//   caller uses the im2col + OpenBLAS path instead.
#include <dnnl.hpp>

#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/cpu/block_transpose.h"
#include "backend/cpu/conv.h"
#include "backend/cpu/conv_weight_grad.h"
#include "backend/cpu/conv_winograd.h"
#include "backend/cpu/copy.h"
#include "backend/cpu/linalg.h"

namespace ft::cpu {

namespace {

using dnnl::memory;
using tag = memory::format_tag;
using ddt = memory::data_type;

dnnl::engine& cpu_engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

dnnl::stream& cpu_stream() {
  thread_local dnnl::stream s(cpu_engine());
  return s;
}

ddt dnnl_type(DType t) { return t == DType::BF16 ? ddt::bf16 : ddt::f32; }

// Primitives take their scratch memory (Winograd's transformed tiles, backward-weights' partial
// sums) from the caller, which gets it from the caching allocator (scratch() below), so it shows
// in the memory statistics and profiles instead of living inside oneDNN.
dnnl::primitive_attr user_scratchpad() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

bool is_reference_impl(const char* impl) { return std::string(impl).rfind("ref", 0) == 0; }

struct ConvPrims {
  memory::desc act_x, act_y;    // user activations (x / gx, y / gy)
  memory::desc user_w, user_b;  // the user's weight and bias layouts
  std::optional<dnnl::convolution_forward::primitive_desc> fwd_pd;
  std::optional<dnnl::convolution_forward> fwd;
  bool data_tried = false, weight_tried = false;
  std::optional<dnnl::convolution_backward_data::primitive_desc> data_pd;
  std::optional<dnnl::convolution_backward_data> data;
  std::optional<dnnl::convolution_backward_weights::primitive_desc> weight_pd;
  std::optional<dnnl::convolution_backward_weights> weight;
  memory::dims strides, dilates, pad_l, pad_r;
  memory::desc any_x, any_y, any_w, any_w_f32, any_b, any_b_f32;
  dnnl::algorithm alg = dnnl::algorithm::convolution_direct;  // that of fwd_pd; the backward ones follow it
};

std::mutex g_mutex;
std::map<std::string, std::unique_ptr<ConvPrims>> g_cache;

std::string cache_key(const ConvParams& p, DType dt, bool bias) {
  std::string k;
  for (int64_t v : {p.N, p.C, p.H, p.W, p.O, p.kH, p.kW, p.stride[0], p.stride[1], p.padding[0], p.padding[1],
                    p.dilation[0], p.dilation[1], p.groups, static_cast<int64_t>(p.channels_last),
                    static_cast<int64_t>(p.weight_channels_last), static_cast<int64_t>(dt), static_cast<int64_t>(bias),
                    // the algorithm the primitives are made for: the switch FT_CONV_ALGO may change in-process
                    static_cast<int64_t>(conv_algorithm(p, dt))}) {
    k += std::to_string(v);
    k += ',';
  }
  return k;
}

// Creates c's forward primitive with algorithm `alg` and activation descriptors x, y, unless oneDNN
// rejects the configuration or would only run its reference kernel for it.
void make_forward(ConvPrims& c, dnnl::algorithm alg, bool bias, const memory::desc& x, const memory::desc& y) {
  try {
    auto d = bias ? dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, alg, x, c.any_w, c.any_b, y,
                                                    c.strides, c.dilates, c.pad_l, c.pad_r)
                  : dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, alg, x, c.any_w, y, c.strides,
                                                    c.dilates, c.pad_l, c.pad_r);
    dnnl::convolution_forward::primitive_desc pd(d, user_scratchpad(), cpu_engine());
    if (is_reference_impl(pd.impl_info_str())) return;
    c.fwd_pd = pd;
    c.fwd = dnnl::convolution_forward(pd);
    c.alg = alg;
  } catch (const dnnl::error&) {
    // unsupported: leave fwd empty
  }
}

// Returns the cached primitives for the configuration (creating the forward one on first use), or
// null when oneDNN has no non-reference forward implementation for it.
ConvPrims* lookup(const ConvParams& p, DType dt, bool bias) {
  const std::string key = cache_key(p, dt, bias);
  auto it = g_cache.find(key);
  if (it != g_cache.end()) return it->second->fwd ? it->second.get() : nullptr;
  auto c = std::make_unique<ConvPrims>();
  const ddt t = dnnl_type(dt);
  const memory::dims xd = {p.N, p.C, p.H, p.W}, yd = {p.N, p.O, p.OH, p.OW};
  const memory::dims wd = p.groups == 1 ? memory::dims{p.O, p.C, p.kH, p.kW}
                                        : memory::dims{p.groups, p.O / p.groups, p.C / p.groups, p.kH, p.kW};
  const tag wtag = p.groups > 1 ? tag::goihw : p.weight_channels_last ? tag::ohwi : tag::oihw;
  const tag atag = p.channels_last ? tag::nhwc : tag::nchw;
  c->act_x = memory::desc(xd, t, atag);
  c->act_y = memory::desc(yd, t, atag);
  c->user_w = memory::desc(wd, t, wtag);
  c->user_b = memory::desc({p.O}, t, tag::x);
  c->any_x = p.channels_last ? c->act_x : memory::desc(xd, t, tag::any);
  c->any_y = p.channels_last ? c->act_y : memory::desc(yd, t, tag::any);
  c->any_w = memory::desc(wd, t, tag::any);
  c->any_w_f32 = memory::desc(wd, ddt::f32, tag::any);
  c->any_b = c->user_b;
  c->any_b_f32 = memory::desc({p.O}, ddt::f32, tag::x);
  c->strides = {p.stride[0], p.stride[1]};
  c->dilates = {p.dilation[0] - 1, p.dilation[1] - 1};  // oneDNN counts the gaps
  c->pad_l = {p.padding[0], p.padding[1]};
  // Right padding so that the output size matches floor((H + 2p - d(k-1) - 1) / s) + 1.
  c->pad_r = {(p.OH - 1) * p.stride[0] + (p.kH - 1) * p.dilation[0] + 1 - p.H - p.padding[0],
              (p.OW - 1) * p.stride[1] + (p.kW - 1) * p.dilation[1] + 1 - p.W - p.padding[1]};
  if (conv_algorithm(p, dt) == ConvAlgorithm::Winograd) {
    // oneDNN's Winograd kernels work on its blocked layouts only, so channels-last activations are
    // reordered too, as NCHW ones always are.
    const memory::desc blocked_x(xd, t, tag::any), blocked_y(yd, t, tag::any);
    make_forward(*c, dnnl::algorithm::convolution_winograd, bias, blocked_x, blocked_y);
    if (c->fwd) c->any_x = blocked_x, c->any_y = blocked_y;
  }
  if (!c->fwd) make_forward(*c, dnnl::algorithm::convolution_direct, bias, c->any_x, c->any_y);
  ConvPrims* out = c->fwd ? c.get() : nullptr;
  g_cache.emplace(key, std::move(c));
  return out;
}

// The algorithms to try for c's backward passes: the forward's, then direct (oneDNN may have a
// Winograd forward for a configuration and no Winograd backward).
std::vector<dnnl::algorithm> backward_algorithms(const ConvPrims& c) {
  if (c.alg == dnnl::algorithm::convolution_direct) return {c.alg};
  return {c.alg, dnnl::algorithm::convolution_direct};
}

// Creates a backward primitive (Prim: backward-data or backward-weights) from describe(algorithm)
// on the first of backward_algorithms(c) that oneDNN runs with a non-reference kernel.
template <class Prim, class Describe>
void make_backward(const ConvPrims& c, Describe describe, std::optional<typename Prim::primitive_desc>& pd_out,
                   std::optional<Prim>& prim_out) {
  for (dnnl::algorithm alg : backward_algorithms(c)) {
    try {
      typename Prim::primitive_desc pd(describe(alg), user_scratchpad(), cpu_engine(), *c.fwd_pd);
      if (is_reference_impl(pd.impl_info_str())) continue;
      pd_out = pd;
      prim_out = Prim(pd);
      return;
    } catch (const dnnl::error&) {
    }
  }
}

void make_backward_data(ConvPrims& c) {
  make_backward<dnnl::convolution_backward_data>(
      c,
      [&c](dnnl::algorithm alg) {
        return dnnl::convolution_backward_data::desc(alg, c.any_x, c.any_w, c.any_y, c.strides, c.dilates, c.pad_l,
                                                     c.pad_r);
      },
      c.data_pd, c.data);
}

// Weight (and bias) gradients in f32 whatever the activations' type (rounded when stored).
void make_backward_weights(ConvPrims& c, bool bias) {
  make_backward<dnnl::convolution_backward_weights>(
      c,
      [&c, bias](dnnl::algorithm alg) {
        using D = dnnl::convolution_backward_weights::desc;
        return bias ? D(alg, c.any_x, c.any_w_f32, c.any_b_f32, c.any_y, c.strides, c.dilates, c.pad_l, c.pad_r)
                    : D(alg, c.any_x, c.any_w_f32, c.any_y, c.strides, c.dilates, c.pad_l, c.pad_r);
      },
      c.weight_pd, c.weight);
}

// Scratch memory for a oneDNN buffer, from the caching allocator.
memory scratch(const memory::desc& md, std::vector<Tensor>& keep) {
  keep.push_back(empty({static_cast<int64_t>(md.get_size())}, TensorOptions(DType::U8)));
  return memory(md, cpu_engine(), keep.back().raw_data());
}

// bf16 activations between plain NCHW and nChw16c (the layout oneDNN's NCHW kernels run on) take
// block_transpose.h's transposes, faster than oneDNN's reorder for them (docs/PERF.md). Returns
// false, having copied nothing, for any other pair of layouts or type.
bool transpose_activation(const memory& from, const memory& to) {
  const memory::desc f = from.get_desc(), t = to.get_desc();
  const memory::dims d = f.dims();
  const ddt dt = f.data_type();
  if (d.size() != 4 || d[1] % 16 != 0 || dt != ddt::bf16 || t.data_type() != dt || !block_transpose_available())
    return false;
  const memory::desc plain(d, dt, tag::nchw), blocked(d, dt, tag::nChw16c);
  if (f == plain && t == blocked)
    nchw_to_blocked16(from.get_data_handle(), to.get_data_handle(), d[0], d[1], d[2] * d[3]);
  else if (f == blocked && t == plain)
    blocked16_to_nchw(from.get_data_handle(), to.get_data_handle(), d[0], d[1], d[2] * d[3]);
  else
    return false;
  return true;
}

// Copies `from` into `to`: the same tensor in another layout.
void reorder(memory from, memory to) {
  cpu_stream().wait();  // a primitive writing `from` has finished
  if (!transpose_activation(from, to)) dnnl::reorder(from, to).execute(cpu_stream(), from, to);
}

// A oneDNN input in layout `want`, from user data in layout `user`: the user buffer itself when the
// layouts agree, else a reordered copy.
memory input(const memory::desc& want, const memory::desc& user, void* ptr, std::vector<Tensor>& keep) {
  memory u(user, cpu_engine(), ptr);
  if (want == user) return u;
  memory m = scratch(want, keep);
  reorder(u, m);
  return m;
}

// The diff_dst that the last backward-data call reordered, kept for the backward-weights call of
// the same convolution: autograd calls the two in turn with the same gy, and oneDNN usually wants
// it in the same blocked layout for both, so the second reorder of gy (as large as the layer's
// output) is skipped. Holding the tensor keeps its memory from being reused by another; its
// version counter catches an in-place change. Dropped at the next backward call either way.
struct ReorderedGy {
  Tensor gy;
  uint32_t version = 0;
  memory mem;
  std::vector<Tensor> keep;
};
thread_local ReorderedGy t_last_gy;

memory diff_dst_for_data(const memory::desc& want, const memory::desc& user, const Tensor& gy) {
  t_last_gy = ReorderedGy{};
  memory m = input(want, user, gy.raw_data(), t_last_gy.keep);
  if (!t_last_gy.keep.empty()) t_last_gy.gy = gy, t_last_gy.version = gy.version(), t_last_gy.mem = m;
  return m;
}

memory diff_dst_for_weights(const memory::desc& want, const memory::desc& user, const Tensor& gy,
                            std::vector<Tensor>& keep) {
  ReorderedGy last = std::move(t_last_gy);
  t_last_gy = ReorderedGy{};
  if (last.gy.defined() && last.gy.same(gy) && last.version == gy.version() && last.mem.get_desc() == want) {
    keep.insert(keep.end(), last.keep.begin(), last.keep.end());
    return last.mem;
  }
  return input(want, user, gy.raw_data(), keep);
}

// An output: the user buffer when layouts agree, else scratch that flush() reorders into the user's.
struct Output {
  memory mem, user;
  bool staged = false;
};
Output output(const memory::desc& want, const memory::desc& user, void* ptr, std::vector<Tensor>& keep) {
  Output o;
  o.user = memory(user, cpu_engine(), ptr);
  if (want == user) {
    o.mem = o.user;
  } else {
    o.mem = scratch(want, keep);
    o.staged = true;
  }
  return o;
}
void flush(Output& o) {
  if (o.staged) reorder(o.mem, o.user);
}

}  // namespace

bool onednn_conv2d_forward(const ConvParams& p, const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y) {
  ConvPrims* c;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    c = lookup(p, x.dtype(), b.defined());
  }
  if (!c) return false;
  std::vector<Tensor> keep;
  const auto& pd = *c->fwd_pd;
  memory xm = input(pd.src_desc(), c->act_x, x.raw_data(), keep);
  memory wm = input(pd.weights_desc(), c->user_w, w.raw_data(), keep);
  Output ym = output(pd.dst_desc(), c->act_y, y.raw_data(), keep);
  std::unordered_map<int, memory> args = {{DNNL_ARG_SRC, xm}, {DNNL_ARG_WEIGHTS, wm}, {DNNL_ARG_DST, ym.mem}};
  if (b.defined()) args[DNNL_ARG_BIAS] = input(pd.bias_desc(), c->user_b, b.raw_data(), keep);
  args[DNNL_ARG_SCRATCHPAD] = scratch(pd.scratchpad_desc(), keep);
  c->fwd->execute(cpu_stream(), args);
  flush(ym);
  cpu_stream().wait();
  return true;
}

bool onednn_conv2d_backward_data(const ConvParams& p, const Tensor& gy, const Tensor& w, const Tensor& gx) {
  // The forward descriptor (with or without bias) only serves as a hint; reuse the bias-free one.
  // Creation happens under the lock; execution (thread-safe in oneDNN) outside it.
  ConvPrims* c;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    c = lookup(p, gy.dtype(), false);
    if (c && !c->data_tried) {
      c->data_tried = true;
      make_backward_data(*c);
    }
  }
  if (!c || !c->data) return false;
  std::vector<Tensor> keep;
  const auto& pd = *c->data_pd;
  memory gym = diff_dst_for_data(pd.diff_dst_desc(), c->act_y, gy);
  memory wm = input(pd.weights_desc(), c->user_w, w.raw_data(), keep);
  Output gxm = output(pd.diff_src_desc(), c->act_x, gx.raw_data(), keep);
  c->data->execute(cpu_stream(), {{DNNL_ARG_DIFF_DST, gym},
                                  {DNNL_ARG_WEIGHTS, wm},
                                  {DNNL_ARG_DIFF_SRC, gxm.mem},
                                  {DNNL_ARG_SCRATCHPAD, scratch(pd.scratchpad_desc(), keep)}});
  flush(gxm);
  cpu_stream().wait();
  return true;
}

bool onednn_conv2d_backward_weight(const ConvParams& p, const Tensor& gy, const Tensor& x, const Tensor& gw,
                                   const Tensor& gb) {
  const bool bias = gb.defined();
  ConvPrims* c;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    c = lookup(p, gy.dtype(), bias);
    if (c && !c->weight_tried) {
      c->weight_tried = true;
      make_backward_weights(*c, bias);
    }
  }
  if (!c || !c->weight) return false;
  std::vector<Tensor> keep;
  const auto& pd = *c->weight_pd;
  memory gym = diff_dst_for_weights(pd.diff_dst_desc(), c->act_y, gy, keep);
  memory xm = input(pd.src_desc(), c->act_x, x.raw_data(), keep);
  // Gradients are produced in f32; for bf16 the reorder into the user's layout rounds them once.
  Output gwm = output(pd.diff_weights_desc(), c->user_w, gw.raw_data(), keep);
  std::unordered_map<int, memory> args = {
      {DNNL_ARG_DIFF_DST, gym}, {DNNL_ARG_SRC, xm}, {DNNL_ARG_DIFF_WEIGHTS, gwm.mem}};
  Output gbm;
  if (bias) {
    gbm = output(pd.diff_bias_desc(), c->user_b, gb.raw_data(), keep);
    args[DNNL_ARG_DIFF_BIAS] = gbm.mem;
  }
  args[DNNL_ARG_SCRATCHPAD] = scratch(pd.scratchpad_desc(), keep);
  c->weight->execute(cpu_stream(), args);
  flush(gwm);
  if (bias) flush(gbm);
  cpu_stream().wait();
  return true;
}

bool paired_conv2d_backward_weight(const ConvParams& p, const Tensor& gy, const Tensor& x, const Tensor& gw,
                                   const Tensor& gb) {
  if (gy.dtype() != DType::BF16 || !paired_weight_grad_supported(p)) return false;
  auto* gw_data = static_cast<uint16_t*>(gw.raw_data());
  auto* gb_data = gb.defined() ? static_cast<uint16_t*>(gb.raw_data()) : nullptr;
  if (p.channels_last) {
    paired_weight_grad(p, static_cast<const uint16_t*>(gy.raw_data()), nhwc_layout(p.O, p.OH, p.OW),
                       static_cast<const uint16_t*>(x.raw_data()), nhwc_layout(p.C, p.H, p.W), gw_data, gb_data);
    return true;
  }
  // NCHW: the kernel reads nChw16c, as oneDNN's kernels do, so gy's copy from backward-data is
  // reused here the same way.
  std::vector<Tensor> keep;
  const memory::dims xd = {p.N, p.C, p.H, p.W}, yd = {p.N, p.O, p.OH, p.OW};
  const memory::desc x_plain(xd, ddt::bf16, tag::nchw), y_plain(yd, ddt::bf16, tag::nchw);
  memory gym = diff_dst_for_weights(memory::desc(yd, ddt::bf16, tag::nChw16c), y_plain, gy, keep);
  memory xm = input(memory::desc(xd, ddt::bf16, tag::nChw16c), x_plain, x.raw_data(), keep);
  paired_weight_grad(p, static_cast<const uint16_t*>(gym.get_data_handle()), nchw16c_layout(p.O, p.OH, p.OW),
                     static_cast<const uint16_t*>(xm.get_data_handle()), nchw16c_layout(p.C, p.H, p.W), gw_data,
                     gb_data);
  return true;
}

namespace {

// Filter (out, in, p, q) of a weight tensor [O, C, 3, 3] in any dense layout: forward reads it as
// it is; backward-data as the transposed, rotated filter (out = c, in = o, p -> 2 - p, q -> 2 - q).
FilterView filter_view(const Tensor& w, bool backward_data) {
  const auto* base = static_cast<const uint16_t*>(w.raw_data());
  const int64_t so = w.stride(0), sc = w.stride(1), sp = w.stride(2), sq = w.stride(3);
  if (!backward_data) return {base, {so, sc, sp, sq}};
  return {base + 2 * sp + 2 * sq, {sc, so, -sp, -sq}};
}

// One Winograd pass from `in` (channels in_c) to `out` (channels out_c), both [N, ., H, W]: NHWC
// read and written in place, NCHW through nChw16c copies (gy's kept for the weight gradient, as
// oneDNN's backward-data does).
void winograd_pass(const ConvParams& p, const Tensor& in, int64_t in_c, FilterView w, const Tensor& bias,
                   const Tensor& out, int64_t out_c, bool in_is_gy) {
  const auto* bias_data = bias.defined() ? static_cast<const uint16_t*>(bias.raw_data()) : nullptr;
  if (p.channels_last) {
    winograd_bf16_conv3x3(p.N, in_c, out_c, p.H, p.W, static_cast<const uint16_t*>(in.raw_data()),
                          nhwc_layout(in_c, p.H, p.W), w, bias_data, static_cast<uint16_t*>(out.raw_data()),
                          nhwc_layout(out_c, p.H, p.W));
    return;
  }
  std::vector<Tensor> keep;
  const memory::dims id = {p.N, in_c, p.H, p.W}, od = {p.N, out_c, p.H, p.W};
  const memory::desc in_plain(id, ddt::bf16, tag::nchw), in_blocked(id, ddt::bf16, tag::nChw16c);
  memory im = in_is_gy ? diff_dst_for_data(in_blocked, in_plain, in) : input(in_blocked, in_plain, in.raw_data(), keep);
  Output om =
      output(memory::desc(od, ddt::bf16, tag::nChw16c), memory::desc(od, ddt::bf16, tag::nchw), out.raw_data(), keep);
  winograd_bf16_conv3x3(p.N, in_c, out_c, p.H, p.W, static_cast<const uint16_t*>(im.get_data_handle()),
                        nchw16c_layout(in_c, p.H, p.W), w, bias_data, static_cast<uint16_t*>(om.mem.get_data_handle()),
                        nchw16c_layout(out_c, p.H, p.W));
  flush(om);
}

}  // namespace

bool winograd_conv2d_forward(const ConvParams& p, const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y) {
  if (x.dtype() != DType::BF16 || !winograd_bf16_supported(p)) return false;
  winograd_pass(p, x, p.C, filter_view(w, false), b, y, p.O, false);
  return true;
}

bool winograd_conv2d_backward_data(const ConvParams& p, const Tensor& gy, const Tensor& w, const Tensor& gx) {
  if (gy.dtype() != DType::BF16 || !winograd_bf16_supported(p)) return false;
  winograd_pass(p, gy, p.O, filter_view(w, true), Tensor(), gx, p.C, true);
  return true;
}

bool winograd_conv2d_backward_weight(const ConvParams& p, const Tensor& gy, const Tensor& x, const Tensor& gw,
                                     const Tensor& gb) {
  if (gy.dtype() != DType::BF16 || !winograd_bf16_supported(p)) return false;
  const FilterStrides strides{gw.stride(0), gw.stride(1), gw.stride(2), gw.stride(3)};
  auto* gw_data = static_cast<uint16_t*>(gw.raw_data());
  auto* gb_data = gb.defined() ? static_cast<uint16_t*>(gb.raw_data()) : nullptr;
  if (p.channels_last) {
    winograd_bf16_weight_grad3x3(p.N, p.C, p.O, p.H, p.W, static_cast<const uint16_t*>(x.raw_data()),
                                 nhwc_layout(p.C, p.H, p.W), static_cast<const uint16_t*>(gy.raw_data()),
                                 nhwc_layout(p.O, p.H, p.W), gw_data, strides, gb_data);
    return true;
  }
  std::vector<Tensor> keep;  // NCHW: nChw16c copies, gy's taken from backward-data when it made one
  const memory::dims xd = {p.N, p.C, p.H, p.W}, yd = {p.N, p.O, p.H, p.W};
  memory gym =
      diff_dst_for_weights(memory::desc(yd, ddt::bf16, tag::nChw16c), memory::desc(yd, ddt::bf16, tag::nchw), gy, keep);
  memory xm =
      input(memory::desc(xd, ddt::bf16, tag::nChw16c), memory::desc(xd, ddt::bf16, tag::nchw), x.raw_data(), keep);
  winograd_bf16_weight_grad3x3(p.N, p.C, p.O, p.H, p.W, static_cast<const uint16_t*>(xm.get_data_handle()),
                               nchw16c_layout(p.C, p.H, p.W), static_cast<const uint16_t*>(gym.get_data_handle()),
                               nchw16c_layout(p.O, p.H, p.W), gw_data, strides, gb_data);
  return true;
}

bool weight_grad_is_one_product(const ConvParams& p) {
  return p.kH == 1 && p.kW == 1 && p.stride[0] == 1 && p.stride[1] == 1 && p.padding[0] == 0 && p.padding[1] == 0 &&
         p.dilation[0] == 1 && p.dilation[1] == 1 && p.groups == 1 && p.channels_last;
}

WeightGradPath choose_weight_grad_path(const ConvParams& p, switches::ConvWeightGrad setting, bool onednn_has_amx,
                                       ConvAlgorithm algorithm) {
  switch (setting) {
    case switches::ConvWeightGrad::Paired: return WeightGradPath::Paired;
    case switches::ConvWeightGrad::Onednn: return WeightGradPath::OneDnn;
    case switches::ConvWeightGrad::Matmul: return WeightGradPath::Matmul;
    case switches::ConvWeightGrad::Auto: break;
  }
  if (algorithm == ConvAlgorithm::Winograd) return WeightGradPath::Winograd;
  if (!onednn_has_amx && weight_grad_is_one_product(p) && p.N * p.OH * p.OW <= kMatmulWeightGradMaxPositions)
    return WeightGradPath::Matmul;
  const bool enough_products_per_gradient = p.kH * p.kW * p.C > 256;
  return !onednn_has_amx && enough_products_per_gradient ? WeightGradPath::Paired : WeightGradPath::OneDnn;
}

WeightGradPath weight_grad_path(const ConvParams& p) {
  static const bool amx = onednn_isa_has_amx();
  // Winograd only where its kernel runs (forced FT_CONV_ALGO=winograd on a stride-2 layer: not).
  const bool winograd = conv_algorithm(p, DType::BF16) == ConvAlgorithm::Winograd && winograd_bf16_supported(p);
  return choose_weight_grad_path(p, switches::conv_weight_grad.get(), amx,
                                 winograd ? ConvAlgorithm::Winograd : ConvAlgorithm::Direct);
}

ConvAlgorithm choose_conv_algorithm(const ConvParams& p, DType dt, switches::ConvAlgo setting, bool onednn_has_amx) {
  if (setting == switches::ConvAlgo::Direct) return ConvAlgorithm::Direct;
  if (setting == switches::ConvAlgo::Winograd) return ConvAlgorithm::Winograd;
  if (dt == DType::BF16) {
    // conv_winograd.h's kernel, for the shapes it takes, where its transformed filters (16 C O
    // bf16) stay in L2 while every block of tiles streams them, and oneDNN has no AMX (whose
    // direct kernels outrun it).
    return winograd_bf16_shape(p) && p.C * p.O <= kWinogradBf16MaxFilterPairs && !onednn_has_amx
               ? ConvAlgorithm::Winograd
               : ConvAlgorithm::Direct;
  }
  // oneDNN's Winograd kernels are f32 only. With fewer than 16 channels on either side (a first
  // layer on RGB) its transforms cost more than the products they save. Below 8x8 outputs per
  // image (ResNet's last stage, 7x7) the gain is small while the scratch memory, which grows with
  // C * O (126 MB for 512 -> 512 backward-weights), is not.
  const bool three_by_three = p.kH == 3 && p.kW == 3 && p.stride[0] == 1 && p.stride[1] == 1 && p.dilation[0] == 1 &&
                              p.dilation[1] == 1 && p.groups == 1;
  const bool wide_enough = p.C >= 16 && p.O >= 16 && p.OH >= 8 && p.OW >= 8;
  return dt == DType::F32 && three_by_three && wide_enough ? ConvAlgorithm::Winograd : ConvAlgorithm::Direct;
}

ConvAlgorithm conv_algorithm(const ConvParams& p, DType dt) {
  static const bool amx = onednn_isa_has_amx();
  return choose_conv_algorithm(p, dt, switches::conv_algo.get(), amx);
}

std::string onednn_conv2d_forward_implementation(const ConvParams& p, DType dt, bool bias) {
  std::lock_guard<std::mutex> lock(g_mutex);
  ConvPrims* c = lookup(p, dt, bias);
  return c ? c->fwd_pd->impl_info_str() : "";
}

int64_t onednn_conv2d_forward_scratch_bytes(const ConvParams& p, DType dt, bool bias) {
  std::lock_guard<std::mutex> lock(g_mutex);
  ConvPrims* c = lookup(p, dt, bias);
  return c ? static_cast<int64_t>(c->fwd_pd->scratchpad_desc().get_size()) : 0;
}

}  // namespace ft::cpu
