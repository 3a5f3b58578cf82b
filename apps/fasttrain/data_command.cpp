// `fasttrain data`: converts text into llm.c token shards (byte-level, char-level, GPT-2 BPE or a
// Hugging Face tokenizer.json) and lists what it wrote.
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
      "Converts a text file, every file in a folder, or every file a quoted glob pattern matches (sorted,\n"
      "concatenated) into llm.c token shards (.bin: 1024-byte header, then uint16 tokens, or uint32\n"
      "tokens for vocabularies past 65536 ids as llm.c's Llama 3 shards).\n"
      "--tokenizer byte (default): token = byte value, 256 tokens.\n"
      "--tokenizer char: the distinct UTF-8 characters of the input, sorted by code point, ids 0..V-1\n"
      "  (V <= 65536), written to <output>/vocab.json so the tokens can be decoded.\n"
      "--tokenizer gpt2: GPT-2's byte-level BPE from --encoder (encoder.json or Hugging Face's vocab.json)\n"
      "  and --merges (vocab.bpe or merges.txt), 50257 tokens. A document is one input file, and within a\n"
      "  file the text between two occurrences of the literal <|endoftext|> (the separator is dropped);\n"
      "  each non-empty document is written as the end-of-text token 50256 followed by its tokens, as\n"
      "  llm.c does. The tokenizer is copied beside the shards (encoder.json, vocab.bpe, and vocab.json\n"
      "  naming them) so the shards can be decoded.\n"
      "--tokenizer FILE.json: a Hugging Face tokenizer.json (byte-level BPE: GPT-2, Llama 3, SmolLM, ...).\n"
      "  Documents as for gpt2; each is written as begin-of-text, its tokens, end-of-text (Llama 3:\n"
      "  128000 ... 128001; a tokenizer with one of them writes it before each document). Special tokens\n"
      "  in the text are matched as Hugging Face's tokenizers match them. tokenizer.json is copied beside\n"
      "  the shards with vocab.json naming it.\n"
      "--val-tokens N: the first N tokens (cut where the count is reached) go to <prefix>_val_*.bin, the\n"
      "  rest to <prefix>_train_*.bin; without it every shard is <prefix>_*.bin.",
      "fasttrain data");
  app.set_help_flag("-h,--help", "show this help");
  std::string input, out_dir, prefix = "tokens";
  std::string tokenizer = "byte", encoder, merges;
  int64_t shard_tokens = 100'000'000, val_tokens = 0;
  app.add_option("--input", input, "text file, folder of text files, or glob pattern")->required();
  app.add_option("--output", out_dir, "folder for the shards (created if missing)")->required();
  app.add_option("--prefix", prefix, "shard file name prefix (default tokens: tokens_000000.bin, ...)");
  app.add_option("--shard-tokens", shard_tokens, "tokens per shard (default 100000000, as llm.c)");
  app.add_option("--val-tokens", val_tokens, "tokens for the validation split (default 0: no split)");
  // --vocab is the option's original name, kept so existing command lines (and their error messages,
  // which name the option given) stay as they were.
  std::string vocab;
  // byte, char, gpt2, or the path of a tokenizer.json.
  const CLI::Validator kind(
      [](std::string& v) -> std::string {
        if (v == "byte" || v == "char" || v == "gpt2" || v.ends_with(".json")) return {};
        return "expected byte, char, gpt2 or a tokenizer.json file, found '" + v + "'";
      },
      "byte|char|gpt2|FILE.json");
  CLI::Option* tokenizer_opt =
      app.add_option("--tokenizer", tokenizer,
                     "byte (default, 256 tokens), char (the input's characters), gpt2 (GPT-2 BPE) or a Hugging "
                     "Face tokenizer.json")
          ->check(kind);
  app.add_option("--vocab", vocab, "the same as --tokenizer")->check(kind)->excludes(tokenizer_opt);
  app.add_option("--encoder", encoder, "--tokenizer gpt2: encoder.json (or vocab.json)");
  app.add_option("--merges", merges, "--tokenizer gpt2: vocab.bpe (or merges.txt)");
  if (!cli::parse_command_line(app, args, "data")) return 0;
  if (!vocab.empty()) tokenizer = vocab;
  if (tokenizer == "gpt2") {
    FT_CHECK(!encoder.empty() && !merges.empty(),
             "data: --tokenizer gpt2 needs --encoder (encoder.json) and --merges "
             "(vocab.bpe), found ",
             encoder.empty() ? "no --encoder" : "no --merges", " (see fasttrain data --help)");
  } else {
    FT_CHECK(encoder.empty() && merges.empty(),
             "data: --encoder and --merges are for --tokenizer gpt2, found --tokenizer ", tokenizer);
  }
  FT_CHECK(val_tokens >= 0, "data: --val-tokens expects 0 or more, found ", val_tokens);
  std::vector<data::WrittenShard> shards;
  data::CharTokenShards chars;
  data::Gpt2TokenShards gpt2;
  data::JsonTokenShards hf;
  const bool json = tokenizer.ends_with(".json");
  if (json) {
    hf = data::write_json_token_shards(input, tokenizer, out_dir, prefix, shard_tokens, val_tokens);
    shards = hf.shards;
  } else if (tokenizer == "char") {
    chars = data::write_char_token_shards(input, out_dir, prefix, shard_tokens, val_tokens);
    shards = chars.shards;
  } else if (tokenizer == "gpt2") {
    gpt2 = data::write_gpt2_token_shards(input, encoder, merges, out_dir, prefix, shard_tokens, val_tokens);
    shards = gpt2.shards;
  } else {
    shards = data::write_byte_token_shards(input, out_dir, prefix, shard_tokens, val_tokens);
  }
  int64_t total = 0, val = 0;
  for (const auto& s : shards) {
    std::printf("wrote %s: %lld tokens%s\n", s.path.c_str(), static_cast<long long>(s.tokens),
                s.val ? " (validation)" : "");
    total += s.tokens;
    if (s.val) val += s.tokens;
  }
  const char* plural = shards.size() == 1 ? "" : "s";
  std::string split;
  if (val_tokens > 0) split = " (" + std::to_string(val) + " validation, " + std::to_string(total - val) + " training)";
  if (tokenizer == "char") {
    std::printf("wrote %s: %zu characters\n", chars.vocab_path.c_str(), chars.vocab.size());
    std::printf("%zu shard%s, %lld tokens%s, char-level vocabulary of %zu\n", shards.size(), plural,
                static_cast<long long>(total), split.c_str(), chars.vocab.size());
  } else if (json) {
    std::printf("wrote %s with tokenizer.json: begin-of-text token %d, end-of-text token %d\n", hf.vocab_path.c_str(),
                hf.bos_token, hf.eos_token);
    std::printf("%zu shard%s (uint%d tokens), %lld tokens%s, %lld document%s, vocabulary of %lld\n", shards.size(),
                plural, 8 * hf.token_bytes, static_cast<long long>(total), split.c_str(),
                static_cast<long long>(hf.documents), hf.documents == 1 ? "" : "s",
                static_cast<long long>(hf.vocab_size));
  } else if (tokenizer == "gpt2") {
    std::printf("wrote %s with encoder.json and vocab.bpe: GPT-2 BPE, end-of-text token %d\n", gpt2.vocab_path.c_str(),
                gpt2.eot_token);
    std::printf("%zu shard%s, %lld tokens%s, %lld document%s, GPT-2 BPE vocabulary of %lld\n", shards.size(), plural,
                static_cast<long long>(total), split.c_str(), static_cast<long long>(gpt2.documents),
                gpt2.documents == 1 ? "" : "s", static_cast<long long>(gpt2.vocab_size));
  } else {
    std::printf("%zu shard%s, %lld tokens%s, byte-level vocabulary of 256\n", shards.size(), plural,
                static_cast<long long>(total), split.c_str());
  }
  return 0;
}

}  // namespace

FT_REGISTER_COMMAND(data, "convert text files into llm.c token shards (byte, char, GPT-2 BPE or tokenizer.json)",
                    run_data);
