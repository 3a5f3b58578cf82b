// Hugging Face tokenizer.json (include/fasttrain/tokenizer.h, JsonTokenizer): loading and checking
// the file, matching added tokens, the pre-tokeniser steps and the byte-level BPE model.
//
// Encoding runs the `tokenizers` library's pipeline in its order:
//   1. added tokens are found in the text (leftmost, then longest; normalized=false ones first),
//      honouring lstrip/rstrip, and cut it into token ids and plain segments;
//   2. each plain segment goes through the pre-tokeniser steps: Split and Digits cut pieces into
//      smaller pieces (regex matches found by PCRE2, see Regex below), the final ByteLevel step
//      optionally prefixes a space and cuts with GPT-2's pattern (the hand-written scan of
//      byte_bpe.h, which is faster than PCRE2's JIT on it: docs/PERF.md);
//   3. each word is a byte-level BPE word (bpe::Model: the per-thread word cache, ignore_merges,
//      the merge loop shared with Gpt2Tokenizer).
// Why PCRE2: Split patterns are arbitrary regular expressions with Unicode properties (\p{L},
// \p{N}), case-insensitive groups and lookahead; PCRE2 is in every distribution, has a JIT, and
// with PCRE2_MATCH_INVALID_UTF matches any bytes (invalid UTF-8 never matches, so it stays in the
// gaps between matches and every byte is still encoded). `tokenizers` itself uses Oniguruma, whose
// \s also holds U+0085: patterns are translated for that (translate_pattern).
#include <algorithm>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "data/byte_bpe.h"
#include "fasttrain/error.h"
#include "fasttrain/tokenizer.h"

namespace ft::data {

namespace {

using nlohmann::json;

// GPT-2's pattern as `tokenizers` writes it (the ByteLevel pre-tokeniser's own regex).
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Oniguruma's \s (Unicode White_Space) holds U+0085, PCRE2's (\p{Xps}) does not: \s becomes
// [\s\x{85}] (\s\x{85} inside a class) and \S becomes [^\s\x{85}].
std::string translate_pattern(std::string_view p) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[++i];
      if (e == 's') {
        out += in_class ? "\\s\\x{85}" : "[\\s\\x{85}]";
      } else if (e == 'S' && !in_class) {
        out += "[^\\s\\x{85}]";
      } else {
        out += c;
        out += e;
      }
      continue;
    }
    if (c == '[' && !in_class) {
      in_class = true;
      out += c;
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];  // a leading ] is a literal
      continue;
    }
    if (c == ']' && in_class) in_class = false;
    out += c;
  }
  return out;
}

// A Split pattern compiled by PCRE2 (UTF, UCP, any bytes), JIT-compiled when the platform has it.
class Regex {
 public:
  Regex(std::string_view pattern, const std::string& where) {
    const std::string translated = translate_pattern(pattern);
    int err = 0;
    PCRE2_SIZE offset = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                          PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &offset, nullptr);
    if (!code_) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      FT_FAIL(where, ": the regex \"", bpe::printable(pattern),
              "\" does not compile (PCRE2: ", reinterpret_cast<const char*>(msg), " at offset ", offset, ")");
    }
    jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
  }
  ~Regex() { pcre2_code_free(code_); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Calls on_match(begin, end) for each match, left to right, as Oniguruma's find_iter does: the
  // next search starts where a match ends, one character further after an empty match.
  template <class F>
  void for_each_match(std::string_view s, F&& on_match) const {
    Scratch& m = scratch();
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
    for (size_t at = 0; at <= s.size();) {
      const int rc = jit_ ? pcre2_jit_match(code_, subject, s.size(), at, 0, m.data, m.context)
                          : pcre2_match(code_, subject, s.size(), at, 0, m.data, m.context);
      if (rc == PCRE2_ERROR_NOMATCH) return;
      if (rc < 0) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof msg);
        FT_FAIL("JsonTokenizer: a Split regex failed on a text of ", s.size(),
                " bytes (PCRE2: ", reinterpret_cast<const char*>(msg), ")");
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(m.data);
      on_match(static_cast<size_t>(ov[0]), static_cast<size_t>(ov[1]));
      if (ov[1] > ov[0]) {
        at = ov[1];
      } else {
        if (ov[1] >= s.size()) return;
        uint32_t cp;
        at = ov[1] + bpe::decode_utf8(subject, ov[1], s.size(), cp);
      }
    }
  }

 private:
  // Per thread: match data (one pair: only the whole match is used) and a JIT stack large enough
  // for long runs of one class.
  struct Scratch {
    pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
    pcre2_jit_stack* stack = pcre2_jit_stack_create(32 << 10, 8 << 20, nullptr);
    pcre2_match_context* context = pcre2_match_context_create(nullptr);
    Scratch() { pcre2_jit_stack_assign(context, nullptr, stack); }
    ~Scratch() {
      pcre2_match_context_free(context);
      pcre2_jit_stack_free(stack);
      pcre2_match_data_free(data);
    }
  };
  static Scratch& scratch() {
    thread_local Scratch s;
    return s;
  }
  pcre2_code* code_ = nullptr;
  bool jit_ = false;
};

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// One Split (or Digits) pre-tokeniser step.
struct SplitStep {
  std::shared_ptr<const Regex> regex;  // null: `literal`, or GPT-2's pattern when gpt2_scan
  std::string literal;
  bool gpt2_scan = false;
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
};

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool lstrip = false, rstrip = false, normalized = false, special = false;
};

// Added tokens by first byte, longest first, so the first that fits at a place is the longest.
class AddedTokenMatcher {
 public:
  void add(const AddedToken* t) {
    auto& list = by_first_[static_cast<unsigned char>(t->content[0])];
    list.push_back(t);
    std::stable_sort(list.begin(), list.end(),
                     [](const AddedToken* a, const AddedToken* b) { return a->content.size() > b->content.size(); });
    if (first_bytes_.find(t->content[0]) == std::string::npos) first_bytes_ += t->content[0];
  }
  bool empty() const { return first_bytes_.empty(); }
  // The leftmost match at or after `from` (its position in `at`), or nullptr.
  const AddedToken* find(std::string_view text, size_t from, size_t& at) const {
    for (size_t i = text.find_first_of(first_bytes_, from); i != std::string_view::npos;
         i = text.find_first_of(first_bytes_, i + 1)) {
      for (const AddedToken* t : by_first_[static_cast<unsigned char>(text[i])])
        if (text.compare(i, t->content.size(), t->content) == 0) {
          at = i;
          return t;
        }
    }
    return nullptr;
  }

 private:
  std::vector<const AddedToken*> by_first_[256];
  std::string first_bytes_;
};

bool is_space_at(std::string_view s, size_t i, int& len) {
  uint32_t cp;
  len = bpe::decode_utf8(reinterpret_cast<const unsigned char*>(s.data()), i, s.size(), cp);
  return bpe::class_table()(cp) == bpe::kSpace;
}

// Start of the whitespace run that ends at `end` (not before `floor`).
size_t space_run_before(std::string_view s, size_t end, size_t floor) {
  while (end > floor) {
    size_t b = end - 1;
    while (b > floor && (static_cast<unsigned char>(s[b]) & 0xC0) == 0x80) --b;  // the character's start
    int len;
    if (!is_space_at(s, b, len) || b + len != end) break;
    end = b;
  }
  return end;
}

size_t space_run_after(std::string_view s, size_t at) {
  int len;
  while (at < s.size() && is_space_at(s, at, len)) at += len;
  return at;
}

}  // namespace

struct JsonTokenizer::Impl : bpe::Model {
  std::string path;
  std::vector<AddedToken> added;
  AddedTokenMatcher raw_matcher, normalized_matcher;  // normalized false / true
  std::vector<SplitStep> steps;
  bool add_prefix_space = false, byte_level_regex = true;
  bool byte_level_gpt2_scan = true;  // else GPT-2's pattern runs through PCRE2 (bench only)
  std::shared_ptr<const Regex> gpt2_regex;
  std::vector<int32_t> prefix, suffix;  // the post-processor's template around $A
  int32_t bos = -1, eos = -1;

  void encode(std::string_view text, std::vector<int32_t>& out) const;
  void encode_plain(std::string_view text, std::vector<int32_t>& out) const;
  void split(const SplitStep& step, std::string_view piece, std::vector<std::string_view>& out) const;
  void byte_level(std::string_view piece, std::vector<int32_t>& out) const;
};

// Step 1: added tokens, raw ones first, then normalized ones in the gaps (no normalizer is
// supported, so the two differ only in that order, as in `tokenizers`' AddedVocabulary).
void JsonTokenizer::Impl::encode(std::string_view text, std::vector<int32_t>& out) const {
  auto pass = [&](const AddedTokenMatcher& m, std::string_view s, auto&& on_plain) {
    if (m.empty()) return on_plain(s);
    size_t done = 0;
    for (size_t at; const AddedToken* t = m.find(s, done, at);) {
      size_t begin = at, end = at + t->content.size();
      if (t->lstrip) begin = space_run_before(s, begin, done);
      if (t->rstrip) end = space_run_after(s, end);
      if (begin > done) on_plain(s.substr(done, begin - done));
      out.push_back(t->id);
      done = end;
    }
    if (done < s.size()) on_plain(s.substr(done));
  };
  pass(raw_matcher, text, [&](std::string_view s) {
    pass(normalized_matcher, s, [&](std::string_view plain) { encode_plain(plain, out); });
  });
}

// Step 2 and 3 on text holding no added token.
void JsonTokenizer::Impl::encode_plain(std::string_view text, std::vector<int32_t>& out) const {
  if (steps.empty()) return byte_level(text, out);
  std::vector<std::string_view> pieces{text}, next;
  for (const SplitStep& step : steps) {
    next.clear();
    for (std::string_view p : pieces) split(step, p, next);
    pieces.swap(next);
  }
  for (std::string_view p : pieces) byte_level(p, out);
}

// `tokenizers`' NormalizedString::split: the piece as alternating gaps and matches (roles swapped
// with invert), combined as the behaviour says; empty pieces are dropped.
void JsonTokenizer::Impl::split(const SplitStep& step, std::string_view piece,
                                std::vector<std::string_view>& out) const {
  struct Seg {
    size_t begin, end;
    bool match;
  };
  thread_local std::vector<Seg> segs;
  segs.clear();
  size_t gap = 0;
  auto on_match = [&](size_t b, size_t e) {
    if (b > gap) segs.push_back({gap, b, false});
    segs.push_back({b, e, true});
    gap = e;
  };
  if (step.gpt2_scan) {
    bpe::pretokenize(piece, on_match);
  } else if (step.regex) {
    step.regex->for_each_match(piece, on_match);
  } else {
    for (size_t at = piece.find(step.literal); at != std::string_view::npos;
         at = piece.find(step.literal, at + step.literal.size()))
      on_match(at, at + step.literal.size());
  }
  if (gap < piece.size()) segs.push_back({gap, piece.size(), false});
  if (step.invert)
    for (Seg& s : segs) s.match = !s.match;
  const size_t first = out.size();
  auto emit = [&](size_t b, size_t e) { out.push_back(piece.substr(b, e - b)); };
  bool previous = false;
  switch (step.behavior) {
    case SplitBehavior::kRemoved:
      for (const Seg& s : segs)
        if (!s.match) emit(s.begin, s.end);
      break;
    case SplitBehavior::kIsolated:
      for (const Seg& s : segs) emit(s.begin, s.end);
      break;
    case SplitBehavior::kMergedWithPrevious:  // a match after a gap joins that gap
      for (const Seg& s : segs) {
        if (s.match && !previous && out.size() > first) {
          out.back() = piece.substr(out.back().data() - piece.data(), s.end - (out.back().data() - piece.data()));
        } else {
          emit(s.begin, s.end);
        }
        previous = s.match;
      }
      break;
    case SplitBehavior::kMergedWithNext: {  // a match before a gap joins that gap
      size_t pending = SIZE_MAX;            // start of a match waiting for the next gap
      for (const Seg& s : segs) {
        if (pending != SIZE_MAX && !s.match) {
          emit(pending, s.end);
          pending = SIZE_MAX;
          continue;
        }
        if (pending != SIZE_MAX) emit(pending, s.begin);
        pending = SIZE_MAX;
        if (s.match) {
          pending = s.begin;
        } else {
          emit(s.begin, s.end);
        }
      }
      if (pending != SIZE_MAX) emit(pending, piece.size());
      break;
    }
    case SplitBehavior::kContiguous:  // neighbours of one kind become one piece (two gaps: invert)
      for (const Seg& s : segs) {
        if (s.match == previous && out.size() > first) {
          out.back() = piece.substr(out.back().data() - piece.data(), s.end - (out.back().data() - piece.data()));
        } else {
          emit(s.begin, s.end);
        }
        previous = s.match;
      }
      break;
  }
  out.erase(std::remove_if(out.begin() + static_cast<std::ptrdiff_t>(first), out.end(),
                           [](std::string_view v) { return v.empty(); }),
            out.end());
}

// The ByteLevel step: the optional prefix space, GPT-2's pattern when use_regex, then BPE per word.
void JsonTokenizer::Impl::byte_level(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  std::string prefixed;
  if (add_prefix_space && piece.front() != ' ') {
    prefixed.reserve(piece.size() + 1);
    prefixed += ' ';
    prefixed += piece;
    piece = prefixed;
  }
  const auto* s = reinterpret_cast<const unsigned char*>(piece.data());
  auto word = [&](size_t b, size_t e) { encode_word(s + b, e - b, out); };
  if (!byte_level_regex) {
    word(0, piece.size());
  } else if (byte_level_gpt2_scan) {
    bpe::pretokenize(piece, word);
  } else {  // invalid UTF-8 matches nothing: the gaps are words too, as the scan makes them
    size_t gap = 0;
    gpt2_regex->for_each_match(piece, [&](size_t b, size_t e) {
      if (b > gap) word(gap, b);
      if (e > b) word(b, e);
      gap = e;
    });
    if (gap < piece.size()) word(gap, piece.size());
  }
}

// ---------------------------------------------------------------------------------------------
// The public interface

namespace {

const JsonTokenizer::Impl& loaded(const std::shared_ptr<const JsonTokenizer::Impl>& impl) {
  FT_CHECK(impl, "JsonTokenizer: used before being loaded (use JsonTokenizer::from_file)");
  return *impl;
}

}  // namespace

void JsonTokenizer::encode(std::string_view text, std::vector<int32_t>& out) const { loaded(impl_).encode(text, out); }

std::vector<int32_t> JsonTokenizer::encode(std::string_view text, bool add_special_tokens) const {
  const Impl& t = loaded(impl_);
  std::vector<int32_t> out;
  if (add_special_tokens) out = t.prefix;
  t.encode(text, out);
  if (add_special_tokens) out.insert(out.end(), t.suffix.begin(), t.suffix.end());
  return out;
}

std::string JsonTokenizer::decode(std::span<const int32_t> ids) const {
  return loaded(impl_).decode(ids, "JsonTokenizer");
}

std::string_view JsonTokenizer::token_bytes(int32_t id) const { return impl_ ? impl_->token(id) : std::string_view(); }

int64_t JsonTokenizer::vocab_size() const { return impl_ ? static_cast<int64_t>(impl_->bytes_of.size()) : 0; }
int32_t JsonTokenizer::bos_token() const { return impl_ ? impl_->bos : -1; }
int32_t JsonTokenizer::eos_token() const { return impl_ ? impl_->eos : -1; }
bool JsonTokenizer::uses_gpt2_scan() const {
  if (!impl_) return false;
  if (impl_->steps.empty()) return impl_->byte_level_regex && impl_->byte_level_gpt2_scan;
  return impl_->steps.size() == 1 && impl_->steps[0].gpt2_scan && !impl_->byte_level_regex;
}

int32_t JsonTokenizer::token_id(std::string_view bytes) const {
  if (!impl_) return -1;
  for (const AddedToken& a : impl_->added)
    if (a.content == bytes) return a.id;
  for (size_t id = 0; id < impl_->bytes_of.size(); ++id)
    if (impl_->used[id] && impl_->bytes_of[id] == bytes) return static_cast<int32_t>(id);
  return -1;
}

// ---------------------------------------------------------------------------------------------
// Loading: every field encode relies on is checked here, so encode never fails on a loaded file.

namespace {

// Reads fields of one JSON object, naming the file and the field's path in every error.
class Fields {
 public:
  Fields(const std::string& file, const json& obj, std::string where)
      : file_(file), obj_(obj), where_(std::move(where)) {
    FT_CHECK(obj.is_object(), fail_prefix(), where_, ": expected an object, found ", obj.dump());
  }
  std::string name(const std::string& key) const { return where_.empty() ? key : where_ + "." + key; }
  std::string fail_prefix() const { return "JsonTokenizer: '" + file_ + "' "; }
  bool has(const std::string& key) const { return obj_.contains(key) && !obj_.at(key).is_null(); }
  const json& get(const std::string& key) const {
    FT_CHECK(has(key), fail_prefix(), name(key), ": expected a value, found none");
    return obj_.at(key);
  }
  std::string text(const std::string& key) const {
    const json& v = get(key);
    FT_CHECK(v.is_string(), fail_prefix(), name(key), ": expected a string, found ", v.dump());
    return v.get<std::string>();
  }
  bool flag(const std::string& key, bool otherwise) const {
    if (!has(key)) return otherwise;
    const json& v = obj_.at(key);
    FT_CHECK(v.is_boolean(), fail_prefix(), name(key), ": expected true or false, found ", v.dump());
    return v.get<bool>();
  }
  // Refuses anything but null, false, 0 or "" (a feature that is not supported) for `key`.
  void unset(const std::string& key, const char* why) const {
    if (!obj_.contains(key)) return;
    const json& v = obj_.at(key);
    const bool off = v.is_null() || (v.is_boolean() && !v.get<bool>()) || (v.is_number() && v.get<double>() == 0) ||
                     (v.is_string() && v.get<std::string>().empty());
    FT_CHECK(off, fail_prefix(), name(key), ": ", v.dump(), " is not supported (", why, ")");
  }
  std::string unsupported(const std::string& key, const std::string& value, const char* expected) const {
    return fail_prefix() + name(key) + ": \"" + value + "\" is not supported (expected " + expected + ")";
  }
  const std::string& file() const { return file_; }
  const std::string& where() const { return where_; }

 private:
  const std::string& file_;
  const json& obj_;
  std::string where_;
};

SplitBehavior behavior_of(const Fields& f) {
  const std::string b = f.text("behavior");
  if (b == "Removed") return SplitBehavior::kRemoved;
  if (b == "Isolated") return SplitBehavior::kIsolated;
  if (b == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (b == "Contiguous") return SplitBehavior::kContiguous;
  FT_FAIL(f.unsupported("behavior", b, "Removed, Isolated, MergedWithPrevious, MergedWithNext or Contiguous"));
}

SplitStep split_step(const Fields& f, bool gpt2_scan) {
  SplitStep step;
  step.behavior = behavior_of(f);
  step.invert = f.flag("invert", false);
  const Fields pattern(f.file(), f.get("pattern"), f.name("pattern"));
  if (pattern.has("Regex")) {
    const std::string re = pattern.text("Regex");
    // The hand-written scan finds exactly the matches of GPT-2's pattern, faster (docs/PERF.md).
    step.gpt2_scan = gpt2_scan && re == kGpt2Pattern;
    if (!step.gpt2_scan) step.regex = std::make_shared<Regex>(re, pattern.fail_prefix() + pattern.name("Regex"));
  } else {
    FT_CHECK(pattern.has("String"), pattern.fail_prefix(), pattern.where(),
             ": expected {\"Regex\": ...} or {\"String\": ...}, found ", f.get("pattern").dump());
    step.literal = pattern.text("String");
    FT_CHECK(!step.literal.empty(), pattern.fail_prefix(), pattern.name("String"), ": expected a non-empty string");
  }
  return step;
}

void read_byte_level(const Fields& f, JsonTokenizer::Impl& t) {
  t.add_prefix_space = f.flag("add_prefix_space", true);
  t.byte_level_regex = f.flag("use_regex", true);
}

void read_pre_tokenizer(const Fields& root, JsonTokenizer::Impl& t, bool gpt2_scan) {
  const Fields pre(root.file(), root.get("pre_tokenizer"), "pre_tokenizer");
  const std::string type = pre.text("type");
  if (type == "ByteLevel") return read_byte_level(pre, t);
  FT_CHECK(type == "Sequence",
           pre.unsupported("type", type, "ByteLevel, or a Sequence of Split/Digits then ByteLevel"));
  const json& list = pre.get("pretokenizers");
  FT_CHECK(list.is_array() && !list.empty(), pre.fail_prefix(), pre.name("pretokenizers"),
           ": expected a non-empty list, found ", list.dump());
  for (size_t k = 0; k < list.size(); ++k) {
    const Fields step(root.file(), list[k], pre.name("pretokenizers") + "[" + std::to_string(k) + "]");
    const std::string kind = step.text("type");
    const bool last = k + 1 == list.size();
    if (kind == "ByteLevel" && last) {
      read_byte_level(step, t);
    } else if (kind == "Split" && !last) {
      t.steps.push_back(split_step(step, gpt2_scan));
    } else if (kind == "Digits" && !last) {
      // `tokenizers` splits on char::is_numeric (\p{N}), each digit alone or runs together.
      SplitStep digits;
      digits.regex = std::make_shared<Regex>("\\p{N}", step.fail_prefix() + step.where());
      digits.behavior = step.flag("individual_digits", false) ? SplitBehavior::kIsolated : SplitBehavior::kContiguous;
      t.steps.push_back(digits);
    } else {
      FT_FAIL(step.unsupported("type", kind,
                               last ? "ByteLevel as the last step" : "Split or Digits before the final ByteLevel"));
    }
  }
}

// Fills bytes_of/used from model.vocab; returns bytes -> id.
std::unordered_map<std::string, int32_t> read_vocab(const Fields& model, JsonTokenizer::Impl& t, int64_t& max_id) {
  const json& vocab = model.get("vocab");
  FT_CHECK(vocab.is_object() && !vocab.empty(), model.fail_prefix(), model.name("vocab"),
           ": expected an object of token -> id, found ", vocab.is_object() ? "{}" : vocab.type_name());
  std::unordered_map<std::string, int32_t> id_of;
  std::vector<std::pair<int32_t, std::string>> entries;
  std::string bytes;
  for (const auto& [token, id] : vocab.items()) {
    FT_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < (int64_t{1} << 30),
             model.fail_prefix(), model.name("vocab"), " token \"", bpe::printable(token),
             "\": expected an id from 0 to 2^30 - 1, found ", id.dump());
    FT_CHECK(bpe::byte_level_to_bytes(token, bytes), model.fail_prefix(), model.name("vocab"), " token \"",
             bpe::printable(token), "\" (id ", id.get<int64_t>(),
             ") has a character outside the byte-level alphabet (bytes_to_unicode)");
    max_id = std::max(max_id, id.get<int64_t>());
    entries.emplace_back(id.get<int32_t>(), bytes);
  }
  t.bytes_of.assign(static_cast<size_t>(max_id + 1), std::string());
  t.used.assign(static_cast<size_t>(max_id + 1), 0);
  for (auto& [id, b] : entries) {
    FT_CHECK(!t.used[id], model.fail_prefix(), model.name("vocab"), ": expected each id once, found id ", id,
             " for both \"", bpe::printable(t.bytes_of[id]), "\" and \"", bpe::printable(b), "\" (as bytes)");
    t.used[id] = 1;
    t.bytes_of[id] = b;
    id_of.emplace(b, id);
  }
  for (int b = 0; b < 256; ++b) {
    auto found = id_of.find(std::string(1, static_cast<char>(b)));
    FT_CHECK(found != id_of.end(), model.fail_prefix(), model.name("vocab"),
             ": expected a token for every byte (byte-level BPE), found none for byte ", b);
    t.byte_token[b] = found->second;
  }
  return id_of;
}

void read_merges(const Fields& model, JsonTokenizer::Impl& t, const std::unordered_map<std::string, int32_t>& id_of) {
  const json& merges = model.get("merges");
  FT_CHECK(merges.is_array(), model.fail_prefix(), model.name("merges"), ": expected a list, found ",
           merges.type_name());
  t.merges.reserve(merges.size());
  std::string a, b;
  for (size_t k = 0; k < merges.size(); ++k) {
    const json& m = merges[k];
    const std::string where = model.name("merges") + "[" + std::to_string(k) + "]";
    std::string left, right;
    if (m.is_string()) {  // "a b"
      const std::string s = m.get<std::string>();
      const size_t sp = s.find(' ');
      FT_CHECK(sp != std::string::npos && sp > 0 && sp + 1 < s.size() && s.find(' ', sp + 1) == std::string::npos,
               model.fail_prefix(), where, ": expected two tokens separated by one space, found \"", bpe::printable(s),
               "\"");
      left = s.substr(0, sp), right = s.substr(sp + 1);
    } else {  // ["a", "b"]
      FT_CHECK(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string(), model.fail_prefix(), where,
               ": expected \"a b\" or [\"a\", \"b\"], found ", m.dump());
      left = m[0].get<std::string>(), right = m[1].get<std::string>();
    }
    const bool ok = bpe::byte_level_to_bytes(left, a) && bpe::byte_level_to_bytes(right, b);
    auto ia = ok ? id_of.find(a) : id_of.end(), ib = ok ? id_of.find(b) : id_of.end();
    auto im = ok ? id_of.find(a + b) : id_of.end();
    FT_CHECK(ia != id_of.end() && ib != id_of.end() && im != id_of.end(), model.fail_prefix(), where, ": the ",
             ia == id_of.end()   ? "left token \"" + bpe::printable(left)
             : ib == id_of.end() ? "right token \"" + bpe::printable(right)
                                 : "merged token \"" + bpe::printable(left + right),
             "\" is not in model.vocab");
    int32_t existing = -1;
    FT_CHECK(t.merges.insert(ia->second, ib->second, {static_cast<int32_t>(k), im->second}, existing),
             model.fail_prefix(), where, ": expected each merge once, found \"", bpe::printable(left), " ",
             bpe::printable(right), "\" already at ", model.name("merges"), "[", existing, "]");
  }
  t.merge_count = static_cast<int64_t>(merges.size());
}

void read_model(const Fields& root, JsonTokenizer::Impl& t, int64_t& max_id) {
  const Fields model(root.file(), root.get("model"), "model");
  const std::string type = model.has("type") ? model.text("type") : std::string("BPE");
  FT_CHECK(type == "BPE", model.unsupported("type", type, "BPE"));
  model.unset("dropout", "BPE dropout changes ids at random");
  model.unset("continuing_subword_prefix", "byte-level BPE has none");
  model.unset("end_of_word_suffix", "byte-level BPE has none");
  t.ignore_merges = model.flag("ignore_merges", false);
  // byte_fallback and unk_token are accepted and never used: every byte has its token.
  (void)model.flag("byte_fallback", false);
  const auto id_of = read_vocab(model, t, max_id);
  read_merges(model, t, id_of);
  if (t.ignore_merges)
    for (const auto& [bytes, id] : id_of) t.token_of_bytes.emplace(bytes, id);
}

void read_added_tokens(const Fields& root, JsonTokenizer::Impl& t, int64_t& max_id) {
  if (!root.has("added_tokens")) return;
  const json& list = root.get("added_tokens");
  FT_CHECK(list.is_array(), root.fail_prefix(), "added_tokens: expected a list, found ", list.type_name());
  for (size_t k = 0; k < list.size(); ++k) {
    const Fields f(root.file(), list[k], "added_tokens[" + std::to_string(k) + "]");
    AddedToken a;
    a.content = f.text("content");
    FT_CHECK(!a.content.empty(), f.fail_prefix(), f.name("content"), ": expected a non-empty string");
    const json& id = f.get("id");
    FT_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < (int64_t{1} << 30),
             f.fail_prefix(), f.name("id"), ": expected an id from 0 to 2^30 - 1, found ", id.dump());
    a.id = id.get<int32_t>();
    a.lstrip = f.flag("lstrip", false), a.rstrip = f.flag("rstrip", false);
    a.normalized = f.flag("normalized", !f.flag("special", false));
    a.special = f.flag("special", false);
    f.unset("single_word", "added tokens that match only whole words");
    max_id = std::max<int64_t>(max_id, a.id);
    t.added.push_back(a);
  }
  t.bytes_of.resize(static_cast<size_t>(max_id + 1));
  t.used.resize(static_cast<size_t>(max_id + 1), 0);
  for (const AddedToken& a : t.added) {
    t.bytes_of[a.id] = a.content;
    t.used[a.id] = 1;
    (a.normalized ? t.normalized_matcher : t.raw_matcher).add(&a);
  }
}

// TemplateProcessing's single template: special tokens, then {"Sequence": {"id": "A"}}, then more.
void read_template(const Fields& f, JsonTokenizer::Impl& t) {
  const json& single = f.get("single");
  FT_CHECK(single.is_array(), f.fail_prefix(), f.name("single"), ": expected a list, found ", single.dump());
  const Fields specials(f.file(), f.get("special_tokens"), f.name("special_tokens"));
  bool seen_a = false;
  for (size_t k = 0; k < single.size(); ++k) {
    const Fields item(f.file(), single[k], f.name("single") + "[" + std::to_string(k) + "]");
    if (item.has("Sequence")) {
      const Fields seq(f.file(), item.get("Sequence"), item.name("Sequence"));
      FT_CHECK(seq.text("id") == "A" && !seen_a, f.fail_prefix(), seq.name("id"),
               ": expected the one sequence \"A\" of a single template, found ", item.get("Sequence").dump());
      seen_a = true;
      continue;
    }
    FT_CHECK(item.has("SpecialToken"), item.fail_prefix(), item.where(),
             ": expected {\"SpecialToken\": ...} or {\"Sequence\": ...}, found ", single[k].dump());
    const std::string name = Fields(f.file(), item.get("SpecialToken"), item.name("SpecialToken")).text("id");
    FT_CHECK(specials.has(name), specials.fail_prefix(), specials.where(), ": expected an entry for \"", name,
             "\" (used by ", item.where(), "), found none");
    const json& ids = Fields(f.file(), specials.get(name), specials.name(name)).get("ids");
    for (const json& id : ids) {
      FT_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0 &&
                   id.get<int64_t>() < static_cast<int64_t>(t.used.size()) && t.used[id.get<int64_t>()],
               specials.fail_prefix(), specials.name(name), ".ids: ", id.dump(), " is not a token id of the file");
      (seen_a ? t.suffix : t.prefix).push_back(id.get<int32_t>());
    }
  }
  FT_CHECK(seen_a, f.fail_prefix(), f.name("single"), ": expected the sequence {\"Sequence\": {\"id\": \"A\"}}");
}

void read_post_processor(const Fields& root, JsonTokenizer::Impl& t) {
  if (!root.has("post_processor")) return;
  const Fields pp(root.file(), root.get("post_processor"), "post_processor");
  auto one = [&](const Fields& f) {
    const std::string type = f.text("type");
    if (type == "ByteLevel") return;  // changes only offsets
    FT_CHECK(type == "TemplateProcessing", f.unsupported("type", type, "ByteLevel, TemplateProcessing or Sequence"));
    read_template(f, t);
  };
  if (pp.text("type") != "Sequence") return one(pp);
  const json& list = pp.get("processors");
  FT_CHECK(list.is_array(), pp.fail_prefix(), pp.name("processors"), ": expected a list, found ", list.dump());
  for (size_t k = 0; k < list.size(); ++k)
    one(Fields(root.file(), list[k], pp.name("processors") + "[" + std::to_string(k) + "]"));
}

int32_t first_added(const JsonTokenizer::Impl& t, std::initializer_list<std::string_view> names) {
  for (std::string_view n : names)
    for (const AddedToken& a : t.added)
      if (a.content == n) return a.id;
  return -1;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  FT_CHECK(in.good(), "JsonTokenizer: cannot open '", path, "'");
  std::ostringstream os;
  os << in.rdbuf();
  FT_CHECK(!in.bad(), "JsonTokenizer: error reading '", path, "'");
  return os.str();
}

}  // namespace

JsonTokenizer JsonTokenizer::from_file(const std::string& path, Gpt2Pattern gpt2_pattern) {
  json doc;
  try {
    doc = json::parse(read_file(path));
  } catch (const json::exception& e) {
    FT_FAIL("JsonTokenizer: '", path, "' is not valid JSON (", e.what(), "); expected a Hugging Face tokenizer.json");
  }
  auto t = std::make_shared<Impl>();
  t->path = path;
  const bool scan = gpt2_pattern == Gpt2Pattern::kHandWritten;
  t->byte_level_gpt2_scan = scan;
  if (!scan) t->gpt2_regex = std::make_shared<Regex>(kGpt2Pattern, "JsonTokenizer: GPT-2's pattern");
  const Fields root(path, doc, "");
  root.unset("normalizer", "no normalizer is supported");
  FT_CHECK(root.has("pre_tokenizer"), root.fail_prefix(),
           "pre_tokenizer: expected ByteLevel or a Sequence ending in ByteLevel, found none");
  read_pre_tokenizer(root, *t, scan);
  FT_CHECK(root.has("decoder"), root.fail_prefix(), "decoder: expected ByteLevel, found none");
  const std::string decoder = Fields(path, root.get("decoder"), "decoder").text("type");
  FT_CHECK(decoder == "ByteLevel",
           Fields(path, root.get("decoder"), "decoder").unsupported("type", decoder, "ByteLevel"));
  int64_t max_id = -1;
  read_model(root, *t, max_id);
  read_added_tokens(root, *t, max_id);
  read_post_processor(root, *t);
  t->bos = t->prefix.size() == 1 ? t->prefix[0] : first_added(*t, {"<|begin_of_text|>", "<s>"});
  t->eos = t->suffix.size() == 1 ? t->suffix[0] : first_added(*t, {"<|end_of_text|>", "<|endoftext|>", "</s>"});
  return JsonTokenizer(std::move(t));
}

}  // namespace ft::data
