// libFuzzer target: the MNIST IDX and CIFAR-10 readers, then one sample read from whatever they
// accept. The first byte picks the file under test; MNIST's other file is a valid one-item file.
#include <vector>

#include "fasttrain/error.h"
#include "fasttrain/image_datasets.h"
#include "fuzz_file.h"

namespace {

void read_first(const ft::data::Dataset& d) {
  if (d.size() == 0) return;
  std::vector<ft::Tensor> fields;
  for (const auto& f : d.spec()) fields.push_back(ft::empty(f.shape, f.dtype));
  d.read(0, 0, fields);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t which = data[0] % 3;
  const std::string path = ft::fuzz::write_input("image_file", data + 1, size - 1);
  // One 1x1 image and its label, big-endian IDX headers.
  static const uint8_t images[] = {0, 0, 8, 3, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 7};
  static const uint8_t labels[] = {0, 0, 8, 1, 0, 0, 0, 1, 3};
  try {
    if (which == 0) {
      read_first(ft::data::MnistDataset(path, ft::fuzz::write_input("labels", labels, sizeof labels)));
    } else if (which == 1) {
      read_first(ft::data::MnistDataset(ft::fuzz::write_input("images", images, sizeof images), path));
    } else {
      read_first(ft::data::Cifar10Dataset({path}));
    }
  } catch (const ft::Error&) {
  }
  return 0;
}
