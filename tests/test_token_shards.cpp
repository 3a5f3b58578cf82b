// llm.c token shards: round trip, every malformed-file error, dataset windows, zero-copy views,
// the streaming reader split between ranks, and byte- and char-level text tokenisation.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "fasttrain/allocator.h"
#include "fasttrain/loader.h"
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

// Vocabularies past 65536 ids (Llama 3: 128256) take llm.c's uint32 shards; readers take both.
TEST_F(TokenShards, Uint32ShardsRoundTripInLlmcsLlama3Layout) {
  std::vector<uint32_t> tokens;
  for (uint32_t i = 0; i < 1000; ++i) tokens.push_back(i * 131 + 65530);  // most past uint16
  write_token_shard_u32(file("w.bin"), tokens);
  EXPECT_EQ(fs::file_size(file("w.bin")), 1024u + 4 * tokens.size());
  int32_t header[3];
  std::ifstream(file("w.bin"), std::ios::binary).read(reinterpret_cast<char*>(header), sizeof header);
  EXPECT_EQ(header[0], 20240801);
  EXPECT_EQ(header[1], 7);
  EXPECT_EQ(header[2], 1000);
  TokenShard shard(file("w.bin"));
  ASSERT_EQ(shard.token_width(), 4);
  ASSERT_EQ(shard.size(), 1000);
  for (int64_t i = 0; i < shard.size(); ++i) ASSERT_EQ(shard.tokens32()[i], tokens[i]) << i;
  EXPECT_EQ(shard.token(999), tokens[999]);
  EXPECT_EQ(shard.max_token(), (std::pair<uint32_t, int64_t>{tokens[999], 999}));
  Tensor w = shard.window(10, 5);
  for (int64_t i = 0; i < 5; ++i) EXPECT_EQ(w.data<int64_t>()[i], tokens[10 + i]);
  EXPECT_EQ(shard.token_bytes().numel(), 4000);
  expect_error([&] { shard.tokens(); }, file("w.bin") + ": holds uint32 tokens (version 7); read it with tokens32()");
  // Windows and streams read either width, and a folder may mix them.
  write_token_shard(file("n.bin"), iota_tokens(10, 1));
  TokenStreamDataset stream(file("*.bin"), 4);
  std::vector<int64_t> all(stream.windows() * 4);
  stream.copy_tokens(0, static_cast<int64_t>(all.size()), all.data());
  EXPECT_EQ(all[0], 1);  // n.bin first (sorted names)
  EXPECT_EQ(all[10], static_cast<int64_t>(tokens[0]));
}

TEST_F(TokenShards, EmptyShardRoundTrips) {
  write_token_shard(file("empty.bin"), {});
  EXPECT_EQ(TokenShard(file("empty.bin")).size(), 0);
}

TEST_F(TokenShards, MalformedFilesNameFileAndValue) {
  std::string p = raw_shard("magic.bin", 12345, 1, 4, 4);
  expect_error(
      [&] { TokenShard s(p); },
      p + ": not a token shard: magic 12345 (expected 20240520 for uint16 tokens or 20240801 for uint32 tokens)");
  p = raw_shard("version.bin", kTokenShardMagic, 2, 4, 4);
  expect_error([&] { TokenShard s(p); }, p + ": unsupported token shard version 2 (magic 20240520 expects version 1)");
  // The header decides the width: llm.c's uint32 magic with the uint16 version is a mismatch.
  p = raw_shard("mixed.bin", kTokenShardMagic32, 1, 4, 8);
  expect_error([&] { TokenShard s(p); }, p + ": unsupported token shard version 1 (magic 20240801 expects version 7)");
  p = raw_shard("count32.bin", kTokenShardMagic32, 7, 4, 4);
  expect_error([&] { TokenShard s(p); }, p + ": header says 4 tokens (16 bytes) but the file holds 8 bytes");
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
  struct Where {
    const std::vector<uint16_t>* src;
    int64_t start;
  };
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
  expect_error([&] { write_byte_token_shards(file("nope"), file("out"), "t", 5); },
               "input '" + file("nope") + "' does not exist");
  std::ofstream(file("empty.txt")).flush();
  expect_error([&] { write_byte_token_shards(file("empty.txt"), file("out"), "t", 5); }, "holds no text (0 bytes)");
  expect_error([&] { write_byte_token_shards(file("empty.txt"), file("out"), "t", 0); },
               "tokens per shard must be in 1-2147483647, found 0");
}

// The stream's windows run on across shard boundaries (an empty shard included): sample i is
// stream tokens [4i, 4i + 4) and the targets one further on.
TEST_F(TokenShards, StreamWindowsRunAcrossShards) {
  const int64_t T = 4;
  std::vector<uint16_t> all;
  const size_t sizes[] = {6, 0, 7, 5};
  for (size_t s = 0; s < 4; ++s) {
    auto t = iota_tokens(sizes[s], static_cast<uint16_t>(all.size()));
    write_token_shard(file("s" + std::to_string(s) + ".bin"), t);
    all.insert(all.end(), t.begin(), t.end());
  }
  auto ds = std::make_shared<TokenStreamDataset>(file("s*.bin"), T);
  ASSERT_EQ(ds->windows(), (18 - 1) / T);
  LoaderOptions o;
  o.batch_size = 3;
  for (int workers : {0, 2}) {
    o.num_workers = workers;
    DataLoader loader(ds, o);
    int64_t window = 0;
    while (const Batch* b = loader.next()) {
      for (int64_t r = 0; r < b->rows; ++r, ++window)
        for (int64_t k = 0; k < T; ++k) {
          ASSERT_EQ(b->field("tokens").data<int64_t>()[r * T + k], all[window * T + k]) << window;
          ASSERT_EQ(b->field("targets").data<int64_t>()[r * T + k], all[window * T + k + 1]) << window;
        }
    }
    EXPECT_EQ(window, ds->windows());
  }
  // open() positions the stream; skip() stops at the end.
  std::vector<Tensor> fields{empty(Shape{T}, DType::I64), empty(Shape{T}, DType::I64)};
  auto stream = ds->open(0, 2);
  ASSERT_TRUE(stream->next(fields));
  EXPECT_EQ(fields[0].data<int64_t>()[0], all[8]);
  EXPECT_EQ(stream->skip(10), 1);
  EXPECT_FALSE(stream->next(fields));
  std::vector<Tensor> wrong{empty(Shape{T}, DType::I32), empty(Shape{T}, DType::I64)};
  expect_error([&] { ds->open(0, 0)->next(wrong); }, "field 'tokens' expected [4] i64, found [4] i32");
  expect_error([&] { TokenStreamDataset bad(file("s*.bin"), 0); }, "context must be positive, found 0");
}

// Rank r of W streams shards r, r + W, ...: the ranks' windows together cover each shard once.
TEST_F(TokenShards, StreamShardsAreSplitBetweenRanks) {
  for (int s = 0; s < 5; ++s)
    write_token_shard(file("r" + std::to_string(s) + ".bin"), iota_tokens(9, static_cast<uint16_t>(100 * s)));
  for (int64_t rank = 0; rank < 2; ++rank) {
    TokenStreamDataset ds(file("r*.bin"), 4, rank, 2);
    ASSERT_EQ(ds.shards().size(), rank == 0 ? 3u : 2u);
    for (size_t i = 0; i < ds.shards().size(); ++i)
      EXPECT_EQ(ds.shards()[i].path(), file("r" + std::to_string(rank + 2 * static_cast<int64_t>(i)) + ".bin"));
    EXPECT_EQ(ds.windows(), (9 * static_cast<int64_t>(ds.shards().size()) - 1) / 4);
  }
  expect_error([&] { TokenStreamDataset bad(file("r*.bin"), 4, 2, 2); },
               "expected 0 <= rank < world_size, found rank 2 of world_size 2");
  expect_error([&] { TokenStreamDataset bad(file("r*.bin"), 4, 0, 6); }, "5 shard(s) cannot be split between 6 ranks");
}

// Char-level: ids are the sorted distinct code points of every file; vocab.json decodes the shards.
TEST_F(TokenShards, TextFolderToCharShards) {
  fs::create_directories(dir_ / "text");
  const std::string a = "h\xC3\xA9llo \xE2\x82\xAC", b = "\xF0\x9F\x98\x80h\n";  // é, €, 😀
  std::ofstream(dir_ / "text" / "a.txt", std::ios::binary) << a;
  std::ofstream(dir_ / "text" / "b.txt", std::ios::binary) << b;
  CharTokenShards out = write_char_token_shards((dir_ / "text").string(), file("out"), "c", 4);
  const std::vector<std::string> vocab = {"\n", " ", "h", "l", "o", "\xC3\xA9", "\xE2\x82\xAC", "\xF0\x9F\x98\x80"};
  EXPECT_EQ(out.vocab, vocab);
  EXPECT_EQ(out.vocab_path, file("out/vocab.json"));
  EXPECT_EQ(read_char_vocabulary(out.vocab_path), vocab);
  ASSERT_EQ(out.shards.size(), 3u);  // 10 characters, 4 per shard
  std::string back;
  for (const auto& w : out.shards) {
    TokenShard s(w.path);
    for (int64_t k = 0; k < s.size(); ++k) back += vocab.at(s.tokens()[k]);
  }
  EXPECT_EQ(back, a + b);
  // The byte-level path writes no vocabulary file.
  write_byte_token_shards((dir_ / "text").string(), file("bytes"), "b", 100);
  EXPECT_FALSE(fs::exists(file("bytes/vocab.json")));
}

TEST_F(TokenShards, CharShardsRejectInvalidUtf8) {
  struct Case {
    std::string text;
    int64_t offset;
    const char* why;
  };
  const Case cases[] = {
      {"ab\x80", 2, "a continuation byte without a lead byte"},
      {"a\xC0\xAF", 1, "a byte that never occurs in UTF-8"},           // overlong '/'
      {"\xE0\x80\xAF", 0, "a multi-byte sequence is broken off"},      // overlong, 3 bytes
      {"xy\xED\xA0\x80", 2, "a multi-byte sequence is broken off"},    // a surrogate
      {"\xF4\x90\x80\x80", 0, "a multi-byte sequence is broken off"},  // past U+10FFFF
      {"ok\xE2\x82", 2, "the file ends inside a multi-byte sequence"},
  };
  for (const Case& c : cases) {
    std::ofstream(file("bad.txt"), std::ios::binary | std::ios::trunc) << c.text;
    expect_error(
        [&] { write_char_token_shards(file("bad.txt"), file("out"), "c", 10); },
        "'" + file("bad.txt") + "' is not valid UTF-8 at byte offset " + std::to_string(c.offset) + " (" + c.why);
  }
  EXPECT_FALSE(fs::exists(file("out")));  // checked before anything is written
  std::ofstream(file("vocab.json")) << R"({"mode": "byte"})";
  expect_error([&] { read_char_vocabulary(file("vocab.json")); }, "expected \"mode\": \"char\", found \"byte\"");
  std::ofstream(file("vocab.json"), std::ios::trunc) << R"({"mode": "char", "vocab_size": 3, "tokens": ["a"]})";
  expect_error([&] { read_char_vocabulary(file("vocab.json")); }, "says vocab_size 3 but lists 1 tokens");
  std::ofstream(file("vocab.json"), std::ios::trunc) << "{";
  expect_error([&] { read_char_vocabulary(file("vocab.json")); }, "is not JSON");
}

// More than 65536 distinct characters cannot be uint16 ids.
TEST_F(TokenShards, CharVocabularyMustFitUint16) {
  std::string text;
  for (uint32_t cp = 0x1000; cp < 0x1000 + 65537 + 2048; ++cp) {
    if (cp >= 0xD800 && cp < 0xE000) continue;  // surrogates are not characters
    if (cp < 0x10000) {
      text += static_cast<char>(0xE0 | (cp >> 12));
      text += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    } else {
      text += static_cast<char>(0xF0 | (cp >> 18));
      text += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      text += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    }
    text += static_cast<char>(0x80 | (cp & 0x3F));
  }
  std::ofstream(file("wide.txt"), std::ios::binary) << text;
  expect_error([&] { write_char_token_shards(file("wide.txt"), file("out"), "c", 1000); },
               "has 65537 distinct characters; a char-level vocabulary holds at most 65536");
}

}  // namespace

namespace {

// A tokenizer with only the begin/end ids decided, for document_start_token.
class FramedTokenizer : public Tokenizer {
 public:
  FramedTokenizer(int32_t bos, int32_t eos) : bos_(bos), eos_(eos) {}
  void encode(std::string_view, std::vector<int32_t>&) const override {}
  std::string decode(std::span<const int32_t>) const override { return {}; }
  std::string_view token_bytes(int32_t) const override { return {}; }
  int64_t vocab_size() const override { return 10; }
  int32_t bos_token() const override { return bos_; }
  int32_t eos_token() const override { return eos_; }

 private:
  int32_t bos_, eos_;
};

std::vector<int32_t> ids_of(const Tensor& t) {
  std::vector<int32_t> v;
  for (double x : t.to_vector()) v.push_back(static_cast<int32_t>(x));
  return v;
}

}  // namespace

// The boundary rule of document_ids (token_shards.h): a document begins at each start token, in
// both layouts `fasttrain data` writes, and the tokens before a window's first start token
// continue an earlier window's document (id 0).
TEST_F(TokenShards, DocumentIdsOfPackedWindows) {
  // GPT-2 (llm.c): <|endoftext|> (9 here) before each document; the start token opens its document.
  const Tensor gpt2 = from_vector({9, 1, 2, 9, 3, 9, 4, 5}, {1, 8}, DType::I64);
  EXPECT_EQ(ids_of(document_ids(gpt2, 9)), (std::vector<int32_t>{1, 1, 1, 2, 2, 3, 3, 3}));
  // Llama 3: BOS (8) document EOS (9): cutting before each BOS is cutting after each EOS; a
  // window starting inside a document (id 0) and a batch of two windows (rows are independent).
  const Tensor llama = from_vector({4, 5, 9, 8, 1, 9, 8, 2, 8, 3, 3, 9, 9, 8, 7, 7}, {2, 8}, DType::I32);
  EXPECT_EQ(ids_of(document_ids(llama, 8)), (std::vector<int32_t>{0, 0, 0, 1, 1, 1, 2, 2, 1, 1, 1, 1, 1, 2, 2, 2}));
  const Tensor one_window = document_ids(llama.select(0, 0), 8);  // [T] alone
  EXPECT_EQ(one_window.shape(), Shape({8}));
  EXPECT_EQ(one_window.dtype(), DType::I32);
  // No start token in the window: one document.
  EXPECT_EQ(ids_of(document_ids(from_vector({1, 2, 3}, {3}, DType::I64), 8)), (std::vector<int32_t>{0, 0, 0}));
  // Which token starts documents: BOS where there is one, else the end-of-text token.
  EXPECT_EQ(document_start_token(FramedTokenizer(8, 9)), 8);
  EXPECT_EQ(document_start_token(FramedTokenizer(-1, 9)), 9);
  EXPECT_EQ(document_start_token(FramedTokenizer(5, 5)), 5);
  EXPECT_EQ(document_start_token(FramedTokenizer(-1, -1)), -1);
  expect_error([&] { document_ids(from_vector({1.5}, {1}, DType::F32), 8); },
               "tokens must be an integer tensor, found f32");

  // TokenWindowDataset with a start token: a third field, the window's ids.
  write_token_shard(file("d.bin"), {9, 1, 2, 9, 3, 9, 4, 5, 9});
  TokenWindowDataset ds(file("d.bin"), 4, 9);
  const SampleSpec spec = ds.spec();
  ASSERT_EQ(spec.size(), 3u);
  EXPECT_EQ(spec[2].name, "doc_ids");
  EXPECT_EQ(spec[2].dtype, DType::I32);
  std::vector<Tensor> fields{empty(Shape{4}, DType::I64), empty(Shape{4}, DType::I64), empty(Shape{4}, DType::I32)};
  ds.read(1, 0, fields);  // tokens 3 9 4 5
  EXPECT_EQ(ids_of(fields[2]), (std::vector<int32_t>{0, 1, 1, 1}));
  EXPECT_EQ(TokenWindowDataset(file("d.bin"), 4).spec().size(), 2u);
}
