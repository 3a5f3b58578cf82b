// Gradient check: compares autograd's gradients with central finite differences in f64.
#pragma once
#include <functional>
#include <vector>

#include "fasttrain/tensor.h"

namespace ft::test {

struct GradcheckOptions {
  double eps = 1e-6;
  double atol = 1e-6;
  double rtol = 1e-4;
};

// fn maps the inputs to one output tensor. Inputs must be f64; those with requires_grad are
// checked. The scalar checked is sum(fn(inputs) * v) for a fixed random v, so every output
// element contributes. Returns an empty string on success, else a description of the worst
// mismatch (input, element, analytical, numerical).
std::string gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& fn, const std::vector<Tensor>& inputs,
                      GradcheckOptions opts = {});

// The oracle of a fused kernel: `fn` against `reference`, the same function composed of simple
// ops (matmul, softmax, reductions, elementwise). Compares the outputs and, for one random
// upstream gradient, the gradients of every input that requires grad, elementwise within
// atol + rtol * |reference|. Returns an empty string on success, else what differs and where.
std::string compare_with_reference(const std::function<Tensor(const std::vector<Tensor>&)>& fn,
                                   const std::function<Tensor(const std::vector<Tensor>&)>& reference,
                                   const std::vector<Tensor>& inputs, double atol = 1e-12, double rtol = 1e-10);

}  // namespace ft::test

// EXPECT_MATCHES_REFERENCE(fn, reference, {inputs...}) fails the test with the difference.
#define EXPECT_MATCHES_REFERENCE(...)                                  \
  do {                                                                 \
    std::string _mr = ::ft::test::compare_with_reference(__VA_ARGS__); \
    EXPECT_TRUE(_mr.empty()) << _mr;                                   \
  } while (0)

// EXPECT_GRADCHECK(fn, {inputs...}) fails the test with the mismatch description.
#define EXPECT_GRADCHECK(...)                             \
  do {                                                    \
    std::string _gc = ::ft::test::gradcheck(__VA_ARGS__); \
    EXPECT_TRUE(_gc.empty()) << _gc;                      \
  } while (0)
