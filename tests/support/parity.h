// Parity with PyTorch. tests/parity/generate.py (run by CTest as a fixture, with Debian's
// python3-torch) writes, for each named case, its inputs, PyTorch's outputs and PyTorch's input
// gradients for a random upstream gradient. A C++ test loads the case, runs the same op on the
// same inputs (rebuilt as the same non-contiguous or broadcast views), and compares.
//
// Tolerances, per dtype, |actual - expected| <= atol + rtol * |expected| elementwise:
//   f64: atol 1e-10, rtol 1e-8      f32: atol 1e-5, rtol 1e-4
//   bf16: atol 1e-2, rtol 2e-2      f16: atol 1e-3, rtol 2e-3
// f16 references are PyTorch computing in f32 on the f16-rounded inputs, rounded to f16 (Debian's
// PyTorch 1.13 lacks most f16 CPU kernels); f16 kernels here compute in f32 the same way.
//   integer and bool: exact
// A case may widen them (reductions over long rows, matmuls) through its "atol"/"rtol" fields.
#pragma once
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "fasttrain/tensor.h"

namespace ft::test {

struct Tolerance {
  double atol, rtol;
};
Tolerance default_tolerance(DType t);

class ParityCase {
 public:
  // Loads the case; the test is skipped (with a message) when the references were not generated
  // because python3-torch is missing. Check with available() and return.
  explicit ParityCase(const std::string& name);
  bool available() const { return available_; }
  const std::string& skip_reason() const { return skip_reason_; }

  // An input rebuilt exactly as PyTorch saw it (dtype, non-contiguous/broadcast layout).
  Tensor input(const std::string& name, bool requires_grad = false) const;
  bool has(const std::string& name) const;
  const nlohmann::json& params() const { return meta_["params"]; }
  template <class T>
  T param(const std::string& key) const {
    return meta_["params"].at(key).get<T>();
  }
  DType dtype() const;

  // Compares an output with PyTorch's output number `index`.
  void expect_output(const Tensor& actual, int index = 0) const;
  // Runs backward from the outputs with the case's upstream gradients.
  void backward(const std::vector<Tensor>& outputs) const;
  // Compares the gradient of an input with PyTorch's.
  void expect_grad(const std::string& input_name, const Tensor& input) const;
  // Compares any tensor with a stored reference array.
  void expect_close(const Tensor& actual, const std::string& ref_name, const std::string& what) const;

 private:
  Tensor load(const std::string& file, DType as) const;
  Tolerance tolerance() const;
  std::string dir_;
  nlohmann::json meta_;
  bool available_ = false;
  std::string skip_reason_;
};

// The generator's manifest.json: one entry per case with "name", "family" (the cases_<family>.py
// it came from), "op" (the op it runs, or null), "dtype", "inputs" (names in call order),
// "outputs" (count) and "grads" (inputs with reference gradients). Tests that walk it run every
// case of an op without naming cases themselves. Not available (with the reason) when the
// references were not generated.
struct ParityManifest {
  bool available = false;
  std::string skip_reason;
  nlohmann::json cases = nlohmann::json::array();
  // The entries of one family that name an op.
  std::vector<nlohmann::json> op_cases(const std::string& family) const;
};
const ParityManifest& parity_manifest();

// Compares two tensors elementwise; empty on success, else the worst element and counts.
std::string compare(const Tensor& actual, const Tensor& expected, Tolerance tol);

}  // namespace ft::test

// Usage: FT_PARITY_MANIFEST(m);  then walk m.op_cases("elementwise").
#define FT_PARITY_MANIFEST(var)                                          \
  const ::ft::test::ParityManifest& var = ::ft::test::parity_manifest(); \
  if (!var.available) GTEST_SKIP() << var.skip_reason

// Usage: FT_PARITY_CASE(c, "softmax_f32_dim1");  then use c.input(...), c.expect_output(...).
#define FT_PARITY_CASE(var, name)   \
  ::ft::test::ParityCase var(name); \
  if (!var.available()) GTEST_SKIP() << var.skip_reason()
