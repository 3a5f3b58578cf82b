// GPT-2's byte-level BPE (include/fasttrain/tokenizer.h): loading encoder.json and vocab.bpe, and
// the definitions of the machinery byte_bpe.h declares (the class table, the merge loop, the word
// cache in front of it), which JsonTokenizer shares.
//
// Where the time goes and what keeps it low:
// - Pre-tokenisation is a hand-written scan of GPT-2's pattern (26-33% faster than PCRE2's JIT on
//   the same pattern, docs/PERF.md):
//   one UTF-8 decode and one class lookup per code point, through a two-level table (an ASCII row
//   plus 128-code-point blocks shared between identical blocks) built once from the generated
//   ranges in unicode_classes.inc.
// - Words repeat (Zipf): each thread keeps a cache word -> ids, so most words cost one hash
//   lookup. Per thread, because a shared cache would need a lock or atomics on every word.
// - BPE runs on token ids, not strings: a merge rule is a (left id, right id) key in an
//   open-addressing table giving (rank, merged id). Short words use the direct loop (scan the
//   pairs for the lowest rank, merge it everywhere, repeat: quadratic, but cheapest for the few
//   symbols of a normal word); long ones (a run of spaces, base64, minified code) use a heap of
//   candidate pairs over a linked list of symbols, n log n, so a megabyte without a space cannot
//   stall the tokenizer. Both merge all occurrences of one rank before any other rank, left to
//   right, exactly GPT-2's order (a rule formed later can rank below the current one, so
//   interleaving ranks would change results).
#include "fasttrain/tokenizer.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <queue>
#include <sstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "data/byte_bpe.h"
#include "data/utf8.h"
#include "fasttrain/error.h"

namespace ft::data {

// ---------------------------------------------------------------------------------------------
// Unicode classes and UTF-8

namespace bpe {

namespace {

struct ClassRange {
  uint32_t first, last;
  uint8_t cls;
};

constexpr uint8_t L = kLetter, N = kNumber, S = kSpace;
constexpr ClassRange kClassRanges[] = {
#include "data/unicode_classes.inc"
};

}  // namespace

ClassTable::ClassTable() {
  std::string all(0x110000, static_cast<char>(kOther));
  for (uint32_t c = 'a'; c <= 'z'; ++c) all[c] = all[c - 'a' + 'A'] = static_cast<char>(kLetter);
  for (uint32_t c = '0'; c <= '9'; ++c) all[c] = static_cast<char>(kNumber);
  for (char c : {'\t', '\n', '\v', '\f', '\r', ' '}) all[static_cast<unsigned char>(c)] = kSpace;
  for (const ClassRange& r : kClassRanges)
    for (uint32_t c = r.first; c <= r.last; ++c) all[c] = static_cast<char>(r.cls);
  std::map<std::string, uint16_t> seen;
  block_of_.resize(0x110000 >> 7);
  for (size_t b = 0; b < block_of_.size(); ++b) {
    std::string block = all.substr(b << 7, 128);
    auto [it, fresh] = seen.emplace(block, static_cast<uint16_t>(seen.size()));
    if (fresh) blocks_.insert(blocks_.end(), block.begin(), block.end());
    block_of_[b] = it->second;
  }
}

const ClassTable& class_table() {
  static const ClassTable table;
  return table;
}

}  // namespace bpe

namespace {

std::array<char32_t, 256> make_byte_to_unicode() {
  std::array<char32_t, 256> table{};
  std::array<bool, 256> printable{};
  for (int b = '!'; b <= '~'; ++b) printable[b] = true;
  for (int b = 0xA1; b <= 0xAC; ++b) printable[b] = true;
  for (int b = 0xAE; b <= 0xFF; ++b) printable[b] = true;
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) table[b] = printable[b] ? static_cast<char32_t>(b) : next++;
  return table;
}

}  // namespace

const std::array<char32_t, 256>& gpt2_byte_to_unicode() {
  static const std::array<char32_t, 256> table = make_byte_to_unicode();
  return table;
}

std::vector<std::string_view> gpt2_pretokenize(std::string_view text) {
  std::vector<std::string_view> words;
  bpe::pretokenize(text, [&](size_t b, size_t e) { words.push_back(text.substr(b, e - b)); });
  return words;
}

// ---------------------------------------------------------------------------------------------
// The merge loop

namespace bpe {

namespace {

constexpr size_t kHeapBpeSymbols = 64;   // words longer than this (in bytes) take the heap path
constexpr size_t kCachedWordBytes = 64;  // longer words are rarely repeated: not cached

std::atomic<uint64_t> next_model_id{1};

}  // namespace

Model::Model() : id(next_model_id++) {}

std::string Model::decode(std::span<const int32_t> ids, const char* who) const {
  std::string out;
  const auto size = static_cast<int64_t>(bytes_of.size());
  for (size_t k = 0; k < ids.size(); ++k) {
    const int32_t id = ids[k];
    FT_CHECK(id >= 0 && id < size && used[id], who, "::decode: token ", k, " is id ", id,
             ", which is not in the vocabulary (ids 0-", size - 1, ")");
    out += bytes_of[id];
  }
  return out;
}

// Merge until no adjacent pair has a rule: per round, the lowest-ranked pair is merged at every
// place it occurs, left to right and without overlap.
void Model::bpe_direct(std::vector<int32_t>& syms) const {
  size_t n = syms.size();
  while (n > 1) {
    MergeTable::Rule best{INT32_MAX, -1};
    int32_t left = -1, right = -1;
    for (size_t k = 0; k + 1 < n; ++k) {
      const MergeTable::Rule r = merges.find(syms[k], syms[k + 1]);
      if (r.rank < best.rank) best = r, left = syms[k], right = syms[k + 1];
    }
    if (best.rank == INT32_MAX) break;
    size_t w = 0;
    for (size_t k = 0; k < n;) {
      if (k + 1 < n && syms[k] == left && syms[k + 1] == right) {
        syms[w++] = best.merged;
        k += 2;
      } else {
        syms[w++] = syms[k++];
      }
    }
    n = w;
  }
  syms.resize(n);
}

// The same merges for long words: symbols are a linked list; a min-heap holds candidate pairs
// (rank, position of the left symbol). All candidates of the lowest rank are taken out together
// and merged in position order (skipping ones a neighbouring merge invalidated), and only then are
// the pairs the merges formed pushed, so no other rank interleaves.
void Model::bpe_heap(std::vector<int32_t>& syms) const {
  const int32_t n = static_cast<int32_t>(syms.size());
  std::vector<int32_t> prev(n), next(n);
  std::vector<uint8_t> alive(n, 1);
  for (int32_t k = 0; k < n; ++k) prev[k] = k - 1, next[k] = k + 1 < n ? k + 1 : -1;
  using Cand = std::pair<int32_t, int32_t>;  // (rank, position)
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto push = [&](int32_t pos) {
    if (pos < 0 || next[pos] < 0) return;
    const MergeTable::Rule r = merges.find(syms[pos], syms[next[pos]]);
    if (r.rank != INT32_MAX) heap.push({r.rank, pos});
  };
  for (int32_t k = 0; k + 1 < n; ++k) push(k);
  std::vector<int32_t> batch, merged_at;
  while (!heap.empty()) {
    const int32_t rank = heap.top().first;
    batch.clear();
    while (!heap.empty() && heap.top().first == rank) {
      batch.push_back(heap.top().second);
      heap.pop();
    }
    merged_at.clear();
    for (int32_t pos : batch) {  // ascending positions: the heap orders equal ranks by position
      if (!alive[pos] || next[pos] < 0) continue;
      const MergeTable::Rule r = merges.find(syms[pos], syms[next[pos]]);
      if (r.rank != rank) continue;  // ranks are unique per pair: another pair stands here now
      const int32_t gone = next[pos];
      syms[pos] = r.merged;
      alive[gone] = 0;
      next[pos] = next[gone];
      if (next[gone] >= 0) prev[next[gone]] = pos;
      merged_at.push_back(pos);
    }
    for (int32_t pos : merged_at) {
      push(prev[pos]);
      push(pos);
    }
  }
  int32_t w = 0;
  for (int32_t k = 0; k >= 0 && k < n; k = next[k]) syms[w++] = syms[k];
  syms.resize(w);
}

void Model::bpe(const unsigned char* word, size_t n, std::vector<int32_t>& out) const {
  thread_local std::vector<int32_t> syms;
  syms.resize(n);
  for (size_t k = 0; k < n; ++k) syms[k] = byte_token[word[k]];
  if (n > kHeapBpeSymbols) {
    bpe_heap(syms);
  } else {
    bpe_direct(syms);
  }
  out.insert(out.end(), syms.begin(), syms.end());
}

void Model::encode_word(const unsigned char* word, size_t n, std::vector<int32_t>& out) const {
  if (n == 1) {
    out.push_back(byte_token[word[0]]);
    return;
  }
  thread_local WordCache cache;
  if (cache.owner != id) cache.reset(id);
  const bool cacheable = n <= kCachedWordBytes;
  const uint64_t h = cacheable ? WordCache::hash(word, n) : 0;
  if (cacheable) {
    uint32_t len = 0;
    if (const int32_t* ids = cache.find(word, n, h, len)) {
      out.insert(out.end(), ids, ids + len);
      return;
    }
  }
  const size_t before = out.size();
  auto whole =
      ignore_merges ? token_of_bytes.find(std::string(reinterpret_cast<const char*>(word), n)) : token_of_bytes.end();
  if (whole != token_of_bytes.end()) {
    out.push_back(whole->second);
  } else {
    bpe(word, n, out);
  }
  if (cacheable) cache.insert(word, n, h, out.data() + before, out.size() - before);
}

}  // namespace bpe

// ---------------------------------------------------------------------------------------------
// The tokenizer

struct Gpt2Tokenizer::Impl : bpe::Model {
  int32_t eot = -1;
};

void Gpt2Tokenizer::encode(std::string_view text, std::vector<int32_t>& out) const {
  FT_CHECK(impl_, "Gpt2Tokenizer: used before being loaded (use Gpt2Tokenizer::from_files)");
  const Impl& t = *impl_;
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  bpe::pretokenize(text, [&](size_t b, size_t e) { t.encode_word(s + b, e - b, out); });
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 16);
  encode(text, out);
  return out;
}

std::string Gpt2Tokenizer::decode(std::span<const int32_t> ids) const {
  FT_CHECK(impl_, "Gpt2Tokenizer: used before being loaded (use Gpt2Tokenizer::from_files)");
  return impl_->decode(ids, "Gpt2Tokenizer");
}

std::string_view Gpt2Tokenizer::token_bytes(int32_t id) const { return impl_ ? impl_->token(id) : std::string_view(); }

int64_t Gpt2Tokenizer::vocab_size() const { return impl_ ? static_cast<int64_t>(impl_->bytes_of.size()) : 0; }
int32_t Gpt2Tokenizer::eot_token() const { return impl_ ? impl_->eot : -1; }
int64_t Gpt2Tokenizer::merges() const { return impl_ ? impl_->merge_count : 0; }

// ---------------------------------------------------------------------------------------------
// Loading

namespace {

std::string read_whole_file(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  FT_CHECK(in.good(), "Gpt2Tokenizer: cannot open the ", what, " file '", path, "'");
  std::ostringstream os;
  os << in.rdbuf();
  FT_CHECK(!in.bad(), "Gpt2Tokenizer: error reading the ", what, " file '", path, "'");
  return os.str();
}

}  // namespace

namespace bpe {

std::string printable(std::string_view s) {
  std::string out;
  for (unsigned char c : s) {
    if (c >= 0x20 && c != 0x7F && c != '\\') {  // UTF-8 stays as it is; control bytes are escaped
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02X", c);
      out += buf;
    }
  }
  return out;
}

bool byte_level_to_bytes(std::string_view token, std::string& bytes) {
  static const std::unordered_map<uint32_t, uint8_t> byte_of = [] {
    std::unordered_map<uint32_t, uint8_t> m;
    for (int b = 0; b < 256; ++b) m[gpt2_byte_to_unicode()[b]] = static_cast<uint8_t>(b);
    return m;
  }();
  bytes.clear();
  const auto* s = reinterpret_cast<const unsigned char*>(token.data());
  for (size_t i = 0; i < token.size();) {
    uint32_t cp;
    const int len = decode_utf8(s, i, token.size(), cp);
    auto it = byte_of.find(cp);
    if (it == byte_of.end()) return false;
    bytes += static_cast<char>(it->second);
    i += len;
  }
  return true;
}

}  // namespace bpe

using bpe::printable;

Gpt2Tokenizer Gpt2Tokenizer::from_files(const std::string& encoder_path, const std::string& merges_path) {
  auto t = std::make_shared<Impl>();
  // --- encoder.json: token -> id
  {
    const std::string text = read_whole_file(encoder_path, "encoder");
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(text);
    } catch (const std::exception& e) {
      FT_FAIL("Gpt2Tokenizer: '", encoder_path, "' is not valid JSON (", e.what(),
              "); expected GPT-2's encoder.json, an object of token -> id");
    }
    FT_CHECK(j.is_object(), "Gpt2Tokenizer: '", encoder_path, "' expected a JSON object of token -> id, found ",
             j.type_name());
    FT_CHECK(!j.empty(), "Gpt2Tokenizer: '", encoder_path, "' expected a JSON object of token -> id, found {}");
    // Ids are dense, as in every GPT-2 vocabulary: N tokens have ids 0..N-1, each once.
    const auto max_id = static_cast<int64_t>(j.size()) - 1;
    for (const auto& [token, id] : j.items())
      FT_CHECK(id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() <= max_id, "Gpt2Tokenizer: '",
               encoder_path, "' token \"", printable(token), "\": expected an id from 0 to ", max_id, " (", j.size(),
               " tokens), found ", id.dump());
    t->bytes_of.assign(static_cast<size_t>(max_id + 1), std::string());
    t->used.assign(static_cast<size_t>(max_id + 1), 0);
    std::vector<std::string> name_of(static_cast<size_t>(max_id + 1));
    std::string bytes;
    for (const auto& [token, value] : j.items()) {
      const auto id = value.get<int32_t>();
      FT_CHECK(bpe::byte_level_to_bytes(token, bytes), "Gpt2Tokenizer: '", encoder_path, "' token \"", printable(token),
               "\" (id ", id, ") has a character outside GPT-2's byte alphabet (bytes_to_unicode)");
      FT_CHECK(!t->used[id], "Gpt2Tokenizer: '", encoder_path, "' expected each id once, found id ", id, " for both \"",
               printable(name_of[id]), "\" and \"", printable(token), "\"");
      t->used[id] = 1;
      t->bytes_of[id] = bytes;
      name_of[id] = token;
    }
    std::unordered_map<std::string_view, int32_t> id_of;
    for (int32_t id = 0; id <= max_id; ++id)
      if (t->used[id]) id_of.emplace(t->bytes_of[id], id);
    for (int b = 0; b < 256; ++b) {
      const char byte = static_cast<char>(b);
      auto found = id_of.find(std::string_view(&byte, 1));
      std::string written;
      append_utf8(written, gpt2_byte_to_unicode()[b]);
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02X", b);
      FT_CHECK(found != id_of.end(), "Gpt2Tokenizer: '", encoder_path,
               "' expected a token for every byte, found none for byte ", hex, " (written \"", written, "\")");
      t->byte_token[b] = found->second;
    }
    auto eot = id_of.find("<|endoftext|>");
    FT_CHECK(eot != id_of.end(), "Gpt2Tokenizer: '", encoder_path,
             "' expected the end-of-text token \"<|endoftext|>\", found none");
    t->eot = eot->second;

    // --- vocab.bpe: merge rules, highest priority first
    const std::string merges_text = read_whole_file(merges_path, "merges");
    std::vector<std::string_view> lines;
    for (size_t at = 0; at < merges_text.size();) {
      size_t end = merges_text.find('\n', at);
      if (end == std::string::npos) end = merges_text.size();
      std::string_view line(merges_text.data() + at, end - at);
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      lines.push_back(line);
      at = end + 1;
    }
    while (!lines.empty() && lines.back().empty()) lines.pop_back();  // the file's final newline
    size_t first = !lines.empty() && lines[0].starts_with("#version") ? 1 : 0;
    t->merges.reserve(lines.size());
    std::string left, right;
    for (size_t k = first; k < lines.size(); ++k) {
      const std::string_view line = lines[k];
      const size_t line_no = k + 1;
      const size_t sp = line.find(' ');
      FT_CHECK(sp != std::string_view::npos && sp > 0 && sp + 1 < line.size() &&
                   line.find(' ', sp + 1) == std::string_view::npos,
               "Gpt2Tokenizer: '", merges_path, "' line ", line_no,
               ": expected two tokens separated by one space, found \"", printable(line), "\"");
      const std::string_view a = line.substr(0, sp), b = line.substr(sp + 1);
      FT_CHECK(bpe::byte_level_to_bytes(a, left) && bpe::byte_level_to_bytes(b, right), "Gpt2Tokenizer: '", merges_path,
               "' line ", line_no, ": \"", printable(line), "\" has a character outside GPT-2's byte alphabet");
      auto ia = id_of.find(left), ib = id_of.find(right), im = id_of.find(left + right);
      const char* missing = ia == id_of.end() ? "left token" : ib == id_of.end() ? "right token" : "merged token";
      const std::string_view which = ia == id_of.end() ? a : ib == id_of.end() ? b : std::string_view();
      FT_CHECK(ia != id_of.end() && ib != id_of.end() && im != id_of.end(), "Gpt2Tokenizer: '", merges_path, "' line ",
               line_no, ": the ", missing, " \"",
               which.empty() ? printable(std::string(a) + std::string(b)) : printable(which),
               "\" is not in the vocabulary '", encoder_path, "'");
      const int32_t rank = static_cast<int32_t>(k - first);
      int32_t existing = -1;
      FT_CHECK(t->merges.insert(ia->second, ib->second, {rank, im->second}, existing), "Gpt2Tokenizer: '", merges_path,
               "' line ", line_no, ": expected each merge once, found \"", printable(line), "\" already on line ",
               existing + first + 1);
    }
    t->merge_count = static_cast<int64_t>(lines.size() - first);
  }
  return Gpt2Tokenizer(std::move(t));
}

}  // namespace ft::data
