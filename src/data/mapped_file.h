// A whole file mapped into memory, shared by every reader that hands out zero-copy views of it
// (token shards, .npy arrays, MNIST, CIFAR-10). The mapping lives as long as its last owner: a
// reader, or a tensor made with from_blob whose deleter holds the shared_ptr.
#pragma once
#include <cstddef>
#include <memory>
#include <string>

#include "io/mapped_read.h"

namespace ft::data {

struct MappedFile {
  MappedFile() = default;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();  // unmaps

  std::string path;
  char* data = nullptr;  // nullptr for an empty file
  size_t size = 0;

  // Runs `copy` (a plain loop reading this mapping) so that the file being truncated by another
  // program meanwhile is an ft::Error naming it, not a SIGBUS that kills the run (io/mapped_read.h).
  template <class F>
  void read(F&& copy) const {
    io::guarded_read(path, data, size, copy);
  }
};

// Maps `path` (MAP_PRIVATE, read-write). Private and writable because from_blob tensors are
// writable: an in-place op on such a view changes this process's copy-on-write pages, never the
// file, and never faults. Throws ft::Error naming the file when it cannot be opened or mapped.
std::shared_ptr<const MappedFile> map_file(const std::string& path);

// Whether the file starts with gzip's magic bytes (1f 8b).
bool is_gzip(const MappedFile& f);
// `path` mapped as map_file does, or, when it is gzip-compressed (by its content, whatever its
// name), its decompressed bytes in anonymous memory (gzip_file.cpp). A corrupt or truncated gzip
// stream is an ft::Error naming the file.
std::shared_ptr<const MappedFile> map_or_inflate(const std::string& path);

}  // namespace ft::data
