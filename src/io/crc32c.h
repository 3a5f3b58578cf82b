// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78): the checksum stored per tensor in
// safetensors metadata. crc32c() uses the SSE4.2 crc32 instruction when the build targets it
// (several times faster; docs/PERF.md) and the table-driven slicing-by-8 reference otherwise;
// both give the same value (tested), so files written on one machine verify on any other.
#pragma once
#include <cstddef>
#include <cstdint>

namespace ft::io {

// Continues a running checksum: crc32c(b, crc32c(a)) == crc32c(a + b). Start with 0.
uint32_t crc32c(const void* data, size_t nbytes, uint32_t crc = 0);
uint32_t crc32c_portable(const void* data, size_t nbytes, uint32_t crc = 0);

}  // namespace ft::io
