// The byte-level BPE machinery shared by Gpt2Tokenizer (bpe_tokenizer.cpp) and the Hugging Face
// tokenizer.json tokenizer (tokenizer_json.cpp): UTF-8 decoding, the Unicode classes of GPT-2's
// pattern and its hand-written scan, the merge table, the per-thread word cache and the merge loop.
// Internal to the library (src/): the public header tokenizer.h shows none of it.
#pragma once
#include <climits>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace ft::data::bpe {

enum CharClass : uint8_t { kOther = 0, kLetter = 1, kNumber = 2, kSpace = 3 };

// class_of(cp) = blocks[block_of[cp >> 7]][cp & 127]. Of the 8704 blocks of 128 code points most
// are wholly "other" or wholly letters (CJK, Hangul), so a few hundred distinct blocks remain.
class ClassTable {
 public:
  ClassTable();  // from the generated ranges (bpe_tokenizer.cpp)
  uint8_t operator()(uint32_t cp) const {
    return static_cast<uint8_t>(blocks_[(size_t{block_of_[cp >> 7]} << 7) | (cp & 127)]);
  }

 private:
  std::vector<uint16_t> block_of_;
  std::string blocks_;
};

const ClassTable& class_table();

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

// The bytes a token written with bytes_to_unicode (gpt2_byte_to_unicode) stands for; false when a
// character is outside that alphabet or the text is not UTF-8.
bool byte_level_to_bytes(std::string_view token, std::string& bytes);

// `s` for an error message: UTF-8 as it is, control bytes and backslashes as \xNN.
std::string printable(std::string_view s);

// A byte-level BPE vocabulary: ids, the token of each byte, the merge rules. Words are raw bytes
// (byte-level pre-tokenisers write bytes as printable characters only so that tokens are text;
// here a byte's token is looked up directly).
struct Model {
  uint64_t id = 0;                    // tells a thread's word cache which model filled it
  std::vector<std::string> bytes_of;  // id -> the token's bytes ("" for an unused id)
  std::vector<uint8_t> used;          // id -> whether a token has it
  int32_t byte_token[256] = {};
  MergeTable merges;
  int64_t merge_count = 0;
  // Hugging Face's ignore_merges (Llama 3): a word that is itself a token is that token, unmerged.
  bool ignore_merges = false;
  std::unordered_map<std::string, int32_t> token_of_bytes;  // filled when ignore_merges is set

  Model();  // takes a fresh id
  // The bytes of the ids; an id no token has is an error naming `who` (the tokenizer class).
  std::string decode(std::span<const int32_t> ids, const char* who) const;
  // The bytes of one token (empty for an id no token has).
  std::string_view token(int32_t id) const {
    return id >= 0 && static_cast<size_t>(id) < bytes_of.size() ? std::string_view(bytes_of[id]) : std::string_view();
  }
  // Appends the ids of one pre-tokenised word, through this thread's word cache.
  void encode_word(const unsigned char* word, size_t n, std::vector<int32_t>& out) const;
  void bpe(const unsigned char* word, size_t n, std::vector<int32_t>& out) const;
  void bpe_direct(std::vector<int32_t>& syms) const;
  void bpe_heap(std::vector<int32_t>& syms) const;
};

}  // namespace ft::data::bpe
