// The process switches (src/core/switches.h): how a variable's value is read and refused, the
// in-process guard that tests and benchmarks use instead of a process per setting, the list that
// `fasttrain switches` prints, and the switches whose users cache work (the CPU kernel table).
#include <gtest/gtest.h>

#include <cstdlib>
#include <set>
#include <string>

#include "backend/cpu/isa.h"
#include "backend/cpu/kernels.h"
#include "backend/kernels.h"
#include "core/switches.h"
#include "fasttrain/fasttrain.h"
#include "support/expect_error.h"
#include "support/run_cli.h"

using namespace ft;
using test::expect_error;

namespace {

// Sets an environment variable for the scope (restoring what was there).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) had_ = true, old_ = old;
    ::setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (had_)
      ::setenv(name_, old_.c_str(), 1);
    else
      ::unsetenv(name_);
  }

 private:
  const char* name_;
  bool had_ = false;
  std::string old_;
};

// A fresh switch reading `variable` (the registry's own read their variable once per process):
// the value `bad` must be refused with `message`.
template <class E, size_t N>
void expect_refused(const char* variable, const detail::EnvChoice<E> (&names)[N], const char* bad,
                    const std::string& message) {
  ScopedEnv env(variable, bad);
  const switches::Switch<E> fresh(variable, names, names[0].value, "");
  expect_error([&] { fresh.get(); }, message);
}

}  // namespace

// Unset or empty gives the default, a listed name its value, anything else an error naming the
// variable, the names and the value.
TEST(Switches, VariablesNameWhatTheyAccept) {
  const char* var = "FT_TEST_ENV_SWITCH";
  ::unsetenv(var);
  {
    const switches::Switch<bool> on_by_default(var, detail::kYesNo, true, "");
    EXPECT_TRUE(on_by_default.get());
    EXPECT_FALSE(on_by_default.setting().has_value());
  }
  {
    ScopedEnv env(var, "");
    const switches::Switch<bool> off_by_default(var, detail::kYesNo, false, "");
    EXPECT_FALSE(off_by_default.get());
  }
  for (const char* off : {"off", "0", "false"}) {
    ScopedEnv env(var, off);
    const switches::Switch<bool> s(var, detail::kYesNo, true, "");
    EXPECT_FALSE(s.get()) << off;
  }
  for (const char* on : {"on", "1", "true"}) {
    ScopedEnv env(var, on);
    const switches::Switch<bool> s(var, detail::kYesNo, false, "");
    EXPECT_TRUE(s.get()) << on;
  }
  expect_refused(var, detail::kYesNo, "Off", "FT_TEST_ENV_SWITCH: expected 1, true, on, 0, false or off, found 'Off'");

  enum class Mode { A, B, C };
  constexpr detail::EnvChoice<Mode> kModes[] = {{Mode::A, "a"}, {Mode::B, "b"}, {Mode::C, "c"}};
  {
    ScopedEnv env(var, "b");
    const switches::Switch<Mode> s(var, kModes, Mode::C, "");
    EXPECT_EQ(s.get(), Mode::B);
    EXPECT_EQ(s.info().value, "b");
  }
  ::unsetenv(var);
  EXPECT_EQ(switches::Switch<Mode>(var, kModes, Mode::C, "").get(), Mode::C);
  expect_refused(var, kModes, "d", "FT_TEST_ENV_SWITCH: expected a, b or c, found 'd'");
}

// Each switch of the registry refuses a name it does not know, naming what it accepts.
TEST(Switches, EachSwitchRefusesAnUnknownName) {
  expect_refused("FT_BF16_GEMM", switches::kHalfGemmNames, "amx",
                 "FT_BF16_GEMM: expected onednn, packed or auto, found 'amx'");
  expect_refused("FT_F32_GEMM", switches::kF32GemmNames, "mkl",
                 "FT_F32_GEMM: expected blas, onednn or auto, found 'mkl'");
  expect_refused("FT_CONV_ALGO", switches::kConvAlgoNames, "fft",
                 "FT_CONV_ALGO: expected direct, winograd or auto, found 'fft'");
  expect_refused("FT_CONV_WEIGHT_GRAD", switches::kConvWeightGradNames, "amx",
                 "FT_CONV_WEIGHT_GRAD: expected auto, paired, onednn or matmul, found 'amx'");
  expect_refused("FASTTRAIN_CPU_ISA", switches::kCpuIsaNames, "sse2",
                 "expected generic, avx2, avx512, avx512_bf16 or amx, found 'sse2'");
  expect_refused("FT_CUDA_GELU_EPILOGUE", switches::kCudaGeluEpilogueNames, "both",
                 "FT_CUDA_GELU_EPILOGUE: expected forward, on, backward or off, found 'both'");
  expect_refused("FT_CUDA_NORM_BACKWARD", switches::kCudaNormBackwardNames, "one",
                 "FT_CUDA_NORM_BACKWARD: expected fused or split, found 'one'");
  expect_refused("FT_DIST_STAGING", switches::kDistStagingNames, "never",
                 "FT_DIST_STAGING: expected auto or always, found 'never'");
}

// A guard overrides the variable and the default for its scope; guards nest and each restores
// what it found.
TEST(Switches, ScopedGuardsOverrideAndRestore) {
  using switches::ConvAlgo;
  const ConvAlgo before = switches::conv_algo.get();
  {
    switches::Scoped outer(switches::conv_algo, ConvAlgo::Winograd);
    EXPECT_EQ(switches::conv_algo.get(), ConvAlgo::Winograd);
    EXPECT_EQ(switches::conv_algo.info().value, "winograd");
    {
      switches::Scoped inner(switches::conv_algo, ConvAlgo::Direct);
      EXPECT_EQ(switches::conv_algo.get(), ConvAlgo::Direct);
    }
    EXPECT_EQ(switches::conv_algo.get(), ConvAlgo::Winograd);
  }
  EXPECT_EQ(switches::conv_algo.get(), before);
  {
    switches::Scoped off(switches::fused_add_norm, false);
    EXPECT_FALSE(switches::fused_add_norm.get());
  }
  EXPECT_TRUE(switches::fused_add_norm.get() || std::getenv("FT_FUSED_ADD_NORM") != nullptr);
}

// The kernel table follows the ISA switch in-process: the portable variants can be run beside the
// machine's own in one test, and the table of the detected level comes back afterwards.
TEST(Switches, TheKernelTableFollowsTheIsaSwitchInProcess) {
  const backend::Kernels& before = backend::kernels(Device::cpu());
  {
    switches::Scoped isa(switches::cpu_isa, cpu::CpuIsa::Generic);
    EXPECT_EQ(cpu::selected_cpu_isa(), cpu::CpuIsa::Generic);
    EXPECT_EQ(&backend::kernels(Device::cpu()), &backend::cpu_kernels_for(cpu::CpuIsa::Generic));
    // Ops run on the portable table and give the same product as the machine's (f64: exact sums
    // of small integers).
    Tensor a = arange(0, 12, 1, DType::F64).reshape({3, 4}), b = arange(0, 8, 1, DType::F64).reshape({4, 2});
    EXPECT_EQ(matmul(a, b).to_vector(), (std::vector<double>{28, 34, 76, 98, 124, 162}));
  }
  EXPECT_EQ(&backend::kernels(Device::cpu()), &before);
  if (cpu::detected_cpu_isa() < cpu::CpuIsa::Amx) {
    switches::Scoped isa(switches::cpu_isa, cpu::CpuIsa::Amx);
    expect_error([] { cpu::selected_cpu_isa(); }, "FASTTRAIN_CPU_ISA: amx is above what this CPU runs");
  }
}

// One list holds every switch, each variable once; `fasttrain switches` prints it with the values
// in effect, and a malformed value is the usual one-line error with exit code 2.
TEST(Switches, OneListAndTheCommandThatPrintsIt) {
  std::set<std::string> variables;
  for (const SwitchInfo& s : process_switches()) {
    EXPECT_TRUE(variables.insert(s.variable).second) << s.variable << " listed twice";
    EXPECT_FALSE(s.help.empty()) << s.variable;
    EXPECT_FALSE(s.accepted.empty()) << s.variable;
  }
  for (const char* v :
       {"FASTTRAIN_CPU_ISA", "FT_F32_GEMM", "FT_BF16_GEMM", "FT_CONV_ALGO", "FT_CONV_WEIGHT_GRAD", "FT_FUSED_ADD_NORM",
        "FT_CUDA_BGRADB", "FT_CUDA_NORM_BACKWARD", "FT_CUDA_GELU_EPILOGUE", "FT_CUDA_ATTENTION_FMA",
        "FT_CUDA_ATTENTION", "FT_CUDA_EXPANDABLE_SEGMENTS", "FT_DIST_STAGING", "FASTTRAIN_FAULT"})
    EXPECT_EQ(variables.count(v), 1u) << v;
  EXPECT_EQ(variables.size(), 14u);

  test::CliRun r = test::run_cli("switches");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("FT_CONV_ALGO"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("accepts: direct, winograd or auto"), std::string::npos) << r.output;
  r = test::run_command("env -u FT_CONV_ALGO FT_CONV_ALGO=winograd " + std::string(FT_CLI_PATH) + " switches");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("FT_CONV_ALGO                 winograd"), std::string::npos) << r.output;
  r = test::run_command("FT_CONV_ALGO=fft " + std::string(FT_CLI_PATH) + " switches");
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("fasttrain: error: FT_CONV_ALGO: expected direct, winograd or auto, found 'fft'"),
            std::string::npos)
      << r.output;
}
