// Running the PyTorch reference scripts beside this header (hf_llama.py, hf_gpt2.py, ...) with
// Debian's /usr/bin/python3, and reading what they write. The scripts exit with kNoTorch when torch
// is not installed; the tests then skip with a message.
#pragma once
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "fasttrain/safetensors.h"
#include "support/parity.h"

namespace ft::test {

inline constexpr int kNoTorch = 77;

// `python3 tests/support/SCRIPT ARGS`'s exit status (-1 when it did not exit).
inline int run_torch_script(const std::string& script, const std::string& args) {
  const std::filesystem::path path = std::filesystem::path(__FILE__).parent_path() / script;
  const int status = std::system(("/usr/bin/python3 " + path.string() + " " + args).c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// The tensor called `name` (a test failure and an undefined tensor when there is none).
inline Tensor named(const TensorMap& m, const std::string& name) {
  for (auto& [n, t] : m)
    if (n == name) return t;
  ADD_FAILURE() << "no tensor " << name;
  return Tensor();
}

// actual against a reference computed in f32 by torch.
inline void expect_close(const Tensor& actual, const Tensor& expected, const std::string& what,
                         Tolerance tol = {2e-5, 2e-4}) {
  const std::string msg = compare(actual, expected.to(DType::F64), tol);
  EXPECT_TRUE(msg.empty()) << what << ": " << msg;
}

}  // namespace ft::test
