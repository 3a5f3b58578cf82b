// CIFAR-10 binary batches: validated at construction, images copied from the mapping on read.
#include <algorithm>
#include <cstring>

#include "data/mapped_file.h"
#include "data/sample_fields.h"
#include "fasttrain/image_datasets.h"

namespace ft::data {

namespace {
constexpr int kNumClasses = 10;
}

Cifar10Dataset::Cifar10Dataset(const std::vector<std::string>& batch_paths) {
  FT_CHECK(!batch_paths.empty(), "Cifar10Dataset: expected at least one batch file");
  first_record_.assign(1, 0);
  for (const auto& path : batch_paths) {
    auto f = map_file(path);
    FT_CHECK(f->size > 0 && f->size % kRecordBytes == 0, path, ": a CIFAR-10 batch is a whole number of ", kRecordBytes,
             "-byte records, found ", f->size, " bytes");
    int64_t records = static_cast<int64_t>(f->size) / kRecordBytes;
    for (int64_t r = 0; r < records; ++r) {
      auto label = static_cast<unsigned char>(f->data[r * kRecordBytes]);
      FT_CHECK(label < kNumClasses, path, ": label ", int{label}, " of record ", r, " is out of range (expected 0-",
               kNumClasses - 1, ")");
    }
    files_.push_back(std::move(f));
    first_record_.push_back(first_record_.back() + records);
  }
  spec_ = {{"image", Shape{3, 32, 32}, DType::U8}, {"label", Shape{}, DType::I64}};
}

void Cifar10Dataset::read(int64_t index, uint64_t, const std::vector<Tensor>& fields) const {
  FT_CHECK(index >= 0 && index < size(), "Cifar10Dataset: sample ", index, " out of range [0, ", size(), ")");
  check_sample_fields("Cifar10Dataset", spec_, fields);
  size_t f = std::upper_bound(first_record_.begin(), first_record_.end(), index) - first_record_.begin() - 1;
  const char* record = files_[f]->data + (index - first_record_[f]) * kRecordBytes;
  void* image = fields[0].raw_data();
  int64_t* label = fields[1].data<int64_t>();
  files_[f]->read([&] {
    std::memcpy(image, record + 1, kImageBytes);
    *label = static_cast<unsigned char>(record[0]);
  });
}

}  // namespace ft::data
