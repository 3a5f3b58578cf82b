// `fasttrain data`: converts text into llm.c token shards (byte-level vocabulary) and lists them.
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
      "(.bin: 1024-byte header, then uint16 tokens) with a byte-level vocabulary: token = byte value, 256 tokens.",
      "fasttrain data");
  app.set_help_flag("-h,--help", "show this help");
  std::string input, out_dir, prefix = "tokens";
  int64_t shard_tokens = 100'000'000;
  app.add_option("--input", input, "text file or folder of text files")->required();
  app.add_option("--output", out_dir, "folder for the shards (created if missing)")->required();
  app.add_option("--prefix", prefix, "shard file name prefix (default tokens: tokens_000000.bin, ...)");
  app.add_option("--shard-tokens", shard_tokens, "tokens per shard (default 100000000, as llm.c)");
  if (!cli::parse_command_line(app, args, "data")) return 0;
  auto shards = data::write_byte_token_shards(input, out_dir, prefix, shard_tokens);
  int64_t total = 0;
  for (const auto& s : shards) {
    std::printf("wrote %s: %lld tokens\n", s.path.c_str(), static_cast<long long>(s.tokens));
    total += s.tokens;
  }
  std::printf("%zu shard%s, %lld tokens, byte-level vocabulary of 256\n", shards.size(), shards.size() == 1 ? "" : "s",
              static_cast<long long>(total));
  return 0;
}

}  // namespace

FT_REGISTER_COMMAND(data, "convert text files into llm.c token shards (byte-level vocabulary)", run_data);
