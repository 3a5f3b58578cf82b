// Atomic file replacement: readers (and a crash at any moment) see either the old file or the
// complete new one, never a half-written file. Data goes to "<path>.tmp.<pid>", which is
// fsync'd, renamed over <path>, and then the directory is fsync'd so the rename itself is
// durable. Used by every writer of weights, checkpoints and state; folders get the same through
// replace_folder.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

namespace ft {

class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(std::string path);  // creates the temporary file; throws if it cannot
  ~AtomicFileWriter();                          // removes the temporary file unless committed
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  void write(const void* data, size_t nbytes);  // throws ft::Error naming the file on failure
  void commit();                                // fsync, rename over the path, fsync the directory
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::string tmp_path_;
  int fd_ = -1;
  bool committed_ = false;
};

// The whole file in one call (JSON state, small text files).
void write_file_atomically(const std::string& path, std::string_view contents);

// Replaces folder `final_dir` by the fully written folder `tmp_dir` (checkpoints, exported model
// folders): a rename, then an fsync of the parent so the new entry survives a crash. An existing
// final_dir is swapped out atomically and then deleted, so a crash at any moment leaves a complete
// folder under the final name.
void replace_folder(const std::string& tmp_dir, const std::string& final_dir);

}  // namespace ft
