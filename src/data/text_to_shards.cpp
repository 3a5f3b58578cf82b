// Text files to llm.c token shards with a byte-level vocabulary (`fasttrain data`).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "fasttrain/token_shards.h"

namespace ft::data {

namespace fs = std::filesystem;

namespace {

std::vector<std::string> text_files(const std::string& input) {
  std::error_code ec;
  FT_CHECK(fs::exists(input, ec), "fasttrain data: input '", input, "' does not exist");
  if (!fs::is_directory(input, ec)) return {input};
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(input, ec))
    if (e.is_regular_file()) files.push_back(e.path().string());
  FT_CHECK(!ec, "fasttrain data: cannot list folder '", input, "' (", ec.message(), ")");
  FT_CHECK(!files.empty(), "fasttrain data: folder '", input, "' holds no regular files");
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

std::vector<WrittenShard> write_byte_token_shards(const std::string& input, const std::string& out_dir,
                                                  const std::string& prefix, int64_t shard_tokens) {
  FT_CHECK(shard_tokens > 0 && shard_tokens <= 0x7fffffff, "fasttrain data: tokens per shard must be in 1-2147483647, found ",
           shard_tokens);
  std::vector<std::string> files = text_files(input);
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  FT_CHECK(!ec, "fasttrain data: cannot create folder '", out_dir, "' (", ec.message(), ")");

  std::vector<WrittenShard> written;
  std::vector<uint16_t> tokens;
  tokens.reserve(static_cast<size_t>(std::min<int64_t>(shard_tokens, int64_t{1} << 24)));
  auto flush = [&] {
    char name[32];
    std::snprintf(name, sizeof name, "_%06zu.bin", written.size());
    std::string path = (fs::path(out_dir) / (prefix + name)).string();
    write_token_shard(path, tokens);
    written.push_back({path, static_cast<int64_t>(tokens.size())});
    tokens.clear();
  };
  std::vector<char> chunk(1 << 16);
  for (const auto& file : files) {
    std::ifstream in(file, std::ios::binary);
    FT_CHECK(in.good(), "fasttrain data: cannot open '", file, "'");
    while (in.read(chunk.data(), chunk.size()) || in.gcount() > 0) {
      for (std::streamsize i = 0; i < in.gcount(); ++i) {
        tokens.push_back(static_cast<unsigned char>(chunk[i]));
        if (static_cast<int64_t>(tokens.size()) == shard_tokens) flush();
      }
    }
    FT_CHECK(in.eof(), "fasttrain data: error reading '", file, "'");
  }
  if (!tokens.empty()) flush();
  FT_CHECK(!written.empty(), "fasttrain data: input '", input, "' holds no text (0 bytes)");
  return written;
}

}  // namespace ft::data
