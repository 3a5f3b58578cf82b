// JPEG and PNG decoding to RGB and the square resampler (image_decode.h).
//
// Both codecs are C libraries that report errors by longjmp (libjpeg) or internally (libpng's
// simplified API), never by C++ exceptions, so each decode runs in a function with no C++ object
// that a longjmp could skip, and the error text is turned into an ft::Error naming the file once
// the codec has returned.
#include "data/image_decode.h"

#include <algorithm>
#include <cmath>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <memory>

// jpeglib.h uses FILE and size_t without including their headers: <cstdio> comes first.
#include <jerror.h>
#include <jpeglib.h>
#include <png.h>

#include "fasttrain/error.h"

namespace ft::data {

namespace {

// A decoded image stays below this many pixels (an 8k x 8k photo has 2^26): the bound keeps a
// crafted header from asking for gigabytes. JPEGs are checked after DCT scaling.
constexpr int64_t kMaxPixels = int64_t{1} << 28;

// --- files --------------------------------------------------------------------------------

struct FileCloser {
  void operator()(FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<FILE, FileCloser>;

File open_file(const std::string& path) {
  File f(std::fopen(path.c_str(), "rb"));
  FT_CHECK(f != nullptr, path, ": cannot open (", std::strerror(errno), ")");
  return f;
}

// The whole file into `bytes` (reused: grows, never shrinks).
void read_whole_file(const std::string& path, std::vector<uint8_t>& bytes, size_t& size) {
  File f = open_file(path);
  FT_CHECK(std::fseek(f.get(), 0, SEEK_END) == 0, path, ": cannot seek (", std::strerror(errno), ")");
  const long end = std::ftell(f.get());
  FT_CHECK(end >= 0, path, ": cannot tell its size (", std::strerror(errno), ")");
  std::rewind(f.get());
  size = static_cast<size_t>(end);
  if (bytes.size() < size) bytes.resize(size);
  FT_CHECK(std::fread(bytes.data(), 1, size, f.get()) == size, path, ": short read (", size, " bytes expected)");
}

std::string first_bytes_hex(const uint8_t* p, size_t n) {
  if (n == 0) return "nothing (an empty file)";
  char buf[32] = "bytes";
  for (size_t i = 0; i < std::min<size_t>(n, 4); ++i)
    std::snprintf(buf + 5 + 3 * i, sizeof buf - 5 - 3 * i, " %02x", p[i]);
  return buf;
}

// --- JPEG ---------------------------------------------------------------------------------

struct JpegErrors {
  jpeg_error_mgr mgr;  // first: libjpeg hands back a pointer to it
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
  bool truncated;
};

[[noreturn]] void jpeg_fail(j_common_ptr cinfo) {
  auto* e = reinterpret_cast<JpegErrors*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, e->message);
  std::longjmp(e->jump, 1);
}

// Warnings leave the image usable except one: a file that ends early decodes to grey below the
// last complete row, which a training set should not silently contain.
void jpeg_note(j_common_ptr cinfo, int level) {
  auto* e = reinterpret_cast<JpegErrors*>(cinfo->err);
  if (level < 0 && cinfo->err->msg_code == JWRN_JPEG_EOF) {
    e->truncated = true;
    (*cinfo->err->format_message)(cinfo, e->message);
  }
}

void init_errors(jpeg_decompress_struct& cinfo, JpegErrors& errors) {
  cinfo.err = jpeg_std_error(&errors.mgr);
  errors.mgr.error_exit = jpeg_fail;
  errors.mgr.emit_message = jpeg_note;
  errors.message[0] = '\0';
  errors.truncated = false;
}

// The header of a JPEG read through stdio (only up to its first scan). False with errors.message
// on failure.
bool jpeg_header_c(FILE* file, JpegErrors* errors, int64_t* width, int64_t* height) {
  jpeg_decompress_struct cinfo;
  init_errors(cinfo, *errors);
  if (setjmp(errors->jump)) {
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_stdio_src(&cinfo, file);
  jpeg_read_header(&cinfo, TRUE);
  *width = cinfo.image_width;
  *height = cinfo.image_height;
  jpeg_destroy_decompress(&cinfo);
  return true;
}

// Where a JPEG's pixels go once its output size is known: the buffer in `rgb`, grown as needed.
struct JpegOutput {
  std::vector<uint8_t>* rgb;
  int64_t width, height;
  bool too_large;
};

// Decodes a JPEG held in memory to interleaved RGB, at a reduced DCT scale where the shorter side
// stays at least `min_side`. No C++ object lives in this frame across the setjmp.
bool jpeg_decode_c(const uint8_t* data, size_t size, int64_t min_side, JpegErrors* errors, JpegOutput* out) {
  jpeg_decompress_struct cinfo;
  init_errors(cinfo, *errors);
  if (setjmp(errors->jump)) {
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(&cinfo, TRUE);
  const bool cmyk = cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK;
  cinfo.out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
  // The smallest of the scales 1/8, 1/4, 1/2 and 1 that keeps the shorter side >= min_side: the
  // ones libjpeg-turbo has SIMD inverse DCTs for (at the other M/8 scales decoding takes longer
  // than decoding the whole image).
  for (unsigned denom = 8; denom >= 1; denom /= 2) {
    cinfo.scale_num = 1;
    cinfo.scale_denom = denom;
    jpeg_calc_output_dimensions(&cinfo);
    if (denom == 1 || (min_side > 0 && std::min<int64_t>(cinfo.output_width, cinfo.output_height) >= min_side)) break;
  }
  out->width = cinfo.output_width;
  out->height = cinfo.output_height;
  if (out->width * out->height > kMaxPixels) {
    out->too_large = true;
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  const int components = cmyk ? 4 : 3;
  const size_t row_bytes = static_cast<size_t>(out->width) * components;
  if (out->rgb->size() < row_bytes * out->height) out->rgb->resize(row_bytes * out->height);
  jpeg_start_decompress(&cinfo);
  uint8_t* base = out->rgb->data();
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = base + row_bytes * cinfo.output_scanline;
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  if (cmyk) {  // Adobe's inverted CMYK (what Photoshop writes): R = C * K / 255, and so on
    const int64_t pixels = out->width * out->height;
    for (int64_t i = 0; i < pixels; ++i) {
      const uint8_t* s = base + 4 * i;
      uint8_t* d = base + 3 * i;  // behind s: safe in place
      const int k = s[3];
      d[0] = static_cast<uint8_t>((s[0] * k + 127) / 255);
      d[1] = static_cast<uint8_t>((s[1] * k + 127) / 255);
      d[2] = static_cast<uint8_t>((s[2] * k + 127) / 255);
    }
  }
  return !errors->truncated;
}

// --- PNG ----------------------------------------------------------------------------------

// libpng's simplified API: any bit depth, palette, grayscale or alpha PNG read as 8-bit RGB.
void decode_png(const std::string& path, const uint8_t* data, size_t size, std::vector<uint8_t>& rgb, int64_t& width,
                int64_t& height) {
  png_image image;
  std::memset(&image, 0, sizeof image);
  image.version = PNG_IMAGE_VERSION;
  FT_CHECK(png_image_begin_read_from_memory(&image, data, size), path, ": not a readable PNG (", image.message, ")");
  width = image.width;
  height = image.height;
  if (width * height > kMaxPixels) {
    png_image_free(&image);
    FT_FAIL(path, ": a ", width, "x", height, " image, more than the ", kMaxPixels, " pixels an image may have");
  }
  image.format = PNG_FORMAT_RGB;
  const size_t bytes = PNG_IMAGE_SIZE(image);
  if (rgb.size() < bytes) rgb.resize(bytes);
  const png_color black{0, 0, 0};  // what transparent pixels show
  FT_CHECK(png_image_finish_read(&image, &black, rgb.data(), 0, nullptr), path, ": corrupt or truncated PNG (",
           image.message, ")");
}

// --- resampling ---------------------------------------------------------------------------

// The filter taps of one axis: output i reads source pixels first[i] .. first[i] + taps - 1 with
// weights weight[i * taps ...] (zeros pad the shorter windows). Windows hold only the pixels of
// non-zero weight, so enlarging reads 2 taps and shrinking by f about 2f.
struct Taps {
  std::vector<int64_t> first;
  std::vector<float> weight;
  int64_t taps = 0;
};

void make_taps(int64_t in, int64_t offset, int64_t out, Taps& t) {
  const double scale = static_cast<double>(in) / static_cast<double>(out);
  const double radius = std::max(1.0, scale);
  std::vector<int64_t>& first = t.first;
  first.assign(out, 0);
  std::vector<int64_t> last(out, 0);
  auto weight = [&](int64_t i, int64_t j) {  // source pixel j's share of output i, before normalising
    const double centre = (static_cast<double>(i) + 0.5) * scale;  // in source pixels, edges at integers
    return std::max(0.0, 1.0 - std::abs(static_cast<double>(j) + 0.5 - centre) / radius);
  };
  t.taps = 1;
  for (int64_t i = 0; i < out; ++i) {
    const double centre = (static_cast<double>(i) + 0.5) * scale;
    int64_t lo = std::max<int64_t>(0, static_cast<int64_t>(std::floor(centre - radius)));
    int64_t hi = std::min<int64_t>(in, static_cast<int64_t>(std::ceil(centre + radius)));
    while (lo + 1 < hi && weight(i, lo) == 0) ++lo;
    while (hi - 1 > lo && weight(i, hi - 1) == 0) --hi;
    first[i] = lo, last[i] = hi;
    t.taps = std::max(t.taps, hi - lo);
  }
  t.weight.assign(out * t.taps, 0.0f);
  for (int64_t i = 0; i < out; ++i) {
    double sum = 0;
    for (int64_t j = first[i]; j < last[i]; ++j) sum += weight(i, j);
    for (int64_t j = first[i]; j < last[i]; ++j)
      t.weight[i * t.taps + (j - first[i])] = static_cast<float>(weight(i, j) / sum);
    first[i] += offset;
  }
}

// The horizontal pass of resize_square: source rows row_lo .. row_lo + rows - 1 filtered to S
// pixels each, written as [rows][S][C] floats. K: the channel count when known at compile time
// (the channel loop then stays in registers), 0 for any.
template <int K>
void filter_rows(const uint8_t* src, int64_t row_lo, int64_t rows, int64_t row_stride, int64_t pixel_stride,
                 int64_t channel_stride, int64_t width, int64_t channels, int64_t S, const Taps& t, float* out) {
  const int64_t C = K > 0 ? K : channels;
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* line = src + (row_lo + r) * row_stride;
    float* o = out + r * S * C;
    for (int64_t x = 0; x < S; ++x) {
      const float* w = &t.weight[x * t.taps];
      const int64_t taps = std::min(t.taps, width - t.first[x]);
      const uint8_t* p = line + t.first[x] * pixel_stride;
      if constexpr (K > 0) {
        float acc[K] = {};
        for (int64_t k = 0; k < taps; ++k)
          for (int c = 0; c < K; ++c) acc[c] += w[k] * static_cast<float>(p[k * pixel_stride + c * channel_stride]);
        for (int c = 0; c < K; ++c) o[x * K + c] = acc[c];
      } else {
        for (int64_t c = 0; c < C; ++c) {
          float acc = 0;
          for (int64_t k = 0; k < taps; ++k) acc += w[k] * static_cast<float>(p[k * pixel_stride + c * channel_stride]);
          o[x * C + c] = acc;
        }
      }
    }
  }
}

struct ResizeScratch {
  Taps x, y;
  std::vector<float> rows;  // horizontally filtered rows: [rows][size][channels]
  std::vector<float> acc;   // one output row: [size][channels]
};
thread_local ResizeScratch resize_scratch;

// The per-thread buffers of load_image_square: the file's bytes and its decoded pixels.
struct DecodeScratch {
  std::vector<uint8_t> file, pixels;
};
thread_local DecodeScratch decode_scratch;

}  // namespace

ImageFormat sniff_image_format(const uint8_t* b, size_t n) {
  if (n >= 3 && b[0] == 0xFF && b[1] == 0xD8 && b[2] == 0xFF) return ImageFormat::Jpeg;
  static const uint8_t png[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  if (n >= 8 && std::memcmp(b, png, 8) == 0) return ImageFormat::Png;
  return ImageFormat::Unknown;
}

ImageHeader read_image_header(const std::string& path) {
  File f = open_file(path);
  uint8_t magic[8];
  const size_t got = std::fread(magic, 1, sizeof magic, f.get());
  ImageHeader h;
  h.format = sniff_image_format(magic, got);
  FT_CHECK(h.format != ImageFormat::Unknown, path, ": not a JPEG or PNG image (starts with ",
           first_bytes_hex(magic, got), ")");
  std::rewind(f.get());
  if (h.format == ImageFormat::Jpeg) {
    JpegErrors errors;
    FT_CHECK(jpeg_header_c(f.get(), &errors, &h.width, &h.height), path, ": corrupt JPEG header (", errors.message,
             ")");
  } else {
    png_image image;
    std::memset(&image, 0, sizeof image);
    image.version = PNG_IMAGE_VERSION;
    FT_CHECK(png_image_begin_read_from_stdio(&image, f.get()), path, ": corrupt PNG header (", image.message, ")");
    h.width = image.width;
    h.height = image.height;
    png_image_free(&image);
  }
  FT_CHECK(h.width > 0 && h.height > 0, path, ": a ", h.width, "x", h.height, " image (expected at least 1x1)");
  return h;
}

void load_image_square(const std::string& path, int64_t size, uint8_t* dst) {
  FT_CHECK(size > 0, "load_image: expected a positive image size, found ", size);
  DecodeScratch& s = decode_scratch;
  size_t bytes = 0;
  read_whole_file(path, s.file, bytes);
  int64_t width = 0, height = 0;
  switch (sniff_image_format(s.file.data(), bytes)) {
    case ImageFormat::Jpeg: {
      JpegErrors errors;
      JpegOutput out{&s.pixels, 0, 0, false};
      const bool ok = jpeg_decode_c(s.file.data(), bytes, size, &errors, &out);
      FT_CHECK(!out.too_large, path, ": a ", out.width, "x", out.height, " image, more than the ", kMaxPixels,
               " pixels an image may have");
      FT_CHECK(ok, path, errors.truncated ? ": truncated JPEG (" : ": corrupt JPEG (", errors.message, ")");
      width = out.width, height = out.height;
      break;
    }
    case ImageFormat::Png: decode_png(path, s.file.data(), bytes, s.pixels, width, height); break;
    case ImageFormat::Unknown:
      FT_FAIL(path, ": not a JPEG or PNG image (starts with ", first_bytes_hex(s.file.data(), bytes), ")");
  }
  resize_square(s.pixels.data(), height, width, 3, width * 3, 3, 1, dst, size);
}

void resize_square(const uint8_t* src, int64_t height, int64_t width, int64_t channels, int64_t row_stride,
                   int64_t pixel_stride, int64_t channel_stride, uint8_t* dst, int64_t size) {
  FT_CHECK(height > 0 && width > 0 && channels > 0 && size > 0, "resize_square: expected positive sizes, found ",
           height, "x", width, "x", channels, " to ", size);
  const int64_t m = std::min(height, width), S = size, C = channels;
  const int64_t top = (height - m) / 2, left = (width - m) / 2;
  if (m == S) {  // the centred square as it is
    for (int64_t c = 0; c < C; ++c)
      for (int64_t y = 0; y < S; ++y) {
        const uint8_t* p = src + (top + y) * row_stride + left * pixel_stride + c * channel_stride;
        uint8_t* out = dst + (c * S + y) * S;
        for (int64_t x = 0; x < S; ++x) out[x] = p[x * pixel_stride];
      }
    return;
  }
  ResizeScratch& s = resize_scratch;
  make_taps(m, left, S, s.x);
  make_taps(m, top, S, s.y);
  // Horizontal pass over the source rows some output row reads: [rows][S][C] floats.
  const int64_t row_lo = s.y.first.front(), row_hi = std::min(s.y.first.back() + s.y.taps, height);
  const int64_t rows = row_hi - row_lo, Y = s.y.taps;
  s.rows.resize(static_cast<size_t>((rows + Y) * S * C));  // + Y rows of zeros: reads past `rows` weigh 0
  std::fill(s.rows.begin() + rows * S * C, s.rows.end(), 0.0f);
  if (C == 3)
    filter_rows<3>(src, row_lo, rows, row_stride, pixel_stride, channel_stride, width, 3, S, s.x, s.rows.data());
  else if (C == 1)
    filter_rows<1>(src, row_lo, rows, row_stride, pixel_stride, channel_stride, width, 1, S, s.x, s.rows.data());
  else
    filter_rows<0>(src, row_lo, rows, row_stride, pixel_stride, channel_stride, width, C, S, s.x, s.rows.data());
  // Vertical pass: each output row is a weighted sum of whole filtered rows (contiguous, so the
  // inner loop vectorises), then rounded into the planar output.
  s.acc.resize(static_cast<size_t>(S * C));
  float* acc = s.acc.data();
  for (int64_t y = 0; y < S; ++y) {
    const float* w = &s.y.weight[y * Y];
    const float* base = s.rows.data() + (s.y.first[y] - row_lo) * S * C;
    std::fill(acc, acc + S * C, 0.0f);
    for (int64_t k = 0; k < Y; ++k) {
      const float wk = w[k];
      const float* row = base + k * S * C;
      for (int64_t j = 0; j < S * C; ++j) acc[j] += wk * row[j];
    }
    for (int64_t x = 0; x < S; ++x)
      for (int64_t c = 0; c < C; ++c)
        dst[(c * S + y) * S + x] = static_cast<uint8_t>(std::clamp(acc[x * C + c], 0.0f, 255.0f) + 0.5f);
  }
}

}  // namespace ft::data
