// Image folder benchmark: how fast ImageFolderDataset turns JPEG or PNG files into u8
// [3, size, size] samples, measured the two ways the classify task uses it:
//   preload  building the dataset decodes every image up front on the CPU threads (--threads)
//   lazy     the dataset only checks headers when built; a DataLoader with --workers threads
//            decodes one epoch of batches of 64 (workers 0: in the calling thread)
// on a folder of --images generated files of --side x --side (10 classes of smooth colour
// fields with noise, written once with libjpeg at quality 90 or libpng) under --dir.
// Prints one JSON line per mode: images/s and the folder's bytes on disk.
// Usage: image_folder [--format jpeg|png] [--images N] [--side W] [--size S] [--workers N]
//                     [--threads N] [--dir PATH]
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

// jpeglib.h uses FILE and size_t without including their headers: <cstdio> comes first.
#include <jpeglib.h>
#include <png.h>

#include "fasttrain/image_datasets.h"
#include "fasttrain/loader.h"
#include "fasttrain/parallel.h"

using namespace ft;
namespace fs = std::filesystem;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A colour field (a gradient between two random colours) with pixel noise: compresses like a
// photograph more than a flat image does.
std::vector<uint8_t> picture(int side, std::mt19937& rng) {
  std::uniform_int_distribution<int> colour(0, 255), noise(-12, 12);
  int a[3], b[3];
  for (int c = 0; c < 3; ++c) a[c] = colour(rng), b[c] = colour(rng);
  std::vector<uint8_t> px(static_cast<size_t>(side) * side * 3);
  for (int y = 0; y < side; ++y)
    for (int x = 0; x < side; ++x)
      for (int c = 0; c < 3; ++c) {
        const int v = a[c] + (b[c] - a[c]) * (x + y) / (2 * side) + noise(rng);
        px[(static_cast<size_t>(y) * side + x) * 3 + c] = static_cast<uint8_t>(std::clamp(v, 0, 255));
      }
  return px;
}

bool write_image(const std::string& path, int side, const std::vector<uint8_t>& px, bool jpeg) {
  if (!jpeg) {
    png_image image;
    std::memset(&image, 0, sizeof image);
    image.version = PNG_IMAGE_VERSION;
    image.width = side, image.height = side, image.format = PNG_FORMAT_RGB;
    return png_image_write_to_file(&image, path.c_str(), 0, px.data(), 0, nullptr) != 0;
  }
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return false;
  jpeg_compress_struct c;
  jpeg_error_mgr errors;
  c.err = jpeg_std_error(&errors);
  jpeg_create_compress(&c);
  jpeg_stdio_dest(&c, f);
  c.image_width = side, c.image_height = side, c.input_components = 3, c.in_color_space = JCS_RGB;
  jpeg_set_defaults(&c);
  jpeg_set_quality(&c, 90, TRUE);
  jpeg_start_compress(&c, TRUE);
  while (c.next_scanline < c.image_height) {
    JSAMPROW row = const_cast<uint8_t*>(&px[static_cast<size_t>(c.next_scanline) * side * 3]);
    jpeg_write_scanlines(&c, &row, 1);
  }
  jpeg_finish_compress(&c);
  jpeg_destroy_compress(&c);
  return std::fclose(f) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string format = "jpeg", dir = (fs::temp_directory_path() / "fasttrain_bench_image_folder").string();
  int64_t images = 2000, side = 32, size = 32, workers = 2, threads = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--format")
      format = v;
    else if (a == "--images")
      images = std::stoll(v);
    else if (a == "--side")
      side = std::stoll(v);
    else if (a == "--size")
      size = std::stoll(v);
    else if (a == "--workers")
      workers = std::stoll(v);
    else if (a == "--threads")
      threads = std::stoll(v);
    else if (a == "--dir")
      dir = v;
    else {
      std::fprintf(stderr, "image_folder: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  if (threads > 0) set_num_threads(static_cast<int>(threads));
  const bool jpeg = format == "jpeg";
  const std::string root = dir + "/" + format + "_" + std::to_string(side) + "_" + std::to_string(images);
  if (!fs::exists(root + "/done")) {  // generated once per shape, reused by later runs
    fs::remove_all(root);
    std::mt19937 rng(0);
    for (int64_t i = 0; i < images; ++i) {
      const std::string cls = root + "/class" + std::to_string(i % 10);
      fs::create_directories(cls);
      char name[32];
      std::snprintf(name, sizeof name, "/%06lld.%s", static_cast<long long>(i), jpeg ? "jpg" : "png");
      if (!write_image(cls + name, static_cast<int>(side), picture(static_cast<int>(side), rng), jpeg)) {
        std::fprintf(stderr, "image_folder: cannot write %s%s\n", cls.c_str(), name);
        return 1;
      }
    }
    std::fclose(std::fopen((root + "/done").c_str(), "w"));
  }
  uintmax_t bytes = 0;
  for (const auto& e : fs::recursive_directory_iterator(root))
    if (e.is_regular_file()) bytes += e.file_size();
  try {
    auto report = [&](const char* mode, double s, int64_t n, int64_t w) {
      std::printf(
          "{\"mode\": \"%s\", \"format\": \"%s\", \"images\": %lld, \"side\": %lld, \"size\": %lld, \"threads\": %d, "
          "\"workers\": %lld, \"seconds\": %.3f, \"images_per_s\": %.0f, \"folder_mb\": %.1f}\n",
          mode, format.c_str(), static_cast<long long>(n), static_cast<long long>(side), static_cast<long long>(size),
          get_num_threads(), static_cast<long long>(w), s, static_cast<double>(n) / s, bytes / 1e6);
    };
    data::ImageFolderOptions o;
    o.image_size = size;
    auto t0 = std::chrono::steady_clock::now();
    const data::ImageFolderDataset preloaded(root, o);
    report("preload", seconds_since(t0), preloaded.size(), 0);

    o.preload_bytes = 0;
    t0 = std::chrono::steady_clock::now();
    auto lazy = std::make_shared<const data::ImageFolderDataset>(root, o);
    report("header-check", seconds_since(t0), lazy->size(), 0);
    data::LoaderOptions lo;
    lo.batch_size = 64, lo.num_workers = static_cast<int>(workers), lo.shuffle = true, lo.drop_last = true;
    data::DataLoader loader(lazy, lo);
    int64_t n = 0;
    t0 = std::chrono::steady_clock::now();
    for (const data::Batch* b = loader.next(); b != nullptr; b = loader.next()) n += b->rows;
    report("lazy", seconds_since(t0), n, workers);
  } catch (const Error& e) {
    std::fprintf(stderr, "image_folder: %s\n", e.what());
    return 1;
  }
  return 0;
}
