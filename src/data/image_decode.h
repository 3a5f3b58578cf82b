// The pixel work behind ImageFolderDataset and load_image (image_datasets.h): JPEG (libjpeg-turbo)
// and PNG (libpng) files decoded to 8-bit RGB, and a square resampler that brings any image to
// the side a model takes. The classify task also resamples MNIST and CIFAR-10 images with it.
// Implemented in src/data/image_decode.cpp.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ft::data {

enum class ImageFormat { Unknown, Jpeg, Png };

// The format a file's first bytes announce (the extension is not trusted).
ImageFormat sniff_image_format(const uint8_t* bytes, size_t size);

struct ImageHeader {
  ImageFormat format = ImageFormat::Unknown;
  int64_t width = 0, height = 0;
};

// Reads only as much of the file as its header takes (up to a JPEG's first scan, a PNG's IHDR and
// the chunks before its image data). Throws ft::Error naming `path` when the file cannot be opened
// or is not a well-formed JPEG or PNG header.
ImageHeader read_image_header(const std::string& path);

// Decodes the file at `path` and writes it as u8 [3, size, size] to `dst`: the centred square of
// side min(width, height) resampled to size x size (see resize_square). Grayscale is replicated to
// RGB, a PNG's alpha channel is composited onto black, CMYK JPEGs (Adobe's inverted convention)
// are converted to RGB. Large JPEGs are decoded at a reduced DCT scale that keeps the shorter side
// at least `size`. A truncated or corrupt file throws ft::Error naming `path`. Thread-safe; the
// file and pixel buffers are per thread and reused, so steady-state calls allocate only inside
// the codec libraries.
void load_image_square(const std::string& path, int64_t size, uint8_t* dst);

// Resamples the centred square of side m = min(height, width) of `src` to size x size and writes
// it channel-planar, u8 [channels, size, size]. Pixel (y, x) of channel c is read from
// src[y * row_stride + x * pixel_stride + c * channel_stride], so interleaved (HWC) and planar
// (CHW) sources both work. The filter is a triangle whose radius is max(1, m / size) source
// pixels: bilinear interpolation when enlarging, an antialiasing average when shrinking (PIL's
// BILINEAR). When m == size it is an exact copy of the square.
void resize_square(const uint8_t* src, int64_t height, int64_t width, int64_t channels, int64_t row_stride,
                   int64_t pixel_stride, int64_t channel_stride, uint8_t* dst, int64_t size);

}  // namespace ft::data
