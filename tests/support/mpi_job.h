// What the data-parallel suites (test_ddp, test_zero) share: the mpirun prefix for jobs of N ranks
// on the CI machine, running a command, and reading back a run folder's losses and weights.
//
// Under AddressSanitizer the ranks run with LeakSanitizer off (and only they): Open MPI leaves
// what its components, PMIx and hwloc allocated unfreed at MPI_Finalize, and every leak reported
// in a rank is in those libraries (docs/ARCHITECTURE.md "Sanitizers"). ASan and UBSan still check
// every rank, and the single-process runs keep the leak check.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "fasttrain/ops.h"
#include "fasttrain/random.h"
#include "fasttrain/safetensors.h"
#include "fasttrain/token_shards.h"
#include "support/run_cli.h"

namespace ft::test {

// "mpirun ... -np N " (FT_MPIEXEC, set in tests/CMakeLists.txt): --oversubscribe, as the CI
// machine has 2 cores; --allow-run-as-root, as it runs as root; mpirun's --timeout is a second
// safety net besides the CTest timeout, so no job outlives it.
// (GCC says ASan with __SANITIZE_ADDRESS__, clang 14 only through __has_feature.)
#if defined(__SANITIZE_ADDRESS__)
#define FT_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FT_TEST_ASAN 1
#endif
#endif
inline std::string mpirun(int ranks) {
#if defined(FT_TEST_ASAN)
  const std::string env = "ASAN_OPTIONS=\"${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0\" ",
                    forward = " -x ASAN_OPTIONS";
#else
  const std::string env, forward;
#endif
  return env + FT_MPIEXEC + forward + " --allow-run-as-root --oversubscribe --timeout 240 -np " +
         std::to_string(ranks) + " ";
}

// <dir>/train.bin (20000 tokens) and <dir>/val.bin (3000): token shards of a noisy cycle over a
// 96-token vocabulary (token i is 7 i + noise in [0, 5), mod 96): structure a small model learns
// in a few steps, for the model-parallel CLI tests.
inline void write_noisy_cycle_shards(const std::string& dir) {
  Generator gen(4);
  for (const char* name : {"train", "val"}) {
    const int64_t n = std::string(name) == "train" ? 20000 : 3000;
    const Tensor noise = randint(0, 5, {n}, DType::I64, &gen);
    std::vector<uint16_t> tokens(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) tokens[i] = static_cast<uint16_t>((i * 7 + noise.data<int64_t>()[i]) % 96);
    data::write_token_shard(dir + "/" + name + ".bin", tokens);
  }
}

// The training losses of a run folder's metrics.csv, in step order.
inline std::vector<double> train_losses(const std::string& dir) {
  std::ifstream f(dir + "/metrics.csv");
  std::vector<double> out;
  std::string line;
  while (std::getline(f, line)) {
    std::vector<std::string> cols;
    std::stringstream ss(line);
    for (std::string c; std::getline(ss, c, ',');) cols.push_back(c);
    if (cols.size() > 3 && cols[2] == "train") out.push_back(std::stod(cols[3]));
  }
  return out;
}

// The model-parallel CLI tests' comparisons (a split run against one process). Every weight tensor of `dir`'s
// model.safetensors within `rel` of the reference's in the 2-norm
// (||a - b|| <= rel ||b||, per tensor), but the keys' biases: the loss does not depend on them
// (softmax is invariant to adding q . b_k to a whole row of scores), so their gradient is zero in
// exact arithmetic and rounding noise in float, which Adam scales up to full-size updates in
// whatever direction the noise points. A different summation order (the split matmuls) gives
// other noise; no layout can reproduce those elements, and nothing else depends on them. (The
// same effect, milder, on elements whose gradient is near zero is why the bound is on the norm,
// at 5e-6: after 20 Adam steps the small biases differ by up to 1.5e-6 of their norm, single
// elements by up to 1.4e-5 of the tensor's largest; the losses agree to 1e-6.)
inline void expect_model_close(const std::string& dir, const std::string& reference, double rel, int64_t C) {
  const SafetensorsFile a = load_safetensors(dir + "/model.safetensors");
  const SafetensorsFile b = load_safetensors(reference + "/model.safetensors");
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    const auto& [name, x] = a.tensors[i];
    ASSERT_EQ(name, b.tensors[i].first);
    Tensor u = x, v = b.tensors[i].second;
    ASSERT_EQ(u.shape(), v.shape()) << name;
    if (name.ends_with(".attn.c_attn.bias")) {  // q and v only
      u = cat({x.narrow(0, 0, C), x.narrow(0, 2 * C, C)});
      v = cat({v.narrow(0, 0, C), v.narrow(0, 2 * C, C)});
    }
    const std::vector<double> p = u.to_vector(), q = v.to_vector();
    double norm = 0, diff = 0;
    for (size_t k = 0; k < q.size(); ++k) {
      norm += q[k] * q[k];
      diff += (p[k] - q[k]) * (p[k] - q[k]);
    }
    EXPECT_LE(std::sqrt(diff), rel * std::sqrt(norm))
        << dir << ": " << name << " differs by " << std::sqrt(diff) << " in norm (its norm " << std::sqrt(norm) << ")";
  }
}

inline void expect_losses_close(const std::vector<double>& got, const std::vector<double>& want, double rel,
                                size_t offset = 0) {
  ASSERT_EQ(got.size() + offset, want.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i + offset], rel * std::abs(want[i + offset])) << "step " << i + offset + 1;
}

inline std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// Every weight of `dir`'s model.safetensors within `rel` of the reference's, relative to the
// largest magnitude in its tensor (near-zero elements are not held to a relative bound of their
// own).
inline void expect_weights_close(const std::string& dir, const std::string& reference, double rel) {
  const SafetensorsFile a = load_safetensors(dir + "/model.safetensors");
  const SafetensorsFile b = load_safetensors(reference + "/model.safetensors");
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    const auto& [name, x] = a.tensors[i];
    ASSERT_EQ(name, b.tensors[i].first);
    const std::vector<double> u = x.to_vector(), v = b.tensors[i].second.to_vector();
    ASSERT_EQ(u.size(), v.size()) << name;
    double scale = 0, worst = 0;
    for (size_t k = 0; k < v.size(); ++k) {
      scale = std::max(scale, std::abs(v[k]));
      worst = std::max(worst, std::abs(u[k] - v[k]));
    }
    EXPECT_LE(worst, rel * scale) << dir << ": " << name << " differs by " << worst << " (largest value " << scale
                                  << ")";
  }
}

}  // namespace ft::test
