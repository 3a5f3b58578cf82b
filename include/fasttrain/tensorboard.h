// TensorBoard event files written by the engine itself (no TensorFlow): the TFRecord framing
// (u64 length, masked CRC-32C of the length, payload, masked CRC-32C of the payload) around
// tensorflow.Event protocol buffers encoded by hand (wall_time, step, file_version, and
// summary { value { tag, simple_value } }). TensorBoard reads `events.out.tfevents.*` files from
// the run folder. Implemented in src/train/tensorboard.cpp.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace ft::train {

class TensorBoardWriter {
 public:
  // Creates <dir>/events.out.tfevents.<seconds>.<host>.<pid>.fasttrain and writes the
  // file_version event ("brain.Event:2"). Throws ft::Error naming the path when it cannot.
  explicit TensorBoardWriter(const std::string& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;
  void add_scalar(const std::string& tag, double value, int64_t step);
  void flush();  // fflush + fsync: a crash after flush() loses nothing written before it
  const std::string& path() const { return path_; }

 private:
  void write_record();  // frames event_ as a TFRecord and appends it to the file

  std::string path_;
  std::FILE* file_ = nullptr;
  // Encoding buffers reused by every add_scalar (no allocation per step once grown).
  std::string value_, summary_, event_, record_;
};

// A scalar read back from an event file.
struct ScalarEvent {
  std::string tag;
  double value = 0;
  int64_t step = 0;
  double wall_time = 0;
};
// Reads every scalar of an event file, checking both CRCs of every record and the protobuf
// framing; a truncated or corrupted file is an ft::Error naming the path and the byte offset.
std::vector<ScalarEvent> read_tensorboard_scalars(const std::string& path);

}  // namespace ft::train
