// MNIST IDX files, as published (gzip-compressed) or unpacked: validated at construction, images
// copied from the mapping (or the decompressed bytes) on read.
#include <cstring>

#include "data/mapped_file.h"
#include "data/sample_fields.h"
#include "fasttrain/image_datasets.h"

namespace ft::data {

namespace {

constexpr int32_t kImagesMagic = 2051, kLabelsMagic = 2049;
constexpr int kNumClasses = 10;
constexpr int64_t kMaxSide = 4096;

// IDX header fields are big-endian uint32.
int64_t be32(const char* p) {
  auto b = reinterpret_cast<const unsigned char*>(p);
  return (int64_t{b[0]} << 24) | (int64_t{b[1]} << 16) | (int64_t{b[2]} << 8) | int64_t{b[3]};
}

// Checks the magic and reads the `ndims` dimensions that follow it.
std::vector<int64_t> idx_dims(const MappedFile& f, int32_t magic, int ndims, const char* what) {
  size_t header = 4 * (1 + ndims);
  FT_CHECK(f.size >= header, f.path, ": truncated MNIST ", what, " file: ", f.size, " bytes, shorter than the ", header,
           "-byte header");
  FT_CHECK(be32(f.data) == magic, f.path, ": not an MNIST ", what, " file: magic ", be32(f.data), " (expected ", magic,
           ")");
  std::vector<int64_t> dims(ndims);
  for (int i = 0; i < ndims; ++i) dims[i] = be32(f.data + 4 * (1 + i));
  return dims;
}

}  // namespace

MnistDataset::MnistDataset(const std::string& images_path, const std::string& labels_path)
    : images_(map_or_inflate(images_path)), labels_(map_or_inflate(labels_path)) {
  std::vector<int64_t> d = idx_dims(*images_, kImagesMagic, 3, "images");
  // The bound keeps the size arithmetic below far from overflow (N < 2^32, rows * cols <= 2^24).
  FT_CHECK(d[1] > 0 && d[2] > 0 && d[1] <= kMaxSide && d[2] <= kMaxSide, images_path, ": image size ", d[1], "x", d[2],
           " (expected rows and columns in 1-", kMaxSide, ")");
  count_ = d[0];
  image_bytes_ = d[1] * d[2];
  int64_t expected = 16 + count_ * image_bytes_;
  FT_CHECK(static_cast<int64_t>(images_->size) == expected, images_path, ": header says ", count_, " images of ", d[1],
           "x", d[2], " (", expected, " bytes with the header) but the file holds ", images_->size, " bytes");
  int64_t nlabels = idx_dims(*labels_, kLabelsMagic, 1, "labels")[0];
  FT_CHECK(static_cast<int64_t>(labels_->size) == 8 + nlabels, labels_path, ": header says ", nlabels, " labels (",
           8 + nlabels, " bytes with the header) but the file holds ", labels_->size, " bytes");
  FT_CHECK(nlabels == count_, labels_path, ": holds ", nlabels, " labels but ", images_path, " holds ", count_,
           " images");
  auto labels = reinterpret_cast<const unsigned char*>(labels_->data + 8);
  for (int64_t i = 0; i < count_; ++i)
    FT_CHECK(labels[i] < kNumClasses, labels_path, ": label ", int{labels[i]}, " of sample ", i,
             " is out of range (expected 0-", kNumClasses - 1, ")");
  spec_ = {{"image", Shape{1, d[1], d[2]}, DType::U8}, {"label", Shape{}, DType::I64}};
}

void MnistDataset::read(int64_t index, uint64_t, const std::vector<Tensor>& fields) const {
  FT_CHECK(index >= 0 && index < count_, "MnistDataset: sample ", index, " out of range [0, ", count_, ")");
  check_sample_fields("MnistDataset", spec_, fields);
  void* image = fields[0].raw_data();
  int64_t* label = fields[1].data<int64_t>();
  images_->read([&] { std::memcpy(image, images_->data + 16 + index * image_bytes_, image_bytes_); });
  labels_->read([&] { *label = static_cast<unsigned char>(labels_->data[8 + index]); });
}

}  // namespace ft::data
