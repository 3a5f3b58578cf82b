#include "backend/cpu/linalg.h"

#include "backend/cpu/blas_setup.h"

#include <cblas.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <dnnl.hpp>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "backend/composed.h"
#include "backend/cpu/copy.h"
#include "backend/cpu/gemm_half.h"
#include "backend/cpu/isa.h"
#include "backend/cpu/peak_rate.h"
#include "backend/kernels.h"
#include "backend/matrix_layout.h"
#include "core/switches.h"
#include "fasttrain/parallel.h"

extern "C" char* openblas_get_corename(void);

namespace ft::cpu {

using backend::batch_aliases;
using backend::batch_offsets;
using backend::flat_batch_stride;
using backend::MatLayout;
using backend::matrix_layout;

namespace {

// Below this many multiply-adds OpenBLAS runs a GEMM on one thread (its SMP threshold is
// 65536 * 4), so spreading such GEMMs over batches cannot oversubscribe the cores.
constexpr int64_t kSmallGemm = int64_t(1) << 18;

// The operand as BLAS can read it: itself, or a dense copy when its strides are not expressible.
Tensor blas_operand(const Tensor& t, MatLayout& L) {
  if (matrix_layout(t, L)) return t;
  Tensor c = empty(t.shape(), t.options());
  copy(c, t);
  matrix_layout(c, L);
  return c;
}

inline void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
                 int64_t ldb, float beta, float* C, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, 1.0f, A, lda, B,
              ldb, beta, C, ldc);
}
inline void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const double* A, int64_t lda, const double* B,
                 int64_t ldb, double beta, double* C, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, 1.0, A, lda, B,
              ldb, beta, C, ldc);
}

template <class T>
void blas_matmul(const Tensor& a_in, const Tensor& b_in, const Tensor& out, bool accumulate, const Tensor& bias) {
  const int nd = out.dim();
  const int64_t M = out.size(nd - 2), N = out.size(nd - 1), K = a_in.size(nd - 1);
  MatLayout la, lb, lc;
  Tensor a = blas_operand(a_in, la), b = blas_operand(b_in, lb);
  FT_CHECK(matrix_layout(out, lc) && !lc.trans, "matmul: internal error, output matrices must be row-major");
  if (bias.defined()) copy(out, bias);  // rows start as the bias; the GEMM adds on top (beta = 1)
  const T beta = (accumulate || bias.defined()) ? T(1) : T(0);
  const std::vector<int64_t> oa = batch_offsets(a), ob = batch_offsets(b), oc = batch_offsets(out);
  const T* pa = a.data<T>();
  const T* pb = b.data<T>();
  T* pc = out.data<T>();
  auto run = [&](int64_t i) {
    gemm(la.trans, lb.trans, M, N, K, pa + oa[i], la.ld, pb + ob[i], lb.ld, beta, pc + oc[i], lc.ld);
  };
  const int64_t nb = static_cast<int64_t>(oc.size());
  if (nb > 1 && M * N * K <= kSmallGemm && !batch_aliases(out)) {
    parallel_for(0, nb, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t i = b0; i < b1; ++i) run(i);
    });
  } else {
    for (int64_t i = 0; i < nb; ++i) run(i);
  }
}

// t converted to `dt` without materialising its broadcast (zero-stride) dims: the compact tensor
// and a view of it with t's shape.
struct Converted {
  Tensor compact, view;
};
Converted convert_compact(const Tensor& t, DType dt, bool copy_values) {
  Shape s = t.shape();
  for (int d = 0; d < t.dim(); ++d)
    if (t.stride(d) == 0) s[d] = 1;
  Tensor c = empty(s, TensorOptions(dt, t.device()));
  if (copy_values) copy(c, t.detach().as_strided(s, t.strides(), t.offset()));
  return {c, c.expand(t.shape())};
}

// --- oneDNN bf16 matmul ------------------------------------------------------------------

dnnl::engine& dnnl_engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

using PrimKey = std::array<int64_t, 16>;
struct Prim {
  dnnl::matmul matmul;
  dnnl::memory::desc a, b, c, bias;
};
struct PrimCache {
  std::mutex mu;
  std::map<PrimKey, std::shared_ptr<Prim>> prims;  // null: oneDNN declined this shape
};
PrimCache& prim_cache() {
  static PrimCache c;
  return c;
}

dnnl::memory::desc mat_desc(int64_t batch, int64_t bstride, int64_t rows, int64_t cols, const MatLayout& L,
                            dnnl::memory::data_type dt) {
  const int64_t sr = L.trans ? 1 : L.ld, sc = L.trans ? L.ld : 1;
  const int64_t bs = batch == 1 ? std::max<int64_t>(rows * cols, 1) : bstride;
  return dnnl::memory::desc({batch, rows, cols}, dt, {bs, sr, sc});
}

}  // namespace

bool blas_has_avx512_kernels() {
  static const bool fast = [] {
    ensure_blas_kernels();
    const char* name = openblas_get_corename();
    std::string n = name ? name : "";
    std::transform(n.begin(), n.end(), n.begin(), [](unsigned char c) { return std::tolower(c); });
    return n.find("skylakex") != std::string::npos || n.find("cooperlake") != std::string::npos ||
           n.find("sapphire") != std::string::npos;
  }();
  return fast;
}

bool matmul_onednn(const Tensor& a_in, const Tensor& b_in, const Tensor& out, bool accumulate, const Tensor& bias) {
  using dt = dnnl::memory::data_type;
  const DType t = out.dtype();
  if ((t != DType::BF16 && t != DType::F16 && t != DType::F32) || a_in.dtype() != t || b_in.dtype() != t) return false;
  if (bias.defined() && (accumulate || bias.dtype() != t)) return false;
  const dt type = t == DType::BF16 ? dt::bf16 : t == DType::F16 ? dt::f16 : dt::f32;
  const int nd = out.dim();
  const int64_t M = out.size(nd - 2), N = out.size(nd - 1), K = a_in.size(nd - 1);
  MatLayout la, lb, lc;
  if (batch_aliases(out) || !matrix_layout(out, lc) || lc.trans) return false;
  Tensor a = blas_operand(a_in, la), b = blas_operand(b_in, lb);
  int64_t nb = 1;
  for (int d = 0; d + 2 < nd; ++d) nb *= out.size(d);
  int64_t sa = 0, sb = 0, sc = 0;
  // One batched primitive when every operand's batch matrices sit at a fixed stride (a stride of
  // 0 is a broadcast operand: batch dim 1 for oneDNN); otherwise one 2-d product per batch.
  const bool flat = flat_batch_stride(a, sa) && flat_batch_stride(b, sb) && flat_batch_stride(out, sc) && sc != 0;
  const int64_t B = flat ? nb : 1;
  const int64_t Ba = (flat && sa != 0) ? nb : 1, Bb = (flat && sb != 0) ? nb : 1;
  PrimKey key = {
      B,  M,  N,        K,     Ba, sa,    la.trans,       la.ld,
      Bb, sb, lb.trans, lb.ld, sc, lc.ld, bias.defined(), (accumulate ? 1 : 0) + 2 * static_cast<int64_t>(type)};
  std::shared_ptr<Prim> prim;
  {
    PrimCache& cache = prim_cache();
    std::lock_guard<std::mutex> lock(cache.mu);
    auto it = cache.prims.find(key);
    if (it != cache.prims.end()) {
      prim = it->second;
    } else {
      try {
        auto a_md = mat_desc(Ba, sa, M, K, la, type);
        auto b_md = mat_desc(Bb, sb, K, N, lb, type);
        auto c_md = mat_desc(B, sc, M, N, lc, type);
        dnnl::memory::desc bias_md;
        if (bias.defined()) bias_md = dnnl::memory::desc({1, 1, N}, type, {N, N, 1});
        // Accumulation is oneDNN's sum post-op: dst = round(A B + dst), the f32 sum rounded once,
        // as the packed GEMM does.
        dnnl::primitive_attr attr;
        if (accumulate) {
          dnnl::post_ops ops;
          ops.append_sum(1.0f);
          attr.set_post_ops(ops);
        }
        dnnl::matmul::desc d(a_md, b_md, bias_md, c_md);
        dnnl::matmul::primitive_desc pd(d, attr, dnnl_engine());
        prim = std::make_shared<Prim>(Prim{dnnl::matmul(pd), a_md, b_md, c_md, bias_md});
      } catch (const dnnl::error&) {
        prim = nullptr;
      }
      // A model has a handful of distinct shapes; a cap keeps shape-varying workloads bounded.
      if (cache.prims.size() >= 512) cache.prims.clear();
      cache.prims.emplace(key, prim);
    }
  }
  if (!prim) return false;
  thread_local dnnl::stream stream(dnnl_engine());
  auto* pa = static_cast<char*>(a.raw_data());
  auto* pb = static_cast<char*>(b.raw_data());
  auto* pc = static_cast<char*>(out.raw_data());
  const size_t es = out.element_size();
  dnnl::memory bias_mem;
  Tensor bias_keep = bias.defined() ? bias.contiguous() : Tensor();
  if (bias.defined()) bias_mem = dnnl::memory(prim->bias, dnnl_engine(), bias_keep.raw_data());
  auto exec = [&](int64_t oa, int64_t ob, int64_t oc) {
    dnnl::memory am(prim->a, dnnl_engine(), pa + oa * es);
    dnnl::memory bm(prim->b, dnnl_engine(), pb + ob * es);
    dnnl::memory cm(prim->c, dnnl_engine(), pc + oc * es);
    std::unordered_map<int, dnnl::memory> args = {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}};
    if (bias.defined()) args.emplace(DNNL_ARG_BIAS, bias_mem);
    prim->matmul.execute(stream, args);
  };
  if (flat) {
    exec(0, 0, 0);
  } else {
    const std::vector<int64_t> oa = batch_offsets(a), ob = batch_offsets(b), oc = batch_offsets(out);
    for (size_t i = 0; i < oc.size(); ++i) exec(oa[i], ob[i], oc[i]);
  }
  stream.wait();
  return true;
}

bool matmul_gemm_half(const Tensor& a, const Tensor& b, const Tensor& out, bool accumulate, const Tensor& bias) {
  const DType dt = out.dtype();
  if (!gemm_half_available() || (dt != DType::BF16 && dt != DType::F16) || a.dtype() != dt || b.dtype() != dt)
    return false;
  // Gradients of broadcast operands (aliased output batches) are summed over batches in f32 by
  // the via-f32 path; rounding after every batch here would lose accuracy.
  MatLayout lc;
  if (batch_aliases(out) || !matrix_layout(out, lc) || lc.trans) return false;
  const int nd = out.dim();
  const int64_t M = out.size(nd - 2), N = out.size(nd - 1), K = a.size(nd - 1);
  const Tensor bias_c = bias.defined() ? bias.contiguous() : Tensor();
  GemmHalfArgs g;
  g.M = M;
  g.N = N;
  g.K = K;
  g.a_rs = a.stride(nd - 2);
  g.a_cs = a.stride(nd - 1);
  g.b_rs = b.stride(nd - 2);
  g.b_cs = b.stride(nd - 1);
  g.ldc = lc.ld;
  g.format = dt == DType::F16 ? HalfFormat::F16 : HalfFormat::BF16;
  g.c_half = true;
  g.accumulate = accumulate;
  // bf16 and f16 are both 16-bit patterns to the GEMM (g.format says which).
  auto bits = [](const Tensor& t) { return static_cast<uint16_t*>(t.raw_data()); };
  g.bias = bias_c.defined() ? bits(bias_c) : nullptr;
  const std::vector<int64_t> oa = batch_offsets(a), ob = batch_offsets(b), oc = batch_offsets(out);
  const uint16_t* pa = bits(a);
  const uint16_t* pb = bits(b);
  uint16_t* pc = bits(out);
  auto run = [&](int64_t i) {
    GemmHalfArgs gi = g;
    gi.a = pa + oa[i];
    gi.b = pb + ob[i];
    gi.c = pc + oc[i];
    gemm_half(gi);
  };
  const int64_t nb = static_cast<int64_t>(oc.size());
  // Small GEMMs are spread over batches (each then runs on one thread); large ones are
  // parallel inside.
  if (nb > 1 && M * N * K <= kSmallGemm) {
    parallel_for(0, nb, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t i = b0; i < b1; ++i) run(i);
    });
  } else {
    for (int64_t i = 0; i < nb; ++i) run(i);
  }
  return true;
}

void matmul_via_f32(const Tensor& a, const Tensor& b, const Tensor& out, bool accumulate, const Tensor& bias) {
  Converted a32 = convert_compact(a, DType::F32, true), b32 = convert_compact(b, DType::F32, true);
  Converted c32 = convert_compact(out, DType::F32, accumulate);
  Tensor bias32 = bias.defined() ? bias.to(DType::F32) : Tensor();
  blas_matmul<float>(a32.view, b32.view, c32.view, accumulate, bias32);
  const Tensor& o = out;
  Shape s = c32.compact.shape();
  copy(o.detach().as_strided(s, o.strides(), o.offset()), c32.compact);
}

const char* half_gemm_path_name(HalfGemmPath p) { return p == HalfGemmPath::Onednn ? "onednn" : "packed"; }

const char* f32_gemm_path_name(F32GemmPath p) { return p == F32GemmPath::Onednn ? "onednn" : "blas"; }

F32GemmPath choose_f32_gemm_path(switches::F32Gemm setting, const F32GemmMachine& machine, const GemmShape& shape) {
  if (setting == switches::F32Gemm::Blas) return F32GemmPath::Blas;
  if (setting == switches::F32Gemm::Onednn) return F32GemmPath::Onednn;
  if (!machine.onednn_avx512) return F32GemmPath::Blas;
  if (!machine.blas_avx512) return F32GemmPath::Onednn;  // OpenBLAS below the CPU's AVX-512 (linalg.h)
  if (shape.batches != 1) return F32GemmPath::Blas;
  // Both on AVX-512: on AMD oneDNN's brgemm wins at every product measured; on Intel it wins on
  // the narrow products of small models and loses where the output is wide or the sum long (the
  // measured boundary, linalg.h).
  const bool inside = shape.N <= 1024 && shape.K <= 2048 && shape.M <= 2048;
  return machine.amd || inside ? F32GemmPath::Onednn : F32GemmPath::Blas;
}

bool onednn_isa_has_avx512() {
  const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  const auto avx512 = static_cast<unsigned>(dnnl::cpu_isa::avx512_core);
  return (isa & avx512) == avx512;
}

F32GemmPath f32_gemm_path(const GemmShape& shape) {
  const switches::F32Gemm setting = switches::f32_gemm.get();
  if (setting != switches::F32Gemm::Auto) return choose_f32_gemm_path(setting, {}, shape);  // no probes
  static const F32GemmMachine machine{blas_has_avx512_kernels(), onednn_isa_has_avx512(),
                                      cpu_vendor() == CpuVendor::Amd};
  return choose_f32_gemm_path(setting, machine, shape);
}

HalfGemmPath choose_half_gemm_path(switches::HalfGemm setting, bool amx, bool bf16_dot_outruns_fma) {
  if (setting == switches::HalfGemm::Onednn) return HalfGemmPath::Onednn;
  if (setting == switches::HalfGemm::Packed) return HalfGemmPath::Packed;
  // oneDNN's bf16 kernels multiply bf16 pairs (tile or vdpbf16ps); the packed GEMM widens to f32
  // and runs FMA. Whichever instruction retires more FLOP/s wins on GEMM-sized problems
  // (bench/gemm_paths compares the two at gpt-mini's shapes).
  return amx || bf16_dot_outruns_fma ? HalfGemmPath::Onednn : HalfGemmPath::Packed;
}

bool onednn_isa_has_amx() {
  const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  const auto amx = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_amx);
  return (isa & amx) == amx;  // oneDNN's ISA values are nested bit masks
}

bool onednn_isa_has_avx512_bf16() {
  const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  const auto bf16 = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_bf16);
  return (isa & bf16) == bf16;
}

HalfGemmPath half_gemm_path() {
  const switches::HalfGemm setting = switches::half_gemm.get();
  if (setting != switches::HalfGemm::Auto) return choose_half_gemm_path(setting, false, false);
  // The automatic choice depends on the kernel table's level, which the ISA switch may lower
  // in-process: one cached choice per level.
  const CpuIsa table = selected_cpu_isa();
  static std::array<std::atomic<int>, std::size(kCpuIsaLevels)> chosen{};  // the path + 1; 0: not chosen yet
  std::atomic<int>& slot = chosen[static_cast<size_t>(table)];
  if (const int c = slot.load(std::memory_order_acquire); c > 0) return static_cast<HalfGemmPath>(c - 1);
  const bool amx = onednn_isa_has_amx() && table >= CpuIsa::Amx;
  bool dot_faster = false;
  if (!amx && table >= CpuIsa::Avx512Bf16 && onednn_isa_has_avx512_bf16()) {
    // One thread, a few tens of milliseconds, once per process. The two rates differ by about
    // 2x either way on the CPUs seen, so the margin keeps a disturbed measurement from flipping
    // the choice.
    const PeakRates& r = measured_peak_rates(1);
    dot_faster = r.bf16_dot_gflops > 1.25 * r.fp32_gflops;
  }
  const HalfGemmPath path = choose_half_gemm_path(setting, amx, dot_faster);
  slot.store(static_cast<int>(path) + 1, std::memory_order_release);
  return path;
}

namespace {

// packed_half: bf16/f16 products may take the packed AVX-512 GEMM (the table decides, isa.h).
void matmul_impl(const Tensor& a, const Tensor& b, const Tensor& out, bool accumulate, const Tensor& bias,
                 bool packed_half) {
  const int nd = out.dim();
  FT_CHECK(nd >= 2 && a.dim() == nd && b.dim() == nd, "matmul: internal error, operands must have equal rank >= 2");
  FT_CHECK(!(accumulate && bias.defined()), "matmul: internal error, bias with accumulate");
  FT_CHECK(accumulate || !batch_aliases(out), "matmul: internal error, aliased output batches need accumulate");
  const int64_t M = out.size(nd - 2), N = out.size(nd - 1), K = a.size(nd - 1);
  if (out.numel() == 0) return;
  const int64_t batches = out.numel() / (M * N);
  if (K == 0) {  // empty sum: out = bias (or 0), or unchanged when accumulating
    if (accumulate) return;
    if (bias.defined())
      copy(out, bias);
    else
      fill(out, 0);
    return;
  }
  switch (out.dtype()) {
    case DType::F32:
      // The one place that picks the f32 GEMM (f32_gemm_path, linalg.h); oneDNN declines aliased
      // (broadcast-gradient) outputs, which OpenBLAS then accumulates batch by batch.
      if (f32_gemm_path(GemmShape{batches, M, N, K}) == F32GemmPath::Onednn &&
          matmul_onednn(a, b, out, accumulate, bias))
        return;
      blas_matmul<float>(a, b, out, accumulate, bias);
      return;
    case DType::F64: blas_matmul<double>(a, b, out, accumulate, bias); return;
    case DType::BF16:
    case DType::F16:
      // The one place that picks the 16-bit GEMM (half_gemm_path, linalg.h). Each path declines
      // what it cannot do (aliased outputs, f16 without oneDNN support) and the next one runs.
      if (half_gemm_path() == HalfGemmPath::Onednn && matmul_onednn(a, b, out, accumulate, bias)) return;
      if (packed_half && matmul_gemm_half(a, b, out, accumulate, bias)) return;  // widens while packing
      // On the development Xeon (AVX512-BF16, no AMX) convert + sgemm beats oneDNN 2.6's brgemm
      // bf16 matmul with OpenBLAS's AVX-512 kernels and loses to it by far with OpenBLAS's
      // Prescott fallback (figures in docs/PERF.md). So oneDNN unless OpenBLAS runs its AVX-512
      // kernels.
      if (out.dtype() == DType::BF16 && !blas_has_avx512_kernels() && matmul_onednn(a, b, out, accumulate, bias))
        return;
      matmul_via_f32(a, b, out, accumulate, bias);
      return;
    default: FT_FAIL("matmul: expected a floating-point tensor, found dtype ", dtype_name(out.dtype()));
  }
}

}  // namespace

void matmul(const Tensor& a, const Tensor& b, const Tensor& out, bool accumulate, const Tensor& bias) {
  matmul_impl(a, b, out, accumulate, bias, true);
}

void matmul_portable(const Tensor& a, const Tensor& b, const Tensor& out, bool accumulate, const Tensor& bias) {
  matmul_impl(a, b, out, accumulate, bias, false);
}

void linear_weight_grad(const Tensor& gy, const Tensor& x, const Tensor& gw, const Tensor& gb) {
  const backend::Kernels& k = backend::kernels(gw);
  k.matmul(gy.t(), x, gw, false, Tensor());
  if (gb.defined()) k.sum(gy, {true, false}, 1.0, gb);
}

void linear_gelu(const Tensor& x, const Tensor& w, const Tensor& b, math::UnaryOp gelu, const Tensor& pre,
                 const Tensor& y) {
  backend::composed::linear_gelu(x, w, b, gelu, pre, y);
}

void matmul_gelu_backward(const Tensor& gy, const Tensor& w, const Tensor& pre, math::UnaryOp gelu, const Tensor& dpre,
                          const Tensor& db) {
  backend::composed::matmul_gelu_backward(gy, w, pre, gelu, dpre, db);
}

}  // namespace ft::cpu
