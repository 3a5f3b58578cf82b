// scaled_dot_product_attention: validation, dropout RNG reservation and autograd. Grouped-query
// attention (Hkv key/value heads for H query heads, H % Hkv == 0; Hkv == 1 is multi-query) goes
// to the same kernels: query head h reads KV head h / (H / Hkv) in place (no repeated copy of K
// and V), and the backward's dK, dV sum over the query heads of each group inside the kernels. The tiled
// kernels (and why they never materialise the [Tq, Tk] score matrix) are in
// backend/cpu/attention.{h,cpp}. Forward saves only q, k, v, the output and the per-row
// logsumexp; backward recomputes the probabilities tile by tile.
//
// Document mask (DocumentMask): query i sees key j iff j <= i and doc_ids[b, j] == doc_ids[b, i].
// With ids that never decrease along T a document is a contiguous run, so the mask of row i is the
// band [start_i, i] with start_i the first position of i's document, and of column j the band
// [j, end_j). The op turns the ids into those bounds once per call (two i32 [B, T] tensors, the
// kernel-table entry attention_document_bounds, which also refuses decreasing ids) and the
// kernels compare positions with them: no [T, T] mask, and a tile whose keys all precede the
// start of its first query's document (or whose queries all follow the end of its last key's
// document) is skipped whole.
#include "fasttrain/ops/attention.h"

#include <cmath>

#include "backend/kernels.h"
#include "fasttrain/ops/indexing.h"
#include "ops/autocast_policy.h"
#include "ops/common.h"
#include "ops/mask_parts.h"

namespace ft {

using backend::kernels;

namespace {

constexpr const char* kOp = "scaled_dot_product_attention";

void check_inputs(const Tensor& q, const Tensor& k, const Tensor& v, double dropout_p, std::optional<double> scale) {
  FT_CHECK(q.defined() && k.defined() && v.defined(), kOp, ": q, k and v must be defined tensors");
  const Tensor* ts[] = {&q, &k, &v};
  const char* names[] = {"q", "k", "v"};
  for (int i = 0; i < 3; ++i) {
    FT_CHECK(ts[i]->dim() == 4, kOp, ": ", names[i], " must have 4 dimensions [B, H, T, D], found ", ts[i]->dim(),
             " (shape ", ts[i]->shape().str(), ")");
    ops::check_floating(*ts[i], kOp, names[i]);
  }
  FT_CHECK(k.dtype() == q.dtype() && v.dtype() == q.dtype(), kOp, ": q, k and v must have one dtype, found q ",
           dtype_name(q.dtype()), ", k ", dtype_name(k.dtype()), ", v ", dtype_name(v.dtype()));
  ops::common_device({&q, &k, &v}, kOp);
  for (int i = 1; i < 3; ++i) {
    const Tensor& t = *ts[i];
    FT_CHECK(t.size(0) == q.size(0), kOp, ": q has batch size ", q.size(0), ", ", names[i], " has ", t.size(0));
    FT_CHECK(t.size(3) == q.size(3), kOp, ": q has head dim ", q.size(3), ", ", names[i], " has ", t.size(3));
  }
  FT_CHECK(v.size(1) == k.size(1), kOp, ": k has ", k.size(1), " heads, v has ", v.size(1),
           " (expected the same number of key/value heads)");
  FT_CHECK(k.size(1) > 0 ? q.size(1) % k.size(1) == 0 : q.size(1) == 0, kOp, ": q has ", q.size(1),
           " heads, not a multiple of k and v's ", k.size(1),
           " (grouped-query attention: each key/value head serves H / Hkv query heads)");
  FT_CHECK(v.size(2) == k.size(2), kOp, ": k has ", k.size(2), " keys, v has ", v.size(2),
           " values (expected the same sequence length)");
  FT_CHECK(dropout_p >= 0.0 && dropout_p < 1.0, kOp, ": dropout_p must be in [0, 1), found ", dropout_p);
  if (scale) FT_CHECK(std::isfinite(*scale), kOp, ": scale must be finite, found ", *scale);
}

// The document mask's bounds (AttentionParams::doc_starts, doc_ends) from doc_ids [B, T].
void set_document_bounds(const Tensor& q, const Tensor& k, const Tensor& doc_ids, backend::AttentionParams& p) {
  FT_CHECK(doc_ids.defined(), kOp, ": the document mask's doc_ids must be a defined tensor");
  FT_CHECK(doc_ids.dtype() == DType::I32 || doc_ids.dtype() == DType::I64, kOp,
           ": doc_ids must be an i32 or i64 tensor, found ", dtype_name(doc_ids.dtype()));
  ops::common_device({&q, &doc_ids}, kOp);
  const int64_t B = q.size(0), T = q.size(2);
  FT_CHECK(k.size(2) == T, kOp, ": a document mask needs self-attention (as many keys as queries), found ", T,
           " queries and ", k.size(2), " keys");
  FT_CHECK(doc_ids.dim() == 2 && doc_ids.size(0) == B && doc_ids.size(1) == T, kOp, ": doc_ids must be [B, T] = [", B,
           ", ", T, "], found shape ", doc_ids.shape().str());
  const Tensor ids = doc_ids.dtype() == DType::I32 ? doc_ids.contiguous() : doc_ids.to(DType::I32);
  Tensor bounds = empty({2, B, T}, TensorOptions(DType::I32, q.device()));
  p.doc_starts = bounds.select(0, 0);
  p.doc_ends = bounds.select(0, 1);
  if (B * T == 0) return;
  kernels(q).attention_document_bounds(ids, p.doc_starts, p.doc_ends, [T](int64_t step, int64_t at) {
    return detail::concat(kOp, ": doc_ids must not decrease along T (each document a run of equal ids), found doc_ids[",
                          at / T, ", ", at % T, "] ", -step, " below doc_ids[", at / T, ", ", at % T - 1, "]");
  });
}

// `counters`: the dropout mask's counters when given (attention_of_heads), else drawn from gen.
Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, const Tensor* doc_ids,
                 double dropout_p, std::optional<double> scale, Generator* gen, const PhiloxDraw* counters = nullptr) {
  check_inputs(q, k, v, dropout_p, scale);
  const int64_t B = q.size(0), H = q.size(1), Tq = q.size(2), Tk = k.size(2), D = q.size(3);

  backend::AttentionParams params;
  params.causal = causal;
  if (doc_ids) set_document_bounds(q, k, *doc_ids, params);
  params.scale = scale ? *scale : 1.0 / std::sqrt(static_cast<double>(std::max<int64_t>(D, 1)));
  params.dropout_p = dropout_p;
  if (dropout_p > 0) {
    // One counter block per 4 score elements, reserved once; the kernels derive each element's
    // counter from its flat (b, h, i, j) index, so backward regenerates the same mask.
    Generator& g = gen ? *gen : default_generator();
    params.philox = counters ? *counters : g.draw(static_cast<uint64_t>((B * H * Tq * Tk + 3) / 4), q.device());
  }

  const DType compute_dtype = q.dtype() == DType::F64 ? DType::F64 : DType::F32;
  Tensor out = empty({B, H, Tq, D}, q.options());
  Tensor lse = empty({B, H, Tq}, TensorOptions(compute_dtype, q.device()));
  const bool needs_grad = autograd::any_requires_grad({&q, &k, &v});
  // bf16/f16: backward's Di = rowsum(dO * O) needs O before rounding (see the kernel header).
  Tensor out_f32;
  if (needs_grad && compute_dtype != q.dtype()) out_f32 = empty({B, H, Tq, D}, TensorOptions(DType::F32, q.device()));
  kernels(q).attention_forward(q, k, v, params, out, lse, out_f32);

  if (needs_grad) {
    autograd::SavedTensor sq(q), sk(k), sv(v), sout(out_f32.defined() ? out_f32 : out), slse(lse);
    autograd::record_function("ScaledDotProductAttentionBackward", {&q, &k, &v}, {&out}, [=](std::vector<Tensor>& g) {
      const char* node = "ScaledDotProductAttentionBackward";
      Tensor qv = sq.get(node), kv = sk.get(node), vv = sv.get(node);
      Tensor dq = empty(qv.shape(), qv.options());
      Tensor dk = empty(kv.shape(), kv.options());
      Tensor dv = empty(vv.shape(), vv.options());
      Tensor go = g[0].dtype() == qv.dtype() ? g[0] : g[0].to(qv.dtype());
      kernels(qv).attention_backward(qv, kv, vv, sout.get(node), slse.get(node), go, params, dq, dk, dv);
      return std::vector<Tensor>{dq, dk, dv};
    });
  }
  return out;
}

}  // namespace

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, double dropout_p,
                                    std::optional<double> scale, Generator* gen) {
  if (auto c = ops::autocast_inputs(ops::AutocastOp::scaled_dot_product_attention, q, k, v))
    return scaled_dot_product_attention((*c)[0], (*c)[1], (*c)[2], causal, dropout_p, scale, gen);
  return attention(q, k, v, causal, nullptr, dropout_p, scale, gen);
}

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const DocumentMask& mask,
                                    double dropout_p, std::optional<double> scale, Generator* gen) {
  if (auto c = ops::autocast_inputs(ops::AutocastOp::scaled_dot_product_attention, q, k, v))
    return scaled_dot_product_attention((*c)[0], (*c)[1], (*c)[2], mask, dropout_p, scale, gen);
  return attention(q, k, v, /*causal=*/true, &mask.doc_ids, dropout_p, scale, gen);
}

Tensor ops::attention_of_heads(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, const DocumentMask* mask,
                               double dropout_p, AttentionHeads heads, Generator* gen) {
  if (auto c = ops::autocast_inputs(ops::AutocastOp::scaled_dot_product_attention, q, k, v))
    return attention_of_heads((*c)[0], (*c)[1], (*c)[2], causal, mask, dropout_p, heads, gen);
  check_inputs(q, k, v, dropout_p, std::nullopt);
  const Tensor* doc_ids = mask ? &mask->doc_ids : nullptr;
  const int64_t B = q.size(0), H = q.size(1), Tq = q.size(2), Tk = k.size(2);
  if (dropout_p == 0 || heads.total == 0 || heads.total == H)
    return attention(q, k, v, causal || mask, doc_ids, dropout_p, std::nullopt, gen);
  FT_CHECK(heads.first >= 0 && heads.first + H <= heads.total, kOp, ": heads [", heads.first, ", ", heads.first + H,
           ") are not heads of a layer of ", heads.total);
  const int64_t per_head = Tq * Tk;
  FT_CHECK((heads.total * per_head) % 4 == 0 && (heads.first * per_head) % 4 == 0, kOp, ": dropout on heads [",
           heads.first, ", ", heads.first + H, ") of ", heads.total, " needs ", Tq, " x ", Tk,
           " scores per head times the heads before them to be a multiple of 4 (the mask's counter blocks)");
  Generator& g = gen ? *gen : default_generator();
  const PhiloxDraw whole = g.draw(static_cast<uint64_t>((B * heads.total * per_head + 3) / 4), q.device());
  std::vector<Tensor> rows;
  for (int64_t b = 0; b < B; ++b) {
    PhiloxDraw row = whole;
    row.base += static_cast<uint64_t>((b * heads.total + heads.first) * per_head / 4);
    const Tensor ids = doc_ids ? doc_ids->narrow(0, b, 1) : Tensor();
    rows.push_back(attention(q.narrow(0, b, 1), k.narrow(0, b, 1), v.narrow(0, b, 1), causal || mask,
                             doc_ids ? &ids : nullptr, dropout_p, std::nullopt, gen, &row));
  }
  return cat(rows, 0);
}

}  // namespace ft
