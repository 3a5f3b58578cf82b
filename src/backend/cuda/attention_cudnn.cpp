// Fused attention through cuDNN's graph API, forward (with the softmax statistics the backward
// needs) and backward, for bf16 and f16 on tensor cores: the same function as the engine's
// kernels (attention.cu), S = scale * Q K^T, causal mask aligned top-left (key j visible to query
// i iff j <= i), P = softmax(S), O = P V, lse = max + log(sum) of each row of S in f32, and
// dQ, dK, dV from dO, O and lse; grouped-query attention as K/V with fewer heads.
//
// Which problems come here (eligible()): bf16/f16, no dropout (cuDNN's own generator could not
// draw the engine's Philox mask, and the two devices must drop the same elements), no document
// mask, head dim a multiple of 8 up to 128, every operand's last dim dense and its other strides
// 16-byte multiples, addresses 16-byte aligned. Under deterministic_algorithms() the backward is
// cuDNN's deterministic graph (dQ written by its product, not accumulated with atomics in an f32
// buffer). Everything else stays on the engine's kernels.
//
// Plans. One per problem (pass, device, dtype, sizes, strides, causal), built on first use and
// kept for the process under a mutex, as conv.cpp's are. A problem cuDNN has no engine for is
// remembered as such: under FT_CUDA_ATTENTION=auto it then stays on the engine's kernels; under
// =cudnn the error is raised, since that switch asks for cuDNN's path by name.
//
// Plans are built outside CUDA-graph captures: a captured call whose problem has no plan yet takes
// the engine's kernels (the warm-up steps before a captured training step build them).
//
// auto: the first call of each problem runs both implementations three times on its own
// operands (the outputs are overwritten, never accumulated, so the repeats change nothing),
// keeps the faster by the best of three, and every later call takes it. A call made while the
// stream is being captured into a CUDA graph cannot be timed (no synchronisation during a
// capture): it takes the engine's kernels and leaves the choice for a later, uncaptured call.
//
// The engine's forward writes O in f32 as well when autograd needs it (its backward's Di reads O
// before rounding); cuDNN's writes O in q's dtype only, so that copy is converted from it, and
// cuDNN's backward, which computes Di itself from O in q's dtype, gets O rounded from the f32
// copy. Both conversions are one elementwise pass over [B, H, T, D].
#include "backend/cuda/attention_cudnn.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <tuple>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cudnn_graph.h"
#include "backend/cuda/cudnn_library.h"
#include "backend/cuda/kernels.h"
#include "backend/device_backend.h"
#include "core/switches.h"
#include "fasttrain/cuda_graph.h"
#include "fasttrain/device.h"

namespace ft::cuda::attention_cudnn {

namespace {

using backend::AttentionParams;
using cudnn_graph::Descriptor;
using cudnn_graph::Plan;
using cudnn_graph::TensorSpec;

enum class Pass { forward, backward };

std::atomic<int64_t> forward_runs{0}, backward_runs{0};

// Tensor uids of the graphs' operands (the variant pack binds each to a pointer).
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kScale, kNegInf, kOne, kDO, kDQ, kDK, kDV, kSoftmaxSum, kDqAccum };

using Strides = std::array<int64_t, 4>;

Strides strides_of(const Tensor& t) { return {t.stride(0), t.stride(1), t.stride(2), t.stride(3)}; }

// Everything a plan depends on.
struct Problem {
  Pass pass = Pass::forward;
  int device = 0;
  DType dtype = DType::BF16;
  int64_t B = 0, H = 0, Hkv = 0, Tq = 0, Tk = 0, D = 0;
  bool causal = false;
  bool deterministic = false;     // backward only: deterministic_algorithms()
  Strides q{}, k{}, v{}, dout{};  // dout: backward only

  auto tie() const { return std::tie(pass, device, dtype, B, H, Hkv, Tq, Tk, D, causal, deterministic, q, k, v, dout); }
  bool operator<(const Problem& o) const { return tie() < o.tie(); }
};

Problem problem_of(Pass pass, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor* dout, bool causal) {
  Problem pr;
  pr.pass = pass;
  pr.device = q.device().index;
  pr.dtype = q.dtype();
  pr.B = q.size(0), pr.H = q.size(1), pr.Hkv = k.size(1), pr.Tq = q.size(2), pr.Tk = k.size(2), pr.D = q.size(3);
  pr.causal = causal;
  pr.q = strides_of(q), pr.k = strides_of(k), pr.v = strides_of(v);
  if (dout != nullptr) pr.dout = strides_of(*dout), pr.deterministic = deterministic_algorithms();
  return pr;
}

// cuDNN versions whose fused attention the front end refuses for bf16/f16 (9.10.0 and 9.10.1:
// known bugs), and, up to 9.15.0, a backward over keys that are not whole tiles of 128, for which
// the front end adds a padding mask of its own.
bool version_supported() {
  const size_t v = cudnn().cudnnGetVersion();
  return v < 91000 || v >= 91002;
}

// Operands cuDNN's fused attention takes: the last dim dense, every other stride positive and a
// multiple of 16 bytes, the address 16-byte aligned.
bool takes_operand(const Tensor& t) {
  const int64_t per16 = 16 / static_cast<int64_t>(dtype_size(t.dtype()));
  if (t.stride(3) != 1 || reinterpret_cast<uintptr_t>(t.raw_data()) % 16 != 0) return false;
  for (int d = 0; d < 3; ++d)
    if (t.stride(d) <= 0 || t.stride(d) % per16 != 0) return false;
  return true;
}

bool eligible(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p) {
  const int64_t D = q.size(3);
  return (q.dtype() == DType::BF16 || q.dtype() == DType::F16) && p.dropout_p == 0 && !p.doc_starts.defined() &&
         D % 8 == 0 && D >= 8 && D <= 128 && q.size(2) > 0 && k.size(2) > 0 && takes_operand(q) && takes_operand(k) &&
         takes_operand(v) && version_supported();
}

cudnnDataType_t cudnn_type(DType dt) { return dt == DType::BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF; }

std::vector<int64_t> vec(const Strides& s) { return {s.begin(), s.end()}; }

// --- the graphs --------------------------------------------------------------------------------
// Written as cuDNN's own front end writes them (cudnn-frontend's composite SDPA nodes, which
// cuDNN's fused flash-attention engines recognise): f32 intermediates, the probabilities in q's
// type where a product reads them, K^T and V^T as views of K and V (dims and strides 2 and 3
// swapped), the causal mask as index comparisons selecting -inf, GQA by K/V's head count alone
// (the products broadcast a KV head over its group; the backward sums the group's dK and dV).

constexpr const char* kForward = "attention_forward (cuDNN)";
constexpr const char* kBackward = "attention_backward (cuDNN)";

using Dims = std::vector<int64_t>;

// Strides of a dense [B, H, M, N].
Dims dense4(int64_t H, int64_t M, int64_t N) { return {H * M * N, M * N, N, 1}; }
// Strides of a dense [B, H, M, 1] (per-row statistics).
Dims rows4(int64_t H, int64_t M) { return {H * M, M, 1, 1}; }
Dims swap23(const Strides& s) { return {s[0], s[1], s[3], s[2]}; }

// -inf for the causal mask: cuDNN before 9.10 wanted the lowest finite float there (the front
// end's rule).
float masked_score() {
  return cudnn().cudnnGetVersion() < 91000 ? std::numeric_limits<float>::lowest()
                                           : -std::numeric_limits<float>::infinity();
}

// scores with every key j > query i set to -inf (kNegInf), top-left aligned.
const Descriptor& causal_mask(cudnn_graph::Graph& g, const Problem& pr, const Descriptor& scores) {
  const Dims dims{pr.B, pr.H, pr.Tq, pr.Tk}, st = dense4(pr.H, pr.Tq, pr.Tk);
  const Descriptor& row = g.virt(CUDNN_DATA_INT32, dims, st);
  const Descriptor& col = g.virt(CUDNN_DATA_INT32, dims, st);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, scores, row, nullptr, nullptr, CUDNN_DATA_FLOAT, 2);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, scores, col, nullptr, nullptr, CUDNN_DATA_FLOAT, 3);
  const Descriptor& keep = g.virt(CUDNN_DATA_BOOLEAN, dims, st);
  g.pointwise(CUDNN_POINTWISE_CMP_GE, row, keep, &col, nullptr, CUDNN_DATA_BOOLEAN);
  const Descriptor& neg_inf = g.scalar(kNegInf);
  const Descriptor& masked = g.virt(CUDNN_DATA_FLOAT, dims, st);
  g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, scores, masked, &neg_inf, &keep);
  return masked;
}

// S = scale * Q K^T (f32, [B, H, Tq, Tk]).
const Descriptor& scaled_scores(cudnn_graph::Graph& g, const Problem& pr, const Descriptor& q, const Descriptor& kt,
                                const Descriptor& scale) {
  const Dims dims{pr.B, pr.H, pr.Tq, pr.Tk}, st = dense4(pr.H, pr.Tq, pr.Tk);
  const Descriptor& s = g.virt(CUDNN_DATA_FLOAT, dims, st);
  g.matmul(q, kt, s);
  const Descriptor& scaled = g.virt(CUDNN_DATA_FLOAT, dims, st);
  g.pointwise(CUDNN_POINTWISE_MUL, s, scaled, &scale);
  return scaled;
}

// Forward: S = scale Q K^T (masked), M = rowmax S, E = exp(S - M), L = rowsum E,
// Stats = M + log L, O = (E / L) V.
void forward_graph(cudnn_graph::Graph& g, const Problem& pr) {
  const cudnnDataType_t T = cudnn_type(pr.dtype);
  const Dims scores{pr.B, pr.H, pr.Tq, pr.Tk}, sst = dense4(pr.H, pr.Tq, pr.Tk);
  const Dims stat{pr.B, pr.H, pr.Tq, 1}, stat_st = rows4(pr.H, pr.Tq);
  const Descriptor& q = g.io(kQ, T, {pr.B, pr.H, pr.Tq, pr.D}, vec(pr.q));
  const Descriptor& kt = g.io(kK, T, {pr.B, pr.Hkv, pr.D, pr.Tk}, swap23(pr.k));
  const Descriptor& v = g.io(kV, T, {pr.B, pr.Hkv, pr.Tk, pr.D}, vec(pr.v));
  const Descriptor& o = g.io(kO, T, {pr.B, pr.H, pr.Tq, pr.D}, dense4(pr.H, pr.Tq, pr.D));
  const Descriptor& stats = g.io(kStats, CUDNN_DATA_FLOAT, stat, stat_st);
  const Descriptor& scale = g.scalar(kScale);
  const Descriptor* s = &scaled_scores(g, pr, q, kt, scale);
  if (pr.causal) s = &causal_mask(g, pr, *s);
  const Descriptor& m = g.virt(CUDNN_DATA_FLOAT, stat, stat_st);
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, *s, m);
  const Descriptor& z = g.virt(CUDNN_DATA_FLOAT, scores, sst);
  g.pointwise(CUDNN_POINTWISE_SUB, *s, z, &m);
  const Descriptor& e = g.virt(CUDNN_DATA_FLOAT, scores, sst);
  g.pointwise(CUDNN_POINTWISE_EXP, z, e);
  const Descriptor& l = g.virt(CUDNN_DATA_FLOAT, stat, stat_st);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, l);
  const Descriptor& log_l = g.virt(CUDNN_DATA_FLOAT, stat, stat_st);
  g.pointwise(CUDNN_POINTWISE_LOG, l, log_l);
  g.pointwise(CUDNN_POINTWISE_ADD, m, stats, &log_l);
  // The second product's A operand in q's type, as the fused engines take it.
  const Descriptor& p = g.virt(T, scores, sst);
  g.pointwise(CUDNN_POINTWISE_DIV, e, p, &l);
  g.matmul(p, v, o);
}

// c = a b into a dense [B, Hkv, ...] result: directly without GQA, else through a per-query-head
// product in q's type summed over each KV head's group.
void grouped_product(cudnn_graph::Graph& g, const Problem& pr, const Descriptor& a, const Descriptor& b,
                     const Descriptor& c) {
  if (pr.Hkv == pr.H) {
    g.matmul(a, b, c);
    return;
  }
  const Descriptor& full = g.virt(cudnn_type(pr.dtype), {pr.B, pr.H, pr.Tk, pr.D}, dense4(pr.H, pr.Tk, pr.D));
  g.matmul(a, b, full);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, full, c);
}

// Backward, with P = exp(scale Q K^T - Stats) (masked) and Di = rowsum(dO * O):
//   dV = P^T dO,  dS = scale * P * (dO V^T - Di),  dK = dS^T Q,  dQ = dS K
// Di (softmax_sum) and dQ's f32 accumulator are graph outputs in memory the caller provides.
void backward_graph(cudnn_graph::Graph& g, const Problem& pr) {
  const cudnnDataType_t T = cudnn_type(pr.dtype);
  const Dims scores{pr.B, pr.H, pr.Tq, pr.Tk}, sst = dense4(pr.H, pr.Tq, pr.Tk);
  const Dims scores_t{pr.B, pr.H, pr.Tk, pr.Tq}, sst_t{pr.H * pr.Tq * pr.Tk, pr.Tq * pr.Tk, 1, pr.Tk};
  const Dims stat{pr.B, pr.H, pr.Tq, 1}, stat_st = rows4(pr.H, pr.Tq);
  const Dims qdims{pr.B, pr.H, pr.Tq, pr.D}, kvdims{pr.B, pr.Hkv, pr.Tk, pr.D};
  const Descriptor& q = g.io(kQ, T, qdims, vec(pr.q));
  const Descriptor& kt = g.io(kK, T, {pr.B, pr.Hkv, pr.D, pr.Tk}, swap23(pr.k));
  const Descriptor& vt = g.io(kV, T, {pr.B, pr.Hkv, pr.D, pr.Tk}, swap23(pr.v));
  const Descriptor& o = g.io(kO, T, qdims, dense4(pr.H, pr.Tq, pr.D));
  const Descriptor& dout = g.io(kDO, T, qdims, vec(pr.dout));
  const Descriptor& stats = g.io(kStats, CUDNN_DATA_FLOAT, stat, stat_st);
  const Descriptor& dq = g.io(kDQ, T, qdims, dense4(pr.H, pr.Tq, pr.D));
  const Descriptor& dk = g.io(kDK, T, kvdims, dense4(pr.Hkv, pr.Tk, pr.D));
  const Descriptor& dv = g.io(kDV, T, kvdims, dense4(pr.Hkv, pr.Tk, pr.D));
  const Descriptor& scale = g.scalar(kScale);
  const Descriptor& one = g.scalar(kOne);

  // Di = rowsum(dO * O), times 1 (the slot of dropout's inverse keep probability).
  const Descriptor& prod =
      g.virt(CUDNN_DATA_FLOAT, qdims, {pr.H * pr.Tq * pr.D, pr.Tq * pr.D, pr.H * pr.D, 1});  // the front end's
  g.pointwise(CUDNN_POINTWISE_MUL, dout, prod, &o);
  const Descriptor& rowsum = g.virt(CUDNN_DATA_FLOAT, stat, stat_st);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, prod, rowsum);
  const Descriptor& di = g.io(kSoftmaxSum, CUDNN_DATA_FLOAT, stat, stat_st);
  g.pointwise(CUDNN_POINTWISE_MUL, rowsum, di, &one);

  // P, masked after subtracting the statistics (the front end's order).
  const Descriptor& s = scaled_scores(g, pr, q, kt, scale);
  const Descriptor* shifted = &g.virt(CUDNN_DATA_FLOAT, scores, sst);
  g.pointwise(CUDNN_POINTWISE_SUB, s, *shifted, &stats);
  if (pr.causal) shifted = &causal_mask(g, pr, *shifted);
  const Descriptor& p = g.virt(CUDNN_DATA_FLOAT, scores, sst);
  g.pointwise(CUDNN_POINTWISE_EXP, *shifted, p);

  // dV = P^T dO.
  const Descriptor& pt = g.virt(T, scores_t, sst_t);
  g.reshape(p, pt);
  grouped_product(g, pr, pt, dout, dv);

  // dS = scale * P * (dO V^T - Di).
  const Descriptor& dp = g.virt(CUDNN_DATA_FLOAT, scores, sst);
  g.matmul(dout, vt, dp);
  const Descriptor& centred = g.virt(CUDNN_DATA_FLOAT, scores, sst);
  g.pointwise(CUDNN_POINTWISE_SUB, dp, centred, &di);
  const Descriptor& weighted = g.virt(CUDNN_DATA_FLOAT, scores, sst);
  g.pointwise(CUDNN_POINTWISE_MUL, centred, weighted, &p);
  const Descriptor& ds = g.virt(CUDNN_DATA_FLOAT, scores, sst);
  g.pointwise(CUDNN_POINTWISE_MUL, weighted, ds, &scale);

  // dK = dS^T Q.
  const Descriptor& dst = g.virt(T, scores_t, sst_t);
  g.reshape(ds, dst);
  grouped_product(g, pr, dst, q, dk);

  // dQ = dS K: accumulated across key tiles in an f32 buffer (atomics) and then rounded into dq,
  // or, deterministic, written by the product directly (the front end's deterministic graph).
  const Descriptor& k = g.virt(T, kvdims, vec(pr.k));
  g.reshape(kt, k);
  if (pr.deterministic) {
    g.matmul(ds, k, dq);
    return;
  }
  const Descriptor& dq_acc = g.io(kDqAccum, CUDNN_DATA_FLOAT, qdims, dense4(pr.H, pr.Tq, pr.D));
  g.matmul(ds, k, dq_acc);
  g.pointwise(CUDNN_POINTWISE_IDENTITY, dq_acc, dq);
}

std::unique_ptr<cudnn_graph::Graph> build_graph(const Problem& pr, cudnn_graph::Target target, const char* op) {
  auto g = std::make_unique<cudnn_graph::Graph>(op);
  if (pr.pass == Pass::forward)
    forward_graph(*g, pr);
  else
    backward_graph(*g, pr);
  g->build(target);
  return g;
}

// --- plans and choices -------------------------------------------------------------------------

struct Entry {
  std::unique_ptr<cudnn_graph::Graph> graph;  // null when cuDNN had no engine (then `error` says why)
  std::string error;
  std::optional<bool> use_cudnn;  // auto's choice, once timed
};

std::mutex entries_mu;
std::map<Problem, Entry>& entries() {
  // std::map: entries never move. Never destroyed: at exit the CUDA context may be gone before a
  // static destructor would free the plans' device resources (as cudnn_handle's handles).
  static auto* m = new std::map<Problem, Entry>();
  return *m;
}

// The problem's entry, its plan built on first use. Under entries_mu.
Entry& entry_for(const Problem& pr, const char* op) {
  auto [it, inserted] = entries().try_emplace(pr);
  if (!inserted) return it->second;
  CudnnHandle& h = cudnn_handle(pr.device, op);
  try {
    it->second.graph = build_graph(pr, {.handle = h.handle}, op);
  } catch (const Error& e) {
    it->second.error = e.what();
  }
  return it->second;
}

// Runs the plan on the current stream with its operands bound, a workspace from the caching
// allocator (freed in stream order once issued).
void execute(const Problem& pr, const Plan& plan, const std::vector<int64_t>& uids, const std::vector<void*>& pointers,
             const char* op) {
  const Stream s = current_stream(Device::cuda(pr.device));
  const Tensor ws =
      plan.workspace > 0 ? empty({plan.workspace}, TensorOptions(DType::U8, Device::cuda(pr.device))) : Tensor();
  CudnnHandle& h = cudnn_handle(pr.device, op);
  std::lock_guard<std::mutex> lock(h.mu);
  if (const cudnnStatus_t st = cudnn().cudnnSetStream(h.handle, static_cast<cudaStream_t>(s.handle));
      st != CUDNN_STATUS_SUCCESS)
    FT_FAIL(op, ": cuDNN set stream failed: ", cudnn_status_text(st));
  cudnn_graph::execute(h.handle, plan, uids, pointers, ws.defined() ? ws.raw_data() : nullptr, op);
  (pr.pass == Pass::forward ? forward_runs : backward_runs).fetch_add(1, std::memory_order_relaxed);
}

// Milliseconds of the best of three runs of f on the current stream.
float best_of_three(int device, const std::function<void()>& f) {
  const cudaStream_t stream = static_cast<cudaStream_t>(current_stream(Device::cuda(device)).handle);
  cudaEvent_t start = nullptr, stop = nullptr;
  check(cudaEventCreate(&start), "attention (cuDNN): event");
  check(cudaEventCreate(&stop), "attention (cuDNN): event");
  float best = 0;
  for (int i = 0; i < 3; ++i) {
    check(cudaEventRecord(start, stream), "attention (cuDNN): event record");
    f();
    check(cudaEventRecord(stop, stream), "attention (cuDNN): event record");
    check(cudaEventSynchronize(stop), "attention (cuDNN): event synchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, stop), "attention (cuDNN): elapsed time");
    best = i == 0 ? ms : std::min(best, ms);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return best;
}

// The common path of both passes: true when `run` (cuDNN) ran the call, false when the engine's
// kernels must.
bool dispatch(const Problem& pr, const char* op, const std::function<void(const Plan&)>& run,
              const std::function<void()>& engine) {
  const switches::CudaAttention mode = switches::cuda_attention.get();
  if (mode == switches::CudaAttention::Engine) return false;
  const Plan* plan = nullptr;
  std::optional<bool> choice;
  {
    std::lock_guard<std::mutex> lock(entries_mu);
    // A plan is not built while the stream is being captured into a CUDA graph (cuDNN compiles and
    // loads kernels and may allocate, which a capture forbids): such a call takes the engine's
    // kernels, and the plan is built at the first uncaptured call (the warm-up steps before a
    // training step is captured).
    if (entries().count(pr) == 0 && capturing_graph() != nullptr) return false;
    Entry& e = entry_for(pr, op);
    if (!e.graph) {
      if (mode == switches::CudaAttention::Cudnn) FT_FAIL(e.error, " (FT_CUDA_ATTENTION=cudnn)");
      return false;
    }
    plan = &e.graph->plan();  // entries are never erased
    choice = e.use_cudnn;
  }
  if (mode == switches::CudaAttention::Auto && !choice) {
    if (capturing_graph() != nullptr) return false;
    note_host_sync(std::string("cudnn attention choice: ") + op);
    const float engine_ms = best_of_three(pr.device, engine);
    const float cudnn_ms = best_of_three(pr.device, [&] { run(*plan); });
    choice = cudnn_ms < engine_ms;
    {
      std::lock_guard<std::mutex> lock(entries_mu);
      entries()[pr].use_cudnn = choice;
    }
    return true;  // the last runs were cuDNN's: out, lse (or dq, dk, dv) hold its results
  }
  if (mode == switches::CudaAttention::Auto && !*choice) return false;
  run(*plan);
  return true;
}

}  // namespace

RunCounts run_counts() { return {forward_runs.load(), backward_runs.load()}; }

PlanVerdict check_plan_for_device(const std::string& device_json, const PlanCheck& c) {
  Problem pr;
  pr.pass = c.backward ? Pass::backward : Pass::forward;
  pr.dtype = c.dtype;
  pr.B = c.B, pr.H = c.H, pr.Hkv = c.Hkv, pr.Tq = c.Tq, pr.Tk = c.Tk, pr.D = c.D;
  pr.causal = c.causal;
  pr.deterministic = c.backward && c.deterministic;
  // [B, H, T, D] dense, or [B, T, H, D] storage seen as [B, H, T, D].
  auto layout = [&](int64_t heads, int64_t T) -> Strides {
    return c.bthd ? Strides{T * heads * c.D, c.D, heads * c.D, 1} : Strides{heads * T * c.D, T * c.D, c.D, 1};
  };
  pr.q = pr.dout = layout(c.H, c.Tq);
  pr.k = pr.v = layout(c.Hkv, c.Tk);
  const char* op = c.backward ? kBackward : kForward;
  PlanVerdict v;
  try {
    const cudnn_graph::Descriptor device = cudnn_graph::device_properties(device_json, op);
    build_graph(pr, {.device = &device}, op);
    v.kind = PlanVerdict::Built;
  } catch (const Error& e) {
    v.detail = e.what();
    // An engine compiled its kernel and only the driver's load of it failed (make_plan lists
    // each configuration's reason).
    v.kind = v.detail.find("cuLibraryLoadData") != std::string::npos    ? PlanVerdict::Compiled
             : v.detail.find("libcuda == nullptr") != std::string::npos ? PlanVerdict::NoDriver
                                                                        : PlanVerdict::Refused;
  }
  return v;
}

std::string device_properties_json(int device) {
  constexpr const char* kOp = "cuDNN device properties";
  return cudnn_graph::device_properties_json(cudnn_handle(device, kOp).handle, kOp);
}

bool backward_supported(int64_t Tk) { return cudnn().cudnnGetVersion() > 91500 || Tk % 128 == 0; }

bool forward(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p, const Tensor& out,
             const Tensor& lse, const Tensor& out_f32, const std::function<void()>& engine) {
  if (switches::cuda_attention.get() == switches::CudaAttention::Engine || !eligible(q, k, v, p)) return false;
  const Problem pr = problem_of(Pass::forward, q, k, v, nullptr, p.causal);
  float scale = static_cast<float>(p.scale), neg_inf = masked_score();
  return dispatch(
      pr, kForward,
      [&](const Plan& plan) {
        std::vector<int64_t> uids{kQ, kK, kV, kO, kStats, kScale};
        std::vector<void*> ptrs{q.raw_data(), k.raw_data(), v.raw_data(), out.raw_data(), lse.raw_data(), &scale};
        if (pr.causal) uids.push_back(kNegInf), ptrs.push_back(&neg_inf);
        execute(pr, plan, uids, ptrs, kForward);
        if (out_f32.defined()) copy(out_f32, out);
      },
      engine);
}

bool backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
              const Tensor& dout, const AttentionParams& p, const Tensor& dq, const Tensor& dk, const Tensor& dv,
              const std::function<void()>& engine) {
  if (switches::cuda_attention.get() == switches::CudaAttention::Engine || !eligible(q, k, v, p) ||
      !takes_operand(dout) || (q.size(2) == 1 && k.size(2) == 1) || !backward_supported(k.size(2)))
    return false;
  const Problem pr = problem_of(Pass::backward, q, k, v, &dout, p.causal);
  float scale = static_cast<float>(p.scale), neg_inf = masked_score(), one = 1.0f;
  return dispatch(
      pr, kBackward,
      [&](const Plan& plan) {
        // cuDNN reads O in q's dtype.
        Tensor o = out;
        if (o.dtype() != q.dtype()) {
          o = empty(out.shape(), q.options());
          copy(o, out);
        }
        const TensorOptions f32(DType::F32, q.device());
        const Tensor di = empty({pr.B, pr.H, pr.Tq}, f32);
        std::vector<int64_t> uids{kQ, kK, kV, kO, kStats, kScale, kOne, kDO, kDQ, kDK, kDV, kSoftmaxSum};
        std::vector<void*> ptrs{q.raw_data(),   k.raw_data(),  v.raw_data(),  o.raw_data(),
                                lse.raw_data(), &scale,        &one,          dout.raw_data(),
                                dq.raw_data(),  dk.raw_data(), dv.raw_data(), di.raw_data()};
        Tensor dq_acc;
        if (!pr.deterministic) {
          dq_acc = empty(q.shape(), f32);
          // Before 9.6 the accumulator had to start at zero (the front end's rule).
          if (cudnn().cudnnGetVersion() < 90600) fill(dq_acc, Scalar(0.0));
          uids.push_back(kDqAccum), ptrs.push_back(dq_acc.raw_data());
        }
        if (pr.causal) uids.push_back(kNegInf), ptrs.push_back(&neg_inf);
        execute(pr, plan, uids, ptrs, kBackward);
      },
      engine);
}

}  // namespace ft::cuda::attention_cudnn
