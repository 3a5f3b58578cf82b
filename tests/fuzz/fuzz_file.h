// Shared by the libFuzzer targets: the readers take paths, so each input is written to a file
// of this process's own (reused) temporary path before the reader opens it.
#pragma once
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

namespace ft::fuzz {

inline std::string write_input(const char* tag, const uint8_t* data, size_t size) {
  const std::string path = "/tmp/fasttrain_fuzz_" + std::to_string(::getpid()) + "_" + tag;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) __builtin_trap();  // the harness itself failed, not the reader
  if (size > 0 && std::fwrite(data, 1, size, f) != size) __builtin_trap();
  std::fclose(f);
  return path;
}

}  // namespace ft::fuzz
