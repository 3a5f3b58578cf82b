// Joining, splitting and gathering. Implemented in src/ops/indexing.cpp.
#pragma once
#include <vector>

#include "fasttrain/tensor.h"

namespace ft {

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0);
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim = 0);
std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim = 0);  // last piece may be smaller
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim = 0);
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim = 0);
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);  // index i64/i32 1-d
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);        // torch.gather
// weight [V, D], ids integer of any shape -> [..., D]. padding_idx rows get no gradient.
Tensor embedding(const Tensor& ids, const Tensor& weight, std::optional<int64_t> padding_idx = std::nullopt);

}  // namespace ft
