// GPT-2's byte-level BPE (include/fasttrain/tokenizer.h): loading encoder.json and vocab.bpe, the
// pre-tokeniser, and the merge loop.
//
// Where the time goes and what keeps it low:
// - Pre-tokenisation is a hand-written scan of GPT-2's pattern (no regex engine here knows \p{L}):
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

#include "data/utf8.h"
#include "fasttrain/error.h"

namespace ft::data {

// ---------------------------------------------------------------------------------------------
// Unicode classes and UTF-8

namespace {

enum CharClass : uint8_t { kOther = 0, kLetter = 1, kNumber = 2, kSpace = 3 };

struct ClassRange {
  uint32_t first, last;
  uint8_t cls;
};

constexpr uint8_t L = kLetter, N = kNumber, S = kSpace;
constexpr ClassRange kClassRanges[] = {
#include "data/unicode_classes.inc"
};

// class_of(cp) = blocks[block_of[cp >> 7]][cp & 127]. Of the 8704 blocks of 128 code points most
// are wholly "other" or wholly letters (CJK, Hangul), so a few hundred distinct blocks remain.
class ClassTable {
 public:
  ClassTable() {
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
  uint8_t operator()(uint32_t cp) const {
    return static_cast<uint8_t>(blocks_[(size_t{block_of_[cp >> 7]} << 7) | (cp & 127)]);
  }

 private:
  std::vector<uint16_t> block_of_;
  std::string blocks_;
};

const ClassTable& class_table() {
  static const ClassTable table;
  return table;
}

// Decodes the code point at s[i] (RFC 3629: no overlong forms, no surrogates, nothing past
// U+10FFFF). Returns its length in bytes; `cp` is 0xFFFD for a byte that starts no valid sequence,
// which then counts as a one-byte character.
inline int decode_utf8(const unsigned char* s, size_t i, size_t n, uint32_t& cp) {
  const unsigned char b = s[i];
  if (b < 0x80) {
    cp = b;
    return 1;
  }
  int need;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b >= 0xC2 && b <= 0xDF) {
    cp = b & 0x1Fu, need = 1;
  } else if (b >= 0xE0 && b <= 0xEF) {
    cp = b & 0x0Fu, need = 2;
    if (b == 0xE0) lo = 0xA0;
    if (b == 0xED) hi = 0x9F;
  } else if (b >= 0xF0 && b <= 0xF4) {
    cp = b & 0x07u, need = 3;
    if (b == 0xF0) lo = 0x90;
    if (b == 0xF4) hi = 0x8F;
  } else {
    cp = 0xFFFD;
    return 1;
  }
  if (i + static_cast<size_t>(need) >= n) {  // the text ends inside the sequence
    cp = 0xFFFD;
    return 1;
  }
  for (int k = 1; k <= need; ++k) {
    const unsigned char c = s[i + k];
    if (c < lo || c > hi) {
      cp = 0xFFFD;
      return 1;
    }
    lo = 0x80, hi = 0xBF;
    cp = (cp << 6) | (c & 0x3Fu);
  }
  return need + 1;
}

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

// ---------------------------------------------------------------------------------------------
// Pre-tokenisation

namespace {

// Calls on_word(begin, end) for each match of GPT-2's pattern, in order. The alternatives are
// tried in the pattern's order at each position; each branch below is one of them.
template <class F>
void pretokenize(std::string_view text, F&& on_word) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  const ClassTable& cls = class_table();
  uint32_t cp;
  size_t i = 0;
  while (i < n) {
    const size_t start = i;
    // 's 't 're 've 'm 'll 'd (lower case only, as in the pattern).
    if (s[i] == '\'' && i + 1 < n) {
      const unsigned char a = s[i + 1];
      if (a == 's' || a == 't' || a == 'm' || a == 'd') {
        on_word(start, i + 2);
        i += 2;
        continue;
      }
      if (i + 2 < n &&
          ((a == 'r' && s[i + 2] == 'e') || (a == 'v' && s[i + 2] == 'e') || (a == 'l' && s[i + 2] == 'l'))) {
        on_word(start, i + 3);
        i += 3;
        continue;
      }
    }
    int len = decode_utf8(s, i, n, cp);
    uint8_t c = cls(cp);
    // ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`: an optional space, then a run of one class.
    if (s[i] == ' ' && i + 1 < n) {
      uint32_t cp2;
      const int len2 = decode_utf8(s, i + 1, n, cp2);
      const uint8_t c2 = cls(cp2);
      if (c2 != kSpace) {
        i += 1;
        len = len2;
        c = c2;
      }
    }
    if (c != kSpace) {
      i += len;
      while (i < n) {
        len = decode_utf8(s, i, n, cp);
        if (cls(cp) != c) break;
        i += len;
      }
      on_word(start, i);
      continue;
    }
    // `\s+(?!\S)`: a whitespace run, less its last character when non-space follows it (that
    // character then starts the next word, e.g. the space before a letter); `\s+` when the run
    // is a single character followed by non-space.
    size_t last = i;  // start of the run's last character
    i += len;
    while (i < n) {
      len = decode_utf8(s, i, n, cp);
      if (cls(cp) != kSpace) break;
      last = i;
      i += len;
    }
    if (i < n && last > start) i = last;
    on_word(start, i);
  }
}

}  // namespace

std::vector<std::string_view> gpt2_pretokenize(std::string_view text) {
  std::vector<std::string_view> words;
  pretokenize(text, [&](size_t b, size_t e) { words.push_back(text.substr(b, e - b)); });
  return words;
}

// ---------------------------------------------------------------------------------------------
// The tokenizer

namespace {

// Merge rules keyed by (left id, right id): open addressing with linear probing, load <= 1/2.
class MergeTable {
 public:
  struct Rule {
    int32_t rank, merged;
  };
  void reserve(size_t rules) {
    size_t cap = 16;
    while (cap < 2 * rules) cap <<= 1;
    keys_.assign(cap, kEmpty);
    rules_.assign(cap, Rule{-1, -1});
    mask_ = cap - 1;
  }
  // Returns false when the pair is already there (its rank in `existing`).
  bool insert(int32_t a, int32_t b, Rule r, int32_t& existing) {
    const uint64_t k = key(a, b);
    for (size_t h = hash(k);; h = (h + 1) & mask_) {
      if (keys_[h] == k) {
        existing = rules_[h].rank;
        return false;
      }
      if (keys_[h] == kEmpty) {
        keys_[h] = k;
        rules_[h] = r;
        return true;
      }
    }
  }
  // The rule for the pair, or rank INT32_MAX when there is none.
  Rule find(int32_t a, int32_t b) const {
    const uint64_t k = key(a, b);
    for (size_t h = hash(k);; h = (h + 1) & mask_) {
      if (keys_[h] == k) return rules_[h];
      if (keys_[h] == kEmpty) return Rule{INT32_MAX, -1};
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  static uint64_t key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }
  size_t hash(uint64_t k) const { return static_cast<size_t>((k * 0x9E3779B97F4A7C15ull) >> 29) & mask_; }
  std::vector<uint64_t> keys_;
  std::vector<Rule> rules_;
  size_t mask_ = 0;
};

std::string read_whole_file(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  FT_CHECK(in.good(), "Gpt2Tokenizer: cannot open the ", what, " file '", path, "'");
  std::ostringstream os;
  os << in.rdbuf();
  FT_CHECK(!in.bad(), "Gpt2Tokenizer: error reading the ", what, " file '", path, "'");
  return os.str();
}

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

constexpr size_t kHeapBpeSymbols = 64;   // words longer than this (in bytes) take the heap path
constexpr size_t kCachedWordBytes = 64;  // longer words are rarely repeated: not cached

std::atomic<uint64_t> next_tokenizer_id{1};

}  // namespace

struct Gpt2Tokenizer::Impl {
  uint64_t id = next_tokenizer_id++;  // tells a thread's cache which tokenizer filled it
  std::vector<std::string> bytes_of;  // id -> the token's bytes ("" for an unused id)
  std::vector<uint8_t> used;          // id -> whether a token has it
  std::array<int32_t, 256> byte_token{};
  MergeTable merges;
  int64_t merge_count = 0;
  int32_t eot = -1;

  void bpe(const unsigned char* word, size_t n, std::vector<int32_t>& out) const;
  void bpe_direct(std::vector<int32_t>& syms) const;
  void bpe_heap(std::vector<int32_t>& syms) const;
};

// Merge until no adjacent pair has a rule: per round, the lowest-ranked pair is merged at every
// place it occurs, left to right and without overlap.
void Gpt2Tokenizer::Impl::bpe_direct(std::vector<int32_t>& syms) const {
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
void Gpt2Tokenizer::Impl::bpe_heap(std::vector<int32_t>& syms) const {
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

void Gpt2Tokenizer::Impl::bpe(const unsigned char* word, size_t n, std::vector<int32_t>& out) const {
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

namespace {

// word bytes -> token ids, open addressing over slots that point into two arenas (the words'
// bytes and the ids), so a lookup is one hash of the word, one probe on average and one memcmp,
// with no allocation per word. Emptied whole when full: frequent words come back at once.
class WordCache {
 public:
  uint64_t owner = 0;  // the tokenizer that filled it

  void reset(uint64_t tokenizer) {
    owner = tokenizer;
    slots_.assign(kSlots, Slot{});
    bytes_.clear();
    ids_.clear();
    size_ = 0;
  }
  static uint64_t hash(const unsigned char* p, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ n;
    for (; n >= 8; p += 8, n -= 8) {
      uint64_t w;
      std::memcpy(&w, p, 8);
      h = (h ^ w) * 0xBF58476D1CE4E5B9ull;
      h ^= h >> 29;
    }
    uint64_t w = 0;
    std::memcpy(&w, p, n);
    h = (h ^ w) * 0x94D049BB133111EBull;
    return h ^ (h >> 31);
  }
  // The cached ids of the word, or nullptr (then `len` is unchanged).
  const int32_t* find(const unsigned char* word, size_t n, uint64_t h, uint32_t& len) const {
    for (size_t k = h & (kSlots - 1);; k = (k + 1) & (kSlots - 1)) {
      const Slot& s = slots_[k];
      if (s.ids_len == 0) return nullptr;
      if (s.hash == h && s.bytes_len == n && same_bytes(bytes_.data() + s.bytes_at, word, n)) {
        len = s.ids_len;
        return ids_.data() + s.ids_at;
      }
    }
  }
  // Words are short: comparing 8 bytes at a time inline beats a call to memcmp.
  static bool same_bytes(const unsigned char* a, const unsigned char* b, size_t n) {
    for (; n >= 8; a += 8, b += 8, n -= 8) {
      uint64_t x, y;
      std::memcpy(&x, a, 8);
      std::memcpy(&y, b, 8);
      if (x != y) return false;
    }
    for (; n > 0; ++a, ++b, --n)
      if (*a != *b) return false;
    return true;
  }
  void insert(const unsigned char* word, size_t n, uint64_t h, const int32_t* ids, size_t count) {
    if (size_ >= kSlots / 2) reset(owner);  // keeps probes short
    size_t k = h & (kSlots - 1);
    while (slots_[k].ids_len != 0) k = (k + 1) & (kSlots - 1);
    slots_[k] = Slot{h, static_cast<uint32_t>(bytes_.size()), static_cast<uint32_t>(ids_.size()),
                     static_cast<uint16_t>(n), static_cast<uint16_t>(count)};
    bytes_.insert(bytes_.end(), word, word + n);
    ids_.insert(ids_.end(), ids, ids + count);
    ++size_;
  }

 private:
  struct Slot {
    uint64_t hash = 0;
    uint32_t bytes_at = 0, ids_at = 0;
    uint16_t bytes_len = 0, ids_len = 0;  // ids_len 0: empty (every word has at least one token)
  };
  static constexpr size_t kSlots = size_t{1} << 18;
  std::vector<Slot> slots_;
  std::vector<unsigned char> bytes_;
  std::vector<int32_t> ids_;
  size_t size_ = 0;
};

}  // namespace

void Gpt2Tokenizer::encode(std::string_view text, std::vector<int32_t>& out) const {
  FT_CHECK(impl_, "Gpt2Tokenizer: used before being loaded (use Gpt2Tokenizer::from_files)");
  const Impl& t = *impl_;
  thread_local WordCache cache;
  if (cache.owner != t.id) cache.reset(t.id);
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  pretokenize(text, [&](size_t b, size_t e) {
    const size_t n = e - b;
    if (n == 1) {
      out.push_back(t.byte_token[s[b]]);
      return;
    }
    const bool cacheable = n <= kCachedWordBytes;
    const uint64_t h = cacheable ? WordCache::hash(s + b, n) : 0;
    if (cacheable) {
      uint32_t len = 0;
      if (const int32_t* ids = cache.find(s + b, n, h, len)) {
        out.insert(out.end(), ids, ids + len);
        return;
      }
    }
    const size_t before = out.size();
    t.bpe(s + b, n, out);
    if (cacheable) cache.insert(s + b, n, h, out.data() + before, out.size() - before);
  });
}

std::vector<int32_t> Gpt2Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 16);
  encode(text, out);
  return out;
}

std::string Gpt2Tokenizer::decode(std::span<const int32_t> ids) const {
  FT_CHECK(impl_, "Gpt2Tokenizer: used before being loaded (use Gpt2Tokenizer::from_files)");
  std::string out;
  for (size_t k = 0; k < ids.size(); ++k) {
    const int32_t id = ids[k];
    FT_CHECK(id >= 0 && id < vocab_size() && impl_->used[id], "Gpt2Tokenizer::decode: token ", k, " is id ", id,
             ", which is not in the vocabulary (ids 0-", vocab_size() - 1, ")");
    out += impl_->bytes_of[id];
  }
  return out;
}

std::string_view Gpt2Tokenizer::token_bytes(int32_t id) const {
  if (!impl_ || id < 0 || id >= vocab_size()) return {};
  return impl_->bytes_of[id];
}

int64_t Gpt2Tokenizer::vocab_size() const { return impl_ ? static_cast<int64_t>(impl_->bytes_of.size()) : 0; }
int32_t Gpt2Tokenizer::eot_token() const { return impl_ ? impl_->eot : -1; }
int64_t Gpt2Tokenizer::merges() const { return impl_ ? impl_->merge_count : 0; }

// ---------------------------------------------------------------------------------------------
// Loading

namespace {

// The bytes a token written with bytes_to_unicode stands for; false when a character is outside
// that alphabet or the text is not UTF-8.
bool token_to_bytes(std::string_view token, std::string& bytes) {
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

}  // namespace

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
      FT_CHECK(token_to_bytes(token, bytes), "Gpt2Tokenizer: '", encoder_path, "' token \"", printable(token),
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
      FT_CHECK(token_to_bytes(a, left) && token_to_bytes(b, right), "Gpt2Tokenizer: '", merges_path, "' line ", line_no,
               ": \"", printable(line), "\" has a character outside GPT-2's byte alphabet");
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
