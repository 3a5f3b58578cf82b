// ImageFolderDataset and load_image (image_datasets.h): the folder layout, the up-front checks or
// decoding, and read(). The pixel work is in image_decode.cpp.
#include <algorithm>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>

#include "data/image_decode.h"
#include "data/sample_fields.h"
#include "fasttrain/image_datasets.h"
#include "fasttrain/parallel.h"

namespace ft::data {

namespace fs = std::filesystem;

namespace {

bool hidden(const fs::path& p) { return p.filename().string().rfind('.', 0) == 0; }

bool image_extension(const fs::path& p) {
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char ch) { return std::tolower(ch); });
  return ext == ".jpg" || ext == ".jpeg" || ext == ".png";
}

// The image files under a class folder, nested folders included, in byte order of their paths.
std::vector<std::string> images_under(const fs::path& dir) {
  std::vector<std::string> files;
  std::error_code ec;
  fs::recursive_directory_iterator it(dir, ec), end;
  FT_CHECK(!ec, dir.string(), ": cannot list the class folder (", ec.message(), ")");
  for (; it != end; it.increment(ec)) {
    FT_CHECK(!ec, dir.string(), ": cannot list the class folder (", ec.message(), ")");
    const fs::path& p = it->path();
    if (hidden(p)) {
      if (it->is_directory(ec)) it.disable_recursion_pending();
      continue;
    }
    if (it->is_regular_file(ec) && image_extension(p)) files.push_back(p.string());
  }
  FT_CHECK(!ec, dir.string(), ": cannot list the class folder (", ec.message(), ")");
  std::sort(files.begin(), files.end());
  return files;
}

// Runs check(i) for every image in parallel; the first failing image in order (not in time) is
// the one reported, so the message does not depend on the thread count.
template <class F>
void for_each_image(const std::vector<std::string>& files, const std::string& root, F&& check) {
  std::mutex mutex;
  std::map<int64_t, std::string> failed;
  parallel_for(0, static_cast<int64_t>(files.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      try {
        check(i);
      } catch (const Error& e) {
        std::lock_guard<std::mutex> lock(mutex);
        failed.emplace(i, e.what());
      }
    }
  });
  if (failed.empty()) return;
  std::string more;
  if (failed.size() > 1)
    more = detail::concat(" (and ", failed.size() - 1, " more of the ", files.size(), " images under ", root,
                          " cannot be read)");
  FT_FAIL(failed.begin()->second, more);
}

}  // namespace

ImageFolderDataset::ImageFolderDataset(const std::string& root, ImageFolderOptions options)
    : root_(root), options_(options) {
  const int64_t S = options_.image_size;
  FT_CHECK(S >= 1 && S <= 4096, "ImageFolderDataset: expected an image size of 1 to 4096 pixels, found ", S);
  std::error_code ec;
  FT_CHECK(fs::is_directory(root_, ec), root_, ": not a folder (expected one sub-folder of images per class)");
  std::vector<fs::path> class_dirs;
  for (fs::directory_iterator it(root_, ec), end; !ec && it != end; it.increment(ec))
    if (!hidden(it->path()) && it->is_directory(ec)) class_dirs.push_back(it->path());
  FT_CHECK(!ec, root_, ": cannot list the folder (", ec.message(), ")");
  FT_CHECK(!class_dirs.empty(), root_, ": no class folders (expected one sub-folder of .jpg/.jpeg/.png images per ",
           "class, e.g. ", (fs::path(root_) / "cat" / "001.jpg").string(), ")");
  std::sort(class_dirs.begin(), class_dirs.end(),
            [](const fs::path& a, const fs::path& b) { return a.filename().string() < b.filename().string(); });
  for (const fs::path& dir : class_dirs) {
    std::vector<std::string> files = images_under(dir);
    FT_CHECK(!files.empty(), dir.string(), ": the class folder holds no images (expected at least one .jpg, .jpeg ",
             "or .png file)");
    const auto label = static_cast<int32_t>(classes_.size());
    classes_.push_back(dir.filename().string());
    for (std::string& f : files) {
      files_.push_back(std::move(f));
      labels_.push_back(label);
    }
  }
  spec_ = {{"image", Shape{3, S, S}, DType::U8}, {"label", Shape{}, DType::I64}};
  const int64_t image_bytes = 3 * S * S;
  if (options_.preload_bytes > 0 && size() <= options_.preload_bytes / image_bytes) {
    pixels_.resize(static_cast<size_t>(size() * image_bytes));
    for_each_image(files_, root_,
                   [&](int64_t i) { load_image_square(files_[i], S, pixels_.data() + i * image_bytes); });
  } else {
    for_each_image(files_, root_, [&](int64_t i) { read_image_header(files_[i]); });
  }
}

const std::string& ImageFolderDataset::file(int64_t index) const {
  FT_CHECK(index >= 0 && index < size(), "ImageFolderDataset: sample ", index, " out of range [0, ", size(), ")");
  return files_[index];
}

int64_t ImageFolderDataset::label(int64_t index) const {
  FT_CHECK(index >= 0 && index < size(), "ImageFolderDataset: sample ", index, " out of range [0, ", size(), ")");
  return labels_[index];
}

void ImageFolderDataset::read(int64_t index, uint64_t, const std::vector<Tensor>& fields) const {
  FT_CHECK(index >= 0 && index < size(), "ImageFolderDataset: sample ", index, " out of range [0, ", size(), ")");
  check_sample_fields("ImageFolderDataset", spec_, fields);
  const int64_t S = options_.image_size, image_bytes = 3 * S * S;
  auto* dst = fields[0].data<uint8_t>();
  if (preloaded())
    std::memcpy(dst, pixels_.data() + index * image_bytes, image_bytes);
  else
    load_image_square(files_[index], S, dst);
  *fields[1].data<int64_t>() = labels_[index];
}

Tensor load_image(const std::string& path, int64_t size) {
  FT_CHECK(size >= 1 && size <= 4096, "load_image: expected an image size of 1 to 4096 pixels, found ", size);
  Tensor image = empty(Shape{3, size, size}, DType::U8);
  load_image_square(path, size, image.data<uint8_t>());
  return image;
}

}  // namespace ft::data
