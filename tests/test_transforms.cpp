// TransformedDataset: crop + flip + normalise against a straightforward reference (pad, crop,
// mirror, divide, in that order), channels-last layout, draws covering their range, identical
// batches for 0 and 2 workers, no allocation per sample, and input validation.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "fasttrain/allocator.h"
#include "fasttrain/loader.h"
#include "fasttrain/transforms.h"
#include "support/expect_error.h"
#include "support/parity.h"

namespace ft::data {
namespace {

// Sample i: image u8 [C, H, W] with pixel (i * 37 + k * 11 + 5) mod 251 + 1 (never 0, so padding
// is distinguishable), label = i.
class ImageBytes : public Dataset {
 public:
  ImageBytes(int64_t n, int64_t c, int64_t h, int64_t w) : n_(n), c_(c), h_(h), w_(w) {}
  int64_t size() const override { return n_; }
  SampleSpec spec() const override { return {{"image", {c_, h_, w_}, DType::U8}, {"label", {}, DType::I64}}; }
  void read(int64_t index, uint64_t, const std::vector<Tensor>& fields) const override {
    uint8_t* p = fields[0].data<uint8_t>();
    for (int64_t k = 0; k < c_ * h_ * w_; ++k) p[k] = pixel(index, k);
    *fields[1].data<int64_t>() = index;
  }
  static uint8_t pixel(int64_t i, int64_t k) { return static_cast<uint8_t>((i * 37 + k * 11 + 5) % 251 + 1); }

 private:
  int64_t n_, c_, h_, w_;
};

// torchvision's order of operations, one pixel at a time: zero-pad, crop at (top, left), mirror,
// ToTensor (/255), Normalize. Returns [C, S, S].
std::vector<double> reference(int64_t index, int64_t C, int64_t H, int64_t W, const ImageTransform& t, CropFlip d) {
  const int64_t S = t.crop_size, P = t.padding;
  std::vector<double> out(C * S * S);
  for (int64_t c = 0; c < C; ++c)
    for (int64_t y = 0; y < S; ++y)
      for (int64_t x = 0; x < S; ++x) {
        int64_t py = d.top + y, px = d.left + (d.flip ? S - 1 - x : x);  // in the padded image
        int64_t sy = py - P, sx = px - P;
        double v = (sy >= 0 && sy < H && sx >= 0 && sx < W) ? ImageBytes::pixel(index, (c * H + sy) * W + sx) : 0.0;
        out[(c * S + y) * S + x] = (v / 255.0 - t.mean[c]) / t.std[c];
      }
  return out;
}

ImageTransform cifar_like(bool channels_last = false) {
  ImageTransform t;
  t.crop_size = 6, t.padding = 2, t.horizontal_flip = true;
  t.mean = {0.49f, 0.48f, 0.45f}, t.std = {0.25f, 0.24f, 0.26f};
  t.channels_last = channels_last, t.seed = 7;
  return t;
}

TEST(TransformedDataset, MatchesReferenceForEveryDrawnCropAndFlip) {
  const int64_t C = 3, H = 5, W = 7;  // non-square, smaller than the padded crop window
  for (bool channels_last : {false, true}) {
    ImageTransform t = cifar_like(channels_last);
    TransformedDataset ds(std::make_shared<ImageBytes>(40, C, H, W), t);
    const int64_t S = t.crop_size;
    EXPECT_EQ(ds.spec()[0].shape, channels_last ? Shape({S, S, C}) : Shape({C, S, S}));
    Tensor image = empty(ds.spec()[0].shape, DType::F32), label = empty(Shape{}, DType::I64);
    std::set<int64_t> tops, lefts, flips;
    for (uint64_t epoch : {0u, 3u})
      for (int64_t i = 0; i < 40; ++i) {
        ds.read(i, epoch, {image, label});
        CropFlip d = ds.draw(i, epoch);
        tops.insert(d.top), lefts.insert(d.left), flips.insert(d.flip);
        std::vector<double> want = reference(i, C, H, W, t, d);
        const float* got = image.data<float>();
        for (int64_t c = 0; c < C; ++c)
          for (int64_t y = 0; y < S; ++y)
            for (int64_t x = 0; x < S; ++x) {
              float g = channels_last ? got[(y * S + x) * C + c] : got[(c * S + y) * S + x];
              ASSERT_NEAR(g, want[(c * S + y) * S + x], 2e-6) << "sample " << i << " c" << c << " y" << y << " x" << x;
            }
        EXPECT_EQ(*label.data<int64_t>(), i);
      }
    // Every corner of the padded window (H + 2P - S + 1 = 4 rows, W + 2P - S + 1 = 6 columns) and
    // both flips occur over 80 draws.
    EXPECT_EQ(tops.size(), 4u);
    EXPECT_EQ(lefts.size(), 6u);
    EXPECT_EQ(flips.size(), 2u);
  }
}

// PyTorch parity of the fused kernel for given draws (tests/parity/cases_transforms.py).
TEST(TransformedDataset, MatchesPyTorchCropFlipNormalize) {
  for (const char* name : {"transform_crop32_pad4_0_0_0", "transform_crop32_pad4_8_8_1", "transform_crop32_pad4_3_6_1",
                           "transform_crop32_pad4_4_4_0", "transform_crop32_pad4_8_1_0"}) {
    ft::test::ParityCase c(name);
    if (!c.available()) GTEST_SKIP() << c.skip_reason();
    ImageTransform t;
    t.crop_size = c.param<int64_t>("size"), t.padding = c.param<int64_t>("padding"), t.horizontal_flip = true;
    t.mean = c.param<std::vector<float>>("mean"), t.std = c.param<std::vector<float>>("std");
    TransformedDataset ds(std::make_shared<ImageBytes>(1, 3, 32, 32), t);
    Tensor image = c.input("x").to(DType::U8).contiguous(), out = empty(Shape{3, 32, 32}, DType::F32);
    ds.apply(image.data<uint8_t>(), {c.param<int64_t>("top"), c.param<int64_t>("left"), c.param<bool>("flip")},
             out.data<float>());
    SCOPED_TRACE(name);
    c.expect_output(out);
  }
}

TEST(TransformedDataset, DrawDependsOnSeedEpochAndIndexOnly) {
  TransformedDataset a(std::make_shared<ImageBytes>(64, 3, 8, 8), cifar_like());
  ImageTransform other = cifar_like();
  other.seed = 8;
  TransformedDataset b(std::make_shared<ImageBytes>(64, 3, 8, 8), other);
  int same_epoch_diff = 0, seed_diff = 0;
  for (int64_t i = 0; i < 64; ++i) {
    CropFlip d0 = a.draw(i, 0), d0_again = a.draw(i, 0), d1 = a.draw(i, 1), s = b.draw(i, 0);
    EXPECT_TRUE(d0.top == d0_again.top && d0.left == d0_again.left && d0.flip == d0_again.flip);
    same_epoch_diff += d0.top != d1.top || d0.left != d1.left || d0.flip != d1.flip;
    seed_diff += d0.top != s.top || d0.left != s.left || d0.flip != s.flip;
  }
  EXPECT_GT(same_epoch_diff, 32);  // a new epoch re-draws
  EXPECT_GT(seed_diff, 32);
}

TEST(TransformedDataset, NoCropNoFlipIsToTensor) {
  ImageTransform t;  // defaults: whole image, mean 0, std 1
  TransformedDataset ds(std::make_shared<ImageBytes>(3, 1, 4, 4), t);
  Tensor image = empty(Shape{1, 4, 4}, DType::F32), label = empty(Shape{}, DType::I64);
  ds.read(2, 5, {image, label});
  for (int64_t k = 0; k < 16; ++k) EXPECT_FLOAT_EQ(image.data<float>()[k], ImageBytes::pixel(2, k) / 255.0f);
}

// Batches through the DataLoader, copied out.
std::vector<float> all_batches(const DatasetPtr& ds, int workers) {
  LoaderOptions o;
  o.batch_size = 16, o.num_workers = workers, o.shuffle = true, o.seed = 3;
  DataLoader loader(ds, o);
  std::vector<float> out;
  for (int epoch = 0; epoch < 2; ++epoch)
    while (const Batch* b = loader.next()) {
      const float* x = b->field("image").data<float>();
      out.insert(out.end(), x, x + b->field("image").numel());
    }
  return out;
}

TEST(TransformedDataset, LoaderBatchesAreTheSameForAnyWorkerCount) {
  auto ds = std::make_shared<TransformedDataset>(std::make_shared<ImageBytes>(100, 3, 8, 8), cifar_like(true));
  std::vector<float> serial = all_batches(ds, 0);
  EXPECT_EQ(serial.size(), 2u * 100 * 6 * 6 * 3);
  EXPECT_EQ(all_batches(ds, 2), serial);
}

TEST(TransformedDataset, AllocatesNothingPerSampleInSteadyState) {
  auto ds = std::make_shared<TransformedDataset>(std::make_shared<ImageBytes>(64, 3, 8, 8), cifar_like());
  for (int workers : {0, 2}) {
    LoaderOptions o;
    o.batch_size = 4, o.num_workers = workers, o.shuffle = true;
    DataLoader loader(ds, o);
    while (loader.next()) {  // warm-up epoch: each worker thread makes its scratch image once
    }
    const int64_t before = allocator_for(Device::cpu()).stats().num_allocs;
    for (int e = 0; e < 3; ++e)
      while (loader.next()) {
      }
    // A worker the scheduler kept off the CPU for the whole warm-up epoch (a loaded machine) makes
    // its one scratch image later; per-sample allocation would be 192 here.
    EXPECT_LE(allocator_for(Device::cpu()).stats().num_allocs - before, workers) << workers << " workers";
  }
}

TEST(TransformedDataset, RejectsBadConfigurations) {
  using ft::test::expect_error;
  auto images = std::make_shared<ImageBytes>(4, 3, 8, 8);
  auto with = [&](auto edit) {
    ImageTransform t = cifar_like();
    edit(t);
    return [images, t] { TransformedDataset(images, t); };
  };
  expect_error([] { TransformedDataset(nullptr, {}); }, "found null");
  expect_error(with([](ImageTransform& t) { t.crop_size = 13; }), "crop_size 13 exceeds the padded image 12x12");
  expect_error(with([](ImageTransform& t) { t.padding = -1; }), "padding must be >= 0, found -1");
  expect_error(with([](ImageTransform& t) { t.mean = {0.5f}; }), "expected 3 per-channel mean values, found 1");
  expect_error(with([](ImageTransform& t) { t.std[1] = 0; }), "std of channel 1 must be > 0");
  class Floats : public ImageBytes {
   public:
    using ImageBytes::ImageBytes;
    SampleSpec spec() const override { return {{"image", {3, 8, 8}, DType::F32}}; }
  };
  expect_error([] { TransformedDataset(std::make_shared<Floats>(1, 3, 8, 8), {}); },
               "expected 'image' u8 [C, H, W], found f32");
  TransformedDataset ds(images, cifar_like());
  expect_error(
      [&] {
        ds.read(0, 0, {empty(Shape{3, 8, 8}, DType::U8), empty(Shape{}, DType::I64)});
      },
      "field 'image' expected");
}

}  // namespace
}  // namespace ft::data
