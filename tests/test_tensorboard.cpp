// TensorBoard event files (src/train/tensorboard.cpp). The expected bytes come from a protobuf
// encoder and a bitwise CRC-32C written here from the specs, independently of the engine's; an
// independent Python reader (tests/support/read_tfevents.py) cross-checks the files, since
// Debian's python3 has neither tensorboard nor tensorflow.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "fasttrain/tensorboard.h"
#include "support/expect_error.h"

using ft::test::expect_error;
using namespace ft::train;
namespace fs = std::filesystem;

namespace {

// --- Independent encoding, from the TFRecord and protobuf specs ---------------------------------

using Bytes = std::vector<uint8_t>;

uint32_t bitwise_crc32c(const Bytes& data) {
  uint32_t crc = 0xFFFFFFFFu;
  for (uint8_t b : data) {
    crc ^= b;
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ ((crc & 1) ? 0x82F63B78u : 0u);
  }
  return ~crc;
}

uint32_t mask(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

void append_le(Bytes& out, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

void append_varint(Bytes& out, uint64_t v) {
  do {
    uint8_t b = v & 0x7f;
    v >>= 7;
    out.push_back(v ? (b | 0x80) : b);
  } while (v);
}

Bytes varint_field(int field, uint64_t v) {
  Bytes out{static_cast<uint8_t>(field << 3 | 0)};
  append_varint(out, v);
  return out;
}
Bytes double_field(int field, double v) {
  Bytes out{static_cast<uint8_t>(field << 3 | 1)};
  uint64_t bits;
  std::memcpy(&bits, &v, 8);
  append_le(out, bits, 8);
  return out;
}
Bytes float_field(int field, float v) {
  Bytes out{static_cast<uint8_t>(field << 3 | 5)};
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  append_le(out, bits, 4);
  return out;
}
Bytes bytes_field(int field, const Bytes& body) {
  Bytes out{static_cast<uint8_t>(field << 3 | 2)};
  append_varint(out, body.size());
  out.insert(out.end(), body.begin(), body.end());
  return out;
}
Bytes str(const std::string& s) { return Bytes(s.begin(), s.end()); }
Bytes cat(std::initializer_list<Bytes> parts) {
  Bytes out;
  for (const Bytes& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

Bytes record(const Bytes& payload) {
  Bytes len;
  append_le(len, payload.size(), 8);
  Bytes out = len;
  append_le(out, mask(bitwise_crc32c(len)), 4);
  out.insert(out.end(), payload.begin(), payload.end());
  append_le(out, mask(bitwise_crc32c(payload)), 4);
  return out;
}

Bytes scalar_event(double wall_time, int64_t step, const std::string& tag, float value) {
  Bytes summary_value = cat({bytes_field(1, str(tag)), float_field(2, value)});
  return cat({double_field(1, wall_time), varint_field(2, static_cast<uint64_t>(step)),
              bytes_field(5, bytes_field(1, summary_value))});
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// --- Fixture ------------------------------------------------------------------------------------

class TensorBoard : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("ft_tensorboard_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string file(const std::string& name) const { return (dir_ / name).string(); }

  static Bytes read_bytes(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return Bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  }
  static void write_bytes(const std::string& path, const Bytes& b) {
    std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), b.size());
  }

  fs::path dir_;
};

TEST_F(TensorBoard, WritesScalarsAndReadsThemBack) {
  const double before = now_seconds();
  std::string path;
  {
    TensorBoardWriter w(file("run/tb"));  // creates missing folders
    path = w.path();
    w.add_scalar("train/loss", 2.5, 1);
    w.add_scalar("train/lr", 1e-3, 1);
    w.add_scalar("train/loss", 1.0 / 3.0, 2);
    w.add_scalar("val/acc", -0.75, int64_t{1} << 40);
    w.flush();
  }
  const double after = now_seconds();
  EXPECT_EQ(fs::path(path).parent_path(), dir_ / "run/tb");
  EXPECT_EQ(fs::path(path).filename().string().rfind("events.out.tfevents.", 0), 0u) << path;

  std::vector<ScalarEvent> s = read_tensorboard_scalars(path);
  ASSERT_EQ(s.size(), 4u);  // the file_version event carries no scalar
  const std::vector<std::string> tags = {"train/loss", "train/lr", "train/loss", "val/acc"};
  const std::vector<double> values = {2.5, 1e-3, 1.0 / 3.0, -0.75};
  const std::vector<int64_t> steps = {1, 1, 2, int64_t{1} << 40};
  for (size_t i = 0; i < s.size(); ++i) {
    EXPECT_EQ(s[i].tag, tags[i]);
    EXPECT_EQ(s[i].value, static_cast<double>(static_cast<float>(values[i])));  // simple_value is f32
    EXPECT_EQ(s[i].step, steps[i]);
    EXPECT_GE(s[i].wall_time, before - 1e-3);
    EXPECT_LE(s[i].wall_time, after + 1e-3);
    if (i > 0) {
      EXPECT_GE(s[i].wall_time, s[i - 1].wall_time);
    }
  }
}

TEST_F(TensorBoard, FileBytesMatchTheSpec) {
  std::string path;
  {
    TensorBoardWriter w(dir_.string());
    path = w.path();
    w.add_scalar("loss", 0.125, 300);  // step 300 needs a two-byte varint
  }
  const Bytes actual = read_bytes(path);
  // Wall times are the clock's, so take them from the file at the offsets the spec puts them:
  // record header (12 bytes), then the wall_time key (0x09) and its 8 bytes.
  const Bytes version_payload = cat({double_field(1, 0), varint_field(2, 0), bytes_field(3, str("brain.Event:2"))});
  const size_t second = 12 + version_payload.size() + 4;
  ASSERT_GE(actual.size(), second + 21);
  auto wall_at = [&](size_t record_start) {
    EXPECT_EQ(actual[record_start + 12], 0x09);
    double w;
    std::memcpy(&w, actual.data() + record_start + 13, 8);
    return w;
  };
  const Bytes expected =
      cat({record(cat({double_field(1, wall_at(0)), varint_field(2, 0), bytes_field(3, str("brain.Event:2"))})),
           record(scalar_event(wall_at(second), 300, "loss", 0.125f))});
  EXPECT_EQ(actual, expected);
  // Spot-check the independent encoder against bytes written out by hand from the spec:
  // Summary.Value { tag: "a" (0x0a 0x01 'a'), simple_value: 1.0f (0x15, 00 00 80 3f) }.
  EXPECT_EQ(cat({bytes_field(1, str("a")), float_field(2, 1.0f)}),
            (Bytes{0x0a, 0x01, 'a', 0x15, 0x00, 0x00, 0x80, 0x3f}));
  EXPECT_EQ(varint_field(2, 300), (Bytes{0x10, 0xac, 0x02}));
}

TEST_F(TensorBoard, ReadsHandConstructedEventsSkippingUnknownFields) {
  // Fields in an unusual order, unknown fields of every wire type, a value without simple_value
  // (an image or tensor summary), and an event with no summary (a file_version event).
  Bytes value_a = cat({float_field(2, 4.5f), varint_field(7, 99), bytes_field(1, str("a"))});
  Bytes value_tensor = cat({bytes_field(1, str("hist")), bytes_field(8, str("opaque tensor"))});
  Bytes summary = cat({bytes_field(1, value_a), bytes_field(1, value_tensor),
                       bytes_field(1, cat({bytes_field(1, str("b")), float_field(2, -2.0f)}))});
  Bytes event = cat({bytes_field(5, summary), float_field(9, 1.0f), varint_field(2, 42), double_field(1, 1234.5),
                     double_field(11, 0.0)});
  write_bytes(file("events"),
              cat({record(cat({double_field(1, 1.0), bytes_field(3, str("brain.Event:2"))})), record(event)}));
  std::vector<ScalarEvent> s = read_tensorboard_scalars(file("events"));
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].tag, "a");
  EXPECT_EQ(s[0].value, 4.5);
  EXPECT_EQ(s[1].tag, "b");
  EXPECT_EQ(s[1].value, -2.0);
  for (const ScalarEvent& e : s) {
    EXPECT_EQ(e.step, 42);
    EXPECT_EQ(e.wall_time, 1234.5);
  }
  write_bytes(file("empty"), {});
  EXPECT_TRUE(read_tensorboard_scalars(file("empty")).empty());
}

TEST_F(TensorBoard, ReportsCorruptionWithTheByteOffset) {
  const Bytes first = record(scalar_event(1.0, 1, "x", 1.0f));
  const Bytes second = record(scalar_event(2.0, 2, "x", 2.0f));
  const Bytes good = cat({first, second});
  const std::string at_second = "at byte offset " + std::to_string(first.size());

  Bytes b = good;
  b[first.size() + 20] ^= 0x01;  // inside the second payload
  write_bytes(file("payload"), b);
  expect_error([&] { read_tensorboard_scalars(file("payload")); },
               file("payload") + ": corrupted record " + at_second + ": the payload's CRC-32C");

  b = good;
  b[first.size() + 1] ^= 0x40;  // the second record's length
  write_bytes(file("length"), b);
  expect_error([&] { read_tensorboard_scalars(file("length")); },
               "corrupted record " + at_second + ": the length's CRC-32C");

  b = good;
  b.back() ^= 0x01;  // the second payload's CRC itself
  write_bytes(file("crc"), b);
  expect_error([&] { read_tensorboard_scalars(file("crc")); }, "corrupted record " + at_second);

  // Valid framing around a broken protobuf: a length-delimited field longer than its message.
  const Bytes broken = {0x2a, 0x05, 0x0a, 0x01};
  write_bytes(file("proto"), cat({first, record(broken)}));
  expect_error(
      [&] { read_tensorboard_scalars(file("proto")); },
      "corrupted event at byte offset " + std::to_string(first.size() + 13) + ": length-delimited field of 5 bytes");
  write_bytes(file("varint"), record({0x10, 0x80, 0x80}));
  expect_error([&] { read_tensorboard_scalars(file("varint")); },
               "corrupted event at byte offset 13: truncated varint");
  write_bytes(file("wiretype"), record({0x2b}));  // field 5 as a start-group
  expect_error([&] { read_tensorboard_scalars(file("wiretype")); }, "Event.summary has wire type 3, expected 2");
  write_bytes(file("group"), record({0x33}));  // unknown field 6, start-group
  expect_error([&] { read_tensorboard_scalars(file("group")); }, "at byte offset 12: unsupported wire type 3");
}

TEST_F(TensorBoard, ReportsTruncationWithTheByteOffset) {
  const Bytes first = record(scalar_event(1.0, 1, "x", 1.0f));
  const Bytes good = cat({first, record(scalar_event(2.0, 2, "loss", 2.0f))});
  const std::string at_second = "truncated record at byte offset " + std::to_string(first.size());
  write_bytes(file("cut1"), Bytes(good.begin(), good.end() - 1));
  expect_error([&] { read_tensorboard_scalars(file("cut1")); }, file("cut1") + ": " + at_second + ": expected");
  write_bytes(file("cut2"), Bytes(good.begin(), good.begin() + first.size() + 5));
  expect_error([&] { read_tensorboard_scalars(file("cut2")); }, at_second + ": the header needs 12 bytes, found 5");
  write_bytes(file("cut3"), Bytes(good.begin(), good.begin() + first.size() + 14));
  expect_error([&] { read_tensorboard_scalars(file("cut3")); }, at_second);
  expect_error([&] { read_tensorboard_scalars(file("missing")); },
               file("missing") + ": cannot read TensorBoard event file");
}

TEST_F(TensorBoard, RejectsBadInput) {
  expect_error([] { TensorBoardWriter w(""); }, "expected a folder, found an empty string");
  write_bytes(file("plain"), {1});
  expect_error([&] { TensorBoardWriter w(file("plain")); }, file("plain") + ": cannot create the folder");
  TensorBoardWriter w(dir_.string());
  expect_error([&] { w.add_scalar("", 1.0, 0); }, "expected a tag, found an empty string");
  expect_error([&] { w.add_scalar("loss", 1.0, -1); }, "expected a step >= 0, found -1");
}

TEST_F(TensorBoard, WritersNeverShareAFile) {
  TensorBoardWriter a(dir_.string()), b(dir_.string());
  EXPECT_NE(a.path(), b.path());
  a.add_scalar("a", 1, 1);
  b.add_scalar("b", 2, 1);
  a.flush();
  b.flush();
  ASSERT_EQ(read_tensorboard_scalars(a.path()).size(), 1u);
  EXPECT_EQ(read_tensorboard_scalars(b.path())[0].tag, "b");
}

TEST_F(TensorBoard, IndependentPythonReaderAgrees) {
  if (::access("/usr/bin/python3", X_OK) != 0) GTEST_SKIP() << "/usr/bin/python3 not found: cross-check not run";
  TensorBoardWriter w(dir_.string());
  for (int step = 0; step < 5; ++step) {
    w.add_scalar("train/loss", 1.0 / (step + 1), step * 1000);
    w.add_scalar("train/grad_norm", 1e6 * step, step * 1000);
  }
  w.flush();  // the Python reader must see everything written before flush()
  const std::string script = (fs::path(__FILE__).parent_path() / "support" / "read_tfevents.py").string();
  const std::string cmd = "/usr/bin/python3 " + script + " '" + w.path() + "' '" + file("out.json") + "'";
  const int status = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << cmd;
  std::ifstream f(file("out.json"));
  const nlohmann::json doc = nlohmann::json::parse(f);
  EXPECT_EQ(doc["file_version"], "brain.Event:2");
  const std::vector<ScalarEvent> ours = read_tensorboard_scalars(w.path());
  ASSERT_EQ(doc["scalars"].size(), ours.size());
  ASSERT_EQ(ours.size(), 10u);
  for (size_t i = 0; i < ours.size(); ++i) {
    const nlohmann::json& e = doc["scalars"][i];
    EXPECT_EQ(e["tag"], ours[i].tag);
    EXPECT_EQ(e["value"].get<double>(), ours[i].value);
    EXPECT_EQ(e["step"].get<int64_t>(), ours[i].step);
    EXPECT_EQ(e["wall_time"].get<double>(), ours[i].wall_time);
  }
}

}  // namespace
