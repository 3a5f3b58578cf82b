// Every process switch of fasttrain, declared in this one file: the environment variables that
// choose between implementations (the A/B switches of the benchmarks and tests) or lower the CPU
// kernel table's instruction set. Each is a typed value with a table of the names its variable
// accepts.
//
//   value in effect = the innermost Scoped override, else the variable's value, else the default
//
// The variable is read once, on first use; an unknown name is an error naming the variable, the
// accepted names and what was found, so a mistyped switch cannot silently measure the default.
// Tests and benchmarks change a switch in-process with a Scoped guard (no process per setting):
//
//   switches::Scoped algo(switches::conv_algo, switches::ConvAlgo::Winograd);
//
// Code that caches work done under a switch (primitives, plans) keys the cache by the value it
// used, so an override never meets a stale entry. `fasttrain switches` lists them all.
#pragma once
#include <atomic>
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "backend/cpu/isa.h"
#include "core/env_setting.h"
#include "fasttrain/switches.h"

namespace ft::switches {

// The value sets. Auto: the code decides from the machine (the rule sits with the switch's user).
enum class F32Gemm { Auto, Blas, Onednn };
enum class HalfGemm { Auto, Onednn, Packed };
enum class ConvAlgo { Auto, Direct, Winograd };
enum class ConvWeightGrad { Auto, Paired, Onednn, Matmul };
enum class CudaNormBackward { Fused, Split };
enum class CudaGeluEpilogue { Forward, On, Backward, Off };
enum class DistStaging { Auto, Always };
enum class CudaAttention { Engine, Cudnn, Auto };

// What a switch says about itself (`fasttrain switches`, the tests of the list).
using Info = SwitchInfo;

template <class E>
class Scoped;

template <class E>
class Switch {
 public:
  template <size_t N>
  constexpr Switch(const char* variable, const detail::EnvChoice<E> (&names)[N], E unset, const char* help)
      : variable_(variable), names_(names), count_(N), unset_(unset), help_(help) {}
  Switch(const Switch&) = delete;
  Switch& operator=(const Switch&) = delete;

  E get() const { return setting().value_or(unset_); }
  // The override or the variable's value; nullopt when neither is set (the default applies).
  std::optional<E> setting() const {
    int v = override_.load(std::memory_order_acquire);
    if (v == kNone) v = from_environment();
    if (v == kNone) return std::nullopt;
    return static_cast<E>(v);
  }
  const char* variable() const { return variable_; }
  Info info() const {
    Info i{variable_, help_, detail::names_list(names_, count_), ""};
    if (const std::optional<E> s = setting()) i.value = name_of(*s);
    return i;
  }

 private:
  friend class Scoped<E>;
  static constexpr int kNone = -1, kUnread = -2;

  // The variable's value as an int (kNone: unset or empty), parsed on the first call. Two threads
  // may both parse it on first use; they store the same result.
  int from_environment() const {
    int v = environment_.load(std::memory_order_acquire);
    if (v != kUnread) return v;
    const std::optional<E> parsed = detail::env_choice(variable_, names_, count_);
    v = parsed ? static_cast<int>(*parsed) : kNone;
    environment_.store(v, std::memory_order_release);
    return v;
  }
  const char* name_of(E value) const {
    for (size_t i = 0; i < count_; ++i)
      if (names_[i].value == value) return names_[i].name;
    return "?";
  }

  const char* variable_;
  const detail::EnvChoice<E>* names_;
  size_t count_;
  E unset_;
  const char* help_;
  mutable std::atomic<int> environment_{kUnread};
  std::atomic<int> override_{kNone};
};

// Sets a switch for the guard's lifetime; guards nest (each restores what it found). Meant for
// the thread that drives a test or a benchmark, between operations, not while kernels run.
template <class E>
class Scoped {
 public:
  Scoped(Switch<E>& s, E value) : switch_(s), saved_(s.override_.exchange(static_cast<int>(value))) {}
  ~Scoped() { switch_.override_.store(saved_, std::memory_order_release); }
  Scoped(const Scoped&) = delete;
  Scoped& operator=(const Scoped&) = delete;

 private:
  Switch<E>& switch_;
  int saved_;
};

// --- the names each variable accepts ---------------------------------------------------------

inline constexpr detail::EnvChoice<F32Gemm> kF32GemmNames[] = {
    {F32Gemm::Blas, "blas"}, {F32Gemm::Onednn, "onednn"}, {F32Gemm::Auto, "auto"}};
inline constexpr detail::EnvChoice<HalfGemm> kHalfGemmNames[] = {
    {HalfGemm::Onednn, "onednn"}, {HalfGemm::Packed, "packed"}, {HalfGemm::Auto, "auto"}};
inline constexpr detail::EnvChoice<ConvAlgo> kConvAlgoNames[] = {
    {ConvAlgo::Direct, "direct"}, {ConvAlgo::Winograd, "winograd"}, {ConvAlgo::Auto, "auto"}};
inline constexpr detail::EnvChoice<ConvWeightGrad> kConvWeightGradNames[] = {{ConvWeightGrad::Auto, "auto"},
                                                                             {ConvWeightGrad::Paired, "paired"},
                                                                             {ConvWeightGrad::Onednn, "onednn"},
                                                                             {ConvWeightGrad::Matmul, "matmul"}};
inline constexpr detail::EnvChoice<cpu::CpuIsa> kCpuIsaNames[] = {{cpu::CpuIsa::Generic, "generic"},
                                                                  {cpu::CpuIsa::Avx2, "avx2"},
                                                                  {cpu::CpuIsa::Avx512, "avx512"},
                                                                  {cpu::CpuIsa::Avx512Bf16, "avx512_bf16"},
                                                                  {cpu::CpuIsa::Amx, "amx"}};
inline constexpr detail::EnvChoice<CudaNormBackward> kCudaNormBackwardNames[] = {{CudaNormBackward::Fused, "fused"},
                                                                                 {CudaNormBackward::Split, "split"}};
inline constexpr detail::EnvChoice<CudaGeluEpilogue> kCudaGeluEpilogueNames[] = {
    {CudaGeluEpilogue::Forward, "forward"},
    {CudaGeluEpilogue::On, "on"},
    {CudaGeluEpilogue::Backward, "backward"},
    {CudaGeluEpilogue::Off, "off"}};
inline constexpr detail::EnvChoice<CudaAttention> kCudaAttentionNames[] = {
    {CudaAttention::Engine, "engine"}, {CudaAttention::Cudnn, "cudnn"}, {CudaAttention::Auto, "auto"}};
inline constexpr detail::EnvChoice<DistStaging> kDistStagingNames[] = {{DistStaging::Auto, "auto"},
                                                                       {DistStaging::Always, "always"}};

// --- the switches ------------------------------------------------------------------------------

// The CPU kernel table's instruction-set level (cpu/isa.h): lowers it below the detected one so
// every variant can be tested on one machine; never raises it.
inline Switch<cpu::CpuIsa> cpu_isa{"FASTTRAIN_CPU_ISA", kCpuIsaNames, cpu::CpuIsa::Amx,
                                   "the CPU kernel table's instruction-set level (default: what the CPU runs)"};
inline Switch<F32Gemm> f32_gemm{"FT_F32_GEMM", kF32GemmNames, F32Gemm::Auto,
                                "the f32 CPU GEMM: OpenBLAS or oneDNN's matmul (cpu/linalg.h)"};
inline Switch<HalfGemm> half_gemm{"FT_BF16_GEMM", kHalfGemmNames, HalfGemm::Auto,
                                  "the bf16/f16 CPU GEMM: oneDNN's matmul or the packed GEMM (cpu/linalg.h)"};
inline Switch<ConvAlgo> conv_algo{"FT_CONV_ALGO", kConvAlgoNames, ConvAlgo::Auto,
                                  "CPU convolutions: direct kernels or Winograd (cpu/conv.h)"};
inline Switch<ConvWeightGrad> conv_weight_grad{
    "FT_CONV_WEIGHT_GRAD", kConvWeightGradNames, ConvWeightGrad::Auto,
    "the bf16 CPU convolution weight gradient: paired kernel, oneDNN, one matrix product (cpu/conv.h)"};
inline Switch<bool> fused_add_norm{"FT_FUSED_ADD_NORM", detail::kYesNo, true,
                                   "residual add and the following norm in one kernel (off: add(), then the norm)"};
inline Switch<bool> cuda_bgradb{"FT_CUDA_BGRADB", detail::kYesNo, true,
                                "CUDA: the bias gradient inside cuBLASLt's weight-gradient product"};
inline Switch<CudaNormBackward> cuda_norm_backward{"FT_CUDA_NORM_BACKWARD", kCudaNormBackwardNames,
                                                   CudaNormBackward::Fused,
                                                   "CUDA: the norm backward in one pass or two (dx, then the sums)"};
inline Switch<CudaGeluEpilogue> cuda_gelu_epilogue{
    "FT_CUDA_GELU_EPILOGUE", kCudaGeluEpilogueNames, CudaGeluEpilogue::Forward,
    "CUDA: which GELU products take cuBLASLt's epilogue (forward, both, backward, none)"};
inline Switch<bool> cuda_attention_fma{"FT_CUDA_ATTENTION_FMA", detail::kYesNo, false,
                                       "CUDA: bf16/f16 attention on the FMA kernels instead of tensor cores"};
// engine until a GPU session has verified cuDNN's path (attention_cudnn.cpp).
inline Switch<CudaAttention> cuda_attention{
    "FT_CUDA_ATTENTION", kCudaAttentionNames, CudaAttention::Engine,
    "CUDA: bf16/f16 attention on the engine's kernels, cuDNN's fused attention, or per shape the faster (auto)"};
inline Switch<bool> cuda_expandable_segments{"FT_CUDA_EXPANDABLE_SEGMENTS", detail::kYesNo, false,
                                             "CUDA: device memory in growable virtual-memory segments"};
inline Switch<DistStaging> dist_staging{
    "FT_DIST_STAGING", kDistStagingNames, DistStaging::Auto,
    "collectives through host copies: of device tensors (auto) or of every tensor (always; tests the staging on CPUs)"};

// process_switches() (fasttrain/switches.h) lists every switch above, in this order, and
// FASTTRAIN_FAULT (fault injection, core/fault_injection.h: a specification, not a choice, read
// before main in builds with tests).

}  // namespace ft::switches
