// ClassifyData (classify_data.h): the four data sources, the held-out split, the per-channel
// statistics, and the datasets the Trainer's loaders read.
//
// 8-bit images (mnist, cifar10, folder) stay u8 until the last step: the source writes u8
// [C, S, S] (resampled to --image-size where its own size differs), a Subset picks a split, and
// data::TransformedDataset crops, flips and normalises into the f32 batch row in one pass, on the
// loader's workers. npy data is held in memory as f32, normalised once when loaded; its images
// are cropped and flipped by NpyRows with the same per-sample Philox draw.
#include "tasks/classify_data.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <optional>

#include "data/image_decode.h"
#include "data/sample_fields.h"
#include "fasttrain/image_datasets.h"
#include "fasttrain/loader.h"
#include "fasttrain/npy.h"
#include "fasttrain/parallel.h"
#include "fasttrain/random.h"
#include "fasttrain/transforms.h"
#include "train/seeds.h"

namespace ft::train {

namespace fs = std::filesystem;

namespace {

// The augmentation of the issue and of the usual CIFAR recipe: pad 4, crop back to the size.
constexpr int64_t kCropPadding = 4;
// A folder too large to decode up front is sampled for its statistics: this many images, evenly
// spaced through the training split. Everything held in memory is measured in full.
constexpr int64_t kMaxStatsSamples = 10000;
// A channel whose values barely vary is centred but not scaled (dividing would blow up noise).
constexpr double kMinStd = 1e-6;

const char* const kForms = "mnist:DIR, cifar10:DIR, folder:DIR or npy:X.npy,y.npy";

struct DataSpec {
  std::string text;    // as given
  std::string kind;    // mnist, cifar10, folder, npy
  std::string path;    // the folder, or npy's features file
  std::string labels;  // npy's labels file
};

DataSpec parse_spec(const std::string& text, const char* option) {
  const size_t colon = text.find(':');
  DataSpec s{text, colon == std::string::npos ? "" : text.substr(0, colon), "", ""};
  FT_CHECK(s.kind == "mnist" || s.kind == "cifar10" || s.kind == "folder" || s.kind == "npy", "option ", option,
           ": expected ", kForms, ", found '", text, "'");
  s.path = text.substr(colon + 1);
  if (s.kind == "npy") {
    const size_t comma = s.path.find(',');
    FT_CHECK(comma != std::string::npos && comma > 0 && comma + 1 < s.path.size() &&
                 s.path.find(',', comma + 1) == std::string::npos,
             "option ", option, ": expected npy:X.npy,y.npy (the features file, a comma, the labels file), found '",
             text, "'");
    s.labels = s.path.substr(comma + 1);
    s.path.resize(comma);
  } else {
    FT_CHECK(!s.path.empty(), "option ", option, ": '", text, "' names no folder (expected ", kForms, ")");
  }
  return s;
}

// --- datasets between the sources and the loaders -------------------------------------------

// The samples of `inner` at `indices`, in that order (a split).
class Subset : public data::Dataset {
 public:
  Subset(data::DatasetPtr inner, std::vector<int64_t> indices)
      : inner_(std::move(inner)), indices_(std::move(indices)) {}
  int64_t size() const override { return static_cast<int64_t>(indices_.size()); }
  data::SampleSpec spec() const override { return inner_->spec(); }
  void read(int64_t index, uint64_t epoch, const std::vector<Tensor>& fields) const override {
    FT_CHECK(index >= 0 && index < size(), "Subset: sample ", index, " out of range [0, ", size(), ")");
    inner_->read(indices_[index], epoch, fields);
  }

 private:
  data::DatasetPtr inner_;
  std::vector<int64_t> indices_;
};

std::atomic<uint64_t> next_resizer_id{1};

// MNIST or CIFAR-10 images (u8 [C, H, W]) resampled to size x size (data::resize_square). The
// source image goes through a per-thread buffer made on the thread's first read.
class ResizedImages : public data::Dataset {
 public:
  ResizedImages(data::DatasetPtr inner, int64_t size) : inner_(std::move(inner)), size_(size), id_(next_resizer_id++) {
    inner_spec_ = inner_->spec();
    spec_ = inner_spec_;
    spec_[0].shape = Shape{inner_spec_[0].shape[0], size, size};
  }
  int64_t size() const override { return inner_->size(); }
  data::SampleSpec spec() const override { return spec_; }
  void read(int64_t index, uint64_t epoch, const std::vector<Tensor>& fields) const override {
    thread_local struct {
      uint64_t owner = 0;
      std::vector<Tensor> fields;
    } scratch;
    if (scratch.owner != id_) {
      scratch.fields = {empty(inner_spec_[0].shape, DType::U8), Tensor()};
      scratch.owner = id_;
    }
    data::check_sample_fields("ResizedImages", spec_, fields);
    scratch.fields[1] = fields[1];
    inner_->read(index, epoch, scratch.fields);
    scratch.fields[1] = Tensor();
    const Shape& in = inner_spec_[0].shape;
    data::resize_square(scratch.fields[0].data<uint8_t>(), in[1], in[2], in[0], in[2], 1, in[1] * in[2],
                        fields[0].data<uint8_t>(), size_);
  }

 private:
  data::DatasetPtr inner_;
  int64_t size_;
  uint64_t id_;
  data::SampleSpec inner_spec_, spec_;
};

// Uniform in [0, n) from a 32-bit word (as data::TransformedDataset draws its crops).
int64_t bounded(uint32_t word, int64_t n) {
  return static_cast<int64_t>((static_cast<uint64_t>(word) * static_cast<uint64_t>(n)) >> 32);
}

// Rows of in-memory, normalised npy data: "features" f32 [d] or "image" f32 [C, S, S], and
// "label" i64. Images of the training split get data::TransformedDataset's augmentation: a
// crop of the image zero-padded (before normalising, so padding holds -mean / std) by `padding`,
// mirrored when `flip` draws it, from Philox keyed by `seed` at counter (index, epoch).
class NpyRows : public data::Dataset {
 public:
  NpyRows(Tensor x, Tensor y, int64_t padding, bool flip, std::vector<float> pad, uint64_t seed)
      : x_(std::move(x)), y_(std::move(y)), padding_(padding), flip_(flip), pad_(std::move(pad)), seed_(seed) {
    Shape row = x_.shape();
    row.erase(0);
    spec_ = {{row.size() == 1 ? "features" : "image", row, DType::F32}, {"label", Shape{}, DType::I64}};
    row_ = row.numel();
  }
  int64_t size() const override { return x_.size(0); }
  data::SampleSpec spec() const override { return spec_; }
  void read(int64_t index, uint64_t epoch, const std::vector<Tensor>& fields) const override {
    FT_CHECK(index >= 0 && index < size(), "NpyRows: sample ", index, " out of range [0, ", size(), ")");
    data::check_sample_fields("NpyRows", spec_, fields);
    const float* src = x_.data<float>() + index * row_;
    float* dst = fields[0].data<float>();
    *fields[1].data<int64_t>() = y_.data<int64_t>()[index];
    if (padding_ == 0 && !flip_) {
      std::memcpy(dst, src, sizeof(float) * row_);
      return;
    }
    const Shape& s = spec_[0].shape;
    const int64_t C = s[0], H = s[1], W = s[2], P = padding_;
    const Philox4 r = philox4x32(seed_, static_cast<uint64_t>(index), epoch);
    const int64_t top = bounded(r.v[0], 2 * P + 1), left = bounded(r.v[1], 2 * P + 1);
    const bool mirror = flip_ && (r.v[2] >> 31) != 0;
    for (int64_t c = 0; c < C; ++c)
      for (int64_t y = 0; y < H; ++y) {
        const int64_t sy = top + y - P;
        float* out = dst + (c * H + y) * W;
        for (int64_t x = 0; x < W; ++x) {
          const int64_t sx = left + (mirror ? W - 1 - x : x) - P;
          out[x] = sy >= 0 && sy < H && sx >= 0 && sx < W ? src[(c * H + sy) * W + sx] : pad_[c];
        }
      }
  }

 private:
  Tensor x_, y_;
  int64_t padding_;
  bool flip_;
  std::vector<float> pad_;
  uint64_t seed_;
  data::SampleSpec spec_;
  int64_t row_ = 0;
};

// --- image sources (mnist, cifar10, folder) --------------------------------------------------

struct ImageSource {
  data::DatasetPtr images;  // "image" u8 [C, S, S], "label" i64
  std::vector<std::string> classes;
  bool lazy = false;  // decoded in read()
};

std::vector<std::string> digit_classes(int64_t n) {
  std::vector<std::string> names;
  for (int64_t i = 0; i < n; ++i) names.push_back(std::to_string(i));
  return names;
}

fs::path existing_folder(const DataSpec& s, const char* expected) {
  std::error_code ec;
  FT_CHECK(fs::is_directory(s.path, ec), s.path, ": not a folder (", s.kind, ":DIR names the folder holding ", expected,
           ")");
  return s.path;
}

// A file of a dataset's standard layout, or its compressed download (NAME.gz, read as it is).
// Some MNIST mirrors spell the names train-images.idx3-ubyte.
std::string required_file(const fs::path& dir, const std::string& name, const DataSpec& s) {
  std::vector<std::string> spellings = {name};
  if (const size_t dash = name.rfind("-idx"); dash != std::string::npos)
    spellings.push_back(name.substr(0, dash) + "." + name.substr(dash + 1));
  std::error_code ec;
  for (const std::string& spelling : spellings)
    for (const char* suffix : {"", ".gz"})
      if (const fs::path p = dir / (spelling + suffix); fs::is_regular_file(p, ec)) return p.string();
  FT_FAIL((dir / name).string(), ": not found, nor ", name, ".gz (", s.text,
          " reads the standard file names of the download)");
}

ImageSource open_images(const DataSpec& s, bool validation, int64_t size) {
  ImageSource src;
  if (s.kind == "mnist") {
    const fs::path dir = existing_folder(s, "train-images-idx3-ubyte and train-labels-idx1-ubyte");
    const std::string prefix = validation ? "t10k" : "train";
    const std::string images = required_file(dir, prefix + "-images-idx3-ubyte", s);
    const std::string labels = required_file(dir, prefix + "-labels-idx1-ubyte", s);
    src.images = std::make_shared<data::MnistDataset>(images, labels);
    src.classes = digit_classes(10);
    FT_CHECK(src.images->size() > 0, images, ": holds no images (expected at least 1)");
  } else if (s.kind == "cifar10") {
    fs::path dir = existing_folder(s, "data_batch_1.bin .. data_batch_5.bin and test_batch.bin");
    std::error_code ec;
    if (fs::is_directory(dir / "cifar-10-batches-bin", ec)) dir /= "cifar-10-batches-bin";  // the unpacked archive
    std::vector<std::string> batches;
    if (validation) {
      batches.push_back(required_file(dir, "test_batch.bin", s));
    } else {
      for (int k = 1; k <= 5; ++k)
        if (fs::is_regular_file(dir / ("data_batch_" + std::to_string(k) + ".bin"), ec))
          batches.push_back((dir / ("data_batch_" + std::to_string(k) + ".bin")).string());
      FT_CHECK(!batches.empty(), (dir / "data_batch_1.bin").string(), ": not found (", s.text,
               " reads data_batch_1.bin .. data_batch_5.bin of the binary version, cifar-10-binary.tar.gz)");
    }
    src.images = std::make_shared<data::Cifar10Dataset>(batches);
    src.classes = {"airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"};
  } else {
    data::ImageFolderOptions o;
    o.image_size = size;
    auto folder = std::make_shared<data::ImageFolderDataset>(s.path, o);
    src.classes = folder->classes();
    FT_CHECK(src.classes.size() >= 2, s.path, ": one class folder (", src.classes.front(),
             "); expected a sub-folder per class and at least 2 classes");
    src.lazy = !folder->preloaded();
    src.images = folder;
  }
  const Shape shape = src.images->spec()[0].shape;  // spec() returns a copy
  if (shape[1] != size || shape[2] != size) src.images = std::make_shared<ResizedImages>(src.images, size);
  return src;
}

// Per-channel mean and standard deviation of u8 images, in [0, 1] units, over all of `ds` or
// (lazy) up to kMaxStatsSamples evenly spaced samples. Integer sums: exact, whatever the threads.
// `ds` is all of --data, the held-out part included: the statistics then depend on --data alone,
// not on the seed or val_fraction, so `fasttrain eval`, which rebuilds the task with --val-data
// replaced, normalises exactly as the training run did.
void image_stats(const data::Dataset& ds, bool lazy, ClassifyInfo& info) {
  const int64_t n = ds.size(), count = lazy ? std::min(n, kMaxStatsSamples) : n;
  const Shape shape = ds.spec()[0].shape;
  const int64_t C = shape[0], plane = shape[1] * shape[2];
  std::vector<uint64_t> sum(C, 0), squares(C, 0);
  std::mutex mutex;
  parallel_for(0, count, 64, [&](int64_t begin, int64_t end) {
    std::vector<Tensor> fields{empty(shape, DType::U8), empty(Shape{}, DType::I64)};
    std::vector<uint64_t> s(C, 0), q(C, 0);
    for (int64_t i = begin; i < end; ++i) {
      ds.read(i * n / count, 0, fields);
      const uint8_t* p = fields[0].data<uint8_t>();
      for (int64_t c = 0; c < C; ++c)
        for (int64_t k = 0; k < plane; ++k) {
          const uint64_t v = p[c * plane + k];
          s[c] += v;
          q[c] += v * v;
        }
    }
    std::lock_guard<std::mutex> lock(mutex);
    for (int64_t c = 0; c < C; ++c) sum[c] += s[c], squares[c] += q[c];
  });
  const double values = static_cast<double>(count) * static_cast<double>(plane);
  info.mean.assign(C, 0), info.std.assign(C, 1);
  for (int64_t c = 0; c < C; ++c) {
    const double mean = static_cast<double>(sum[c]) / values;
    const double var = std::max(0.0, static_cast<double>(squares[c]) / values - mean * mean);
    info.mean[c] = mean / 255;
    info.std[c] = std::sqrt(var) / 255 < kMinStd ? 1.0 : std::sqrt(var) / 255;
  }
  info.stats_samples = count;
}

// --- npy -------------------------------------------------------------------------------------

struct NpyPair {
  Tensor x;  // f32 [n, d] or [n, C, H, W], contiguous, our own copy
  Tensor y;  // i64 [n]
};

NpyPair load_pair(const DataSpec& s) {
  Tensor x = load_npy(s.path);
  Tensor y = load_npy(s.labels);
  const Shape xs = x.shape();
  FT_CHECK(x.dim() >= 2 && x.dim() <= 4, s.path, ": expected [n, d] feature vectors or [n, C, H, W] images, found ",
           "shape ", xs.str());
  FT_CHECK(x.dtype() != DType::Bool, s.path, ": expected numbers, found booleans");
  FT_CHECK(y.dim() == 1, s.labels, ": expected labels of shape [n], found ", y.shape().str());
  FT_CHECK(y.dtype() == DType::I64 || y.dtype() == DType::I32 || y.dtype() == DType::U8, s.labels,
           ": expected integer labels (int64, int32 or uint8), found ", dtype_name(y.dtype()));
  FT_CHECK(y.size(0) == x.size(0), s.labels, ": holds ", y.size(0), " labels but ", s.path, " holds ", x.size(0),
           " rows; expected one label per row");
  FT_CHECK(x.size(0) > 0, s.path, ": holds no rows (expected at least 1 sample)");
  for (int64_t d = 1; d < x.dim(); ++d) FT_CHECK(xs[d] > 0, s.path, ": a sample of shape ", xs.str(), " is empty");
  if (x.dim() == 3) x = x.reshape(Shape{xs[0], 1, xs[1], xs[2]});           // [n, H, W]: one channel
  NpyPair p{x.to(DType::F32).contiguous(), y.to(DType::I64).contiguous()};  // x is ours: normalised in place later
  const int64_t n = p.x.size(0), row = p.x.numel() / n;
  const float* v = p.x.data<float>();
  for (int64_t i = 0; i < n * row; ++i)
    FT_CHECK(std::isfinite(v[i]), s.path, ": row ", i / row, " holds a non-finite value (", v[i], ")");
  return p;
}

// Labels in [0, classes); `classes` 0: any non-negative label (the training file defines them).
void check_labels(const Tensor& y, const std::string& file, int64_t classes, const std::string& defined_by) {
  const int64_t* l = y.data<int64_t>();
  for (int64_t i = 0; i < y.size(0); ++i) {
    FT_CHECK(l[i] >= 0, file, ": row ", i, " holds label ", l[i], "; expected a class in [0, classes)");
    FT_CHECK(classes == 0 || l[i] < classes, file, ": row ", i, " holds label ", l[i], "; expected a class in [0, ",
             classes, ") (the classes of ", defined_by, ")");
  }
}

// Rows `rows` of t (a split), copied.
Tensor take_rows(const Tensor& t, const std::vector<int64_t>& rows) {
  Shape shape = t.shape();
  shape[0] = static_cast<int64_t>(rows.size());
  Tensor out = empty(shape, t.dtype());
  const size_t bytes = t.nbytes() / t.size(0);
  for (size_t i = 0; i < rows.size(); ++i)
    std::memcpy(static_cast<char*>(out.raw_data()) + i * bytes,
                static_cast<const char*>(t.raw_data()) + rows[i] * bytes, bytes);
  return out;
}

// Mean and std over all rows of --data (as image_stats), per channel of images or per feature of
// vectors.
void npy_stats(const Tensor& x, ClassifyInfo& info) {
  const int64_t n = x.size(0);
  const int64_t groups = info.images ? info.channels : info.features;  // statistics per group
  const int64_t inner = info.images ? info.image_size * info.image_size : 1;
  const float* v = x.data<float>();
  auto at = [&](int64_t i, int64_t g, int64_t k) { return static_cast<double>(v[(i * groups + g) * inner + k]); };
  info.mean.assign(groups, 0), info.std.assign(groups, 1);
  const double count = static_cast<double>(n) * static_cast<double>(inner);
  for (int64_t g = 0; g < groups; ++g) {
    double sum = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < inner; ++k) sum += at(i, g, k);
    const double mean = sum / count;
    double squares = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < inner; ++k) squares += (at(i, g, k) - mean) * (at(i, g, k) - mean);
    const double std = std::sqrt(squares / count);
    info.mean[g] = mean;
    info.std[g] = std < kMinStd ? 1.0 : std;
  }
  info.stats_samples = n;
}

void normalise(Tensor& x, const ClassifyInfo& info) {
  const int64_t n = x.size(0);
  const int64_t groups = static_cast<int64_t>(info.mean.size());
  const int64_t inner = x.numel() / (n * groups);
  float* v = x.data<float>();
  for (int64_t i = 0; i < n; ++i)
    for (int64_t g = 0; g < groups; ++g) {
      const float mean = static_cast<float>(info.mean[g]), inv = static_cast<float>(1.0 / info.std[g]);
      float* p = v + (i * groups + g) * inner;
      for (int64_t k = 0; k < inner; ++k) p[k] = (p[k] - mean) * inv;
    }
}

// --- splits ----------------------------------------------------------------------------------

// The held-out split: the first round(val_fraction x n) of a permutation seeded by the run's
// seed go to validation, the rest to training; both ascending (reads in file order).
void hold_out(int64_t n, const TrainerConfig& c, std::vector<int64_t>& train, std::vector<int64_t>& val) {
  const auto n_val = static_cast<int64_t>(std::llround(c.data.val_fraction * static_cast<double>(n)));
  FT_CHECK(n_val >= 1, c.data.train, ": holding out val_fraction ", c.data.val_fraction, " of its ", n,
           " samples leaves the validation split empty; expected at least 1 sample (raise --val-fraction or give "
           "--val-data)");
  FT_CHECK(n_val < n, c.data.train, ": holding out val_fraction ", c.data.val_fraction, " of its ", n,
           " samples leaves the training split empty; expected at least 1 sample (lower --val-fraction or give "
           "--val-data)");
  std::vector<int64_t> perm;
  data::random_permutation(n, derive_seed(c.seed, SeedUse::ValData), 0, perm);
  val.assign(perm.begin(), perm.begin() + n_val);
  train.assign(perm.begin() + n_val, perm.end());
  std::sort(val.begin(), val.end());
  std::sort(train.begin(), train.end());
}

void check_split_sizes(const TrainerConfig& c, const ClassifyInfo& info) {
  FT_CHECK(info.val_samples >= 1, c.data.val, ": the validation split is empty (expected at least 1 sample)");
  if (c.batch_size > 0)  // 0: the batch-size finder picks it (at most the split)
    FT_CHECK(info.train_samples >= c.batch_size * c.accumulate, c.data.train, ": the training split holds ",
             info.train_samples, " samples", info.held_out ? " (after holding out val_fraction)" : "",
             ", fewer than batch_size x accumulate = ", c.batch_size * c.accumulate,
             " (a step needs that many; lower --batch-size)");
}

std::vector<float> floats(const std::vector<double>& v) { return {v.begin(), v.end()}; }

}  // namespace

Shape ClassifyInfo::sample_shape() const { return images ? Shape{channels, image_size, image_size} : Shape{features}; }

void check_classify_model(const std::string& model, const ClassifyInfo& d, const std::string& data) {
  if (model == "mlp") return;  // flattens whatever it is given
  FT_CHECK(d.images, "option model: ", model, " takes images [C, H, W]; ", data, " holds feature vectors of ",
           d.features, " values (use --model mlp)");
  if (model.rfind("resnet", 0) == 0)
    FT_CHECK(d.channels == 3, "option model: ", model, " takes 3-channel (RGB) images; ", data, " holds ", d.channels,
             "-channel images (use --model cnn-mini or mlp)");
  if (model == "resnet18" || model == "resnet50")
    FT_CHECK(d.image_size >= 32, "option model: ", model,
             " reduces images 32-fold (ImageNet stem and four stages) and takes 32x32 pixels or more; ", data,
             " gives ", d.image_size, "x", d.image_size, " images (use resnet20 or cnn-mini for small images)");
}

ClassifyData::ClassifyData(const TrainerConfig& c) {
  const DataSpec train = parse_spec(c.data.train, "data");
  std::optional<DataSpec> val;
  if (!c.data.val.empty()) {
    val = parse_spec(c.data.val, "val_data");
    FT_CHECK(val->kind == train.kind, "option val_data: expected ", train.kind, ": data like --data (", c.data.train,
             "), found '", c.data.val, "'");
  }
  info_.kind = train.kind;
  const uint64_t augment_seed = derive_seed(c.seed, SeedUse::Data);
  std::vector<int64_t>& train_idx = train_indices_;
  std::vector<int64_t>& val_idx = val_indices_;

  if (train.kind != "npy") {
    const int64_t S = c.data.image_size;
    info_.images = true;
    info_.channels = train.kind == "mnist" ? 1 : 3;
    info_.image_size = S;
    check_classify_model(c.model.name, info_, c.data.train);  // before reading any image
    const ImageSource src = open_images(train, false, S);
    info_.classes = src.classes;
    info_.decoded_lazily = src.lazy;
    data::DatasetPtr train_set = src.images, val_set;
    if (val) {
      const ImageSource vsrc = open_images(*val, true, S);
      FT_CHECK(vsrc.classes == src.classes, val->path, ": its ", vsrc.classes.size(),
               " class folders differ from the training folder's ", src.classes.size(), " (", train.path,
               "); expected the same class names");
      val_set = vsrc.images;
    } else {
      hold_out(src.images->size(), c, train_idx, val_idx);
      train_set = std::make_shared<Subset>(src.images, train_idx);
      val_set = std::make_shared<Subset>(src.images, val_idx);
      info_.held_out = true;
    }
    info_.train_samples = train_set->size();
    info_.val_samples = val_set->size();
    check_split_sizes(c, info_);
    image_stats(*src.images, src.lazy, info_);
    data::ImageTransform t;
    t.crop_size = S;
    t.mean = floats(info_.mean);
    t.std = floats(info_.std);
    val_ = std::make_shared<data::TransformedDataset>(val_set, t);
    // Mirrored digits are other shapes (or none): MNIST is only cropped.
    info_.crop_padding = c.data.augment ? kCropPadding : 0;
    info_.flip = c.data.augment && train.kind != "mnist";
    t.padding = info_.crop_padding;
    t.horizontal_flip = info_.flip;
    t.seed = augment_seed;
    train_ = std::make_shared<data::TransformedDataset>(train_set, t);
    return;
  }

  NpyPair all = load_pair(train);
  const Shape xs = all.x.shape();
  info_.images = all.x.dim() == 4;
  if (info_.images) {
    info_.channels = xs[1];
    info_.image_size = xs[2];
    FT_CHECK(xs[2] == xs[3], train.path, ": holds ", xs[2], "x", xs[3], " images; expected square images");
    FT_CHECK(xs[2] == c.data.image_size, train.path, ": holds ", xs[2], "x", xs[3], " images; expected ",
             c.data.image_size, "x", c.data.image_size,
             " (--image-size: npy images are used as they are, not resized)");
  } else {
    info_.features = xs[1];
  }
  check_classify_model(c.model.name, info_, train.path);
  check_labels(all.y, train.labels, 0, "");
  const int64_t* labels = all.y.data<int64_t>();
  const int64_t classes = *std::max_element(labels, labels + all.y.size(0)) + 1;
  FT_CHECK(classes >= 2, train.labels, ": every label is 0; expected at least 2 classes (labels 0, 1, ...)");
  info_.classes = digit_classes(classes);
  npy_stats(all.x, info_);
  normalise(all.x, info_);
  NpyPair tr, va;
  if (val) {
    tr = std::move(all);
    va = load_pair(*val);
    Shape want = xs, got = va.x.shape();
    want.erase(0), got.erase(0);
    FT_CHECK(got == want, val->path, ": samples of shape ", got.str(), "; expected ", want.str(), " like ", train.path);
    check_labels(va.y, val->labels, classes, train.labels);
    normalise(va.x, info_);
  } else {
    hold_out(all.x.size(0), c, train_idx, val_idx);
    tr = {take_rows(all.x, train_idx), take_rows(all.y, train_idx)};
    va = {take_rows(all.x, val_idx), take_rows(all.y, val_idx)};
    info_.held_out = true;
  }
  info_.train_samples = tr.x.size(0);
  info_.val_samples = va.x.size(0);
  check_split_sizes(c, info_);
  std::vector<float> pad;  // a zero before normalising
  for (size_t g = 0; g < info_.mean.size(); ++g) pad.push_back(static_cast<float>(-info_.mean[g] / info_.std[g]));
  if (info_.images && c.data.augment) {
    info_.crop_padding = kCropPadding;
    info_.flip = true;
  }
  train_ = std::make_shared<NpyRows>(tr.x, tr.y, info_.crop_padding, info_.flip, pad, augment_seed);
  val_ = std::make_shared<NpyRows>(va.x, va.y, 0, false, pad, augment_seed);
}

}  // namespace ft::train
