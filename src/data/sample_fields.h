// The check every Dataset::read() makes on the tensors the caller hands it: one per field, CPU,
// contiguous, with the spec's shape and dtype. Cheap (no allocation), so it runs on every read.
#pragma once
#include <string>
#include <vector>

#include "fasttrain/dataset.h"

namespace ft::data {

inline void check_sample_fields(const char* who, const SampleSpec& spec, const std::vector<Tensor>& fields) {
  FT_CHECK(fields.size() == spec.size(), who, ": expected ", spec.size(), " field tensors, found ", fields.size());
  for (size_t i = 0; i < spec.size(); ++i) {
    const Tensor& t = fields[i];
    FT_CHECK(t.defined() && t.device().is_cpu() && t.is_contiguous(), who, ": field '", spec[i].name,
             "' must be a contiguous CPU tensor");
    FT_CHECK(t.shape() == spec[i].shape && t.dtype() == spec[i].dtype, who, ": field '", spec[i].name, "' expected ",
             spec[i].shape.str(), " ", dtype_name(spec[i].dtype), ", found ", t.shape().str(), " ",
             dtype_name(t.dtype()));
  }
}

}  // namespace ft::data
