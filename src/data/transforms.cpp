// The fused crop + flip + normalise kernel and its per-sample Philox draw.
#include "fasttrain/transforms.h"

#include <algorithm>
#include <atomic>

#include "data/sample_fields.h"
#include "fasttrain/random.h"

namespace ft::data {

namespace {

std::atomic<uint64_t> next_instance_id{1};

// Uniform in [0, n) from a 32-bit word (multiply-shift; bias below 2^-24 for image sizes).
int64_t bounded(uint32_t word, int64_t n) {
  return static_cast<int64_t>((static_cast<uint64_t>(word) * static_cast<uint64_t>(n)) >> 32);
}

// The u8 image read from the inner dataset, per worker thread: made on a thread's first read of
// an instance, reused for every later sample (no allocation per sample).
struct Scratch {
  uint64_t owner = 0;
  Tensor image;
  std::vector<Tensor> fields;  // the inner dataset's fields: caller's rows, image -> scratch
};
thread_local Scratch scratch;

}  // namespace

TransformedDataset::TransformedDataset(DatasetPtr inner, ImageTransform transform)
    : inner_(std::move(inner)), t_(std::move(transform)), id_(next_instance_id++) {
  FT_CHECK(inner_ != nullptr, "TransformedDataset: expected a dataset, found null");
  inner_spec_ = inner_->spec();
  auto it = std::find_if(inner_spec_.begin(), inner_spec_.end(), [](const FieldSpec& f) { return f.name == "image"; });
  FT_CHECK(it != inner_spec_.end(), "TransformedDataset: the dataset has no 'image' field");
  FT_CHECK(it->dtype == DType::U8 && it->shape.size() == 3, "TransformedDataset: expected 'image' u8 [C, H, W], found ",
           dtype_name(it->dtype), " ", it->shape.str());
  image_field_ = static_cast<size_t>(it - inner_spec_.begin());
  channels_ = it->shape[0], height_ = it->shape[1], width_ = it->shape[2];
  FT_CHECK(t_.padding >= 0, "TransformedDataset: padding must be >= 0, found ", t_.padding);
  FT_CHECK(t_.crop_size > 0 || (t_.crop_size == 0 && height_ == width_),
           "TransformedDataset: crop_size must be > 0 (or 0 for a square image), found ", t_.crop_size, " for ",
           height_, "x", width_);
  crop_ = t_.crop_size > 0 ? t_.crop_size : height_;
  FT_CHECK(crop_ <= height_ + 2 * t_.padding && crop_ <= width_ + 2 * t_.padding, "TransformedDataset: crop_size ",
           crop_, " exceeds the padded image ", height_ + 2 * t_.padding, "x", width_ + 2 * t_.padding);
  for (const auto* v : {&t_.mean, &t_.std})
    FT_CHECK(v->empty() || static_cast<int64_t>(v->size()) == channels_, "TransformedDataset: expected ", channels_,
             " per-channel ", v == &t_.mean ? "mean" : "std", " values, found ", v->size());
  scale_.resize(channels_), bias_.resize(channels_);
  for (int64_t c = 0; c < channels_; ++c) {
    float mean = t_.mean.empty() ? 0.0f : t_.mean[c];
    float std = t_.std.empty() ? 1.0f : t_.std[c];
    FT_CHECK(std > 0.0f, "TransformedDataset: std of channel ", c, " must be > 0, found ", std);
    scale_[c] = 1.0f / (255.0f * std);
    bias_[c] = -mean / std;
  }
  spec_ = inner_spec_;
  spec_[image_field_].dtype = DType::F32;
  spec_[image_field_].shape = t_.channels_last ? Shape{crop_, crop_, channels_} : Shape{channels_, crop_, crop_};
}

CropFlip TransformedDataset::draw(int64_t index, uint64_t epoch) const {
  Philox4 r = philox4x32(t_.seed, static_cast<uint64_t>(index), epoch);
  CropFlip d;
  d.top = bounded(r.v[0], height_ + 2 * t_.padding - crop_ + 1);
  d.left = bounded(r.v[1], width_ + 2 * t_.padding - crop_ + 1);
  d.flip = t_.horizontal_flip && (r.v[2] >> 31) != 0;
  return d;
}

void TransformedDataset::apply(const uint8_t* src, const CropFlip& at, float* dst) const {
  const int64_t S = crop_, P = t_.padding, C = channels_, H = height_, W = width_;
  // Crop columns cx in [x_lo, x_hi) read source column at.left + cx - P; the rest are padding.
  const int64_t x_lo = std::clamp<int64_t>(P - at.left, 0, S), x_hi = std::clamp<int64_t>(P - at.left + W, x_lo, S);
  for (int64_t y = 0; y < S; ++y) {
    const int64_t sy = at.top + y - P;
    const bool row_inside = sy >= 0 && sy < H;
    for (int64_t c = 0; c < C; ++c) {
      const float scale = scale_[c], bias = bias_[c];
      // Output pixels are `step` floats apart: 1 in [C, S, S], C in [S, S, C].
      const int64_t step = t_.channels_last ? C : 1;
      float* out = t_.channels_last ? dst + y * S * C + c : dst + (c * S + y) * S;
      if (!row_inside) {
        for (int64_t x = 0; x < S; ++x) out[x * step] = bias;
        continue;
      }
      const uint8_t* row = src + (c * H + sy) * W + (at.left - P);  // row[cx]: source of crop column cx
      if (!at.flip) {
        for (int64_t cx = 0; cx < x_lo; ++cx) out[cx * step] = bias;
        for (int64_t cx = x_lo; cx < x_hi; ++cx) out[cx * step] = static_cast<float>(row[cx]) * scale + bias;
        for (int64_t cx = x_hi; cx < S; ++cx) out[cx * step] = bias;
      } else {
        for (int64_t cx = 0; cx < x_lo; ++cx) out[(S - 1 - cx) * step] = bias;
        for (int64_t cx = x_lo; cx < x_hi; ++cx) out[(S - 1 - cx) * step] = static_cast<float>(row[cx]) * scale + bias;
        for (int64_t cx = x_hi; cx < S; ++cx) out[(S - 1 - cx) * step] = bias;
      }
    }
  }
}

void TransformedDataset::read(int64_t index, uint64_t epoch, const std::vector<Tensor>& fields) const {
  check_sample_fields("TransformedDataset", spec_, fields);
  if (scratch.owner != id_) {
    scratch.image = empty(inner_spec_[image_field_].shape, DType::U8);
    scratch.fields.assign(fields.size(), Tensor());
    scratch.owner = id_;
  }
  for (size_t f = 0; f < fields.size(); ++f) scratch.fields[f] = f == image_field_ ? scratch.image : fields[f];
  inner_->read(index, epoch, scratch.fields);
  apply(scratch.image.data<uint8_t>(), draw(index, epoch), fields[image_field_].data<float>());
  for (size_t f = 0; f < fields.size(); ++f)  // drop the references to the caller's rows
    if (f != image_field_) scratch.fields[f] = Tensor();
}

}  // namespace ft::data
