// Joining, splitting and gathering. Implemented in src/ops/indexing.cpp.
#pragma once
#include <functional>
#include <string>
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

// Raises message(value, position) for the first entry of `index` (integer, any shape) outside
// [0, size): at once on the CPU; on a GPU the check runs on the device and nothing waits for it,
// so the error comes at the next host synchronisation (a loss.item(), a copy to the CPU). The
// indexing ops above check their own indices this way.
void check_index_range(const Tensor& index, int64_t size,
                       const std::function<std::string(int64_t value, int64_t position)>& message);

}  // namespace ft
