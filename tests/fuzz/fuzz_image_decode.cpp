// libFuzzer target: the JPEG/PNG reading of ImageFolderDataset (read_image_header, then the full
// decode and resampling of load_image) on arbitrary file contents. The first byte picks the output
// side (1 to 64 pixels); images whose header asks for more than a megapixel are only
// header-checked, so each input stays quick.
#include <vector>

#include "data/image_decode.h"
#include "fasttrain/error.h"
#include "fasttrain/image_datasets.h"
#include "fuzz_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const int64_t side = 1 + data[0] % 64;
  const std::string path = ft::fuzz::write_input("image", data + 1, size - 1);
  try {
    const ft::data::ImageHeader h = ft::data::read_image_header(path);
    if (h.width * h.height > (int64_t{1} << 20)) return 0;
    const ft::Tensor image = ft::data::load_image(path, side);
    if (image.numel() != 3 * side * side) __builtin_trap();
  } catch (const ft::Error&) {
  }
  return 0;
}
