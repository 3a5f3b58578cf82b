// safetensors I/O (src/io/safetensors.cpp), its CRC-32C (src/io/crc32c.cpp) and the atomic
// writer (src/io/atomic_file.cpp). Interop runs an independent Python implementation of the
// format (tests/support/safetensors_torch.py) against PyTorch tensors.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "fasttrain/atomic_file.h"
#include "fasttrain/fasttrain.h"
#include "fasttrain/safetensors.h"
#include "io/crc32c.h"
#include "support/expect_error.h"

using namespace ft;
using ft::test::expect_error;
namespace fs = std::filesystem;

namespace {

const char* kPython = "/usr/bin/python3";

fs::path script() { return fs::path(__FILE__).parent_path() / "support" / "safetensors_torch.py"; }

// A fresh directory per test, removed afterwards.
class Safetensors : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("ft_safetensors_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string file(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

constexpr int kNoTorch = 77;  // the script's exit status when torch is not installed

int run_script(const std::string& cmd, const std::string& path, const std::string& out) {
  int status =
      std::system((std::string(kPython) + " " + script().string() + " " + cmd + " " + path + " " + out).c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  return nlohmann::json::parse(f);
}

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(bytes.data(), bytes.size());
}

// A file with a hand-written header (8-byte length, JSON, data) for the corruption cases.
void write_raw(const std::string& path, const std::string& header, const std::string& data, uint64_t len_override = 0) {
  uint64_t n = len_override ? len_override : header.size();
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(n >> (8 * i));
  write_bytes(path, bytes + header + data);
}

TensorMap sample() {
  return {
      {"w", from_vector({1.5, -2, 3.25, 4, 5, -6}, {2, 3})},
      {"b.f64", from_vector({0.1, 0.2, 1e-300}, {3}, DType::F64)},
      {"h.bf16", from_vector({1, -0.5, 3.140625}, {3}, DType::BF16)},
      {"h.f16", from_vector({65504, -0.25}, {2}, DType::F16)},
      {"i32", from_vector({-7, 8, 9, 10}, {2, 2}, DType::I32)},
      {"i64", from_vector({-1099511627776.0, 42}, {2}, DType::I64)},
      {"u8", from_vector({0, 255, 17}, {3}, DType::U8)},
      {"mask", from_vector({1, 0, 1}, {3}, DType::Bool)},
      {"scalar", scalar_tensor(7.0)},
      {"empty", zeros({0, 4})},
  };
}

void expect_same(const Tensor& a, const Tensor& b, const std::string& name) {
  EXPECT_EQ(a.dtype(), b.dtype()) << name;
  EXPECT_EQ(a.shape(), b.shape()) << name;
  EXPECT_EQ(a.to_vector(), b.to_vector()) << name;
}

}  // namespace

TEST(Crc32c, KnownValueAndHardwareMatchesTable) {
  const std::string check = "123456789";
  EXPECT_EQ(io::crc32c(check.data(), check.size()), 0xE3069283u);  // the standard check value
  EXPECT_EQ(io::crc32c_portable(check.data(), check.size()), 0xE3069283u);
  std::string data(1000, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 131 + 7);
  for (size_t n : {0, 1, 7, 8, 9, 63, 1000})
    EXPECT_EQ(io::crc32c(data.data(), n), io::crc32c_portable(data.data(), n)) << n;
  // Continuation: checksum of a whole equals the checksum continued over its parts.
  EXPECT_EQ(io::crc32c(data.data() + 300, 700, io::crc32c(data.data(), 300)), io::crc32c(data.data(), 1000));
}

TEST_F(Safetensors, RoundTripsEveryDtypeMetadataAndOrder) {
  TensorMap in = sample();
  in.emplace_back("transposed", arange(0, 6).reshape({2, 3}).t());  // written contiguous
  save_safetensors(file("m.safetensors"), in, {{"format", "pt"}, {"step", "12"}});
  SafetensorsFile out = load_safetensors(file("m.safetensors"));
  ASSERT_EQ(out.tensors.size(), in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ(out.tensors[i].first, in[i].first);  // the order tensors were added
    expect_same(out.tensors[i].second, in[i].second, in[i].first);
    EXPECT_TRUE(out.tensors[i].second.is_contiguous());
  }
  // Checksums are the writer's business: not returned as user metadata.
  EXPECT_EQ(out.metadata, (std::map<std::string, std::string>{{"format", "pt"}, {"step", "12"}}));
  // Header padded to 8 bytes, so the data section is aligned.
  std::string bytes = read_bytes(file("m.safetensors"));
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(bytes.substr(8, 1), "{");
}

TEST_F(Safetensors, WritesAtomicallyAndLeavesNoTemporaryFile) {
  save_safetensors(file("m.safetensors"), {{"a", ones({4})}});
  save_safetensors(file("m.safetensors"), {{"a", zeros({2})}});  // replaces
  EXPECT_EQ(load_safetensors(file("m.safetensors")).tensors[0].second.to_vector(), (std::vector<double>{0, 0}));
  size_t files = 0;
  for (auto& e : fs::directory_iterator(dir_)) files += (void(e), 1);
  EXPECT_EQ(files, 1u);
  {
    AtomicFileWriter w(file("m.safetensors"));
    w.write("partial", 7);
  }  // abandoned without commit: the old file stays, the temporary file is removed
  EXPECT_EQ(load_safetensors(file("m.safetensors")).tensors[0].second.numel(), 2);
  files = 0;
  for (auto& e : fs::directory_iterator(dir_)) files += (void(e), 1);
  EXPECT_EQ(files, 1u);
  expect_error(
      [&] {
        save_safetensors(file("missing_dir/m.safetensors"), {{"a", ones({1})}});
      },
      "cannot create temporary file");
}

TEST_F(Safetensors, RejectsBadInputToSave) {
  expect_error([&] { save_safetensors(file("x"), {{"a", ones({1})}, {"a", ones({1})}}); }, "tensor 'a' appears twice");
  expect_error([&] { save_safetensors(file("x"), {{"__metadata__", ones({1})}}); }, "reserved");
  expect_error([&] { save_safetensors(file("x"), {{"", ones({1})}}); }, "names must not be empty");
  expect_error([&] { save_safetensors(file("x"), {{"u", Tensor()}}); }, "tensor 'u' is undefined");
  expect_error([&] { save_safetensors(file("x"), {{"a", ones({1})}}, {{"crc32c.a", "0"}}); }, "reserved prefix");
  EXPECT_FALSE(fs::exists(file("x")));
}

TEST_F(Safetensors, PyTorchReadsWhatWeWrite) {
  TensorMap in = sample();
  save_safetensors(file("m.safetensors"), in, {{"format", "pt"}});
  // The Python reader also verifies our CRC-32C values with its own bitwise implementation.
  const int rc = run_script("read", file("m.safetensors"), file("m.json"));
  if (rc == kNoTorch) GTEST_SKIP() << "python3-torch not installed: interop not tested";
  ASSERT_EQ(rc, 0);
  nlohmann::json doc = read_json(file("m.json"));
  ASSERT_EQ(doc["tensors"].size(), in.size());
  const char* st_dtype[] = {"F32", "F64", "BF16", "F16", "I32", "I64", "U8", "BOOL"};
  for (const auto& [name, t] : in) {
    const auto& e = doc["tensors"].at(name);
    EXPECT_EQ(e["dtype"], st_dtype[static_cast<int>(t.dtype())]) << name;
    EXPECT_EQ(e["shape"].get<std::vector<int64_t>>(), std::vector<int64_t>(t.shape().begin(), t.shape().end())) << name;
    EXPECT_EQ(e["values"].get<std::vector<double>>(), t.to_vector()) << name;
  }
  EXPECT_EQ(doc["metadata"]["format"], "pt");
}

TEST_F(Safetensors, WeReadWhatPyTorchWrites) {
  const int rc = run_script("write", file("torch.safetensors"), file("torch.json"));
  if (rc == kNoTorch) GTEST_SKIP() << "python3-torch not installed: interop not tested";
  ASSERT_EQ(rc, 0);
  nlohmann::json doc = read_json(file("torch.json"));
  SafetensorsFile f = load_safetensors(file("torch.safetensors"));  // no checksums in this file
  ASSERT_EQ(f.tensors.size(), doc["tensors"].size());
  std::vector<std::string> expected_order;
  for (const auto& [name, e] : doc["tensors"].items()) expected_order.push_back(name);
  for (const auto& [name, t] : f.tensors) {
    const auto& e = doc["tensors"].at(name);
    EXPECT_EQ(std::vector<int64_t>(t.shape().begin(), t.shape().end()), e["shape"].get<std::vector<int64_t>>()) << name;
    EXPECT_EQ(t.to_vector(), e["values"].get<std::vector<double>>()) << name;
  }
  EXPECT_EQ(f.metadata.at("source"), "torch");
  EXPECT_EQ(f.tensors.front().second.dtype(), DType::F32);
  EXPECT_EQ(f.tensors[2].second.dtype(), DType::BF16);
}

TEST_F(Safetensors, RejectsTruncatedFile) {
  save_safetensors(file("m.safetensors"), sample());
  std::string bytes = read_bytes(file("m.safetensors"));
  write_bytes(file("cut.safetensors"), bytes.substr(0, bytes.size() - 3));
  expect_error([&] { load_safetensors(file("cut.safetensors")); }, "run past the end of the data section");
  write_bytes(file("cut.safetensors"), bytes.substr(0, 40));
  expect_error([&] { load_safetensors(file("cut.safetensors")); }, "cut.safetensors: header length");
  write_bytes(file("cut.safetensors"), bytes.substr(0, 5));
  expect_error([&] { load_safetensors(file("cut.safetensors")); }, "too short for the 8-byte header length");
  expect_error([&] { load_safetensors(file("none.safetensors")); }, "none.safetensors: cannot open");
}

TEST_F(Safetensors, DetectsAFlippedDataByte) {
  save_safetensors(file("model.safetensors"),
                   {{"transformer.wpe.weight", ones({4, 4})}, {"transformer.wte.weight", ones({8, 4})}});
  std::string bytes = read_bytes(file("model.safetensors"));
  bytes[bytes.size() - 5] ^= 0x10;  // inside the last tensor
  write_bytes(file("model.safetensors"), bytes);
  expect_error([&] { load_safetensors(file("model.safetensors")); },
               "model.safetensors: tensor 'transformer.wte.weight' checksum mismatch: file altered or corrupt");
}

TEST_F(Safetensors, RejectsMalformedHeaders) {
  const std::string data(16, '\0');
  const std::string good = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                           R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})";
  write_raw(file("ok"), good, data);
  EXPECT_EQ(load_safetensors(file("ok")).tensors.size(), 2u);

  write_raw(file("len"), good, data, 1000);
  expect_error([&] { load_safetensors(file("len")); }, "header length 1000 runs past the end of the file");
  write_raw(file("json"), R"({"a":{"dtype":"F32",)", data);
  expect_error([&] { load_safetensors(file("json")); }, "json: malformed JSON header");
  write_raw(file("array"), "[1,2]", "");
  expect_error([&] { load_safetensors(file("array")); }, "header must be a JSON object");
  write_raw(file("dtype"), R"({"a":{"dtype":"F8_E4M3","shape":[16],"data_offsets":[0,16]}})", data);
  expect_error([&] { load_safetensors(file("dtype")); }, "tensor 'a' has unknown dtype 'F8_E4M3'");
  write_raw(file("count"), R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})", data);
  expect_error([&] { load_safetensors(file("count")); },
               "tensor 'a' has shape [3] F32 (12 bytes) but data_offsets [0, 16] span 16 bytes");
  write_raw(
      file("overlap"),
      R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
      data);
  expect_error([&] { load_safetensors(file("overlap")); }, "tensor 'b' data_offsets [8, 16] overlap tensor 'a'");
  write_raw(
      file("gap"),
      R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
      data);
  expect_error([&] { load_safetensors(file("gap")); }, "tensor 'b' starts at byte 8 of the data section, expected 4");
  write_raw(file("trailing"), R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", data);
  expect_error([&] { load_safetensors(file("trailing")); }, "8 trailing bytes");
  write_raw(file("range"), R"({"a":{"dtype":"F32","shape":[8],"data_offsets":[0,32]}})", data);
  expect_error([&] { load_safetensors(file("range")); }, "tensor 'a' data_offsets [0, 32] run past the end");
  write_raw(file("shape"), R"({"a":{"dtype":"F32","shape":[-4],"data_offsets":[0,16]}})", data);
  expect_error([&] { load_safetensors(file("shape")); }, "tensor 'a' shape must hold non-negative integers");
  write_raw(file("huge"), R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,16]}})", data);
  expect_error([&] { load_safetensors(file("huge")); }, "(too large)");
  write_raw(file("missing"), R"({"a":{"dtype":"F32","data_offsets":[0,16]}})", data);
  expect_error([&] { load_safetensors(file("missing")); }, "tensor 'a' has no \"shape\"");
  write_raw(file("meta"), R"({"__metadata__":{"k":3},"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", data);
  expect_error([&] { load_safetensors(file("meta")); }, "metadata 'k' must be a string");
  write_raw(file("crc"),
            R"({"__metadata__":{"crc32c.zz":"00000000"},"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", data);
  expect_error([&] { load_safetensors(file("crc")); }, "checksum for tensor 'zz' which the file does not hold");
}
