// llm.c token shards: round trip, every malformed-file error, dataset windows, zero-copy views.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "fasttrain/allocator.h"
#include "fasttrain/token_shards.h"
#include "support/expect_error.h"

using namespace ft;
using namespace ft::data;
using ft::test::expect_error;
namespace fs = std::filesystem;

namespace {

class TokenShards : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("ft_token_shards_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string file(const std::string& name) const { return (dir_ / name).string(); }
  // A shard with a hand-made header, for the malformed cases.
  std::string raw_shard(const std::string& name, int32_t magic, int32_t version, int32_t count, size_t ntokens) {
    std::vector<int32_t> header(256, 0);
    header[0] = magic, header[1] = version, header[2] = count;
    std::ofstream f(file(name), std::ios::binary);
    f.write(reinterpret_cast<const char*>(header.data()), 1024);
    std::vector<uint16_t> tokens(ntokens, 7);
    f.write(reinterpret_cast<const char*>(tokens.data()), ntokens * 2);
    return file(name);
  }
  fs::path dir_;
};

std::vector<uint16_t> iota_tokens(size_t n, uint16_t first) {
  std::vector<uint16_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = static_cast<uint16_t>(first + i * 257);  // exercises both bytes
  return t;
}

TEST_F(TokenShards, RoundTripAndLlmcLayout) {
  auto tokens = iota_tokens(1000, 3);
  write_token_shard(file("a.bin"), tokens);
  EXPECT_EQ(fs::file_size(file("a.bin")), 1024u + 2 * tokens.size());
  TokenShard shard(file("a.bin"));
  ASSERT_EQ(shard.size(), 1000);
  for (int64_t i = 0; i < shard.size(); ++i) ASSERT_EQ(shard.tokens()[i], tokens[i]) << i;
  Tensor w = shard.window(10, 5);
  ASSERT_EQ(w.dtype(), DType::I64);
  for (int64_t i = 0; i < 5; ++i) EXPECT_EQ(w.data<int64_t>()[i], tokens[10 + i]);
  expect_error([&] { shard.window(998, 5); }, "token window [998, 1003) is outside the shard's 1000 tokens");
}

TEST_F(TokenShards, EmptyShardRoundTrips) {
  write_token_shard(file("empty.bin"), {});
  EXPECT_EQ(TokenShard(file("empty.bin")).size(), 0);
}

TEST_F(TokenShards, MalformedFilesNameFileAndValue) {
  std::string p = raw_shard("magic.bin", 12345, 1, 4, 4);
  expect_error([&] { TokenShard s(p); }, p + ": not a token shard: magic 12345 (expected 20240520)");
  p = raw_shard("version.bin", kTokenShardMagic, 2, 4, 4);
  expect_error([&] { TokenShard s(p); }, p + ": unsupported token shard version 2 (expected 1)");
  p = raw_shard("count.bin", kTokenShardMagic, 1, 10, 4);
  expect_error([&] { TokenShard s(p); }, p + ": header says 10 tokens (20 bytes) but the file holds 8 bytes");
  p = raw_shard("negative.bin", kTokenShardMagic, 1, -1, 0);
  expect_error([&] { TokenShard s(p); }, p + ": header says -1 tokens");
  p = file("short.bin");
  std::ofstream(p, std::ios::binary).write("abc", 3);
  expect_error([&] { TokenShard s(p); }, p + ": truncated token shard: 3 bytes, shorter than the 1024-byte header");
  expect_error([&] { TokenShard s(file("missing.bin")); }, file("missing.bin") + ": cannot open file");
  expect_error([&] { open_token_shards(file("none_*.bin")); }, "no file matches '" + file("none_*.bin") + "'");
}

TEST_F(TokenShards, GlobOpensShardsInSortedOrder) {
  write_token_shard(file("train_002.bin"), iota_tokens(5, 200));
  write_token_shard(file("train_000.bin"), iota_tokens(5, 0));
  write_token_shard(file("train_001.bin"), iota_tokens(5, 100));
  write_token_shard(file("val_000.bin"), iota_tokens(5, 999));
  auto shards = open_token_shards(file("train_*.bin"));
  ASSERT_EQ(shards.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(shards[i].path(), file("train_00" + std::to_string(i) + ".bin"));
    EXPECT_EQ(shards[i].tokens()[0], 100 * i);
  }
}

TEST_F(TokenShards, DatasetWindowsStayWithinEachShard) {
  const int64_t T = 4;
  auto a = iota_tokens(13, 0);   // (13 - 1) / 4 = 3 windows, exactly fills with its last target
  auto b = iota_tokens(3, 50);   // too short for one window
  auto c = iota_tokens(10, 90);  // (10 - 1) / 4 = 2 windows, one token left over
  write_token_shard(file("s0.bin"), a);
  write_token_shard(file("s1.bin"), b);
  write_token_shard(file("s2.bin"), c);
  TokenWindowDataset ds(file("s*.bin"), T);
  ASSERT_EQ(ds.size(), 5);
  SampleSpec spec = ds.spec();
  ASSERT_EQ(spec.size(), 2u);
  EXPECT_EQ(spec[0].name, "tokens");
  EXPECT_EQ(spec[1].name, "targets");
  std::vector<Tensor> fields{empty(Shape{T}, DType::I64), empty(Shape{T}, DType::I64)};
  struct Where { const std::vector<uint16_t>* src; int64_t start; };
  const Where expected[] = {{&a, 0}, {&a, 4}, {&a, 8}, {&c, 0}, {&c, 4}};
  for (int64_t i = 0; i < ds.size(); ++i) {
    ds.read(i, 0, fields);
    for (int64_t k = 0; k < T; ++k) {
      EXPECT_EQ(fields[0].data<int64_t>()[k], (*expected[i].src)[expected[i].start + k]) << i;
      EXPECT_EQ(fields[1].data<int64_t>()[k], (*expected[i].src)[expected[i].start + k + 1]) << i;
    }
  }
  expect_error([&] { ds.read(5, 0, fields); }, "sample 5 out of range [0, 5)");
  std::vector<Tensor> wrong{empty(Shape{T}, DType::I32), empty(Shape{T}, DType::I64)};
  expect_error([&] { ds.read(0, 0, wrong); }, "field 'tokens' expected [4] i64, found [4] i32");
  expect_error([&] { TokenWindowDataset bad(file("s*.bin"), 0); }, "context must be positive, found 0");
}

TEST_F(TokenShards, ViewsAndReadsAllocateNothing) {
  write_token_shard(file("z.bin"), iota_tokens(4096, 1));
  TokenWindowDataset ds(file("z.bin"), 64);
  std::vector<Tensor> fields{empty(Shape{64}, DType::I64), empty(Shape{64}, DType::I64)};
  const TokenShard& shard = ds.shards()[0];
  Allocator& a = allocator_for(Device::cpu());
  AllocatorStats before = a.stats();
  Tensor bytes = shard.token_bytes();
  for (int64_t i = 0; i < ds.size(); ++i) ds.read(i, 0, fields);
  AllocatorStats after = a.stats();
  EXPECT_EQ(after.num_allocs, before.num_allocs);
  // The view is the mapping itself: its data pointer is the first token.
  EXPECT_EQ(bytes.raw_data(), static_cast<const void*>(shard.tokens()));
  EXPECT_EQ(bytes.numel(), 2 * shard.size());
  uint16_t first;
  std::memcpy(&first, bytes.data<uint8_t>(), 2);
  EXPECT_EQ(first, shard.tokens()[0]);
}

TEST_F(TokenShards, ViewOutlivesTheShard) {
  write_token_shard(file("keep.bin"), iota_tokens(8, 11));
  Tensor bytes;
  {
    TokenShard shard(file("keep.bin"));
    bytes = shard.token_bytes();
  }
  uint16_t first;
  std::memcpy(&first, bytes.data<uint8_t>(), 2);
  EXPECT_EQ(first, 11);
}

}  // namespace

namespace {

TEST_F(TokenShards, TextFolderToByteShards) {
  fs::create_directories(dir_ / "text");
  std::ofstream(dir_ / "text" / "b.txt", std::ios::binary) << "world\xff";
  std::ofstream(dir_ / "text" / "a.txt", std::ios::binary) << "hello ";
  fs::create_directories(dir_ / "text" / "sub");  // folders inside are skipped
  auto written = write_byte_token_shards((dir_ / "text").string(), file("out"), "t", 5);
  const std::string text = "hello world\xff";  // a.txt then b.txt
  ASSERT_EQ(written.size(), 3u);
  std::string back;
  for (size_t i = 0; i < written.size(); ++i) {
    EXPECT_EQ(written[i].path, file("out/t_00000" + std::to_string(i) + ".bin"));
    TokenShard s(written[i].path);
    EXPECT_EQ(s.size(), written[i].tokens);
    for (int64_t k = 0; k < s.size(); ++k) back.push_back(static_cast<char>(s.tokens()[k]));
  }
  EXPECT_EQ(back, text);
  EXPECT_EQ(written[2].tokens, 2);
  expect_error([&] { write_byte_token_shards(file("nope"), file("out"), "t", 5); }, "input '" + file("nope") + "' does not exist");
  std::ofstream(file("empty.txt")).flush();
  expect_error([&] { write_byte_token_shards(file("empty.txt"), file("out"), "t", 5); }, "holds no text (0 bytes)");
  expect_error([&] { write_byte_token_shards(file("empty.txt"), file("out"), "t", 0); }, "tokens per shard must be in 1-2147483647, found 0");
}

}  // namespace
