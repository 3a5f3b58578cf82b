// safetensors reader and writer. The layout follows the reference implementation
// (huggingface/safetensors): header JSON padded with spaces to a multiple of 8 bytes, tensors
// packed back to back in the data section with no gaps, offsets relative to its start. Loading
// maps the file, validates the whole header before copying anything, and verifies the CRC-32C
// checksums this writer stores in "__metadata__" (files from other writers have none and load
// without the check).
#include "fasttrain/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <set>

#include <nlohmann/json.hpp>

#include "core/fault_injection.h"
#include "fasttrain/atomic_file.h"
#include "io/crc32c.h"
#include "io/mapped_read.h"

namespace ft {
namespace {

using ordered_json = nlohmann::ordered_json;

constexpr const char* kMetadataKey = "__metadata__";
constexpr const char* kChecksumPrefix = "crc32c.";
constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the reference reader's limit

const char* safetensors_dtype(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::F64: return "F64";
    case DType::BF16: return "BF16";
    case DType::F16: return "F16";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
    case DType::U8: return "U8";
    case DType::Bool: return "BOOL";
  }
  FT_FAIL("safetensors: unhandled dtype");
}

bool parse_dtype(const std::string& s, DType& out) {
  for (DType t : {DType::F32, DType::F64, DType::BF16, DType::F16, DType::I32, DType::I64, DType::U8, DType::Bool})
    if (s == safetensors_dtype(t)) {
      out = t;
      return true;
    }
  return false;
}

std::string hex32(uint32_t v) {
  char buf[9];
  std::snprintf(buf, sizeof buf, "%08x", v);
  return buf;
}

bool parse_hex32(const std::string& s, uint32_t& out) {
  if (s.size() != 8 || s.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos) return false;
  out = static_cast<uint32_t>(std::stoul(s, nullptr, 16));
  return true;
}

// Read-only memory map of a whole file, unmapped on destruction.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    FT_CHECK(fd >= 0, path, ": cannot open: ", std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      ::close(fd);
      FT_FAIL(path, ": cannot stat: ", std::strerror(errno));
    }
    size_ = static_cast<size_t>(st.st_size);
    if (size_ > 0) {
      void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
      ::close(fd);
      FT_CHECK(p != MAP_FAILED, path, ": cannot map ", size_, " bytes: ", std::strerror(errno));
      data_ = static_cast<const unsigned char*>(p);
      ::madvise(p, size_, MADV_SEQUENTIAL);
    } else {
      ::close(fd);
    }
  }
  ~MappedFile() {
    if (data_) ::munmap(const_cast<unsigned char*>(data_), size_);
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const unsigned char* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  const unsigned char* data_ = nullptr;
  size_t size_ = 0;
};

struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin, end;  // within the data section
};

uint64_t json_uint(const ordered_json& v, const std::string& path, const std::string& name, const char* field) {
  FT_CHECK(v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0), path, ": tensor '", name, "' ",
           field, " must hold non-negative integers, found ", v.dump());
  return v.get<uint64_t>();
}

Entry parse_entry(const std::string& path, const std::string& name, const ordered_json& info, uint64_t data_bytes) {
  FT_CHECK(info.is_object(), path, ": tensor '", name, "': expected an object with dtype, shape, data_offsets, found ",
           info.dump());
  for (const char* field : {"dtype", "shape", "data_offsets"})
    FT_CHECK(info.contains(field), path, ": tensor '", name, "' has no \"", field, "\"");
  Entry e;
  e.name = name;
  FT_CHECK(info["dtype"].is_string(), path, ": tensor '", name, "' dtype must be a string, found ",
           info["dtype"].dump());
  std::string dt = info["dtype"].get<std::string>();
  FT_CHECK(parse_dtype(dt, e.dtype), path, ": tensor '", name, "' has unknown dtype '", dt,
           "' (expected one of F32, F64, BF16, F16, I32, I64, U8, BOOL)");
  const auto& shape = info["shape"];
  FT_CHECK(shape.is_array(), path, ": tensor '", name, "' shape must be an array, found ", shape.dump());
  // Byte count with an overflow guard: a size product past the data section is already wrong.
  uint64_t nbytes = dtype_size(e.dtype);
  bool too_big = false;
  for (const auto& d : shape) {
    uint64_t n = json_uint(d, path, name, "shape");
    e.shape.push_back(static_cast<int64_t>(n));
    if (n != 0 && nbytes > (data_bytes + 1) / n + 1) too_big = true;
    nbytes *= n;
  }
  if (too_big) {
    for (int64_t d : e.shape)
      if (d == 0) too_big = false;  // an empty tensor holds no bytes however large the other dims
  }
  const auto& off = info["data_offsets"];
  FT_CHECK(off.is_array() && off.size() == 2, path, ": tensor '", name, "' data_offsets must be [begin, end], found ",
           off.dump());
  e.begin = json_uint(off[0], path, name, "data_offsets");
  e.end = json_uint(off[1], path, name, "data_offsets");
  FT_CHECK(e.begin <= e.end, path, ": tensor '", name, "' data_offsets [", e.begin, ", ", e.end, "] end before begin");
  FT_CHECK(e.end <= data_bytes, path, ": tensor '", name, "' data_offsets [", e.begin, ", ", e.end,
           "] run past the end of the data section (", data_bytes, " bytes): file truncated or corrupt");
  FT_CHECK(!too_big && nbytes == e.end - e.begin, path, ": tensor '", name, "' has shape ", e.shape.str(), " ", dt,
           (too_big ? std::string(" (too large)") : " (" + std::to_string(nbytes) + " bytes)"), " but data_offsets [",
           e.begin, ", ", e.end, "] span ", e.end - e.begin, " bytes");
  return e;
}

}  // namespace

void save_safetensors(const std::string& path, const TensorMap& tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::vector<Tensor> data;
  data.reserve(tensors.size());
  std::set<std::string> names;
  for (const auto& [name, t] : tensors) {
    FT_CHECK(!name.empty(), "save_safetensors ", path, ": tensor names must not be empty");
    FT_CHECK(name != kMetadataKey, "save_safetensors ", path, ": '", kMetadataKey, "' is reserved, not a tensor name");
    FT_CHECK(names.insert(name).second, "save_safetensors ", path, ": tensor '", name, "' appears twice");
    FT_CHECK(t.defined(), "save_safetensors ", path, ": tensor '", name, "' is undefined");
    Tensor cpu = t.device().is_cpu() ? t : t.to(Device::cpu());
    data.push_back(cpu.contiguous());
  }
  ordered_json meta = ordered_json::object();
  for (const auto& [k, v] : metadata) {
    FT_CHECK(k.rfind(kChecksumPrefix, 0) != 0, "save_safetensors ", path, ": metadata key '", k,
             "' uses the reserved prefix '", kChecksumPrefix, "' (checksums are added by the writer)");
    meta[k] = v;
  }
  for (size_t i = 0; i < data.size(); ++i)
    meta[kChecksumPrefix + tensors[i].first] = hex32(io::crc32c(data[i].raw_data(), data[i].nbytes()));

  ordered_json header = ordered_json::object();
  header[kMetadataKey] = std::move(meta);
  uint64_t offset = 0;
  for (size_t i = 0; i < data.size(); ++i) {
    ordered_json info = ordered_json::object();
    info["dtype"] = safetensors_dtype(data[i].dtype());
    info["shape"] = ordered_json::array();
    for (int64_t d : data[i].shape()) info["shape"].push_back(d);
    info["data_offsets"] = {offset, offset + data[i].nbytes()};
    offset += data[i].nbytes();
    header[tensors[i].first] = std::move(info);
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data section starts 8-byte aligned
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(static_cast<uint64_t>(text.size()) >> (8 * i));

  AtomicFileWriter out(path);
  out.write(len, sizeof len);
  out.write(text.data(), text.size());
  for (const Tensor& t : data) out.write(t.raw_data(), t.nbytes());
  out.commit();
}

SafetensorsFile load_safetensors(const std::string& path) {
  MappedFile file(path);
  fault::point("load", path);
  const uint64_t size = file.size();
  FT_CHECK(size >= 8, path, ": file is ", size, " bytes, too short for the 8-byte header length");
  // Every read of the mapping is a guarded copy: the file may be truncated under us (mapped_read.h).
  auto copy_out = [&](void* dst, uint64_t offset, uint64_t nbytes) {
    const unsigned char* src = file.data() + offset;
    io::guarded_read(path, file.data(), size, [&] { std::memcpy(dst, src, nbytes); });
  };
  unsigned char len[8];
  copy_out(len, 0, 8);
  uint64_t header_len = 0;
  for (int i = 0; i < 8; ++i) header_len |= static_cast<uint64_t>(len[i]) << (8 * i);
  FT_CHECK(header_len <= size - 8, path, ": header length ", header_len, " runs past the end of the file (", size,
           " bytes): truncated or not a safetensors file");
  FT_CHECK(header_len <= kMaxHeaderBytes, path, ": header length ", header_len, " exceeds the limit of ",
           kMaxHeaderBytes, " bytes");
  std::string header_text(header_len, '\0');
  copy_out(header_text.data(), 8, header_len);
  ordered_json header;
  try {
    header = ordered_json::parse(header_text);
  } catch (const nlohmann::json::exception& e) {
    FT_FAIL(path, ": malformed JSON header: ", e.what());
  }
  FT_CHECK(header.is_object(), path, ": header must be a JSON object, found ", header.type_name());

  const uint64_t data_start = 8 + header_len;
  const uint64_t data_bytes = size - data_start;
  SafetensorsFile result;
  std::map<std::string, uint32_t> checksums;
  std::vector<Entry> entries;
  for (const auto& [key, value] : header.items()) {
    if (key == kMetadataKey) {
      FT_CHECK(value.is_object(), path, ": \"__metadata__\" must be an object of strings, found ", value.type_name());
      for (const auto& [k, v] : value.items()) {
        FT_CHECK(v.is_string(), path, ": metadata '", k, "' must be a string, found ", v.dump());
        std::string s = v.get<std::string>();
        if (k.rfind(kChecksumPrefix, 0) == 0) {
          uint32_t crc;
          FT_CHECK(parse_hex32(s, crc), path, ": metadata '", k, "' must be 8 hex digits, found '", s, "'");
          checksums[k.substr(std::strlen(kChecksumPrefix))] = crc;
        } else {
          result.metadata[k] = s;
        }
      }
      continue;
    }
    entries.push_back(parse_entry(path, key, value, data_bytes));
  }

  // The data section must be exactly the tensors, back to back: no overlap, no gap, nothing after.
  std::vector<const Entry*> by_offset;
  for (const auto& e : entries) by_offset.push_back(&e);
  std::stable_sort(by_offset.begin(), by_offset.end(), [](const Entry* a, const Entry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t covered = 0;
  const Entry* prev = nullptr;
  for (const Entry* e : by_offset) {
    FT_CHECK(e->begin >= covered, path, ": tensor '", e->name, "' data_offsets [", e->begin, ", ", e->end,
             "] overlap tensor '", prev ? prev->name : "", "' which ends at ", covered);
    FT_CHECK(e->begin == covered, path, ": tensor '", e->name, "' starts at byte ", e->begin,
             " of the data section, expected ", covered, " (a gap after ",
             prev ? "tensor '" + prev->name + "'" : std::string("the header"), ")");
    covered = e->end;
    prev = e;
  }
  FT_CHECK(covered == data_bytes, path, ": data section holds ", data_bytes, " bytes but the tensors cover ", covered,
           ": ", data_bytes - covered, " trailing bytes (file altered or corrupt)");
  for (const auto& [name, crc] : checksums)
    // wanted: clang 14 cannot capture a structured binding.
    FT_CHECK(std::any_of(entries.begin(), entries.end(), [&wanted = name](const Entry& e) { return e.name == wanted; }),
             path, ": metadata has a checksum for tensor '", name, "' which the file does not hold");

  result.tensors.reserve(entries.size());
  for (const Entry* e : by_offset) {
    const size_t nbytes = e->end - e->begin;
    Tensor t = empty(e->shape, e->dtype);
    if (nbytes) copy_out(t.raw_data(), data_start + e->begin, nbytes);
    auto it = checksums.find(e->name);
    if (it != checksums.end())
      FT_CHECK(io::crc32c(t.raw_data(), nbytes) == it->second, path, ": tensor '", e->name,
               "' checksum mismatch: file altered or corrupt");
    result.tensors.emplace_back(e->name, std::move(t));
  }
  return result;
}

}  // namespace ft
