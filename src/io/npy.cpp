#include "fasttrain/npy.h"

#include "fasttrain/atomic_file.h"
#include "io/npy_header.h"

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <regex>
#include <sstream>
#include <vector>

namespace ft {
namespace {

const char* descr_of(DType t) {
  switch (t) {
    case DType::F32: return "<f4";
    case DType::F64: return "<f8";
    case DType::F16: return "<f2";
    case DType::I32: return "<i4";
    case DType::I64: return "<i8";
    case DType::U8: return "|u1";
    case DType::Bool: return "|b1";
    case DType::BF16: break;
  }
  FT_FAIL("save_npy: dtype ", dtype_name(t), " has no NumPy equivalent");
}

DType dtype_of_descr(const std::string& d, const std::string& path) {
  static const std::pair<const char*, DType> table[] = {{"<f4", DType::F32},  {"<f8", DType::F64}, {"<f2", DType::F16},
                                                        {"<i4", DType::I32},  {"<i8", DType::I64}, {"|u1", DType::U8},
                                                        {"|b1", DType::Bool}, {"<u1", DType::U8}};
  for (auto& [name, dt] : table)
    if (d == name) return dt;
  FT_FAIL(path, ": unsupported .npy dtype '", d, "' (expected one of <f4 <f8 <f2 <i4 <i8 |u1 |b1)");
}

}  // namespace

NpyHeader parse_npy_header(const char* bytes, size_t size, const std::string& path) {
  FT_CHECK(size >= 10 && std::string(bytes, 6) == "\x93NUMPY", path, ": not a .npy file (expected magic \\x93NUMPY)");
  int major = static_cast<unsigned char>(bytes[6]);
  FT_CHECK(major >= 1 && major <= 3, path, ": unsupported .npy version ", major, " (expected 1, 2 or 3)");
  size_t header_len, header_start;
  if (major == 1) {
    header_len = static_cast<unsigned char>(bytes[8]) | (static_cast<unsigned char>(bytes[9]) << 8);
    header_start = 10;
  } else {
    FT_CHECK(size >= 12, path, ": truncated .npy header");
    header_len = 0;
    for (int i = 0; i < 4; ++i) header_len |= static_cast<size_t>(static_cast<unsigned char>(bytes[8 + i])) << (8 * i);
    header_start = 12;
  }
  FT_CHECK(header_start + header_len <= size, path, ": header length ", header_len, " runs past the end of the file");
  std::string header(bytes + header_start, header_len);
  std::smatch m;
  FT_CHECK(std::regex_search(header, m, std::regex("'descr':\\s*'([^']+)'")), path, ": header has no 'descr'");
  DType dt = dtype_of_descr(m[1], path);
  FT_CHECK(std::regex_search(header, m, std::regex("'fortran_order':\\s*(True|False)")), path,
           ": header has no 'fortran_order'");
  FT_CHECK(m[1] == "False", path, ": Fortran-order arrays are not supported (expected C order)");
  FT_CHECK(std::regex_search(header, m, std::regex("'shape':\\s*\\(([^)]*)\\)")), path, ": header has no 'shape'");
  Shape shape;
  std::string dims = m[1];
  std::stringstream ss(dims);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.find_first_not_of(" ") == std::string::npos) continue;
    size_t pos = 0;
    long long d = -1;
    try {
      d = std::stoll(item, &pos);
    } catch (const std::exception&) {
      pos = 0;
    }
    FT_CHECK(pos > 0 && item.find_first_not_of(" ", pos) == std::string::npos && d >= 0, path,
             ": header shape has an invalid dimension '", item, "'");
    shape.push_back(d);
  }
  size_t data_start = header_start + header_len;
  // Checked product: a hostile header with huge dimensions must not wrap around to a size that
  // happens to match the file.
  uint64_t expected = dtype_size(dt);
  for (int64_t d : shape)
    FT_CHECK(!__builtin_mul_overflow(expected, static_cast<uint64_t>(d), &expected), path, ": header shape ",
             shape.str(), " is too large");
  FT_CHECK(size - data_start == expected, path, ": header says ", shape.str(), " ", dtype_name(dt), " (", expected,
           " bytes) but the file holds ", size - data_start, " bytes of data");
  return {dt, shape, data_start};
}

Tensor load_npy(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  FT_CHECK(f.good(), path, ": cannot open file");
  std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  NpyHeader h = parse_npy_header(bytes.data(), bytes.size(), path);
  Tensor t = empty(h.shape, h.dtype);
  if (t.nbytes()) std::memcpy(t.raw_data(), bytes.data() + h.data_offset, t.nbytes());
  return t;
}

void save_npy(const std::string& path, const Tensor& t_in) {
  Tensor t = t_in.device().is_cpu() ? t_in.contiguous() : t_in.to(Device::cpu()).contiguous();
  if (t.dtype() == DType::BF16) t = t.to(DType::F32);
  std::ostringstream h;
  h << "{'descr': '" << descr_of(t.dtype()) << "', 'fortran_order': False, 'shape': (";
  for (int i = 0; i < t.dim(); ++i) h << t.size(i) << (t.dim() == 1 || i + 1 < t.dim() ? "," : "");
  h << "), }";
  std::string header = h.str();
  size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');
  AtomicFileWriter f(path);
  f.write("\x93NUMPY\x01\x00", 8);
  uint16_t len = static_cast<uint16_t>(header.size());
  f.write(&len, 2);
  f.write(header.data(), header.size());
  f.write(t.raw_data(), t.nbytes());
  f.commit();
}

}  // namespace ft
