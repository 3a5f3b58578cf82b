// Per-sample image augmentation run inside the loader's workers: torchvision's
// RandomCrop(size, padding) + RandomHorizontalFlip(0.5) + ToTensor() + Normalize(mean, std), fused
// into one pass from the u8 image to the f32 batch row, optionally written channels-last.
// Implemented in src/data/transforms.cpp.
#pragma once
#include <cstdint>
#include <vector>

#include "fasttrain/dataset.h"

namespace ft::data {

struct ImageTransform {
  int64_t crop_size = 0;         // output height = width; 0 keeps the input size (no crop)
  int64_t padding = 0;           // zero padding on every side before cropping
  bool horizontal_flip = false;  // flip with probability 0.5
  std::vector<float> mean;       // per channel, in [0, 1] units (after /255); empty: 0
  std::vector<float> std;        // per channel; empty: 1
  // Write the sample as [H, W, C] instead of [C, H, W]. A batch [N, H, W, C] is then used as the
  // NCHW tensor batch.permute({0, 3, 1, 2}) — a view with channels-last strides, no copy.
  bool channels_last = false;
  uint64_t seed = 0;  // with (epoch, index), the only source of randomness
};

// What was drawn for one sample: the crop's corner in padded coordinates (0 .. in + 2 padding -
// crop_size) and whether the crop is mirrored.
struct CropFlip {
  int64_t top = 0, left = 0;
  bool flip = false;
};

// Wraps a dataset with an "image" field u8 [C, H, W]; that field becomes f32 [C, S, S] (or
// [S, S, C] channels-last, S the crop size), other fields pass through unchanged. The draw for a
// sample comes from Philox keyed by `seed` at counter (index, epoch), so batches are identical
// whatever the worker count. read() allocates nothing in steady state: the u8 image goes into a
// per-thread scratch buffer made once per thread and dataset.
class TransformedDataset : public Dataset {
 public:
  TransformedDataset(DatasetPtr inner, ImageTransform transform);

  int64_t size() const override { return inner_->size(); }
  SampleSpec spec() const override { return spec_; }
  void read(int64_t index, uint64_t epoch, const std::vector<Tensor>& fields) const override;

  // The crop/flip read() applies to sample `index` in `epoch` (exposed for tests and parity).
  CropFlip draw(int64_t index, uint64_t epoch) const;
  // The fused kernel: u8 [C, H, W] at `src` -> f32 sample at `dst` for the given draw.
  void apply(const uint8_t* src, const CropFlip& at, float* dst) const;

 private:
  DatasetPtr inner_;
  ImageTransform t_;
  SampleSpec inner_spec_, spec_;
  size_t image_field_ = 0;
  int64_t channels_ = 0, height_ = 0, width_ = 0, crop_ = 0;
  std::vector<float> scale_, bias_;  // out = pixel * scale[c] + bias[c] = (pixel / 255 - mean) / std
  uint64_t id_;                      // tells per-thread scratch buffers of different instances apart
};

}  // namespace ft::data
