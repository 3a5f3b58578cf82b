// Datasets for the loader. A sample is a fixed list of fields (e.g. image and label), each with a
// fixed shape and dtype given by spec(). read() writes a sample straight into tensors the caller
// provides — rows of a reused batch buffer — so collation allocates nothing per sample.
// Implemented in src/data/.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
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

}  // namespace ft::data
