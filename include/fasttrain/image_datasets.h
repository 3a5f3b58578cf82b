// Image datasets in their original distribution formats, read by memory map: each read() copies
// one image straight from the mapping into the caller's batch row. Fields: "image" u8 [C, H, W]
// and "label" i64 scalar (shape {}). Every file is validated when the dataset is built (magic,
// sizes against the header's dimensions, every label in range), so read() cannot meet bad data;
// errors name the file and the offending value.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "fasttrain/dataset.h"

namespace ft::data {

struct MappedFile;

// MNIST IDX pair (train-images-idx3-ubyte / train-labels-idx1-ubyte, or Fashion-MNIST): images
// have big-endian magic 2051 and dims N, rows, cols; labels magic 2049 and N; labels in 0-9.
// image is u8 [1, rows, cols].
class MnistDataset : public Dataset {
 public:
  MnistDataset(const std::string& images_path, const std::string& labels_path);
  int64_t size() const override { return count_; }
  SampleSpec spec() const override { return spec_; }
  void read(int64_t index, uint64_t epoch, const std::vector<Tensor>& fields) const override;

 private:
  std::shared_ptr<const MappedFile> images_, labels_;
  int64_t count_ = 0, image_bytes_ = 0;
  SampleSpec spec_;
};

// CIFAR-10 binary batches (data_batch_1.bin ... test_batch.bin): records of one label byte (0-9)
// and 3072 pixel bytes (red, green, blue planes of 32x32). image is u8 [3, 32, 32]. Samples are
// numbered through the files in the order given.
class Cifar10Dataset : public Dataset {
 public:
  static constexpr int64_t kImageBytes = 3 * 32 * 32;
  static constexpr int64_t kRecordBytes = 1 + kImageBytes;

  explicit Cifar10Dataset(const std::vector<std::string>& batch_paths);
  int64_t size() const override { return first_record_.back(); }
  SampleSpec spec() const override { return spec_; }
  void read(int64_t index, uint64_t epoch, const std::vector<Tensor>& fields) const override;

 private:
  std::vector<std::shared_ptr<const MappedFile>> files_;
  std::vector<int64_t> first_record_;  // records in the files before each one; back() = total
  SampleSpec spec_;
};

}  // namespace ft::data
