// The ranks of test_tensor_parallel's jobs (run under mpirun): each mode checks one part of model
// parallelism against the single-process computation every rank can also do on its own, prints
// "FAIL <what>" for each mismatch and "<mode> ok" at the end when there was none.
//
//   groups TP PP     the rank layout and each group's members, an all-reduce per group, a ring
//                    of send/recv in the tensor group
//   layers           column- and row-parallel Linear, vocabulary-parallel embedding and
//                    cross-entropy (values and gradients) against the ordinary ops; the
//                    cross-entropy's gradient against f64 finite differences; shard/unshard
//   gpt              a tensor-parallel GPT against the single-process one built from the same
//                    generator: the gathered weights (bit for bit), logits, loss and gradients
//   debug            --dist-debug per group: with tp 2, world rank 3 all-reduces 2 elements in its
//                    tensor group where rank 2 reduces 1; the other tensor group agrees
//   llama            the same for a Llama (grouped-query attention; tied and untied head)
//   bytes STAGE      dp 2 x tp 2: one step under DDP (0) or ZeRO STAGE over the data groups; the
//                    bytes per rank (parameters, optimizer state, each group's traffic) = formulas
//   overflow STAGE   dp 2 x tp 2, fp16-mixed: an inf in one rank's part skips the step everywhere
//   sequence         GPT and Llama with sequence parallelism against the whole model and the split
//                    one without it: logits, loss, gradients, tensor-group bytes, activations held
//   refuse TP PP HEADS [KV]  catches the layout error on every rank and prints it ("rank R
//                    refused: ..."); with KV a Llama of HEADS heads and KV key/value heads
//   fail RANK STEP   a GPT trained with tp = world; RANK throws in step STEP (the job must end)
//   hang RANK STEP   RANK stops communicating in step STEP (dist_timeout 3 s must end the job)
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "fasttrain/fasttrain.h"
#include "fasttrain/zero.h"

namespace {

using namespace ft;

int g_failures = 0;
int g_rank = 0;

void fail(const std::string& what) {
  ++g_failures;
  std::printf("rank %d: FAIL %s\n", g_rank, what.c_str());
}

// |a - b| <= rel * max|b| element-wise, else a failure naming `what`.
void expect_close(const Tensor& a, const Tensor& b, double rel, const std::string& what) {
  if (a.shape() != b.shape()) return fail(what + ": shape " + a.shape().str() + " vs " + b.shape().str());
  const std::vector<double> u = a.to_vector(), v = b.to_vector();
  double scale = 1e-30, worst = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    scale = std::max(scale, std::abs(v[i]));
    worst = std::max(worst, std::abs(u[i] - v[i]));
  }
  if (worst > rel * scale)
    fail(what + ": differs by " + std::to_string(worst) + " (largest " + std::to_string(scale) + ")");
}

std::string members(const dist::Communicator& c) {
  std::string s = "[";
  for (int r = 0; r < c.world_size(); ++r) s += (r ? " " : "") + std::to_string(c.world_rank(r));
  return s + "]";
}

int groups(int tp, int pp) {
  const dist::ProcessGroups& g = dist::process_groups(tp, pp);
  const int w = g.world->rank();
  if (g.world_rank_of(g.tp_rank, g.dp_rank, g.pp_rank) != w) fail("coordinates do not give back the world rank");
  // Each group's members follow the formula, and an all-reduce over it sums exactly them.
  auto check = [&](dist::Communicator& c, const char* name, auto member) {
    int64_t expected = 0;
    for (int r = 0; r < c.world_size(); ++r) {
      if (c.world_rank(r) != member(r)) fail(std::string(name) + " group member " + std::to_string(r));
      expected += c.world_rank(r);
    }
    Tensor t = scalar_tensor(static_cast<int64_t>(w), DType::I64).reshape({1});
    c.all_reduce_async(t, dist::ReduceOp::Sum)->wait();
    if (t.item<int64_t>() != expected) fail(std::string(name) + " all-reduce");
  };
  check(*g.tensor, "tensor", [&](int r) { return g.world_rank_of(r, g.dp_rank, g.pp_rank); });
  check(*g.data, "data", [&](int r) { return g.world_rank_of(g.tp_rank, r, g.pp_rank); });
  check(*g.pipeline, "pipeline", [&](int r) { return g.world_rank_of(g.tp_rank, g.dp_rank, r); });
  // A ring in the tensor group: rank 0 sends first, the others receive first (no two ranks both
  // wait in a send).
  if (g.tp > 1) {
    dist::Communicator& c = *g.tensor;
    const int next = (c.rank() + 1) % c.world_size(), prev = (c.rank() + c.world_size() - 1) % c.world_size();
    Tensor out = scalar_tensor(static_cast<int64_t>(w), DType::I64).reshape({1}), in = empty({1}, DType::I64);
    if (c.rank() == 0) {
      c.send(out, next);
      c.recv(in, prev);
    } else {
      c.recv(in, prev);
      c.send(out, next);
    }
    if (in.item<int64_t>() != c.world_rank(prev)) fail("ring: received " + std::to_string(in.item<int64_t>()));
  }
  std::printf("rank %d: tp %d dp %d pp %d tensor %s data %s pipeline %s\n", w, g.tp_rank, g.dp_rank, g.pp_rank,
              members(*g.tensor).c_str(), members(*g.data).c_str(), members(*g.pipeline).c_str());
  return 0;
}

Tensor leaf(const Tensor& t) {
  Tensor l = t.detach().clone();
  l.requires_grad_(true);
  return l;
}

int layers() {
  const std::shared_ptr<dist::Communicator> world = dist::world();
  const dist::ProcessGroups& g = dist::process_groups(world->world_size(), 1);
  const std::shared_ptr<dist::Communicator> tp = g.tensor;
  const int r = tp->rank(), t = tp->world_size();
  Generator gen(7);  // every rank draws the same numbers: each can compute the single-process result
  const Tensor x = randn({3, 5, 8}, {}, &gen);

  // Column-parallel: this rank's output features, the input's gradient summed by f.
  {
    const Tensor W = randn({12, 8}, {}, &gen), b = randn({12}, {}, &gen), R = randn({3, 5, 12}, {}, &gen);
    Tensor xs = leaf(x), Ws = leaf(W), bs = leaf(b);
    const Tensor y = linear(xs, Ws, bs);
    sum(mul(y, R)).backward();
    dist::ColumnParallelLinear col(8, 12, true, tp);
    {
      autograd::NoGradGuard ng;
      col.weight.copy_(dist::shard_tensor(W, col.shard(), r, t));
      col.bias.copy_(dist::shard_tensor(b, col.shard(), r, t));
    }
    Tensor xp = leaf(x);
    const Tensor yp = col(xp);
    // The loss one process would form: the sum over the ranks' parts (g; identity backward).
    dist::reduce_from_tensor_group(sum(mul(yp, dist::shard_tensor(R, {2, 1}, r, t))), tp).backward();
    expect_close(yp, dist::shard_tensor(y, {2, 1}, r, t), 1e-6, "column: output");
    expect_close(xp.grad(), xs.grad(), 1e-6, "column: input gradient");
    expect_close(col.weight.grad(), dist::shard_tensor(Ws.grad(), {0, 1}, r, t), 1e-6, "column: weight gradient");
    expect_close(col.bias.grad(), dist::shard_tensor(bs.grad(), {0, 1}, r, t), 1e-6, "column: bias gradient");
  }
  // Row-parallel: this rank's input features, the output summed by g, the bias once.
  {
    const Tensor h = randn({3, 5, 12}, {}, &gen), W = randn({6, 12}, {}, &gen), b = randn({6}, {}, &gen);
    const Tensor R = randn({3, 5, 6}, {}, &gen);
    Tensor hs = leaf(h), Ws = leaf(W), bs = leaf(b);
    const Tensor y = linear(hs, Ws, bs);
    sum(mul(y, R)).backward();
    dist::RowParallelLinear row(12, 6, true, tp);
    {
      autograd::NoGradGuard ng;
      row.weight.copy_(dist::shard_tensor(W, {1, 1}, r, t));
      row.bias.copy_(b);
    }
    Tensor hp = leaf(dist::shard_tensor(h, {2, 1}, r, t));
    const Tensor yp = row(hp);
    sum(mul(yp, R)).backward();  // replicated: every rank forms the whole loss
    expect_close(yp, y, 1e-6, "row: output");
    expect_close(hp.grad(), dist::shard_tensor(hs.grad(), {2, 1}, r, t), 1e-6, "row: input gradient");
    expect_close(row.weight.grad(), dist::shard_tensor(Ws.grad(), {1, 1}, r, t), 1e-6, "row: weight gradient");
    expect_close(row.bias.grad(), bs.grad(), 1e-6, "row: bias gradient");
  }
  // Vocabulary-parallel embedding: rows split, the lookups summed.
  {
    const int64_t V = 8 * t;
    const Tensor E = randn({V, 4}, {}, &gen), R = randn({2, 7, 4}, {}, &gen);
    const Tensor ids = randint(0, V, {2, 7}, DType::I64, &gen);
    Tensor Es = leaf(E);
    sum(mul(embedding(ids, Es), R)).backward();
    dist::VocabParallelEmbedding emb(V, 4, tp);
    {
      autograd::NoGradGuard ng;
      emb.weight.copy_(dist::shard_tensor(E, {0, 1}, r, t));
    }
    const Tensor yp = emb(ids);
    sum(mul(yp, R)).backward();
    expect_close(yp, embedding(ids, E), 0, "embedding: output");
    expect_close(emb.weight.grad(), dist::shard_tensor(Es.grad(), {0, 1}, r, t), 1e-6, "embedding: weight gradient");
  }
  // Vocabulary-parallel cross-entropy against cross_entropy on the whole logits.
  {
    const int64_t N = 10, V = 6 * t;
    const Tensor L = mul(randn({N, V}, {}, &gen), 3.0), targets = randint(0, V, {N}, DType::I64, &gen);
    Tensor Ls = leaf(L);
    const Tensor loss = cross_entropy(Ls, targets);
    loss.backward();
    Tensor Lp = leaf(dist::shard_tensor(L, {1, 1}, r, t));
    const Tensor lp = dist::vocab_parallel_cross_entropy(Lp, targets, r * (V / t), tp);
    lp.backward();
    expect_close(lp, loss, 1e-6, "cross-entropy: loss");
    expect_close(Lp.grad(), dist::shard_tensor(Ls.grad(), {1, 1}, r, t), 1e-6, "cross-entropy: gradient");
  }
  // ... and its f64 gradient against central differences: element k of rank q is perturbed by q
  // alone while every rank evaluates the loss (a collective), so each rank checks its own.
  {
    const int64_t N = 3, V = 4 * t;
    const Tensor L = randn({N, V}, TensorOptions(DType::F64), &gen), targets = randint(0, V, {N}, DType::I64, &gen);
    Tensor Lp = leaf(dist::shard_tensor(L, {1, 1}, r, t));
    dist::vocab_parallel_cross_entropy(Lp, targets, r * (V / t), tp).backward();
    const std::vector<double> analytic = Lp.grad().to_vector();
    const double eps = 1e-6;
    double worst = 0;
    for (int q = 0; q < t; ++q)
      for (int64_t k = 0; k < N * (V / t); ++k) {
        auto at = [&](double delta) {
          autograd::NoGradGuard ng;
          Tensor p = Lp.detach().clone();
          if (q == r) {
            Tensor element = p.reshape({-1}).narrow(0, k, 1);
            add_(element, scalar_tensor(delta, DType::F64));
          }
          return dist::vocab_parallel_cross_entropy(p, targets, r * (V / t), tp).item<double>();
        };
        const double numeric = (at(eps) - at(-eps)) / (2 * eps);
        if (q == r) worst = std::max(worst, std::abs(numeric - analytic[static_cast<size_t>(k)]));
      }
    if (worst > 1e-7) fail("cross-entropy f64 gradient vs finite differences: " + std::to_string(worst));
  }
  // q | k | v blocks: shard then unshard gives the tensor back.
  {
    const Tensor W = randn({3 * 4 * t, 5}, {}, &gen);
    expect_close(dist::unshard_tensor(dist::shard_tensor(W, {0, 3}, r, t), {0, 3}, *tp), W, 0, "blocks round trip");
    const Tensor q = dist::shard_tensor(W, {0, 3}, r, t).narrow(0, 0, 4);  // this rank's q rows
    expect_close(q, W.narrow(0, r * 4, 4), 0, "blocks: q rows of this rank");
  }
  return 0;
}

// Together the ranks hold exactly the single-process weights, bit for bit.
void expect_same_initial_weights(nn::Module& whole, nn::Module& split) {
  const TensorMap gathered = dist::gather_tensor_parallel_state(split), reference = whole.state_dict();
  if (gathered.size() != reference.size()) fail("gathered state: " + std::to_string(gathered.size()) + " tensors");
  for (size_t i = 0; i < std::min(gathered.size(), reference.size()); ++i) {
    if (gathered[i].first != reference[i].first) fail("gathered state: name " + gathered[i].first);
    expect_close(gathered[i].second, reference[i].second, 0, "initial weight " + reference[i].first);
  }
}

// Every gradient of the split model (the split parameters' parts gathered; the replicated ones
// as they are on this rank) against the whole model's.
void expect_same_gradients(nn::Module& whole, nn::Module& split, const std::shared_ptr<dist::Communicator>& tp) {
  const std::map<std::string, dist::TensorShard> shards = dist::tensor_shards(split);
  std::map<std::string, Tensor> want;
  for (const auto& [name, p] : whole.named_parameters()) want[name] = p.grad();
  for (const auto& [name, p] : split.named_parameters()) {
    const auto it = shards.find(name);
    const Tensor grad = it == shards.end() ? p.grad() : dist::unshard_tensor(p.grad(), it->second, *tp);
    expect_close(grad, want.at(name), 2e-5, "gradient of " + name);
  }
}

nn::GPTConfig small_gpt(int64_t heads, int64_t vocab) {
  nn::GPTConfig c;
  c.vocab_size = vocab;
  c.context = 16;
  c.layers = 2;
  c.dim = 32;
  c.heads = heads;
  return c;
}

// Under a document mask (--doc-mask) the split attention keeps to each packed document too:
// documents of 5 tokens, the first one's start cut off by the window. `logits`: the whole model's
// without the mask, which the mask must change for the check to say anything.
template <class Model>
void expect_same_masked_logits(Model& whole, Model& split, const Tensor& ids, const Tensor& logits) {
  std::vector<double> starts;
  for (int64_t i = 0; i < ids.numel(); ++i) starts.push_back(static_cast<double>((i % ids.size(1) + 2) / 5));
  const Tensor docs = from_vector(starts, ids.shape(), DType::I64);
  const Tensor masked = whole.forward(ids, docs), part = split.forward(ids, docs);
  expect_close(part, masked.narrow(2, split.vocab_start(), part.size(2)), 1e-5, "logits under a document mask");
  const std::vector<double> with_mask = masked.to_vector(), without = logits.to_vector();
  double changed = 0;
  for (size_t i = 0; i < with_mask.size(); ++i) changed = std::max(changed, std::abs(with_mask[i] - without[i]));
  if (changed < 1e-3) fail("the document mask changed no logit: the check says nothing");
}

int gpt() {
  const std::shared_ptr<dist::Communicator> world = dist::world();
  const std::shared_ptr<dist::Communicator> tp = dist::process_groups(world->world_size(), 1).tensor;
  const nn::GPTConfig cfg = small_gpt(4, 100);  // padded to 128 rows: the last rank's part ends in padding
  Generator a(11), b(11);
  nn::GPT whole(cfg, &a, true), split(cfg, &b, true, tp);
  expect_same_initial_weights(whole, split);
  Generator data(3);
  const Tensor ids = randint(0, cfg.vocab_size, {4, 16}, DType::I64, &data);
  const Tensor targets = randint(0, cfg.vocab_size, {4, 16}, DType::I64, &data);
  const Tensor logits = whole(ids);
  const Tensor loss = cross_entropy(logits.reshape({-1, cfg.vocab_size}), targets.reshape({-1}));
  loss.backward();
  // Bytes the tensor group moves for one micro-batch (ARCHITECTURE.md): forward, the embedding's
  // and each block's two g's (B T C each) and the cross-entropy's three all-reduces of B T;
  // backward, each block's two f's and the head's (B T C each).
  const int64_t before = tp->bytes_issued();
  const Tensor part = split(ids);
  const int64_t start = split.vocab_start();
  expect_close(part, logits.narrow(2, start, part.size(2)), 1e-5, "logits");
  const Tensor lp = dist::vocab_parallel_cross_entropy(part.reshape({-1, part.size(2)}), targets.reshape({-1}), start,
                                                       split.vocab_group());
  lp.backward();
  {
    const int64_t B = 4, T = 16, C = cfg.dim, L = cfg.layers;
    const int64_t expected = 4 * (2 * (2 * L + 1) * B * T * C + 3 * B * T);
    if (tp->bytes_issued() - before != expected)
      fail("bytes of one micro-batch: " + std::to_string(tp->bytes_issued() - before) + ", formula " +
           std::to_string(expected));
    // Parameters per rank: the split ones' parts and the replicated ones whole.
    const dist::TensorParallelSync sync(split, tp, nullptr);
    const int64_t t = tp->world_size(), Vp = 128;
    if (sync.sharded_elements() != (L * (12 * C * C + 7 * C) + Vp * C) / t)
      fail("split parameter elements " + std::to_string(sync.sharded_elements()));
    if (sync.replicated_elements() != L * 6 * C + cfg.context * C + 2 * C)
      fail("replicated parameter elements " + std::to_string(sync.replicated_elements()));
  }
  expect_close(lp, loss, 1e-6, "loss");
  expect_same_gradients(whole, split, tp);
  expect_same_masked_logits(whole, split, ids, logits);
  return 0;
}

// The split model against the whole one built from the same generator: gathered weights (bit for
// bit), this rank's logits, the loss and every gradient.
template <class Model, class Config>
void compare_split(const Config& cfg, int64_t vocab, const std::shared_ptr<dist::Communicator>& tp) {
  Generator a(11), b(11);
  Model whole(cfg, &a), split(cfg, &b, tp);
  expect_same_initial_weights(whole, split);
  Generator data(3);
  const Tensor ids = randint(0, vocab, {4, 16}, DType::I64, &data);
  const Tensor targets = randint(0, vocab, {4, 16}, DType::I64, &data);
  const Tensor logits = whole(ids);
  const Tensor loss = cross_entropy(logits.reshape({-1, vocab}), targets.reshape({-1}));
  loss.backward();
  const Tensor part = split(ids);
  expect_close(part, logits.narrow(2, split.vocab_start(), part.size(2)), 1e-5, "logits");
  const Tensor lp = dist::vocab_parallel_cross_entropy(part.reshape({-1, part.size(2)}), targets.reshape({-1}),
                                                       split.vocab_start(), split.vocab_group());
  lp.backward();
  expect_close(lp, loss, 1e-6, "loss");
  expect_same_gradients(whole, split, tp);
  expect_same_masked_logits(whole, split, ids, logits);
}

nn::LlamaConfig small_llama(int64_t heads, int64_t kv_heads, bool tied) {
  nn::LlamaConfig c;
  c.vocab_size = 64;
  c.context = 16;
  c.layers = 2;
  c.dim = 32;
  c.heads = heads;
  c.kv_heads = kv_heads;
  c.ffn_dim = 64;
  c.tie_embeddings = tied;
  c.attention_bias = !tied;  // Qwen2's q, k, v biases on the untied variant
  return c;
}

int llama() {
  const std::shared_ptr<dist::Communicator> world = dist::world();
  const std::shared_ptr<dist::Communicator> tp = dist::process_groups(world->world_size(), 1).tensor;
  // 8 query heads sharing 4 key/value heads: every rank keeps whole groups.
  for (bool tied : {true, false}) compare_split<nn::Llama>(small_llama(8, 4, tied), 64, tp);
  return 0;
}

// Sequence parallelism: the split model with and without it against the whole one. With it the
// logits, loss and (after TensorParallelSync, which sums the replicated parameters' partial
// gradients) every gradient equal the whole model's; the tensor group's bytes follow the formula
// (ARCHITECTURE.md) and the activations held between forward and backward are fewer.
std::unique_ptr<nn::GPT> build(const nn::GPTConfig& c, Generator* gen, std::shared_ptr<dist::Communicator> tp = {}) {
  return std::make_unique<nn::GPT>(c, gen, true, std::move(tp));
}
std::unique_ptr<nn::Llama> build(const nn::LlamaConfig& c, Generator* gen,
                                 std::shared_ptr<dist::Communicator> tp = {}) {
  return std::make_unique<nn::Llama>(c, gen, std::move(tp));
}

template <class Config>
void compare_sequence_parallel(const Config& cfg, int64_t vocab, int64_t blocks_comm, int64_t extra_gathers,
                               const std::shared_ptr<dist::Communicator>& tp, const char* what) {
  Generator a(11), b(11), c(11);
  const auto whole_model = build(cfg, &a), plain_model = build(cfg, &b, tp), split_model = build(cfg, &c, tp);
  auto &whole = *whole_model, &plain = *plain_model, &split = *split_model;
  dist::set_sequence_parallel(split, true);
  Generator data(3);
  const int64_t B = 4, T = 16, C = cfg.dim, t = tp->world_size();
  const Tensor ids = randint(0, vocab, {B, T}, DType::I64, &data);
  const Tensor targets = randint(0, vocab, {B, T}, DType::I64, &data);
  const Tensor logits = whole(ids);
  cross_entropy(logits.reshape({-1, vocab}), targets.reshape({-1})).backward();
  Allocator& alloc = allocator_for(Device::cpu());
  int64_t held[2] = {0, 0}, bytes[2] = {0, 0};
  Tensor loss[2];
  decltype(&plain) models[2] = {&plain, &split};
  for (int k = 0; k < 2; ++k) {
    const int64_t before = tp->bytes_issued(), allocated = alloc.stats().allocated_bytes;
    const Tensor part = (*models[k])(ids);
    expect_close(part, logits.narrow(2, models[k]->vocab_start(), part.size(2)), 1e-5,
                 std::string(what) + " logits" + (k ? " (sequence parallel)" : ""));
    loss[k] = dist::vocab_parallel_cross_entropy(part.reshape({-1, part.size(2)}), targets.reshape({-1}),
                                                 models[k]->vocab_start(), models[k]->vocab_group());
    held[k] = alloc.stats().allocated_bytes - allocated;
    loss[k].backward();
    bytes[k] = tp->bytes_issued() - before;
  }
  expect_close(loss[1], loss[0], 1e-6, std::string(what) + " loss under sequence parallelism");
  dist::TensorParallelSync sync(split, tp, nullptr);
  sync.finish();  // the replicated parameters' partial gradients summed
  expect_same_gradients(whole, split, tp);
  // Per micro-batch, n = B T C f32 activations: without it 2 `blocks_comm` all-reduces of n
  // (embedding and row-parallel outputs forward, column-parallel inputs backward) plus the loss's
  // 3 of B T. With it each becomes a reduce-scatter (input n) and an all-gather (input n / t): a
  // ring moves the same (t-1)/t n per rank for each half, so the wire traffic is unchanged, but
  // bytes_issued counts inputs: n (1 + 1/t) per former all-reduce. `extra_gathers`: column-parallel
  // entries that gather what another already gathered (none here).
  const int64_t n = B * T * C;
  const int64_t plain_bytes = 4 * (2 * blocks_comm * n + 3 * B * T);
  const int64_t sp_bytes = 4 * (2 * blocks_comm * (n + n / t) + extra_gathers * (n + n / t) + 3 * B * T);
  if (bytes[0] != plain_bytes)
    fail(std::string(what) + " bytes without sequence parallelism: " + std::to_string(bytes[0]) + ", formula " +
         std::to_string(plain_bytes));
  if (bytes[1] != sp_bytes)
    fail(std::string(what) + " bytes with sequence parallelism: " + std::to_string(bytes[1]) + ", formula " +
         std::to_string(sp_bytes));
  if (held[1] >= held[0])
    fail(std::string(what) + " activations held with sequence parallelism: " + std::to_string(held[1]) +
         " bytes, not fewer than without: " + std::to_string(held[0]));
  std::printf("rank %d: %s activations held %lld -> %lld bytes, tensor-group bytes %lld -> %lld\n", g_rank, what,
              static_cast<long long>(held[0]), static_cast<long long>(held[1]), static_cast<long long>(bytes[0]),
              static_cast<long long>(bytes[1]));
}

int sequence() {
  const std::shared_ptr<dist::Communicator> world = dist::world();
  const std::shared_ptr<dist::Communicator> tp = dist::process_groups(world->world_size(), 1).tensor;
  // GPT: embedding + 2 per block + the head: 2L + 1 exchanges each way.
  const nn::GPTConfig gpt = small_gpt(4, 100);
  compare_sequence_parallel(gpt, 100, 2 * gpt.layers + 1, 0, tp, "gpt");
  // Llama (untied head, q/k/v biases): the same count (q, k and v share one gather, gate and up one).
  const nn::LlamaConfig llama = small_llama(8, 4, false);
  compare_sequence_parallel(llama, 64, 2 * llama.layers + 1, 0, tp, "llama");
  return 0;
}

// The split model's synchronisation over its data group: DDP (stage 0) inside TensorParallelSync,
// or ZeRO stage 1-3 told which parameters are split.
struct DataGroupSync {
  std::unique_ptr<dist::ZeroSharding> zero;
  std::unique_ptr<dist::TensorParallelSync> sync;
  std::unique_ptr<optim::Optimizer> shard;
  optim::Optimizer& optimizer(optim::Optimizer& full) const { return zero ? *shard : full; }
  train::GradSync* grad_sync() const { return zero ? static_cast<train::GradSync*>(zero.get()) : sync.get(); }
};

DataGroupSync sync_over_data_group(nn::Module& model, optim::Optimizer& full, const dist::ProcessGroups& g, int stage,
                                   const std::vector<Tensor>& split) {
  DataGroupSync d;
  if (stage == 0) {
    d.sync = std::make_unique<dist::TensorParallelSync>(model, g.tensor,
                                                        std::make_unique<dist::DataParallel>(model, g.data));
  } else {
    d.zero = std::make_unique<dist::ZeroSharding>(model, full, g.data, stage);
    d.zero->set_tensor_parallel(g.tensor, split);
    d.shard = d.zero->make_shard_optimizer();
  }
  return d;
}

// dp 2 x tp 2 (4 ranks): one AdamW step with clipping of the split GPT under DDP (stage 0) or
// ZeRO stage 1, 2 or 3 over the data groups, its bytes per rank against ARCHITECTURE.md's
// formulas ("Bytes per rank"). Ψ_s: the split parameters' elements (whole), Ψ_r: the replicated
// ones', Ψ = Ψ_s / t + Ψ_r this rank's, P its parameter tensors, s its ZeRO shard.
int bytes(int stage) {
  const std::shared_ptr<dist::Communicator> world = dist::world();
  const dist::ProcessGroups& g = dist::process_groups(2, 1);
  const nn::GPTConfig cfg = small_gpt(4, 100);
  Generator gen(11);
  nn::GPT model(cfg, &gen, true, g.tensor);
  const int64_t t = g.tp, d = g.dp, L = cfg.layers, C = cfg.dim, Vp = 128, B = 4, T = 16;
  const int64_t psi_s = L * (12 * C * C + 7 * C) + Vp * C, psi_r = L * 6 * C + cfg.context * C + 2 * C;
  const int64_t psi = psi_s / t + psi_r;
  optim::GroupOptions o;
  o.lr = 1e-3;
  o.weight_decay = 0.1;
  auto full = optim::make_adamw(optim::decay_groups(model.named_parameters(), o));
  std::vector<Tensor> split;
  const auto shards = dist::tensor_shards(model);
  int64_t P = 0;
  for (const auto& [name, p] : model.named_parameters()) {
    ++P;
    if (shards.count(name) != 0) split.push_back(p);
  }
  const DataGroupSync ds = sync_over_data_group(model, *full, g, stage, split);
  const auto& zero = ds.zero;
  const auto& sync = ds.sync;
  const auto& shard = ds.shard;
  train::StepOptions so;
  so.clip = 0.5;
  train::StepRunner runner(model, ds.optimizer(*full), so);
  runner.set_grad_sync(ds.grad_sync());
  Generator data(3 + static_cast<uint64_t>(g.dp_rank));
  int64_t tensor_bytes = 0, data_bytes = 0;
  for (int step = 0; step < 2; ++step) {  // the second step's bytes (stage 3 learns its order in the first)
    const Tensor ids = randint(0, cfg.vocab_size, {B, T}, DType::I64, &data);
    const Tensor targets = randint(0, cfg.vocab_size, {B, T}, DType::I64, &data);
    const int64_t tensor_before = g.tensor->bytes_issued(), data_before = g.data->bytes_issued();
    runner.forward_backward([&] {
      const Tensor part = model(ids);
      return dist::vocab_parallel_cross_entropy(part.reshape({-1, part.size(2)}), targets.reshape({-1}),
                                                model.vocab_start(), model.vocab_group());
    });
    runner.optimizer_step();
    tensor_bytes = g.tensor->bytes_issued() - tensor_before;
    data_bytes = g.data->bytes_issued() - data_before;
  }
  const optim::Optimizer& opt = zero ? *shard : *full;
  int64_t moments = 0;
  for (const auto& [name, st] : opt.state_tensors())
    if (st.dim() > 0) moments += static_cast<int64_t>(st.nbytes());
  int64_t param_bytes = 0;
  for (const Tensor& p : model.parameters()) param_bytes += static_cast<int64_t>(p.nbytes());
  const std::string what = "stage " + std::to_string(stage) + ": ";
  auto expect_eq = [&](int64_t got, int64_t want, const std::string& name) {
    if (got != want) fail(what + name + " " + std::to_string(got) + ", formula " + std::to_string(want));
  };
  // Activations: 2 (2L + 1) all-reduces of B T C per micro-batch and the loss's 3 of B T; then
  // the clip's f64 sum of the split parameters' squares. Replicated gradients: all of them
  // averaged (DDP), or this rank's shard's part of them (ZeRO: the data group's parts sum to Ψ_r).
  const int64_t activations = 4 * (2 * (2 * L + 1) * B * T * C + 3 * B * T) + 8;
  Tensor summed = scalar_tensor(tensor_bytes - activations, DType::I64).reshape({1});
  g.data->all_reduce(summed, dist::ReduceOp::Sum);
  expect_eq(zero ? summed.data<int64_t>()[0] : tensor_bytes - activations, 4 * psi_r,
            "tensor-group bytes past the activations'");
  if (!zero) {
    expect_eq(sync->sharded_elements() + sync->replicated_elements(), psi, "parameter elements");
    expect_eq(param_bytes, 4 * psi, "parameter bytes");
    expect_eq(moments, 8 * psi, "AdamW moment bytes");
    int64_t grads = 0;
    for (const Tensor& p : model.parameters())
      if (p.grad().defined()) grads += static_cast<int64_t>(p.grad().nbytes());
    expect_eq(grads, 4 * psi, "gradient bytes");
    expect_eq(data_bytes, 4 * (psi + P), "data-group bytes");  // DDP: gradients and used flags
  } else {
    const int64_t s = zero->shard_count();
    expect_eq(zero->parameter_count(), psi, "ZeRO's parameter elements");
    expect_eq(zero->padded_count(), s * d, "padded elements");
    Tensor state = scalar_tensor(moments, DType::I64).reshape({1});
    g.data->all_reduce(state, dist::ReduceOp::Sum);
    expect_eq(state.data<int64_t>()[0], 8 * psi, "AdamW moment bytes over the data group");
    if (moments > 8 * s) fail(what + "moments " + std::to_string(moments) + " above 8 s = " + std::to_string(8 * s));
    expect_eq(zero->parameter_bytes(model), stage == 3 ? 4 * s : 4 * psi, "parameter bytes held");
    // Gradients held after the step: the shard's (stage 1 also DDP's buckets: Ψ and P flags).
    expect_eq(zero->gradient_bytes(model), stage == 1 ? 4 * (psi + P) + 4 * s : 4 * s, "gradient bytes held");
    // Data group per step (zero.h): stage 1 all-reduce Ψ + flags, all-gather s; stage 2
    // reduce-scatter s d, flags, all-gather s; both the clip's f64.
    if (stage == 1) expect_eq(data_bytes, 4 * (psi + P) + 8 + 4 * s, "data-group bytes");
    if (stage == 2) expect_eq(data_bytes, 4 * s * d + 4 * P + 8 + 4 * s, "data-group bytes");
    if (stage == 3 && (data_bytes < 4 * s * d + 4 * P + 8 + 4 * s || data_bytes > 4 * (2 * s + s * d + P) + 8))
      fail(what + "data-group bytes " + std::to_string(data_bytes) +
           " outside [4 (s + s d + P) + 8, 4 (2 s + s d + P) + 8]");
  }
  return 0;
}

// dp 2 x tp 2, fp16-mixed: in the second step world rank 1 (tensor rank 1 of data replica 0)
// makes one element of its part of the embedding overflow. Only its ZeRO shard (or its DDP
// replica pair) sees the inf; every rank must skip that step and halve its loss scale.
int overflow(int stage) {
  const std::shared_ptr<dist::Communicator> world = dist::world();
  const dist::ProcessGroups& g = dist::process_groups(2, 1);
  const nn::GPTConfig cfg = small_gpt(4, 100);
  Generator gen(11);
  nn::GPT model(cfg, &gen, true, g.tensor);
  optim::GroupOptions o;
  o.lr = 1e-3;
  auto full = optim::make_adamw(optim::decay_groups(model.named_parameters(), o));
  std::vector<Tensor> split;
  const auto shards = dist::tensor_shards(model);
  Tensor target;
  for (const auto& [name, p] : model.named_parameters()) {
    if (shards.count(name) != 0) split.push_back(p);
    if (name == "transformer.wte.weight") target = p;  // the root's: whole through the step under stage 3
  }
  const DataGroupSync ds = sync_over_data_group(model, *full, g, stage, split);
  const auto& zero = ds.zero;
  train::StepOptions so;
  so.clip = 0.5;
  so.precision = train::Precision::FP16Mixed;
  train::StepRunner runner(model, ds.optimizer(*full), so);
  runner.set_grad_sync(ds.grad_sync());
  Generator data(3 + static_cast<uint64_t>(g.dp_rank));
  for (int step = 0; step < 3; ++step) {
    const Tensor ids = randint(0, cfg.vocab_size, {4, 16}, DType::I64, &data);
    const Tensor targets = randint(0, cfg.vocab_size, {4, 16}, DType::I64, &data);
    const double scale = runner.scaler().get_scale();
    TensorMap before;
    {
      const dist::GatheredParameters whole(zero.get());
      for (const auto& [name, t] : model.state_dict()) before.emplace_back(name, t.clone());
    }
    const bool inject = step == 1 && world->rank() == 1;
    runner.forward_backward([&] {
      const Tensor part = model(ids);
      Tensor loss = dist::vocab_parallel_cross_entropy(part.reshape({-1, part.size(2)}), targets.reshape({-1}),
                                                       model.vocab_start(), model.vocab_group());
      if (inject)
        loss = add(loss, mul(sum(target.reshape({-1}).narrow(0, 7, 1)), std::numeric_limits<double>::infinity()));
      return loss;
    });
    runner.optimizer_step();
    const dist::GatheredParameters whole(zero.get());
    bool changed = false;
    const TensorMap after = model.state_dict();
    for (size_t i = 0; i < after.size(); ++i)
      changed = changed || after[i].second.to_vector() != before[i].second.to_vector();
    const double now = runner.scaler().get_scale();
    if (step == 1 && (changed || now != scale / 2))
      fail("stage " + std::to_string(stage) + ": the overflow step was not skipped here (scale " +
           std::to_string(scale) + " -> " + std::to_string(now) + (changed ? ", weights changed)" : ")"));
    if (step != 1 && (!changed || now != scale))
      fail("stage " + std::to_string(stage) + ": step " + std::to_string(step) + " did not update as a clean step");
  }
  return 0;
}

int debug() {
  const std::shared_ptr<dist::Communicator> world = dist::world();
  world->set_timeout(120);  // the comparison must fail long before
  const dist::ProcessGroups& g = dist::process_groups(2, 1);
  for (const auto& c : {g.world, g.tensor, g.data, g.pipeline}) c->set_debug(true);
  Tensor t = ones({g.world->rank() == 3 ? 2 : 1});
  g.tensor->all_reduce(t, dist::ReduceOp::Sum);
  g.data->barrier();  // the groups that agreed go on; {2, 3} fails on both ranks
  return 0;
}

int refuse(int tp, int pp, int64_t heads, int64_t kv_heads) {
  try {
    const dist::ProcessGroups& g = dist::process_groups(tp, pp);
    if (kv_heads > 0) {
      nn::Llama model(small_llama(heads, kv_heads, true), nullptr, g.tensor);
    } else {
      nn::GPT model(small_gpt(heads, 100), nullptr, true, g.tensor);
    }
    std::printf("rank %d: accepted\n", g_rank);
  } catch (const Error& e) {
    std::printf("rank %d refused: %s\n", g_rank, e.what());
  }
  return 0;
}

// A few steps of a GPT split over the whole world; rank `who` throws or sleeps in step `step`.
int train_gpt(int who, int step, bool hang) {
  const std::shared_ptr<dist::Communicator> world = dist::world();
  world->set_timeout(hang ? 3 : 60);
  const std::shared_ptr<dist::Communicator> tp = dist::process_groups(world->world_size(), 1).tensor;
  Generator gen(5), data(9);
  nn::GPT model(small_gpt(4, 64), &gen, true, tp);
  for (int s = 1; s <= 6; ++s) {
    if (s == step && g_rank == who) {
      if (!hang) throw Error("injected failure in training step " + std::to_string(s));
      std::this_thread::sleep_for(std::chrono::seconds(60));
    }
    const Tensor ids = randint(0, 64, {2, 16}, DType::I64, &data), targets = randint(0, 64, {2, 16}, DType::I64, &data);
    const Tensor logits = model(ids);
    dist::vocab_parallel_cross_entropy(logits.reshape({-1, logits.size(2)}), targets.reshape({-1}), model.vocab_start(),
                                       model.vocab_group())
        .backward();
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) {
    std::fprintf(stderr,
                 "usage: tp_worker groups|layers|gpt|llama|sequence|bytes|overflow|debug|refuse|fail|hang ...\n");
    return 2;
  }
  try {
    set_num_threads(1);
    g_rank = dist::world()->rank();
    const std::string& mode = args[0];
    auto arg = [&](size_t i) { return std::stoi(args.at(i)); };
    if (mode == "groups") groups(arg(1), arg(2));
    if (mode == "layers") layers();
    if (mode == "gpt") gpt();
    if (mode == "debug") debug();
    if (mode == "llama") llama();
    if (mode == "sequence") sequence();
    if (mode == "bytes") bytes(arg(1));
    if (mode == "overflow") overflow(arg(1));
    if (mode == "refuse") return refuse(arg(1), arg(2), arg(3), args.size() > 4 ? arg(4) : 0);
    if (mode == "fail" || mode == "hang") train_gpt(arg(1), arg(2), mode == "hang");
    if (g_failures == 0) std::printf("rank %d: %s ok\n", g_rank, mode.c_str());
    std::fflush(stdout);
    return g_failures == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    dist::abort_job(e.what(), 2);
  }
}
