// MNIST IDX and CIFAR-10 binary datasets over small synthetic files: samples, validation errors.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "fasttrain/allocator.h"
#include "fasttrain/image_datasets.h"
#include "fasttrain/loader.h"
#include "support/expect_error.h"

using namespace ft;
using namespace ft::data;
using ft::test::expect_error;
namespace fs = std::filesystem;

namespace {

using Bytes = std::vector<unsigned char>;

void put_be32(Bytes& b, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<unsigned char>(v >> s));
}

// The pixel at byte k of sample i: distinct across samples and positions.
unsigned char pixel(int64_t i, int64_t k) { return static_cast<unsigned char>(i * 31 + k * 7 + 1); }

class ImageDatasets : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("ft_image_datasets_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const Bytes& b) {
    std::string p = (dir_ / name).string();
    std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), b.size());
    return p;
  }
  Bytes idx_images(uint32_t magic, uint32_t n, uint32_t rows, uint32_t cols, int64_t pixels) {
    Bytes b;
    put_be32(b, magic), put_be32(b, n), put_be32(b, rows), put_be32(b, cols);
    for (int64_t k = 0; k < pixels; ++k) b.push_back(pixel(k / (rows * cols), k % (rows * cols)));
    return b;
  }
  Bytes idx_labels(uint32_t magic, const Bytes& labels) {
    Bytes b;
    put_be32(b, magic), put_be32(b, static_cast<uint32_t>(labels.size()));
    b.insert(b.end(), labels.begin(), labels.end());
    return b;
  }
  Bytes cifar(const Bytes& labels, int64_t first_sample) {
    Bytes b;
    for (size_t r = 0; r < labels.size(); ++r) {
      b.push_back(labels[r]);
      for (int64_t k = 0; k < Cifar10Dataset::kImageBytes; ++k) b.push_back(pixel(first_sample + r, k));
    }
    return b;
  }
  fs::path dir_;
};

TEST_F(ImageDatasets, MnistSamples) {
  const Bytes labels{3, 0, 9, 5};
  MnistDataset ds(write("img", idx_images(2051, 4, 28, 28, 4 * 784)), write("lbl", idx_labels(2049, labels)));
  ASSERT_EQ(ds.size(), 4);
  SampleSpec spec = ds.spec();
  ASSERT_EQ(spec.size(), 2u);
  EXPECT_EQ(spec[0].name, "image");
  EXPECT_EQ(spec[0].shape, (Shape{1, 28, 28}));
  EXPECT_EQ(spec[0].dtype, DType::U8);
  EXPECT_EQ(spec[1].name, "label");
  EXPECT_EQ(spec[1].shape, Shape{});
  EXPECT_EQ(spec[1].dtype, DType::I64);
  std::vector<Tensor> fields{empty(spec[0].shape, DType::U8), empty(spec[1].shape, DType::I64)};
  AllocatorStats before = allocator_for(Device::cpu()).stats();
  for (int64_t i = 0; i < ds.size(); ++i) {
    ds.read(i, 0, fields);
    EXPECT_EQ(*fields[1].data<int64_t>(), labels[i]);
    const uint8_t* img = fields[0].data<uint8_t>();
    for (int64_t k = 0; k < 784; ++k) ASSERT_EQ(img[k], pixel(i, k)) << i << " " << k;
  }
  EXPECT_EQ(allocator_for(Device::cpu()).stats().num_allocs, before.num_allocs);
  expect_error([&] { ds.read(4, 0, fields); }, "MnistDataset: sample 4 out of range [0, 4)");
}

TEST_F(ImageDatasets, MnistMalformedFiles) {
  std::string lbl = write("lbl", idx_labels(2049, {1, 2}));
  std::string img = write("img", idx_images(2051, 2, 28, 28, 2 * 784));
  std::string p = write("magic", idx_images(2049, 2, 28, 28, 2 * 784));
  expect_error([&] { MnistDataset d(p, lbl); }, p + ": not an MNIST images file: magic 2049 (expected 2051)");
  p = write("lmagic", idx_labels(2051, {1, 2}));
  expect_error([&] { MnistDataset d(img, p); }, p + ": not an MNIST labels file: magic 2051 (expected 2049)");
  p = write("short", idx_images(2051, 2, 28, 28, 2 * 784 - 1));
  expect_error([&] { MnistDataset d(p, lbl); },
               p + ": header says 2 images of 28x28 (1584 bytes with the header) but the file holds 1583 bytes");
  p = write("tiny", Bytes{0, 0, 8});
  expect_error([&] { MnistDataset d(p, lbl); }, p + ": truncated MNIST images file: 3 bytes, shorter than the 16-byte");
  p = write("count", idx_labels(2049, {1, 2, 3}));
  expect_error([&] { MnistDataset d(img, p); }, p + ": holds 3 labels but " + img + " holds 2 images");
  Bytes lb = idx_labels(2049, {1, 2});
  lb.pop_back();
  p = write("ltrunc", lb);
  expect_error([&] { MnistDataset d(img, p); },
               p + ": header says 2 labels (10 bytes with the header) but the file holds 9");
  p = write("range", idx_labels(2049, {1, 10}));
  expect_error([&] { MnistDataset d(img, p); }, p + ": label 10 of sample 1 is out of range (expected 0-9)");
}

TEST_F(ImageDatasets, CifarSamplesAcrossBatches) {
  const Bytes a{6, 9, 0}, b{1, 2};
  Cifar10Dataset ds({write("data_batch_1.bin", cifar(a, 0)), write("data_batch_2.bin", cifar(b, 3))});
  ASSERT_EQ(ds.size(), 5);
  SampleSpec spec = ds.spec();
  EXPECT_EQ(spec[0].shape, (Shape{3, 32, 32}));
  EXPECT_EQ(spec[1].shape, Shape{});
  std::vector<Tensor> fields{empty(spec[0].shape, DType::U8), empty(spec[1].shape, DType::I64)};
  const Bytes all{6, 9, 0, 1, 2};
  for (int64_t i = 0; i < ds.size(); ++i) {
    ds.read(i, 0, fields);
    EXPECT_EQ(*fields[1].data<int64_t>(), all[i]);
    const uint8_t* img = fields[0].data<uint8_t>();
    for (int64_t k = 0; k < Cifar10Dataset::kImageBytes; ++k) ASSERT_EQ(img[k], pixel(i, k)) << i << " " << k;
  }
  std::vector<Tensor> wrong{empty(Shape{3, 32, 31}, DType::U8), empty(Shape{}, DType::I64)};
  expect_error([&] { ds.read(0, 0, wrong); }, "field 'image' expected [3, 32, 32] u8, found [3, 32, 31] u8");
}

// The loader's worker threads fill batch rows through read(): batches match the files.
TEST_F(ImageDatasets, CifarThroughTheLoader) {
  const Bytes labels{6, 9, 0, 1, 2, 7, 3};
  auto ds = std::make_shared<Cifar10Dataset>(std::vector<std::string>{write("b.bin", cifar(labels, 0))});
  LoaderOptions o;
  o.batch_size = 3;
  o.num_workers = 2;
  DataLoader loader(ds, o);
  int64_t seen = 0;
  while (const Batch* b = loader.next()) {
    const uint8_t* img = b->field("image").data<uint8_t>();
    const int64_t* lbl = b->field("label").data<int64_t>();
    for (int64_t r = 0; r < b->rows; ++r, ++seen) {
      EXPECT_EQ(lbl[r], labels[seen]);
      for (int64_t k = 0; k < Cifar10Dataset::kImageBytes; k += 97)
        ASSERT_EQ(img[r * Cifar10Dataset::kImageBytes + k], pixel(seen, k));
    }
  }
  EXPECT_EQ(seen, 7);
}

TEST_F(ImageDatasets, CifarMalformedFiles) {
  Bytes b = cifar({1, 2}, 0);
  b.pop_back();
  std::string p = write("trunc.bin", b);
  expect_error([&] { Cifar10Dataset d({p}); },
               p + ": a CIFAR-10 batch is a whole number of 3073-byte records, found 6145 bytes");
  p = write("empty.bin", {});
  expect_error([&] { Cifar10Dataset d({p}); }, "found 0 bytes");
  p = write("range.bin", cifar({4, 0, 200}, 0));
  expect_error([&] { Cifar10Dataset d({p}); }, p + ": label 200 of record 2 is out of range (expected 0-9)");
  expect_error([&] { Cifar10Dataset d({}); }, "expected at least one batch file");
}

}  // namespace
