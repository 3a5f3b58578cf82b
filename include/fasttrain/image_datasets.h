// Image datasets in their original distribution formats. MNIST and CIFAR-10 are read by memory
// map: each read() copies one image straight from the mapping into the caller's batch row. A
// folder of JPEG/PNG files (ImageFolderDataset) is decoded with libjpeg-turbo and libpng, once
// into memory when it fits, otherwise in read(). Fields: "image" u8 [C, H, W] and "label" i64
// scalar (shape {}). Every file is validated when the dataset is built (magic, sizes against the
// header's dimensions, every label in range; every image's header, or every image when decoded up
// front), so read() cannot meet bad data short of a file changed or damaged after that; errors
// name the file and the offending value.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fasttrain/dataset.h"

namespace ft::data {

struct MappedFile;

// MNIST IDX pair (train-images-idx3-ubyte / train-labels-idx1-ubyte, or Fashion-MNIST): images
// have big-endian magic 2051 and dims N, rows, cols; labels magic 2049 and N; labels in 0-9.
// image is u8 [1, rows, cols]. Either file may be gzip-compressed, as the downloads are published.
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

// A folder of images, one sub-folder per class (torchvision's ImageFolder layout):
//   root/cat/001.jpg, root/cat/more/002.png, root/dog/003.jpeg, ...
// Classes are the sub-folders' names in byte order, labelled 0, 1, ...; a class's images are the
// files under its sub-folder (nested folders included) ending in .jpg, .jpeg or .png in any case,
// in byte order of their paths. Names starting with '.' are skipped; other files are ignored. The
// format is taken from a file's first bytes, not its name.
//
// Every image becomes u8 [3, image_size, image_size]: RGB (grayscale replicated, alpha composited
// onto black, CMYK converted), its centred square of side min(width, height) resampled to
// image_size (bilinear when enlarging, area-averaging when shrinking: load_image).
//
// Building the dataset checks the layout (a root with at least one class folder, every class
// folder with at least one image). When the decoded images take at most `preload_bytes`, they are
// all decoded then, in parallel (ft::parallel_for), and read() is a copy; otherwise every file's
// header is read then and the pixels are decoded in read(), on the loader's workers. Either way a
// file that cannot be opened, is not a JPEG or PNG or has a corrupt header is refused when the
// dataset is built, and the error names the file (the first in order, with a count of the others).
struct ImageFolderOptions {
  int64_t image_size = 32;                   // side of the square images read() writes
  int64_t preload_bytes = int64_t{1} << 30;  // decode up front when 3 x side^2 x images fits (0: never)
};

class ImageFolderDataset : public Dataset {
 public:
  explicit ImageFolderDataset(const std::string& root, ImageFolderOptions options = {});
  int64_t size() const override { return static_cast<int64_t>(files_.size()); }
  SampleSpec spec() const override { return spec_; }
  void read(int64_t index, uint64_t epoch, const std::vector<Tensor>& fields) const override;

  const std::string& root() const { return root_; }
  const std::vector<std::string>& classes() const { return classes_; }
  const std::string& file(int64_t index) const;  // the image's path
  int64_t label(int64_t index) const;
  int64_t image_size() const { return options_.image_size; }
  bool preloaded() const { return !pixels_.empty(); }  // decoded up front

 private:
  std::string root_;
  ImageFolderOptions options_;
  std::vector<std::string> classes_, files_;
  std::vector<int32_t> labels_;
  std::vector<uint8_t> pixels_;  // size() x 3 x side x side when preloaded
  SampleSpec spec_;
};

// One JPEG or PNG file as ImageFolderDataset reads it: u8 [3, size, size]. Throws ft::Error naming
// the file when it cannot be read or decoded (a truncated file included).
Tensor load_image(const std::string& path, int64_t size);

}  // namespace ft::data
