// TensorBoard event files (tensorboard.h): TFRecord framing around hand-encoded tensorflow.Event
// protocol buffers, and a decoder of the same wire format for reading scalars back.
#include "fasttrain/tensorboard.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>

#include "fasttrain/error.h"
#include "io/crc32c.h"
#include "train/run_files.h"

namespace ft::train {

namespace {

// --- Wire format shared by the writer and the reader -------------------------------------------

// Protocol buffer wire types (the low 3 bits of a field key).
enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

// Field numbers of the messages we write (tensorflow/core/util/event.proto, summary.proto).
constexpr uint32_t kEventWallTime = 1, kEventStep = 2, kEventFileVersion = 3, kEventSummary = 5;
constexpr uint32_t kSummaryValue = 1;
constexpr uint32_t kValueTag = 1, kValueSimpleValue = 2;

constexpr size_t kRecordHeader = 12;  // u64 length + masked CRC of the length
constexpr size_t kRecordFooter = 4;   // masked CRC of the payload

// TFRecord stores CRCs masked so that a CRC computed over data that itself contains CRCs stays
// well distributed.
uint32_t masked_crc(const void* data, size_t n) {
  const uint32_t crc = io::crc32c(data, n);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

void put_le(std::string& out, uint64_t v, int nbytes) {
  for (int i = 0; i < nbytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t get_le(const unsigned char* p, int nbytes) {
  uint64_t v = 0;
  for (int i = 0; i < nbytes; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void put_key(std::string& out, uint32_t field, WireType type) { put_varint(out, (uint64_t{field} << 3) | type); }

void put_bytes(std::string& out, uint32_t field, const std::string& bytes) {
  put_key(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out += bytes;
}

// Event { wall_time, step } followed by the caller's fields.
void put_event_header(std::string& out, double wall_time, int64_t step) {
  uint64_t bits;
  std::memcpy(&bits, &wall_time, sizeof bits);
  put_key(out, kEventWallTime, kFixed64);
  put_le(out, bits, 8);
  put_key(out, kEventStep, kVarint);
  put_varint(out, static_cast<uint64_t>(step));
}

double wall_clock_seconds() {
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

std::string host_name() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0 || host[0] == '\0') return "localhost";
  return host;
}

// --- Reading -----------------------------------------------------------------------------------

// A protocol buffer message being decoded: [p, end) with `base` the file offset of p's start, so
// every error names the byte offset in the file.
class MessageReader {
 public:
  MessageReader(const std::string& path, const unsigned char* begin, const unsigned char* end, size_t base)
      : path_(path), begin_(begin), p_(begin), end_(end), base_(base) {}

  bool done() const { return p_ == end_; }
  size_t offset() const { return base_ + static_cast<size_t>(p_ - begin_); }

  uint64_t varint() {
    const size_t start = offset();
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (p_ == end_) fail(start, "truncated varint");
      const unsigned char b = *p_++;
      v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) return v;
    }
    fail(start, "varint longer than 10 bytes");
  }

  // Reads a field key; returns the field number and sets `type`.
  uint32_t key(WireType& type) {
    const size_t start = offset();
    const uint64_t k = varint();
    const uint64_t field = k >> 3;
    type = static_cast<WireType>(k & 7);
    if (field == 0 || field > 0x1fffffff) fail(start, "invalid field number ", field);
    return static_cast<uint32_t>(field);
  }

  uint64_t fixed(int nbytes) {
    need(static_cast<size_t>(nbytes), "fixed-width field");
    const uint64_t v = get_le(p_, nbytes);
    p_ += nbytes;
    return v;
  }

  // The body of a length-delimited field, as a reader of its own.
  MessageReader sub() {
    const size_t start = offset();
    const uint64_t n = varint();
    if (n > static_cast<uint64_t>(end_ - p_))
      fail(start, "length-delimited field of ", n, " bytes runs past the end of its message (", end_ - p_,
           " bytes left)");
    MessageReader r(path_, p_, p_ + n, offset());
    p_ += n;
    return r;
  }

  std::string bytes() {
    MessageReader r = sub();
    return std::string(reinterpret_cast<const char*>(r.p_), static_cast<size_t>(r.end_ - r.p_));
  }

  void skip(WireType type, size_t key_offset) {
    switch (type) {
      case kVarint: varint(); return;
      case kFixed64: fixed(8); return;
      case kFixed32: fixed(4); return;
      case kLengthDelimited: sub(); return;
    }
    fail(key_offset, "unsupported wire type ", static_cast<int>(type));
  }

  // A known field arrived with another wire type than the schema's.
  void expect_type(WireType found, WireType expected, const char* field, size_t key_offset) {
    if (found != expected)
      fail(key_offset, field, " has wire type ", static_cast<int>(found), ", expected ", static_cast<int>(expected));
  }

  template <class... Args>
  [[noreturn]] void fail(size_t at, const Args&... args) const {
    FT_FAIL(path_, ": corrupted event at byte offset ", at, ": ", args...);
  }

 private:
  void need(size_t n, const char* what) {
    if (n > static_cast<size_t>(end_ - p_))
      fail(offset(), "truncated ", what, ": needs ", n, " bytes, found ", end_ - p_);
  }

  const std::string& path_;
  const unsigned char* begin_;
  const unsigned char* p_;
  const unsigned char* end_;
  size_t base_;
};

// Summary.Value: appends a scalar when the value carries simple_value (images, histograms and
// tensors are skipped).
void read_value(MessageReader r, double wall_time, int64_t step, std::vector<ScalarEvent>& out) {
  ScalarEvent e;
  e.wall_time = wall_time;
  e.step = step;
  bool has_value = false;
  while (!r.done()) {
    const size_t at = r.offset();
    WireType type;
    const uint32_t field = r.key(type);
    if (field == kValueTag) {
      r.expect_type(type, kLengthDelimited, "Summary.Value.tag", at);
      e.tag = r.bytes();
    } else if (field == kValueSimpleValue) {
      r.expect_type(type, kFixed32, "Summary.Value.simple_value", at);
      const auto bits = static_cast<uint32_t>(r.fixed(4));
      float f;
      std::memcpy(&f, &bits, sizeof f);
      e.value = f;
      has_value = true;
    } else {
      r.skip(type, at);
    }
  }
  if (has_value) out.push_back(std::move(e));
}

void read_event(MessageReader r, std::vector<ScalarEvent>& out) {
  double wall_time = 0;
  int64_t step = 0;
  // Summaries may precede wall_time/step in a valid encoding, so decode them after the scan.
  std::vector<MessageReader> summaries;
  while (!r.done()) {
    const size_t at = r.offset();
    WireType type;
    const uint32_t field = r.key(type);
    if (field == kEventWallTime) {
      r.expect_type(type, kFixed64, "Event.wall_time", at);
      const uint64_t bits = r.fixed(8);
      std::memcpy(&wall_time, &bits, sizeof wall_time);
    } else if (field == kEventStep) {
      r.expect_type(type, kVarint, "Event.step", at);
      step = static_cast<int64_t>(r.varint());
    } else if (field == kEventSummary) {
      r.expect_type(type, kLengthDelimited, "Event.summary", at);
      summaries.push_back(r.sub());
    } else {
      r.skip(type, at);
    }
  }
  for (MessageReader& s : summaries) {
    while (!s.done()) {
      const size_t at = s.offset();
      WireType type;
      const uint32_t field = s.key(type);
      if (field == kSummaryValue) {
        s.expect_type(type, kLengthDelimited, "Summary.value", at);
        read_value(s.sub(), wall_time, step, out);
      } else {
        s.skip(type, at);
      }
    }
  }
}

}  // namespace

// --- Writer ------------------------------------------------------------------------------------

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  FT_CHECK(!dir.empty(), "TensorBoard writer: expected a folder, found an empty string");
  make_dirs(dir);
  const std::string base = dir + "/events.out.tfevents." + std::to_string(static_cast<int64_t>(std::time(nullptr))) +
                           "." + host_name() + "." + std::to_string(::getpid()) + ".fasttrain";
  // "x": never append to another writer's file (two writers opened in the same second).
  path_ = base;
  for (int i = 2; (file_ = std::fopen(path_.c_str(), "wbx")) == nullptr && errno == EEXIST; ++i)
    path_ = base + "." + std::to_string(i);
  FT_CHECK(file_ != nullptr, path_, ": cannot create the TensorBoard event file: ", std::strerror(errno));
  put_event_header(event_, wall_clock_seconds(), 0);
  put_bytes(event_, kEventFileVersion, "brain.Event:2");
  write_record();
}

TensorBoardWriter::~TensorBoardWriter() {
  if (!file_) return;
  // Errors cannot be reported from a destructor; flush() is where a caller learns of them.
  if (std::fflush(file_) == 0) ::fsync(::fileno(file_));
  std::fclose(file_);
}

void TensorBoardWriter::add_scalar(const std::string& tag, double value, int64_t step) {
  FT_CHECK(!tag.empty(), path_, ": add_scalar: expected a tag, found an empty string");
  FT_CHECK(step >= 0, path_, ": add_scalar '", tag, "': expected a step >= 0, found ", step);
  value_.clear();
  put_bytes(value_, kValueTag, tag);
  put_key(value_, kValueSimpleValue, kFixed32);
  const auto f = static_cast<float>(value);  // simple_value is a float in summary.proto
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  put_le(value_, bits, 4);
  summary_.clear();
  put_bytes(summary_, kSummaryValue, value_);
  event_.clear();
  put_event_header(event_, wall_clock_seconds(), step);
  put_bytes(event_, kEventSummary, summary_);
  write_record();
}

void TensorBoardWriter::write_record() {
  record_.clear();
  put_le(record_, event_.size(), 8);
  put_le(record_, masked_crc(record_.data(), 8), 4);
  record_ += event_;
  put_le(record_, masked_crc(event_.data(), event_.size()), 4);
  FT_CHECK(std::fwrite(record_.data(), 1, record_.size(), file_) == record_.size(), path_,
           ": write of a TensorBoard event failed: ", std::strerror(errno));
}

void TensorBoardWriter::flush() {
  FT_CHECK(std::fflush(file_) == 0, path_, ": flush failed: ", std::strerror(errno));
  FT_CHECK(::fsync(::fileno(file_)) == 0, path_, ": fsync failed: ", std::strerror(errno));
}

// --- Reader ------------------------------------------------------------------------------------

std::vector<ScalarEvent> read_tensorboard_scalars(const std::string& path) {
  const std::string data = read_text(path, "TensorBoard event file");
  const auto* bytes = reinterpret_cast<const unsigned char*>(data.data());
  std::vector<ScalarEvent> out;
  size_t at = 0;
  while (at < data.size()) {
    const size_t left = data.size() - at;
    FT_CHECK(left >= kRecordHeader, path, ": truncated record at byte offset ", at, ": the header needs ",
             kRecordHeader, " bytes, found ", left);
    const uint64_t length = get_le(bytes + at, 8);
    const auto length_crc = static_cast<uint32_t>(get_le(bytes + at + 8, 4));
    FT_CHECK(length_crc == masked_crc(bytes + at, 8), path, ": corrupted record at byte offset ", at,
             ": the length's CRC-32C does not match");
    FT_CHECK(length <= left - kRecordHeader && left - kRecordHeader - length >= kRecordFooter, path,
             ": truncated record at byte offset ", at, ": expected ", length, " payload bytes and a ", kRecordFooter,
             "-byte CRC, found ", left - kRecordHeader, " bytes");
    const size_t payload = at + kRecordHeader;
    const auto payload_crc = static_cast<uint32_t>(get_le(bytes + payload + length, 4));
    FT_CHECK(payload_crc == masked_crc(bytes + payload, length), path, ": corrupted record at byte offset ", at,
             ": the payload's CRC-32C does not match");
    read_event(MessageReader(path, bytes + payload, bytes + payload + length, payload), out);
    at = payload + length + kRecordFooter;
  }
  return out;
}

}  // namespace ft::train
