// `fasttrain data`: converts text into llm.c token shards (byte- or char-level vocabulary) and lists
// what it wrote.
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli_parse.h"
#include "commands.h"
#include "fasttrain/token_shards.h"

using namespace ft;

namespace {

int run_data(const std::vector<std::string>& args) {
  CLI::App app(
      "Converts a text file, or every file in a folder (sorted, concatenated), into llm.c token shards\n"
      "(.bin: 1024-byte header, then uint16 tokens). --vocab byte (default): token = byte value, 256 tokens.\n"
      "--vocab char: the distinct UTF-8 characters of the input, sorted by code point, ids 0..V-1 (V <= 65536),\n"
      "written to <output>/vocab.json so the tokens can be decoded.",
      "fasttrain data");
  app.set_help_flag("-h,--help", "show this help");
  std::string input, out_dir, prefix = "tokens";
  std::string vocab = "byte";
  int64_t shard_tokens = 100'000'000;
  app.add_option("--input", input, "text file or folder of text files")->required();
  app.add_option("--output", out_dir, "folder for the shards (created if missing)")->required();
  app.add_option("--prefix", prefix, "shard file name prefix (default tokens: tokens_000000.bin, ...)");
  app.add_option("--shard-tokens", shard_tokens, "tokens per shard (default 100000000, as llm.c)");
  app.add_option("--vocab", vocab, "vocabulary: byte (default, 256 tokens) or char (the input's characters)")
      ->check(CLI::IsMember({"byte", "char"}));
  if (!cli::parse_command_line(app, args, "data")) return 0;
  std::vector<data::WrittenShard> shards;
  data::CharTokenShards chars;
  if (vocab == "char") {
    chars = data::write_char_token_shards(input, out_dir, prefix, shard_tokens);
    shards = chars.shards;
  } else {
    shards = data::write_byte_token_shards(input, out_dir, prefix, shard_tokens);
  }
  int64_t total = 0;
  for (const auto& s : shards) {
    std::printf("wrote %s: %lld tokens\n", s.path.c_str(), static_cast<long long>(s.tokens));
    total += s.tokens;
  }
  const char* plural = shards.size() == 1 ? "" : "s";
  if (vocab == "char") {
    std::printf("wrote %s: %zu characters\n", chars.vocab_path.c_str(), chars.vocab.size());
    std::printf("%zu shard%s, %lld tokens, char-level vocabulary of %zu\n", shards.size(), plural,
                static_cast<long long>(total), chars.vocab.size());
  } else {
    std::printf("%zu shard%s, %lld tokens, byte-level vocabulary of 256\n", shards.size(), plural,
                static_cast<long long>(total));
  }
  return 0;
}

}  // namespace

FT_REGISTER_COMMAND(data, "convert text files into llm.c token shards (byte- or char-level vocabulary)", run_data);
