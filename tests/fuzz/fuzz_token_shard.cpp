// libFuzzer target: the llm.c token shard reader (magic, version, token count against the size).
#include "fasttrain/error.h"
#include "fasttrain/token_shards.h"
#include "fuzz_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = ft::fuzz::write_input("shard.bin", data, size);
  try {
    ft::data::TokenShard shard(path);
  } catch (const ft::Error&) {
  }
  return 0;
}
