// libFuzzer target: the safetensors loader (header JSON, dtypes, offsets against the file size).
#include "fasttrain/error.h"
#include "fasttrain/safetensors.h"
#include "fuzz_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = ft::fuzz::write_input("safetensors", data, size);
  try {
    ft::SafetensorsFile f = ft::load_safetensors(path);
    (void)f.tensors.size();
  } catch (const ft::Error&) {
  }
  return 0;
}
