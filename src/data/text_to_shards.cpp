// Text files to llm.c token shards with a byte-level, char-level, GPT-2 BPE or Hugging Face
// tokenizer.json vocabulary (`fasttrain data`). Tokens stream into shards as they are made, so no corpus is held whole
// in memory; the first --val-tokens of the stream go to validation shards.
#include <glob.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "data/utf8.h"
#include "fasttrain/atomic_file.h"
#include "fasttrain/parallel.h"
#include "fasttrain/token_shards.h"
#include "fasttrain/tokenizer.h"

namespace ft::data {

namespace fs = std::filesystem;

namespace {

// Every file matching a glob(3) pattern, sorted; empty when nothing matches.
std::vector<std::string> glob_files(const std::string& pattern) {
  glob_t g{};
  std::vector<std::string> files;
  if (::glob(pattern.c_str(), 0, nullptr, &g) == 0)
    for (size_t i = 0; i < g.gl_pathc; ++i)
      if (fs::is_regular_file(g.gl_pathv[i])) files.emplace_back(g.gl_pathv[i]);
  globfree(&g);
  std::sort(files.begin(), files.end());
  return files;
}

std::vector<std::string> text_files(const std::string& input) {
  std::error_code ec;
  if (!fs::exists(input, ec) && input.find_first_of("*?[") != std::string::npos) {
    std::vector<std::string> files = glob_files(input);
    FT_CHECK(!files.empty(), "fasttrain data: input pattern '", input, "' matches no regular file");
    return files;
  }
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

void check_shard_tokens(int64_t shard_tokens) {
  FT_CHECK(shard_tokens > 0 && shard_tokens <= 0x7fffffff,
           "fasttrain data: tokens per shard must be in 1-2147483647, found ", shard_tokens);
}

// Shards of at most `shard_tokens` tokens, written as the tokens arrive. With a validation split
// the first `val_tokens` tokens go to <prefix>_val_NNNNNN.bin and the rest to
// <prefix>_train_NNNNNN.bin (llm.c's naming); without one, all go to <prefix>_NNNNNN.bin.
class ShardWriter {
 public:
  // wide: uint32 shards (llm.c's version 7), for vocabularies past 65536 ids.
  ShardWriter(std::string out_dir, std::string prefix, int64_t shard_tokens, int64_t val_tokens = 0, bool wide = false)
      : wide_(wide),
        out_dir_(std::move(out_dir)),
        prefix_(std::move(prefix)),
        shard_tokens_(shard_tokens),
        val_tokens_(val_tokens),
        split_(val_tokens > 0),
        in_val_(val_tokens > 0) {
    check_shard_tokens(shard_tokens);
    FT_CHECK(val_tokens >= 0, "fasttrain data: validation tokens must be 0 or more, found ", val_tokens);
    std::error_code ec;
    fs::create_directories(out_dir_, ec);
    FT_CHECK(!ec, "fasttrain data: cannot create folder '", out_dir_, "' (", ec.message(), ")");
    const auto reserve = static_cast<size_t>(std::min<int64_t>(shard_tokens, int64_t{1} << 24));
    wide_ ? tokens32_.reserve(reserve) : tokens_.reserve(reserve);
  }
  void push(uint32_t token) {
    wide_ ? tokens32_.push_back(token) : tokens_.push_back(static_cast<uint16_t>(token));
    ++total_;
    if (in_val_ && total_ == val_tokens_) {
      flush();
      in_val_ = false;
    } else if (held() == shard_tokens_) {
      flush();
    }
  }
  // Writes the last, partial shard; returns every shard written.
  std::vector<WrittenShard> finish(const std::string& input) {
    if (held() > 0) flush();
    FT_CHECK(!written_.empty(), "fasttrain data: input '", input, "' holds no text (0 bytes)");
    FT_CHECK(!split_ || train_shards_ > 0, "fasttrain data: input '", input, "' makes ", total_,
             " tokens; a validation split of ", val_tokens_, " tokens leaves none for training");
    return std::move(written_);
  }

 private:
  void flush() {
    char name[40];
    size_t& index = in_val_ ? val_shards_ : train_shards_;
    std::snprintf(name, sizeof name, "%s_%06zu.bin", !split_ ? "" : in_val_ ? "_val" : "_train", index++);
    std::string path = (fs::path(out_dir_) / (prefix_ + name)).string();
    wide_ ? write_token_shard_u32(path, tokens32_) : write_token_shard(path, tokens_);
    written_.push_back({path, held(), in_val_});
    tokens_.clear();
    tokens32_.clear();
  }
  int64_t held() const { return static_cast<int64_t>(wide_ ? tokens32_.size() : tokens_.size()); }

  bool wide_;

  std::string out_dir_, prefix_;
  int64_t shard_tokens_, val_tokens_;
  bool split_;   // val_tokens > 0: names say _val / _train
  bool in_val_;  // the tokens being collected belong to the validation split
  size_t val_shards_ = 0, train_shards_ = 0;
  int64_t total_ = 0;
  std::vector<uint16_t> tokens_;
  std::vector<uint32_t> tokens32_;
  std::vector<WrittenShard> written_;
};

// Calls on_byte(offset, byte) for every byte of `file`, read in 64 KiB chunks.
template <class F>
void for_each_byte(const std::string& file, F&& on_byte) {
  std::ifstream in(file, std::ios::binary);
  FT_CHECK(in.good(), "fasttrain data: cannot open '", file, "'");
  std::vector<char> chunk(1 << 16);
  int64_t offset = 0;
  while (in.read(chunk.data(), static_cast<std::streamsize>(chunk.size())) || in.gcount() > 0) {
    for (std::streamsize i = 0; i < in.gcount(); ++i) on_byte(offset++, static_cast<unsigned char>(chunk[i]));
  }
  FT_CHECK(in.eof(), "fasttrain data: error reading '", file, "'");
}

// Calls on_code_point(cp) for every code point of a UTF-8 file; invalid UTF-8 (RFC 3629: no
// overlong forms, no surrogates, nothing past U+10FFFF) is an error naming the file and offset.
template <class F>
void for_each_code_point(const std::string& file, F&& on_code_point) {
  uint32_t cp = 0;
  int need = 0;                  // continuation bytes still expected
  uint8_t lo = 0x80, hi = 0xBF;  // the allowed range of the next continuation byte
  int64_t start = 0;             // offset of the sequence being decoded
  auto bad = [&](int64_t offset, const char* what) {
    FT_FAIL("fasttrain data: '", file, "' is not valid UTF-8 at byte offset ", offset, " (", what,
            "); --vocab char needs UTF-8 text, --vocab byte takes any bytes");
  };
  for_each_byte(file, [&](int64_t offset, uint8_t byte) {
    if (need > 0) {
      if (byte < lo || byte > hi) bad(start, "a multi-byte sequence is broken off");
      cp = (cp << 6) | (byte & 0x3Fu);
      lo = 0x80;
      hi = 0xBF;
      if (--need == 0) on_code_point(cp);
      return;
    }
    start = offset;
    if (byte < 0x80) {
      on_code_point(byte);
    } else if (byte >= 0xC2 && byte <= 0xDF) {
      cp = byte & 0x1Fu, need = 1;
    } else if (byte >= 0xE0 && byte <= 0xEF) {
      cp = byte & 0x0Fu, need = 2;
      if (byte == 0xE0) lo = 0xA0;  // overlong otherwise
      if (byte == 0xED) hi = 0x9F;  // surrogates otherwise
    } else if (byte >= 0xF0 && byte <= 0xF4) {
      cp = byte & 0x07u, need = 3;
      if (byte == 0xF0) lo = 0x90;  // overlong otherwise
      if (byte == 0xF4) hi = 0x8F;  // past U+10FFFF otherwise
    } else {
      bad(offset, byte < 0xC0 ? "a continuation byte without a lead byte" : "a byte that never occurs in UTF-8");
    }
  });
  if (need > 0) bad(start, "the file ends inside a multi-byte sequence");
}

std::string utf8(uint32_t cp) {
  std::string s;
  append_utf8(s, cp);
  return s;
}

bool is_ascii_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }
bool is_ascii_letter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool is_ascii_digit(char c) { return c >= '0' && c <= '9'; }

// Where text may be cut so that encoding the two sides apart gives the tokens of the whole: a
// position p (0 < p < text.size()) where the pre-tokeniser always ends a word, whatever the text
// around, and where the matches from p on depend only on the text from p on.
using CutRule = bool (*)(std::string_view text, size_t p);

// GPT-2's pattern: an ASCII whitespace byte right after an ASCII byte that is not whitespace. No
// match takes whitespace after non-whitespace (only the optional space at a word's start, and
// whitespace runs, hold whitespace).
bool gpt2_cut(std::string_view text, size_t p) {
  return is_ascii_space(text[p]) && static_cast<unsigned char>(text[p - 1]) < 0x80 && !is_ascii_space(text[p - 1]);
}

// Any tokenizer.json: a space between an ASCII letter or digit and an ASCII letter ("word word").
// The Split patterns of GPT-2, Llama 3, SmolLM and Qwen2 all end a letter or digit run at the
// space and start the next word with it; unlike GPT-2's rule, no \r or \n (Llama 3 keeps
// ".\n" and " \n" together) and no punctuation before the space.
bool json_cut(std::string_view text, size_t p) {
  return text[p] == ' ' && p + 1 < text.size() && is_ascii_letter(text[p + 1]) &&
         (is_ascii_letter(text[p - 1]) || is_ascii_digit(text[p - 1]));
}

// The last cut position in (from, to] (and < text.size()), or 0 when there is none.
size_t last_word_boundary(std::string_view text, size_t from, size_t to, CutRule cut) {
  to = std::min(to, text.size() - std::min<size_t>(text.size(), 1));
  for (size_t p = to; p > from && p > 0; --p)
    if (cut(text, p)) return p;
  return 0;
}

// The first cut position in [from, to), or `to` when there is none.
size_t next_word_boundary(std::string_view text, size_t from, size_t to, CutRule cut) {
  to = std::min(to, text.size());
  for (size_t p = std::max<size_t>(from, 1); p < to; ++p)
    if (cut(text, p)) return p;
  return to;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  FT_CHECK(in.good(), "fasttrain data: cannot open '", path, "'");
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

constexpr std::string_view kEndOfText = "<|endoftext|>";
constexpr size_t kReadChunk = size_t{4} << 20;
constexpr size_t kPieceBytes = size_t{256} << 10;  // text per parallel encode task

constexpr uint32_t kCodePoints = 0x110000;
constexpr int64_t kMaxCharVocab = 65536;  // ids are uint16

}  // namespace

std::vector<WrittenShard> write_byte_token_shards(const std::string& input, const std::string& out_dir,
                                                  const std::string& prefix, int64_t shard_tokens, int64_t val_tokens) {
  check_shard_tokens(shard_tokens);
  std::vector<std::string> files = text_files(input);
  ShardWriter writer(out_dir, prefix, shard_tokens, val_tokens);
  for (const auto& file : files) for_each_byte(file, [&](int64_t, uint8_t byte) { writer.push(byte); });
  return writer.finish(input);
}

CharTokenShards write_char_token_shards(const std::string& input, const std::string& out_dir, const std::string& prefix,
                                        int64_t shard_tokens, int64_t val_tokens) {
  check_shard_tokens(shard_tokens);
  std::vector<std::string> files = text_files(input);
  // Pass 1: the vocabulary (and the UTF-8 check, before anything is written).
  std::vector<uint8_t> seen(kCodePoints, 0);
  for (const auto& file : files) for_each_code_point(file, [&](uint32_t cp) { seen[cp] = 1; });
  std::vector<int32_t> id_of(kCodePoints, -1);
  CharTokenShards out;
  for (uint32_t cp = 0; cp < kCodePoints; ++cp) {
    if (!seen[cp]) continue;
    id_of[cp] = static_cast<int32_t>(out.vocab.size());
    out.vocab.push_back(utf8(cp));
  }
  FT_CHECK(static_cast<int64_t>(out.vocab.size()) <= kMaxCharVocab, "fasttrain data: input '", input, "' has ",
           out.vocab.size(), " distinct characters; a char-level vocabulary holds at most ", kMaxCharVocab,
           " (uint16 token ids)");
  // Pass 2: the shards.
  ShardWriter writer(out_dir, prefix, shard_tokens, val_tokens);
  for (const auto& file : files)
    for_each_code_point(file, [&](uint32_t cp) { writer.push(static_cast<uint16_t>(id_of[cp])); });
  out.shards = writer.finish(input);
  nlohmann::json vocab = {{"mode", "char"}, {"vocab_size", out.vocab.size()}, {"tokens", out.vocab}};
  out.vocab_path = (fs::path(out_dir) / "vocab.json").string();
  write_file_atomically(out.vocab_path, vocab.dump(1) + "\n");
  return out;
}

namespace {

// The ids written around each document.
struct DocumentFrame {
  int32_t before = -1, after = -1;  // -1: none
};

// BPE tokenisation of `files` into shards, document by document (see token_shards.h).
int64_t write_bpe_shards(const std::vector<std::string>& files, const Tokenizer& tokenizer, DocumentFrame frame,
                         CutRule cut_rule, ShardWriter& writer) {
  int64_t documents = 0;
  bool in_document = false;
  // Text waiting to be encoded: ranges of `pending`, long ones cut at word boundaries into pieces
  // that the threads encode side by side (each thread with its own word cache); the ids are then
  // written in order, so the shards do not depend on the thread count.
  struct Piece {
    size_t begin, end;
    bool ends_document;
  };
  std::vector<Piece> pieces;
  std::vector<std::vector<int32_t>> piece_ids;
  auto queue = [&](std::string_view view, size_t b, size_t e, bool ends_document) {
    for (size_t p; e - b > kPieceBytes && (p = next_word_boundary(view, b + kPieceBytes, e, cut_rule)) < e; b = p)
      pieces.push_back({b, p, false});
    pieces.push_back({b, e, ends_document});
  };
  // The first non-empty piece of a document is preceded by frame.before; the document's end,
  // when it had a token, is followed by frame.after.
  auto encode_queued = [&](std::string_view view) {
    if (piece_ids.size() < pieces.size()) piece_ids.resize(pieces.size());
    parallel_for(0, static_cast<int64_t>(pieces.size()), 1, [&](int64_t lo, int64_t hi) {
      for (int64_t k = lo; k < hi; ++k) {
        piece_ids[k].clear();
        tokenizer.encode(view.substr(pieces[k].begin, pieces[k].end - pieces[k].begin), piece_ids[k]);
      }
    });
    for (size_t k = 0; k < pieces.size(); ++k) {
      if (!piece_ids[k].empty()) {
        if (!in_document) {
          if (frame.before >= 0) writer.push(static_cast<uint32_t>(frame.before));
          ++documents;
          in_document = true;
        }
        for (int32_t id : piece_ids[k]) writer.push(static_cast<uint32_t>(id));
      }
      if (pieces[k].ends_document && in_document) {
        if (frame.after >= 0) writer.push(static_cast<uint32_t>(frame.after));
        in_document = false;
      }
    }
    pieces.clear();
  };
  // Each file is read in chunks; complete documents and, of an unfinished one, the text up to a
  // word boundary are encoded, the rest waits for the next chunk. `searched` and `cut_searched`
  // remember how far the separator and boundary searches got, so text without either is not
  // scanned again for every chunk.
  std::string pending;
  std::vector<char> chunk(kReadChunk);
  for (const auto& file : files) {
    std::ifstream in(file, std::ios::binary);
    FT_CHECK(in.good(), "fasttrain data: cannot open '", file, "'");
    pending.clear();
    in_document = false;
    size_t searched = 0, cut_searched = 0;
    for (bool eof = false; !eof;) {
      in.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
      pending.append(chunk.data(), static_cast<size_t>(in.gcount()));
      if (!in) {
        FT_CHECK(in.eof(), "fasttrain data: error reading '", file, "'");
        eof = true;
      }
      const std::string_view view(pending);
      size_t at = 0;  // start of the text not yet encoded
      for (size_t sep; (sep = view.find(kEndOfText, searched)) != std::string_view::npos;) {
        queue(view, at, sep, true);
        at = searched = sep + kEndOfText.size();
        cut_searched = at;
      }
      if (eof) {
        queue(view, at, view.size(), true);
        encode_queued(view);
        break;
      }
      // A separator may start in the last bytes and end in the next chunk: leave them.
      const size_t settled = std::max(at, view.size() - std::min(view.size(), kEndOfText.size() - 1));
      searched = settled;
      const size_t cut = last_word_boundary(view, std::max(at, cut_searched), settled, cut_rule);
      cut_searched = settled;
      if (cut > at) {
        queue(view, at, cut, false);
        at = cut;
      }
      encode_queued(view);
      pending.erase(0, at);
      searched -= at;
      cut_searched -= at;
    }
  }
  return documents;
}

}  // namespace

Gpt2TokenShards write_gpt2_token_shards(const std::string& input, const std::string& encoder_path,
                                        const std::string& merges_path, const std::string& out_dir,
                                        const std::string& prefix, int64_t shard_tokens, int64_t val_tokens) {
  check_shard_tokens(shard_tokens);
  std::vector<std::string> files = text_files(input);
  const Gpt2Tokenizer tokenizer = Gpt2Tokenizer::from_files(encoder_path, merges_path);
  FT_CHECK(tokenizer.vocab_size() <= 65536, "fasttrain data: '", encoder_path, "' has ids up to ",
           tokenizer.vocab_size() - 1, "; token shards hold uint16 ids (at most 65535)");
  ShardWriter writer(out_dir, prefix, shard_tokens, val_tokens);
  Gpt2TokenShards out;
  // llm.c's layout: the end-of-text token before each document.
  out.documents = write_bpe_shards(files, tokenizer, {tokenizer.eot_token(), -1}, gpt2_cut, writer);
  out.shards = writer.finish(input);
  // The tokenizer travels with the shards, so they can be decoded without the original files.
  write_file_atomically((fs::path(out_dir) / "encoder.json").string(), read_bytes(encoder_path));
  write_file_atomically((fs::path(out_dir) / "vocab.bpe").string(), read_bytes(merges_path));
  nlohmann::json vocab = {{"mode", "gpt2"},
                          {"vocab_size", tokenizer.vocab_size()},
                          {"eot_token", tokenizer.eot_token()},
                          {"encoder", "encoder.json"},
                          {"merges", "vocab.bpe"}};
  out.vocab_path = (fs::path(out_dir) / "vocab.json").string();
  write_file_atomically(out.vocab_path, vocab.dump(1) + "\n");
  out.vocab_size = tokenizer.vocab_size();
  out.eot_token = tokenizer.eot_token();
  return out;
}

namespace {

// A vocab.json that `fasttrain data` wrote, checked to be of `mode`; errors name `who` and the file.
nlohmann::json read_vocab_json(const std::string& path, const char* who, const std::string& mode) {
  std::ifstream in(path, std::ios::binary);
  FT_CHECK(in.good(), who, ": cannot open '", path, "'");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    FT_FAIL(who, ": '", path, "' is not JSON (", e.what(), ")");
  }
  FT_CHECK(j.is_object() && j.value("mode", std::string()) == mode, who, ": '", path, "' expected \"mode\": \"", mode,
           "\", found ", j.is_object() && j.contains("mode") ? j["mode"].dump() : "none");
  return j;
}

}  // namespace

Gpt2Tokenizer read_gpt2_tokenizer(const std::string& path) {
  const nlohmann::json j = read_vocab_json(path, "read_gpt2_tokenizer", "gpt2");
  for (const char* key : {"encoder", "merges"})
    FT_CHECK(j.contains(key) && j[key].is_string(), "read_gpt2_tokenizer: '", path, "' expected a \"", key,
             "\" file name, found ", j.contains(key) ? j[key].dump() : "none");
  const fs::path dir = fs::path(path).parent_path();
  Gpt2Tokenizer t = Gpt2Tokenizer::from_files((dir / j["encoder"].get<std::string>()).string(),
                                              (dir / j["merges"].get<std::string>()).string());
  FT_CHECK(j.value("vocab_size", int64_t{-1}) == t.vocab_size() && j.value("eot_token", int64_t{-1}) == t.eot_token(),
           "read_gpt2_tokenizer: '", path, "' says vocab_size ", j.value("vocab_size", int64_t{-1}), " and eot_token ",
           j.value("eot_token", int64_t{-1}), ", its tokenizer files have ", t.vocab_size(), " and ", t.eot_token());
  return t;
}

JsonTokenShards write_json_token_shards(const std::string& input, const std::string& tokenizer_path,
                                        const std::string& out_dir, const std::string& prefix, int64_t shard_tokens,
                                        int64_t val_tokens) {
  check_shard_tokens(shard_tokens);
  std::vector<std::string> files = text_files(input);
  const JsonTokenizer tokenizer = JsonTokenizer::from_file(tokenizer_path);
  JsonTokenShards out;
  out.vocab_size = tokenizer.vocab_size();
  out.bos_token = tokenizer.bos_token();
  out.eos_token = tokenizer.eos_token();
  FT_CHECK(out.bos_token >= 0 || out.eos_token >= 0, "fasttrain data: '", tokenizer_path,
           "' has no begin- or end-of-text token (a TemplateProcessing post-processor, or an added token named "
           "<|begin_of_text|>, <s>, <|end_of_text|>, <|endoftext|> or </s>) to mark where documents end");
  out.token_bytes = out.vocab_size > 65536 ? 4 : 2;
  ShardWriter writer(out_dir, prefix, shard_tokens, val_tokens, out.token_bytes == 4);
  // Llama 3's pretraining layout: <|begin_of_text|> document <|end_of_text|>. A tokenizer whose
  // begin and end are one token (SmolLM's <|endoftext|>) writes it once, before each document.
  const DocumentFrame frame{out.bos_token >= 0 ? out.bos_token : out.eos_token,
                            out.bos_token >= 0 && out.eos_token != out.bos_token ? out.eos_token : -1};
  out.documents = write_bpe_shards(files, tokenizer, frame, json_cut, writer);
  out.shards = writer.finish(input);
  write_file_atomically((fs::path(out_dir) / "tokenizer.json").string(), read_bytes(tokenizer_path));
  nlohmann::json vocab = {{"mode", "tokenizer.json"},       {"vocab_size", out.vocab_size},
                          {"bos_token", out.bos_token},     {"eos_token", out.eos_token},
                          {"token_bytes", out.token_bytes}, {"tokenizer", "tokenizer.json"}};
  out.vocab_path = (fs::path(out_dir) / "vocab.json").string();
  write_file_atomically(out.vocab_path, vocab.dump(1) + "\n");
  return out;
}

JsonTokenizer read_json_tokenizer(const std::string& path) {
  const nlohmann::json j = read_vocab_json(path, "read_json_tokenizer", "tokenizer.json");
  FT_CHECK(j.contains("tokenizer") && j["tokenizer"].is_string(), "read_json_tokenizer: '", path,
           "' expected a \"tokenizer\" file name, found ", j.contains("tokenizer") ? j["tokenizer"].dump() : "none");
  JsonTokenizer t =
      JsonTokenizer::from_file((fs::path(path).parent_path() / j["tokenizer"].get<std::string>()).string());
  FT_CHECK(j.value("vocab_size", int64_t{-1}) == t.vocab_size(), "read_json_tokenizer: '", path, "' says vocab_size ",
           j.value("vocab_size", int64_t{-1}), ", its tokenizer.json has ", t.vocab_size());
  return t;
}

std::vector<std::string> read_char_vocabulary(const std::string& path) {
  const nlohmann::json j = read_vocab_json(path, "read_char_vocabulary", "char");
  FT_CHECK(j.contains("tokens") && j["tokens"].is_array(), "read_char_vocabulary: '", path,
           "' expected a \"tokens\" list, found none");
  std::vector<std::string> vocab;
  for (const auto& t : j["tokens"]) {
    FT_CHECK(t.is_string(), "read_char_vocabulary: '", path, "' token ", vocab.size(), " is not a string: ", t.dump());
    vocab.push_back(t.get<std::string>());
  }
  FT_CHECK(j.contains("vocab_size") && j["vocab_size"].is_number_integer() &&
               j["vocab_size"].get<int64_t>() == static_cast<int64_t>(vocab.size()),
           "read_char_vocabulary: '", path, "' says vocab_size ",
           j.contains("vocab_size") ? j["vocab_size"].dump() : "none", " but lists ", vocab.size(), " tokens");
  return vocab;
}

}  // namespace ft::data
