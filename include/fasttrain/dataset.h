// Datasets for the loader. A sample is a fixed list of fields (e.g. image and label), each with a
// fixed shape and dtype given by spec(). read() writes a sample straight into tensors the caller
// provides — rows of a reused batch buffer — so collation allocates nothing per sample.
// Implemented in src/data/.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "fasttrain/tensor.h"

namespace ft::data {

struct FieldSpec {
  std::string name;  // "image", "label", "tokens", "targets", ...
  Shape shape;       // of one sample
  DType dtype;
};
using SampleSpec = std::vector<FieldSpec>;

// Random access (torch.utils.data.Dataset with a fixed sample layout).
class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  virtual SampleSpec spec() const = 0;
  // Writes sample `index` into `fields` (one CPU tensor per field, shape and dtype as spec()).
  // `epoch` seeds random transforms, so a sample's augmentation depends only on (seed, epoch,
  // index), never on which worker reads it. Called from worker threads concurrently: must be
  // thread-safe and should not allocate. Errors throw ft::Error naming the sample (and file).
  virtual void read(int64_t index, uint64_t epoch, const std::vector<Tensor>& fields) const = 0;
};

using DatasetPtr = std::shared_ptr<const Dataset>;

// A cursor over one epoch's stream of samples (see IterableDataset). Used by one thread at a time.
class SampleStream {
 public:
  virtual ~SampleStream() = default;
  // Writes the next sample into `fields` (one CPU tensor per field, shape and dtype as spec()) and
  // returns true, or returns false, writing nothing, once the stream has run dry. Should not
  // allocate. Errors throw ft::Error naming the sample (and file).
  virtual bool next(const std::vector<Tensor>& fields) = 0;
  // Passes over up to `n` samples without writing them; returns how many it passed (fewer than
  // `n` only when the stream runs dry). The loader skips the samples other workers take, so this
  // should be cheap where the source allows it.
  virtual int64_t skip(int64_t n) = 0;
};

// A stream of samples (torch.utils.data.IterableDataset with a fixed sample layout): for data whose
// size is unknown up front or that is read sequentially. open() must be a pure function of
// (epoch, start) — every stream opened for an epoch yields the same samples in the same order — so
// each loader worker can open its own stream and a resumed run can reopen at the point it reached.
// The loader splits the stream between workers (loader.h), the Trainer between ranks (rank r takes
// samples r, r + W, ...); outside the Trainer a dataset may split itself (TokenStreamDataset).
class IterableDataset {
 public:
  virtual ~IterableDataset() = default;
  virtual SampleSpec spec() const = 0;
  // The stream of `epoch` positioned at sample `start` (0-based; past the end gives a dry stream).
  // Called from worker threads concurrently: must be thread-safe.
  virtual std::unique_ptr<SampleStream> open(uint64_t epoch, int64_t start) const = 0;
};

using IterableDatasetPtr = std::shared_ptr<const IterableDataset>;

// Rows of tensors as samples (torch.utils.data.TensorDataset): sample i holds row i of every
// tensor, e.g. {"x", features [n, d]}, {"y", labels [n]} from two .npy files (load_npy or the
// zero-copy map_npy). The tensors must be CPU tensors with the same first dimension; they are
// made contiguous once here. Implemented in src/data/tensor_dataset.cpp.
class TensorDataset : public Dataset {
 public:
  explicit TensorDataset(std::vector<std::pair<std::string, Tensor>> fields);
  int64_t size() const override { return rows_; }
  SampleSpec spec() const override { return spec_; }
  void read(int64_t index, uint64_t epoch, const std::vector<Tensor>& fields) const override;

 private:
  std::vector<Tensor> tensors_;
  SampleSpec spec_;
  int64_t rows_ = 0;
};

}  // namespace ft::data
