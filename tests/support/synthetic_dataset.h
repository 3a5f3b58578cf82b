// A small random-access dataset whose samples say where they came from, and helpers that copy
// batches out, for the loader and prefetcher tests.
#pragma once
#include <atomic>
#include <vector>

#include "fasttrain/dataset.h"
#include "fasttrain/error.h"
#include "fasttrain/loader.h"

namespace ft::data::test_support {

// Sample i: image [2, 3] float = 100 i + j + epoch / 4 (so the epoch reaches read()), label = i.
// Sample `broken` throws while `fail` is set.
class SyntheticDataset : public Dataset {
 public:
  explicit SyntheticDataset(int64_t n, int64_t broken = -1) : n_(n), broken_(broken) {}
  int64_t size() const override { return n_; }
  SampleSpec spec() const override { return {{"image", {2, 3}, DType::F32}, {"label", {}, DType::I64}}; }
  void read(int64_t index, uint64_t epoch, const std::vector<Tensor>& fields) const override {
    FT_CHECK(!(index == broken_ && fail.load()), "synthetic: sample file vanished");
    float* image = fields[0].data<float>();
    for (int j = 0; j < 6; ++j) image[j] = static_cast<float>(100 * index + j) + static_cast<float>(epoch) / 4;
    *fields[1].data<int64_t>() = index;
  }
  mutable std::atomic<bool> fail{true};

 private:
  int64_t n_, broken_;
};

// What a batch held, copied out (the batch's tensors are reused after the next call).
struct Seen {
  std::vector<int64_t> labels;
  std::vector<float> images;
  uint64_t epoch;
  int64_t index;
  bool operator==(const Seen&) const = default;
};

// Works for batches on any device (a device batch is read back on the current stream).
inline Seen copy(const Batch& b) {
  Seen s{{}, {}, b.epoch, b.index};
  const Tensor labels = b.field("label").to(Device::cpu());
  const Tensor images = b.field("image").to(Device::cpu());
  const int64_t* l = labels.data<int64_t>();
  s.labels.assign(l, l + b.rows);
  const float* x = images.data<float>();
  s.images.assign(x, x + b.rows * 6);
  return s;
}

// Every batch of the next `epochs` epochs from a DataLoader or a DevicePrefetcher.
template <class Batches>
std::vector<Seen> drain(Batches& batches, int epochs) {
  std::vector<Seen> out;
  for (int e = 0; e < epochs; ++e)
    while (const Batch* b = batches.next()) out.push_back(copy(*b));
  return out;
}

}  // namespace ft::data::test_support
