// libFuzzer target: the .npy header parser (map_npy). Only ft::Error may escape the reader.
#include "fasttrain/error.h"
#include "fasttrain/npy.h"
#include "fuzz_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = ft::fuzz::write_input("npy", data, size);
  try {
    ft::Tensor t = ft::map_npy(path);
    (void)t.numel();
  } catch (const ft::Error&) {
  }
  return 0;
}
