// Matrix products on CUDA through cuBLASLt: out (+)= a @ b (+ bias), batched over leading dims,
// for f32 (TF32 tensor cores when allow_tf32()), bf16 and f16 (tensor cores, f32 accumulation)
// and f64.
//
// cuBLASLt is column-major. A row-major [rows, cols] matrix with leading dimension ld is, to it,
// the column-major [cols, rows] matrix with the same ld, so the row-major product
// C[M,N] = A[M,K] B[K,N] is issued as the column-major C^T[N,M] = B^T[N,K] A^T[K,M]: cuBLASLt's
// "A" is our b and its "B" is our a, and a transposed view is a transpose flag, not a copy.
//
// Batches go in one call when each operand's batch matrices sit at multiples of one stride
// (broadcast operands have stride 0). An output whose batches alias (the gradient of a broadcast
// operand, accumulated) is summed one batch at a time: one launch's batches run concurrently and
// would race on it. The bias rides in cuBLASLt's epilogue (no extra pass over the output).
//
// Descriptors and the heuristic's algorithm are cached per problem (shapes, strides, dtypes,
// pointer alignment, epilogue): the heuristic query costs more than a small GEMM.
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>

#include "backend/composed.h"
#include "backend/cuda/cublaslt_library.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "backend/matrix_layout.h"
#include "core/switches.h"

namespace ft::cuda {

void check_lt(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS)
    FT_FAIL("matmul: cuBLASLt ", what, " failed: ", cublaslt().cublasLtGetStatusName(st), " (",
            cublaslt().cublasLtGetStatusString(st), ")");
}

namespace {

struct DeviceState {
  cublasLtHandle_t handle = nullptr;
  std::map<void*, Tensor> workspaces;  // per stream: two streams' GEMMs must not share one
};

DeviceState& device_state(int device) {
  static std::mutex mu;
  static std::map<int, DeviceState> states;
  std::lock_guard<std::mutex> lock(mu);
  DeviceState& s = states[device];
  if (s.handle == nullptr) {
    check(cudaSetDevice(device), "matmul: set device");
    check_lt(cublaslt().cublasLtCreate(&s.handle), "handle creation");
  }
  return s;
}

}  // namespace

cublasLtHandle_t lt_handle(int device) { return device_state(device).handle; }

cublasLtMatmulPreference_t lt_workspace_preference() {
  cublasLtMatmulPreference_t pref = nullptr;
  check_lt(cublaslt().cublasLtMatmulPreferenceCreate(&pref), "preference");
  const uint64_t ws = kLtWorkspaceBytes;
  check_lt(
      cublaslt().cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)),
      "workspace preference");
  return pref;
}

void* lt_workspace(int device, cudaStream_t stream) {
  static std::mutex mu;
  DeviceState& s = device_state(device);
  std::lock_guard<std::mutex> lock(mu);
  Tensor& w = s.workspaces[stream];
  if (!w.defined()) {
    StreamGuard guard(Stream{Device::cuda(device), stream});
    w = empty({static_cast<int64_t>(kLtWorkspaceBytes)}, TensorOptions(DType::U8, Device::cuda(device)));
  }
  return w.raw_data();
}

namespace {

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::F32: return CUDA_R_32F;
    case DType::F64: return CUDA_R_64F;
    case DType::BF16: return CUDA_R_16BF;
    case DType::F16: return CUDA_R_16F;
    default: FT_FAIL("matmul: expected a floating-point dtype on CUDA, found ", dtype_name(t));
  }
}

uint32_t alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && a % align != 0) align /= 2;
  return align;
}

// What the epilogue adds: nothing, the bias (added to every row of our output), or the bias
// gradient (the sums over k of cuBLASLt's B, our a's columns: linear's db beside its dW); the
// GELU (tanh form) of the output, its input kept in the aux matrix (GeluAux*); or the output times
// GELU's derivative at the aux matrix, with its column sums as the bias gradient (DGelu*).
enum class Epilogue : uint8_t { None, Bias, BiasGradB, GeluAux, GeluAuxBias, DGelu, DGeluBGrad };

cublasLtEpilogue_t lt_epilogue(Epilogue e) {
  switch (e) {
    case Epilogue::None: return CUBLASLT_EPILOGUE_DEFAULT;
    case Epilogue::Bias: return CUBLASLT_EPILOGUE_BIAS;
    case Epilogue::BiasGradB: return CUBLASLT_EPILOGUE_BGRADB;
    case Epilogue::GeluAux: return CUBLASLT_EPILOGUE_GELU_AUX;
    case Epilogue::GeluAuxBias: return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case Epilogue::DGelu: return CUBLASLT_EPILOGUE_DGELU;
    case Epilogue::DGeluBGrad: return CUBLASLT_EPILOGUE_DGELU_BGRAD;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}
bool uses_bias(Epilogue e) {
  return e == Epilogue::Bias || e == Epilogue::BiasGradB || e == Epilogue::GeluAuxBias || e == Epilogue::DGeluBGrad;
}
bool uses_aux(Epilogue e) {
  return e == Epilogue::GeluAux || e == Epilogue::GeluAuxBias || e == Epilogue::DGelu || e == Epilogue::DGeluBGrad;
}
// An epilogue the caller can do without (by unfused kernels) when cuBLASLt has no algorithm for it.
bool optional_fusion(Epilogue e) { return e != Epilogue::None && e != Epilogue::Bias; }

// One problem as cuBLASLt sees it (column-major, its A = our b, its B = our a).
struct Problem {
  DType dtype;
  bool tf32;
  bool trans_a, trans_b;  // cuBLASLt's op(A), op(B)
  int64_t m, n, k;        // its C is m x n: m = our N, n = our M
  int64_t lda, ldb, ldc;
  int64_t batch;
  int64_t stride_a, stride_b, stride_c;
  Epilogue epilogue;
  uint32_t align_a, align_b, align_c, align_bias, align_aux;
  auto tie() const {
    return std::tie(dtype, tf32, trans_a, trans_b, m, n, k, lda, ldb, ldc, batch, stride_a, stride_b, stride_c,
                    epilogue, align_a, align_b, align_c, align_bias, align_aux);
  }
  bool operator<(const Problem& o) const { return tie() < o.tie(); }
};

struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool found = false;  // false: cuBLASLt has no algorithm for the problem (kept, so it is asked once)
};

cublasLtMatrixLayout_t layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld, int64_t batch,
                              int64_t stride) {
  cublasLtMatrixLayout_t l = nullptr;
  check_lt(
      cublaslt().cublasLtMatrixLayoutCreate(&l, type, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), ld),
      "layout");
  if (batch > 1) {
    const int32_t count = static_cast<int32_t>(batch);
    check_lt(cublaslt().cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)),
             "batch count");
    check_lt(cublaslt().cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                         sizeof(stride)),
             "batch stride");
  }
  return l;
}

// Built once per problem; the cache lives as long as the process (descriptors are small).
const Plan& plan_for(const Problem& p, int device) {
  static std::mutex mu;
  static std::map<std::pair<int, Problem>, Plan> plans;
  std::lock_guard<std::mutex> lock(mu);
  auto key = std::make_pair(device, p);
  auto it = plans.find(key);
  if (it != plans.end()) return it->second;

  Plan plan;
  const cudaDataType_t type = cuda_type(p.dtype);
  const bool f64 = p.dtype == DType::F64;
  const cublasComputeType_t compute =
      f64 ? CUBLAS_COMPUTE_64F : (p.dtype == DType::F32 && p.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F);
  check_lt(cublaslt().cublasLtMatmulDescCreate(&plan.op, compute, f64 ? CUDA_R_64F : CUDA_R_32F), "descriptor");
  const cublasOperation_t ta = p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  check_lt(cublaslt().cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)), "transa");
  check_lt(cublaslt().cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)), "transb");
  if (p.epilogue != Epilogue::None) {
    const cublasLtEpilogue_t epi = lt_epilogue(p.epilogue);
    check_lt(cublaslt().cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)),
             "epilogue");
  }
  if (uses_bias(p.epilogue)) {
    const cudaDataType_t bias_type = type;
    check_lt(cublaslt().cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                                       sizeof(bias_type)),
             "bias type");
  }
  if (uses_aux(p.epilogue)) {  // the aux matrix is shaped and laid out as the output
    const int64_t aux_ld = p.ldc;
    check_lt(cublaslt().cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld,
                                                       sizeof(aux_ld)),
             "aux leading dimension");
  }
  // Stored shapes, before op(): op(A) is m x k, op(B) is k x n.
  plan.a = p.trans_a ? layout(type, p.k, p.m, p.lda, p.batch, p.stride_a)
                     : layout(type, p.m, p.k, p.lda, p.batch, p.stride_a);
  plan.b = p.trans_b ? layout(type, p.n, p.k, p.ldb, p.batch, p.stride_b)
                     : layout(type, p.k, p.n, p.ldb, p.batch, p.stride_b);
  plan.c = layout(type, p.m, p.n, p.ldc, p.batch, p.stride_c);

  cublasLtMatmulPreference_t pref = lt_workspace_preference();
  const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> aligns[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, p.align_a},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, p.align_b},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, p.align_c},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, p.align_c}};
  for (const auto& [attr, value] : aligns)
    check_lt(cublaslt().cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value)),
             "alignment preference");
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st = cublaslt().cublasLtMatmulAlgoGetHeuristic(lt_handle(device), plan.op, plan.a, plan.b,
                                                                      plan.c, plan.c, pref, 1, &result, &found);
  cublaslt().cublasLtMatmulPreferenceDestroy(pref);
  // A fused epilogue the library cannot do here is not an error: the caller falls back.
  if (!optional_fusion(p.epilogue) || (st == CUBLAS_STATUS_SUCCESS && found > 0)) {
    check_lt(st, "heuristic");
    FT_CHECK(found > 0, "matmul: cuBLASLt has no algorithm for ", dtype_name(p.dtype), " [", p.n, ", ", p.k, "] x [",
             p.k, ", ", p.m, "] (batch ", p.batch, ")");
  }
  plan.found = st == CUBLAS_STATUS_SUCCESS && found > 0;
  plan.algo = result.algo;
  return plans.emplace(key, plan).first->second;
}

// One cuBLASLt call: `batch` products at the given element strides.
void run(const Problem& p, const void* a, const void* b, void* c, const void* bias, bool accumulate, const Tensor& on,
         const void* aux = nullptr) {
  const int device = on.device().index;
  const cudaStream_t stream = static_cast<cudaStream_t>(current_stream(on.device()).handle);
  check(cudaSetDevice(device), "matmul: set device");
  const Plan& plan = plan_for(p, device);
  // The bias and aux pointers are attributes of the cached descriptor: set and use them under one lock.
  static std::mutex pointer_mu;
  std::unique_lock<std::mutex> lock(pointer_mu, std::defer_lock);
  if (p.epilogue != Epilogue::None) lock.lock();
  if (uses_bias(p.epilogue))
    check_lt(cublaslt().cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)),
             "bias pointer");
  if (uses_aux(p.epilogue))
    check_lt(cublaslt().cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux,
                                                       sizeof(aux)),
             "aux pointer");
  const double alpha64 = 1, beta64 = accumulate ? 1 : 0;
  const float alpha32 = 1, beta32 = accumulate ? 1 : 0;
  const bool f64 = p.dtype == DType::F64;
  const void* alpha = f64 ? static_cast<const void*>(&alpha64) : &alpha32;
  const void* beta = f64 ? static_cast<const void*>(&beta64) : &beta32;
  check_lt(cublaslt().cublasLtMatmul(lt_handle(device), plan.op, alpha, a, plan.a, b, plan.b, beta, c, plan.c, c,
                                     plan.c, &plan.algo, lt_workspace(device, stream), kLtWorkspaceBytes, stream),
           "matmul");
}

// The row-major out[M, N] = a[M, K] b[K, N] as cuBLASLt's column-major problem (its A is our b, its
// B our a), from the operands' layouts; batch, strides and alignments are the caller's to fill.
Problem problem_for(DType dtype, const backend::MatLayout& la, const backend::MatLayout& lb,
                    const backend::MatLayout& lc, int64_t M, int64_t N, int64_t K, Epilogue epilogue) {
  Problem p{};
  p.dtype = dtype;
  p.tf32 = allow_tf32();
  p.trans_a = lb.trans;
  p.trans_b = la.trans;
  p.m = N;
  p.n = M;
  p.k = K;
  p.lda = lb.ld;
  p.ldb = la.ld;
  p.ldc = lc.ld;
  p.epilogue = epilogue;
  return p;
}

// The operand as cuBLASLt can read it: itself, or a dense copy when its strides are not expressible.
Tensor lt_operand(const Tensor& t, backend::MatLayout& L) {
  if (backend::matrix_layout(t, L)) return t;
  Tensor c = t.contiguous();
  backend::matrix_layout(c, L);
  return c;
}

}  // namespace

void matmul(const Tensor& a_in, const Tensor& b_in, const Tensor& out, bool accumulate, const Tensor& bias) {
  const int nd = out.dim();
  FT_CHECK(nd >= 2 && a_in.dim() == nd && b_in.dim() == nd,
           "matmul: internal error, operands must have equal rank >= 2");
  FT_CHECK(!(accumulate && bias.defined()), "matmul: internal error, bias with accumulate");
  const int64_t M = out.size(nd - 2), N = out.size(nd - 1), K = a_in.size(nd - 1);
  if (out.numel() == 0) return;
  if (K == 0) {  // empty sum: out = bias (or 0), or unchanged when accumulating
    if (accumulate) return;
    if (bias.defined())
      copy(out, bias.expand(out.shape()));
    else
      fill(out, 0);
    return;
  }
  backend::MatLayout la, lb, lc;
  Tensor a = lt_operand(a_in, la), b = lt_operand(b_in, lb);
  FT_CHECK(backend::matrix_layout(out, lc) && !lc.trans, "matmul: internal error, output matrices must be row-major");
  const bool dense_bias = bias.defined() && bias.dim() == 1 && bias.size(0) == N && bias.stride(0) == 1 &&
                          bias.dtype() == out.dtype() && out.dtype() != DType::F64;
  Tensor bias_c = dense_bias ? bias : Tensor();
  if (bias.defined() && !dense_bias) {
    copy(out, bias.expand(out.shape()));  // rows start as the bias; the GEMM adds on top
    accumulate = true;
  }

  Problem p = problem_for(out.dtype(), la, lb, lc, M, N, K, bias_c.defined() ? Epilogue::Bias : Epilogue::None);
  const size_t es = out.element_size();
  char* pa = static_cast<char*>(a.raw_data());
  char* pb = static_cast<char*>(b.raw_data());
  char* pc = static_cast<char*>(out.raw_data());
  const void* pbias = bias_c.defined() ? bias_c.raw_data() : nullptr;
  p.align_a = alignment(pb);
  p.align_b = alignment(pa);
  p.align_c = alignment(pc);
  p.align_bias = pbias ? alignment(pbias) : 0;

  int64_t sa = 0, sb = 0, sc = 0;
  int64_t nb = 1;
  for (int d = 0; d + 2 < nd; ++d) nb *= out.size(d);
  const bool flat = backend::flat_batch_stride(a, sa) && backend::flat_batch_stride(b, sb) &&
                    backend::flat_batch_stride(out, sc) && (nb == 1 || sc != 0);
  if (flat) {
    p.batch = nb;
    p.stride_a = sb;
    p.stride_b = sa;
    p.stride_c = sc;
    run(p, pb, pa, pc, pbias, accumulate, out);
    return;
  }
  // Aliased or irregular batches: one product per batch, in order on the stream.
  const std::vector<int64_t> oa = backend::batch_offsets(a), ob = backend::batch_offsets(b),
                             oc = backend::batch_offsets(out);
  p.batch = 1;
  for (size_t i = 0; i < oc.size(); ++i) {
    char* ai = pa + oa[i] * es;
    char* bi = pb + ob[i] * es;
    char* ci = pc + oc[i] * es;
    Problem q = p;
    q.align_a = alignment(bi);
    q.align_b = alignment(ai);
    q.align_c = alignment(ci);
    run(q, bi, ai, ci, pbias, accumulate, out);
  }
}

// gw = gy^T x with gb = the column sums of gy in the same product where cuBLASLt can fuse them
// (CUBLASLT_EPILOGUE_BGRADB reduces its B, which is gy^T, over k = R rows): the bias gradient's own
// pass over gy goes. Otherwise (f32, f64), or with FT_CUDA_BGRADB=off (the benchmark's A/B), the
// product and the sum one after the other.
void linear_weight_grad(const Tensor& gy, const Tensor& x, const Tensor& gw, const Tensor& gb) {
  const bool fused_off = !switches::cuda_bgradb.get();
  const int64_t R = gy.size(0), out_f = gy.size(1), in = x.size(1);
  backend::MatLayout la, lb, lc;
  const Tensor a = gy.t();
  // 16-bit only: cuBLASLt does not say in what order or precision the epilogue sums, and only the
  // 16-bit results (rounded to 16 bits anyway) were measured against the CPU's.
  const bool half = gy.dtype() == DType::BF16 || gy.dtype() == DType::F16;
  const bool fusable = gb.defined() && !fused_off && R > 0 && half && backend::matrix_layout(a, la) &&
                       backend::matrix_layout(x, lb) && backend::matrix_layout(gw, lc) && !lc.trans && gb.dim() == 1 &&
                       gb.stride(0) == 1 && gb.dtype() == gy.dtype();
  if (fusable) {
    Problem p = problem_for(gw.dtype(), la, lb, lc, out_f, in, R, Epilogue::BiasGradB);
    p.batch = 1;
    p.align_a = alignment(x.raw_data());
    p.align_b = alignment(a.raw_data());
    p.align_c = alignment(gw.raw_data());
    p.align_bias = alignment(gb.raw_data());
    check(cudaSetDevice(gw.device().index), "linear_weight_grad: set device");
    if (plan_for(p, gw.device().index).found) {
      run(p, x.raw_data(), a.raw_data(), gw.raw_data(), gb.raw_data(), false, gw);
      return;
    }
  }
  matmul(a, x, gw, false, Tensor());
  if (gb.defined()) sum(gy, {true, false}, 1.0, gb);
}

namespace {

// Which GELU products take cuBLASLt's epilogue: FT_CUDA_GELU_EPILOGUE=forward|on|off|backward
// (core/switches.h; the benchmark's A/B). Default forward: on an H200 gpt2-124m's step was faster with
// GELU_AUX_BIAS in the forward but slower with DGELU_BGRAD in the backward than with the plain
// product and the elementwise kernels there (docs/PERF.md, sixteenth session).
bool gelu_epilogue_enabled(bool forward) {
  using switches::CudaGeluEpilogue;
  const CudaGeluEpilogue mode = switches::cuda_gelu_epilogue.get();
  return mode == CudaGeluEpilogue::On || mode == (forward ? CudaGeluEpilogue::Forward : CudaGeluEpilogue::Backward);
}

// The MLP's GELU products (linear_gelu, matmul_gelu_backward) in one cuBLASLt call each:
// out[R, N] = a[R, K] b[K, N] with `epilogue` reading or writing aux (dense [R, N], out's twin)
// and `bias` ([N]: added, or the bias gradient written). False when the fused form does not apply
// (f32/f64: cuBLASLt does not say how precisely its epilogue evaluates tanh, and only 16-bit
// results were measured against the CPU's; exact GELU; layouts or alignments cuBLASLt's aux
// matrix does not take; switched off by gelu_epilogue_enabled), and the caller composes.
bool gelu_product(const Tensor& a, const Tensor& b, const Tensor& out, const Tensor& aux, const Tensor& bias,
                  math::UnaryOp gelu, Epilogue epilogue) {
  const bool forward = epilogue == Epilogue::GeluAux || epilogue == Epilogue::GeluAuxBias;
  const DType dt = out.dtype();
  if (!gelu_epilogue_enabled(forward) || gelu != math::UnaryOp::GeluTanh || (dt != DType::BF16 && dt != DType::F16))
    return false;
  const int64_t R = out.size(0), N = out.size(1), K = a.size(1);
  backend::MatLayout la, lb, lc;
  const bool dense = backend::matrix_layout(a, la) && backend::matrix_layout(b, lb) &&
                     backend::matrix_layout(out, lc) && !lc.trans && lc.ld == N && aux.is_contiguous() &&
                     (!bias.defined() || (bias.is_contiguous() && bias.dtype() == dt));
  if (!dense || R == 0 || K == 0 || N % 8 != 0 || alignment(aux.raw_data()) < 16) return false;
  Problem p = problem_for(dt, la, lb, lc, R, N, K, epilogue);
  p.batch = 1;
  p.align_a = alignment(b.raw_data());
  p.align_b = alignment(a.raw_data());
  p.align_c = alignment(out.raw_data());
  p.align_bias = bias.defined() ? alignment(bias.raw_data()) : 0;
  p.align_aux = alignment(aux.raw_data());
  check(cudaSetDevice(out.device().index), "gelu epilogue: set device");
  if (!plan_for(p, out.device().index).found) return false;
  run(p, b.raw_data(), a.raw_data(), out.raw_data(), bias.defined() ? bias.raw_data() : nullptr, false, out,
      aux.raw_data());
  return true;
}

}  // namespace

void linear_gelu(const Tensor& x, const Tensor& w, const Tensor& b, math::UnaryOp gelu, const Tensor& pre,
                 const Tensor& y) {
  if (!gelu_product(x, w.t(), y, pre, b, gelu, b.defined() ? Epilogue::GeluAuxBias : Epilogue::GeluAux))
    backend::composed::linear_gelu(x, w, b, gelu, pre, y);
}

void matmul_gelu_backward(const Tensor& gy, const Tensor& w, const Tensor& pre, math::UnaryOp gelu, const Tensor& dpre,
                          const Tensor& db) {
  if (!gelu_product(gy, w, dpre, pre, db, gelu, db.defined() ? Epilogue::DGeluBGrad : Epilogue::DGelu))
    backend::composed::matmul_gelu_backward(gy, w, pre, gelu, dpre, db);
}

}  // namespace ft::cuda
