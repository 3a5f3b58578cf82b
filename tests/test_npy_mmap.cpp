// map_npy: zero-copy tensors over .npy files for every dtype, and the malformed-file errors.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "fasttrain/allocator.h"
#include "fasttrain/npy.h"
#include "fasttrain/ops.h"
#include "support/expect_error.h"

using namespace ft;
using ft::test::expect_error;
namespace fs = std::filesystem;

namespace {

class NpyMmap : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("ft_npy_mmap_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string file(const std::string& name) const { return (dir_ / name).string(); }
  // A version-1 .npy file with the given header text (not padded) and `data_bytes` zero bytes.
  std::string raw_npy(const std::string& name, const std::string& header, size_t data_bytes) {
    std::ofstream f(file(name), std::ios::binary);
    f.write("\x93NUMPY\x01\x00", 8);
    uint16_t len = static_cast<uint16_t>(header.size());
    f.write(reinterpret_cast<const char*>(&len), 2);
    f.write(header.data(), header.size());
    f << std::string(data_bytes, '\0');
    return file(name);
  }
  fs::path dir_;
};

// The file backing the mapping that contains `p`, from /proc/self/maps ("" when none).
std::string mapped_file_of(const void* p) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  auto addr = reinterpret_cast<uintptr_t>(p);
  while (std::getline(maps, line)) {
    std::istringstream ls(line);
    std::string range, perms, offset, dev, inode, path;
    ls >> range >> perms >> offset >> dev >> inode >> path;
    uintptr_t lo = std::stoull(range.substr(0, range.find('-')), nullptr, 16);
    uintptr_t hi = std::stoull(range.substr(range.find('-') + 1), nullptr, 16);
    if (addr >= lo && addr < hi) return path;
  }
  return "";
}

TEST_F(NpyMmap, EveryDtypeMapsWithoutCopying) {
  Tensor base = arange(0, 24, 1, TensorOptions(DType::F64)).view({2, 3, 4});
  for (DType dt : {DType::F32, DType::F64, DType::F16, DType::I32, DType::I64, DType::U8, DType::Bool}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor x = base.to(dt);
    std::string path = file(std::string("x_") + dtype_name(dt) + ".npy");
    save_npy(path, x);
    AllocatorStats before = allocator_for(Device::cpu()).stats();
    Tensor y = map_npy(path);
    AllocatorStats after = allocator_for(Device::cpu()).stats();
    EXPECT_EQ(after.num_allocs, before.num_allocs);
    EXPECT_EQ(mapped_file_of(y.raw_data()), fs::canonical(path).string());
    EXPECT_EQ(y.dtype(), dt);
    EXPECT_EQ(y.shape(), x.shape());
    EXPECT_EQ(y.to_vector(), x.to_vector());
  }
}

TEST_F(NpyMmap, WritesChangeOnlyTheProcessCopy) {
  std::string path = file("w.npy");
  save_npy(path, arange(0, 8, 1, TensorOptions(DType::F32)));
  Tensor y = map_npy(path);
  y.data<float>()[0] = 42.f;
  EXPECT_EQ(y.data<float>()[0], 42.f);
  EXPECT_EQ(load_npy(path).data<float>()[0], 0.f);
}

TEST_F(NpyMmap, MappingOutlivesTheUnlinkedFile) {
  std::string path = file("keep.npy");
  save_npy(path, arange(3, 7, 1, TensorOptions(DType::I64)));
  Tensor y = map_npy(path);
  fs::remove(path);  // the mapping stays valid after the file is unlinked
  EXPECT_EQ(y.to_vector(), (std::vector<double>{3, 4, 5, 6}));
}

TEST_F(NpyMmap, MalformedFilesNameFileAndProblem) {
  std::string p = file("magic.npy");
  std::ofstream(p, std::ios::binary) << "NOTNUMPY....";
  expect_error([&] { map_npy(p); }, p + ": not a .npy file");
  p = file("empty.npy");
  std::ofstream(p, std::ios::binary).flush();
  expect_error([&] { map_npy(p); }, p + ": not a .npy file");
  p = raw_npy("fortran.npy", "{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }\n", 8);
  expect_error([&] { map_npy(p); }, p + ": Fortran-order arrays are not supported");
  p = raw_npy("descr.npy", "{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }\n", 8);
  expect_error([&] { map_npy(p); }, p + ": unsupported .npy dtype '>f4'");
  p = raw_npy("size.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }\n", 20);
  expect_error([&] { map_npy(p); }, p + ": header says [2, 3] f32 (24 bytes) but the file holds 20 bytes of data");
  p = raw_npy("dim.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (2, x), }\n", 8);
  expect_error([&] { map_npy(p); }, p + ": header shape has an invalid dimension ' x'");
  // Header of 56 bytes: data at offset 66, not a multiple of 8.
  p = raw_npy("align.npy", "{'descr': '<f8', 'fortran_order': False, 'shape': (1,)}\n", 8);
  expect_error([&] { map_npy(p); }, p + ": array data starts at byte 66, not aligned to its 8-byte elements");
  std::ofstream(file("trunc.npy"), std::ios::binary) << std::string("\x93NUMPY\x01\x00\xff\x00", 10) << "{'descr'";
  expect_error([&] { map_npy(file("trunc.npy")); }, file("trunc.npy") + ": header length 255 runs past the end");
  expect_error([&] { map_npy(file("missing.npy")); }, file("missing.npy") + ": cannot open file");
}

}  // namespace
