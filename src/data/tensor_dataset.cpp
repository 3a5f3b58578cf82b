// TensorDataset (dataset.h): a sample is one row of each tensor, copied with memcpy.
#include <cstring>

#include "fasttrain/dataset.h"
#include "fasttrain/error.h"

namespace ft::data {

TensorDataset::TensorDataset(std::vector<std::pair<std::string, Tensor>> fields) {
  FT_CHECK(!fields.empty(), "TensorDataset: expected at least one tensor, found none");
  rows_ = -1;
  for (auto& [name, t] : fields) {
    FT_CHECK(t.defined() && t.dim() >= 1, "TensorDataset: field '", name,
             "': expected a tensor with a first (sample) dimension, found ",
             t.defined() ? "a 0-d tensor" : "no tensor");
    FT_CHECK(t.device().is_cpu(), "TensorDataset: field '", name, "': expected a CPU tensor, found one on ",
             t.device().str());
    if (rows_ < 0) rows_ = t.size(0);
    FT_CHECK(t.size(0) == rows_, "TensorDataset: field '", name, "' has ", t.size(0), " rows, expected ", rows_,
             " like '", fields.front().first, "'");
    Shape row = t.shape();
    row.erase(0);
    spec_.push_back({name, row, t.dtype()});
    tensors_.push_back(t.contiguous());
  }
}

void TensorDataset::read(int64_t index, uint64_t, const std::vector<Tensor>& fields) const {
  FT_CHECK(index >= 0 && index < rows_, "TensorDataset: expected a sample index in [0, ", rows_, "), found ", index);
  for (size_t f = 0; f < tensors_.size(); ++f) {
    const size_t bytes = static_cast<size_t>(fields[f].numel()) * dtype_size(tensors_[f].dtype());
    std::memcpy(fields[f].raw_data(), static_cast<const char*>(tensors_[f].raw_data()) + index * bytes, bytes);
  }
}

}  // namespace ft::data
