// FP8 products on CUDA through cuBLASLt (kernel-table entry fp8_matmul; the recipe is in
// fasttrain/fp8.h): out [M, N] = (a [M, K] b [N, K]^T) * a_scale_inv * b_scale_inv (+ bias), a and
// b 8-bit codes (E4M3 or E5M2, not both E5M2), f32 accumulation, out bf16 or f32. Hopper and later
// (compute capability 8.9+); cuBLASLt raises "not supported" elsewhere, which the op reports.
//
// cuBLASLt's FP8 GEMMs take only the "TN" form: both operands with the summed dimension dense.
// Row-major a [M, K] is, column-major, [K, M] with ld K (cuBLASLt's B, not transposed); row-major
// b [N, K] is [K, N] with ld K (its A, transposed): the column-major result [N, M] with ld N is
// our row-major out. The scales are device pointers (A's is b's, B's is a's), so nothing reads
// them on the host and the call can be captured in a CUDA graph. K, the leading dimensions and
// the pointers must be multiples of 16 (bytes for the pointers): fp8_linear_shape_ok and the
// caching allocator's alignment see to it.
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>

#include "backend/cuda/cublaslt_library.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"

namespace ft::cuda {

namespace {

struct Fp8Problem {
  int device;
  int64_t M, N, K;
  Fp8Format fa, fb;
  DType out;
  bool bias, fast_accumulate;
  auto tie() const { return std::tie(device, M, N, K, fa, fb, out, bias, fast_accumulate); }
  bool operator<(const Fp8Problem& o) const { return tie() < o.tie(); }
};

struct Fp8Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

cudaDataType_t fp8_type(Fp8Format f) { return f == Fp8Format::E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2; }
cudaDataType_t out_type(DType t) { return t == DType::BF16 ? CUDA_R_16BF : CUDA_R_32F; }

template <class V>
void set(cublasLtMatmulDesc_t op, cublasLtMatmulDescAttributes_t attr, const V& value, const char* what) {
  check_lt(cublaslt().cublasLtMatmulDescSetAttribute(op, attr, &value, sizeof(value)), what);
}

cublasLtMatrixLayout_t layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld) {
  cublasLtMatrixLayout_t l = nullptr;
  check_lt(
      cublaslt().cublasLtMatrixLayoutCreate(&l, type, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), ld),
      "fp8 layout");
  return l;
}

const Fp8Plan& plan_for(const Fp8Problem& p) {
  static std::mutex mu;
  static std::map<Fp8Problem, Fp8Plan> plans;
  std::lock_guard<std::mutex> lock(mu);
  auto it = plans.find(p);
  if (it != plans.end()) return it->second;
  Fp8Plan plan;
  check_lt(cublaslt().cublasLtMatmulDescCreate(&plan.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "fp8 descriptor");
  set(plan.op, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T, "fp8 transa");
  set(plan.op, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N, "fp8 transb");
  set(plan.op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, static_cast<int8_t>(p.fast_accumulate), "fp8 fast accumulation");
  if (p.bias) {
    set(plan.op, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_BIAS, "fp8 bias epilogue");
    set(plan.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, out_type(p.out), "fp8 bias type");
  }
  plan.a = layout(fp8_type(p.fb), p.K, p.N, p.K);  // our b, [K, N] column-major, transposed by op
  plan.b = layout(fp8_type(p.fa), p.K, p.M, p.K);  // our a, [K, M] column-major
  plan.d = layout(out_type(p.out), p.N, p.M, p.N);
  cublasLtMatmulPreference_t pref = lt_workspace_preference();
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st = cublaslt().cublasLtMatmulAlgoGetHeuristic(lt_handle(p.device), plan.op, plan.a, plan.b,
                                                                      plan.d, plan.d, pref, 1, &result, &found);
  cublaslt().cublasLtMatmulPreferenceDestroy(pref);
  check_lt(st, "fp8 heuristic (FP8 GEMMs need compute capability 8.9 or later)");
  FT_CHECK(found > 0, "fp8_matmul: cuBLASLt has no FP8 algorithm for [", p.M, ", ", p.K, "] x [", p.N, ", ", p.K,
           "]^T (", fp8_format_name(p.fa), " x ", fp8_format_name(p.fb), " -> ", dtype_name(p.out), ")");
  plan.algo = result.algo;
  return plans.emplace(p, plan).first->second;
}

}  // namespace

void fp8_matmul(const Tensor& a, Fp8Format fa, const Tensor& a_scale_inv, const Tensor& b, Fp8Format fb,
                const Tensor& b_scale_inv, const Tensor& bias, bool fast_accumulate, const Tensor& out) {
  const int device = out.device().index;
  const int64_t M = a.size(0), K = a.size(1), N = b.size(0);
  const cudaStream_t stream = static_cast<cudaStream_t>(current_stream(out.device()).handle);
  check(cudaSetDevice(device), "fp8_matmul: set device");
  const Fp8Plan& plan = plan_for({device, M, N, K, fa, fb, out.dtype(), bias.defined(), fast_accumulate});
  // The scale and bias pointers are attributes of the cached descriptor: set and use them under one lock.
  static std::mutex pointer_mu;
  std::lock_guard<std::mutex> lock(pointer_mu);
  const void* a_scale = b_scale_inv.raw_data();  // cuBLASLt's A is our b
  const void* b_scale = a_scale_inv.raw_data();
  set(plan.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, a_scale, "fp8 A scale");
  set(plan.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, b_scale, "fp8 B scale");
  if (bias.defined()) set(plan.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias.raw_data(), "fp8 bias pointer");
  const float alpha = 1, beta = 0;
  check_lt(cublaslt().cublasLtMatmul(lt_handle(device), plan.op, &alpha, b.raw_data(), plan.a, a.raw_data(), plan.b,
                                     &beta, out.raw_data(), plan.d, out.raw_data(), plan.d, &plan.algo,
                                     lt_workspace(device, stream), kLtWorkspaceBytes, stream),
           "fp8 matmul");
}

}  // namespace ft::cuda
