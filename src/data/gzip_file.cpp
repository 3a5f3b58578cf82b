// Gzip-compressed files read whole into memory, for the downloads that are published compressed
// (MNIST's train-images-idx3-ubyte.gz and friends), so a user need not gunzip them first, as
// torchvision does not ask either. zlib (Debian's zlib1g) inflates the stream into an anonymous
// mapping that grows by doubling (mremap); the result is a MappedFile like any other, so every
// reader of mapped files takes it unchanged. A file of several gzip members (what `cat a.gz b.gz`
// makes, and what gzip itself accepts) decompresses to their concatenation.
#include <sys/mman.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "data/mapped_file.h"
#include "fasttrain/error.h"

namespace ft::data {

namespace {

// Far above any dataset file read whole, far below what would exhaust the address space: a
// corrupt or hostile length stops here with a message instead of at the out-of-memory killer.
constexpr size_t kMaxInflated = size_t{1} << 36;  // 64 GiB

// Grows an anonymous mapping to at least `need` bytes (doubling), keeping its contents.
void grow(MappedFile& out, size_t need) {
  size_t size = std::max<size_t>(out.size, 1 << 16);
  while (size < need) size *= 2;
  void* p = out.data ? ::mremap(out.data, out.size, size, MREMAP_MAYMOVE)
                     : ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  FT_CHECK(p != MAP_FAILED, out.path, ": cannot allocate ", size, " bytes to decompress into (", std::strerror(errno),
           ")");
  out.data = static_cast<char*>(p);
  out.size = size;
}

}  // namespace

bool is_gzip(const MappedFile& f) {
  return f.size >= 2 && static_cast<unsigned char>(f.data[0]) == 0x1f && static_cast<unsigned char>(f.data[1]) == 0x8b;
}

std::shared_ptr<const MappedFile> map_or_inflate(const std::string& path) {
  std::shared_ptr<const MappedFile> packed = map_file(path);
  if (!is_gzip(*packed)) return packed;
  auto out = std::make_shared<MappedFile>();
  out->path = path;
  z_stream z{};
  // 16 + MAX_WBITS: a gzip header and trailer (CRC-32 and length checked by zlib), not raw deflate.
  FT_CHECK(inflateInit2(&z, 16 + MAX_WBITS) == Z_OK, path, ": zlib could not start decompressing");
  struct End {
    z_stream& z;
    ~End() { inflateEnd(&z); }
  } end{z};
  size_t produced = 0;
  size_t consumed = 0;
  int status = Z_OK;
  packed->read([&] {
    while (consumed < packed->size) {
      if (status == Z_STREAM_END) {  // the next member of a multi-member file
        inflateReset(&z);
        status = Z_OK;
      }
      if (produced == out->size) {
        FT_CHECK(produced < kMaxInflated, path, ": decompresses to more than ", kMaxInflated,
                 " bytes (expected a dataset file)");
        grow(*out, produced + 1);
      }
      const size_t in_chunk = std::min<size_t>(packed->size - consumed, 1u << 30);
      const size_t out_chunk = std::min<size_t>(out->size - produced, 1u << 30);
      z.next_in = reinterpret_cast<Bytef*>(packed->data + consumed);
      z.avail_in = static_cast<uInt>(in_chunk);
      z.next_out = reinterpret_cast<Bytef*>(out->data + produced);
      z.avail_out = static_cast<uInt>(out_chunk);
      status = inflate(&z, Z_NO_FLUSH);
      consumed += in_chunk - z.avail_in;
      produced += out_chunk - z.avail_out;
      FT_CHECK(status == Z_OK || status == Z_STREAM_END || (status == Z_BUF_ERROR && z.avail_out == 0), path,
               ": not a valid gzip file (zlib: ", z.msg ? z.msg : "corrupt data", ", after ", consumed, " of ",
               packed->size, " bytes)");
    }
  });
  FT_CHECK(status == Z_STREAM_END, path, ": truncated gzip file (the compressed stream ends without its trailer after ",
           packed->size, " bytes; expected the whole download)");
  // Give back what the doubling over-allocated; an empty result is an empty MappedFile.
  if (produced == 0) {
    if (out->data) ::munmap(out->data, out->size);
    out->data = nullptr;
  } else if (produced < out->size) {
    void* p = ::mremap(out->data, out->size, produced, 0);
    if (p != MAP_FAILED)
      out->data = static_cast<char*>(p);
    else
      ::munmap(out->data + produced, out->size - produced);
  }
  out->size = produced;
  return out;
}

}  // namespace ft::data
