// The classify task (--task classify) and its data sources, on small files generated here: JPEG
// and PNG decoding and resampling, ImageFolderDataset, every --data form (mnist, cifar10, folder,
// npy) with its split, statistics and augmentation, each malformed input refused before anything
// is written, and `fasttrain train --task classify` on an image folder reaching a stated accuracy.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>

#include <gtest/gtest.h>
#include <zlib.h>
#include <nlohmann/json.hpp>

// jpeglib.h uses FILE and size_t without including their headers: <cstdio> comes first.
#include <jpeglib.h>
#include <png.h>

#include "data/image_decode.h"
#include "fasttrain/image_datasets.h"
#include "fasttrain/loader.h"
#include "fasttrain/npy.h"
#include "fasttrain/tasks.h"
#include "support/expect_error.h"
#include "support/run_cli.h"
#include "support/trainer_configs.h"
#include "tasks/classify_data.h"

using namespace ft;
using ft::test::CliRun;
using ft::test::expect_error;
using ft::test::run_cli;
namespace fs = std::filesystem;

namespace {

// --- writing test files --------------------------------------------------------------------

using Pixels = std::vector<uint8_t>;  // interleaved rows: height x width x channels

void write_png(const std::string& path, int width, int height, int channels, const Pixels& pixels) {
  png_image image;
  std::memset(&image, 0, sizeof image);
  image.version = PNG_IMAGE_VERSION;
  image.width = width;
  image.height = height;
  image.format = channels == 1   ? PNG_FORMAT_GRAY
                 : channels == 2 ? PNG_FORMAT_GA
                 : channels == 3 ? PNG_FORMAT_RGB
                                 : PNG_FORMAT_RGBA;
  ASSERT_TRUE(png_image_write_to_file(&image, path.c_str(), 0, pixels.data(), 0, nullptr)) << image.message;
}

// A palette PNG: `indices` (height x width) into `palette` (RGB triples).
void write_palette_png(const std::string& path, int width, int height, const Pixels& indices, const Pixels& palette) {
  png_image image;
  std::memset(&image, 0, sizeof image);
  image.version = PNG_IMAGE_VERSION;
  image.width = width;
  image.height = height;
  image.format = PNG_FORMAT_RGB_COLORMAP;
  image.colormap_entries = static_cast<png_uint_32>(palette.size() / 3);
  ASSERT_TRUE(png_image_write_to_file(&image, path.c_str(), 0, indices.data(), 0, palette.data())) << image.message;
}

// channels 1 (grayscale), 3 (RGB) or 4 (CMYK, stored as Adobe applications store it).
void write_jpeg(const std::string& path, int width, int height, int channels, const Pixels& pixels, int quality = 95) {
  jpeg_compress_struct c;
  jpeg_error_mgr errors;
  c.err = jpeg_std_error(&errors);
  jpeg_create_compress(&c);
  FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  jpeg_stdio_dest(&c, f);
  c.image_width = width;
  c.image_height = height;
  c.input_components = channels;
  c.in_color_space = channels == 1 ? JCS_GRAYSCALE : channels == 3 ? JCS_RGB : JCS_CMYK;
  jpeg_set_defaults(&c);
  jpeg_set_quality(&c, quality, TRUE);
  jpeg_start_compress(&c, TRUE);
  while (c.next_scanline < c.image_height) {
    JSAMPROW row = const_cast<uint8_t*>(&pixels[static_cast<size_t>(c.next_scanline) * width * channels]);
    jpeg_write_scanlines(&c, &row, 1);
  }
  jpeg_finish_compress(&c);
  jpeg_destroy_compress(&c);
  std::fclose(f);
}

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A smooth RGB test image: every pixel distinct enough that a mix-up shows.
Pixels gradient(int width, int height) {
  Pixels p(static_cast<size_t>(width) * height * 3);
  for (int y = 0; y < height; ++y)
    for (int x = 0; x < width; ++x) {
      uint8_t* q = &p[(static_cast<size_t>(y) * width + x) * 3];
      q[0] = static_cast<uint8_t>(x * 255 / std::max(1, width - 1));
      q[1] = static_cast<uint8_t>(y * 255 / std::max(1, height - 1));
      q[2] = static_cast<uint8_t>((x + y) * 127 / std::max(1, width + height - 2) + 64);
    }
  return p;
}

// Image of class `cls` for the end-to-end runs: two random colours in horizontal stripes (0),
// vertical stripes (1) or a checkerboard (2) of random period and phase, with pixel noise. Crops
// and mirror images keep the class.
Pixels pattern(int cls, int size, std::mt19937& rng) {
  std::uniform_int_distribution<int> colour(0, 255), period(8, 14), noise(-20, 20);
  int a[3], b[3];
  do {
    for (int c = 0; c < 3; ++c) a[c] = colour(rng), b[c] = colour(rng);
  } while (std::abs(a[0] - b[0]) + std::abs(a[1] - b[1]) + std::abs(a[2] - b[2]) < 150);
  const int p = period(rng), phase_x = colour(rng) % p, phase_y = colour(rng) % p;
  Pixels px(static_cast<size_t>(size) * size * 3);
  for (int y = 0; y < size; ++y)
    for (int x = 0; x < size; ++x) {
      const bool row = ((y + phase_y) / p) % 2, col = ((x + phase_x) / p) % 2;
      const bool on = cls == 0 ? row : cls == 1 ? col : row != col;
      for (int c = 0; c < 3; ++c)
        px[(static_cast<size_t>(y) * size + x) * 3 + c] =
            static_cast<uint8_t>(std::clamp((on ? a[c] : b[c]) + noise(rng), 0, 255));
    }
  return px;
}

// root/<class>/NNN.png|jpg: `per_class` images of each of the three pattern classes, alternately
// PNG and JPEG.
void make_pattern_folder(const std::string& root, int per_class, int size, uint32_t seed = 7) {
  std::mt19937 rng(seed);
  const char* names[] = {"horizontal", "vertical", "checker"};
  for (int cls = 0; cls < 3; ++cls) {
    fs::create_directories(fs::path(root) / names[cls]);
    for (int i = 0; i < per_class; ++i) {
      char name[32];
      std::snprintf(name, sizeof name, "%03d.%s", i, i % 2 ? "jpg" : "png");
      const std::string path = (fs::path(root) / names[cls] / name).string();
      const Pixels px = pattern(cls, size, rng);
      if (i % 2)
        write_jpeg(path, size, size, 3, px, 90);
      else
        write_png(path, size, size, 3, px);
    }
  }
}

void put_be32(std::string& b, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<char>(v >> s));
}

// MNIST IDX files <prefix>-images-idx3-ubyte / <prefix>-labels-idx1-ubyte of n images of
// side x side: image i is filled with (i * 37) % 256, label i % 10.
void write_mnist(const std::string& dir, const std::string& prefix, int n, int side = 28) {
  fs::create_directories(dir);
  std::string images, labels;
  put_be32(images, 2051), put_be32(images, n), put_be32(images, side), put_be32(images, side);
  put_be32(labels, 2049), put_be32(labels, n);
  for (int i = 0; i < n; ++i) {
    images.append(static_cast<size_t>(side) * side, static_cast<char>((i * 37) % 256));
    labels.push_back(static_cast<char>(i % 10));
  }
  write_bytes(dir + "/" + prefix + "-images-idx3-ubyte", images);
  write_bytes(dir + "/" + prefix + "-labels-idx1-ubyte", labels);
}

// Replaces `file` by `file`.gz holding the same bytes as `members` gzip members (gzip's own
// multi-member form: what `cat a.gz b.gz` makes).
void gzip_in_place(const std::string& file, int members) {
  const std::string bytes = read_bytes(file);
  const size_t part = bytes.size() / members + 1;
  for (int m = 0; m < members; ++m) {
    gzFile gz = gzopen((file + ".gz").c_str(), m == 0 ? "wb" : "ab");
    ASSERT_NE(gz, nullptr);
    const size_t begin = std::min(bytes.size(), m * part), end = std::min(bytes.size(), begin + part);
    if (end > begin) ASSERT_EQ(gzwrite(gz, bytes.data() + begin, static_cast<unsigned>(end - begin)), int(end - begin));
    ASSERT_EQ(gzclose(gz), Z_OK);
  }
  fs::remove(file);
}

// A CIFAR-10 binary batch of n records: label i % 10, red plane 10 * (i % 10), green 100, blue 200.
void write_cifar(const std::string& path, int n) {
  std::string b;
  for (int i = 0; i < n; ++i) {
    b.push_back(static_cast<char>(i % 10));
    b.append(1024, static_cast<char>(10 * (i % 10)));
    b.append(1024, static_cast<char>(100));
    b.append(1024, static_cast<char>(200));
  }
  write_bytes(path, b);
}

Tensor f32_tensor(const std::vector<float>& v, const Shape& shape) {
  Tensor t = empty(shape, DType::F32);
  std::copy(v.begin(), v.end(), t.data<float>());
  return t;
}

Tensor i64_tensor(const std::vector<int64_t>& v) {
  Tensor t = empty(Shape{static_cast<int64_t>(v.size())}, DType::I64);
  std::copy(v.begin(), v.end(), t.data<int64_t>());
  return t;
}

// Two Gaussian blobs per class in `d` dimensions (class k centred at 3 * e_k, feature scales 1,
// 10, 100, ... so the per-feature normalisation matters): n rows.
void write_blobs(const std::string& x_path, const std::string& y_path, int n, int d, int classes, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> noise(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n) * d);
  std::vector<int64_t> y(n);
  for (int i = 0; i < n; ++i) {
    y[i] = i % classes;
    for (int j = 0; j < d; ++j)
      x[static_cast<size_t>(i) * d + j] = (noise(rng) + (j == y[i] ? 3.0f : 0.0f)) * std::pow(10.0f, j % 3);
  }
  save_npy(x_path, f32_tensor(x, Shape{n, d}));
  save_npy(y_path, i64_tensor(y));
}

// --- running ---------------------------------------------------------------------------------

class Classify : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::scratch_dir("ft_classify", ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }

  // A classify config over `data` that trains in moments, its run folder under the scratch dir.
  train::TrainerConfig config(const std::string& data) const {
    train::TrainerConfig c = train::TrainerConfig::defaults_for("classify");
    c.data.train = data;
    c.run_dir = path("run");
    c.progress = false;
    c.tensorboard = false;
    c.batch_size = 8;
    c.max_steps = 4;
    c.schedule.as<ft::train::CosineSchedule>().warmup_steps = 1;
    c.eval_every = 0;
    c.log_every_n_steps = 2;
    c.threads = 2;
    return c;
  }

  // The task must be refused with `fragment` in the message, and no run folder written.
  void expect_refused(const train::TrainerConfig& c, const std::string& fragment) const {
    SCOPED_TRACE(fragment);
    expect_error(
        [&] {
          test::BuiltinRun run(c);
          run.fit();
        },
        fragment);
    EXPECT_FALSE(fs::exists(c.run_dir)) << "a refused run wrote " << c.run_dir;
  }

  std::string dir_;
};

std::vector<Tensor> sample_fields(const data::Dataset& ds) {
  std::vector<Tensor> f;
  for (const data::FieldSpec& s : ds.spec()) f.push_back(empty(s.shape, s.dtype));
  return f;
}

}  // namespace

// --- decoding and resampling ---------------------------------------------------------------

TEST_F(Classify, PngOfEveryColourTypeDecodesToExactRgb) {
  const int W = 6, H = 4;
  const Pixels rgb = gradient(W, H);
  Pixels gray(W * H), gray_alpha(W * H * 2), rgba(W * H * 4), indices(W * H);
  const Pixels palette = {255, 0, 0, 0, 255, 0, 0, 0, 255, 10, 20, 30};
  for (int i = 0; i < W * H; ++i) {
    gray[i] = rgb[3 * i];
    gray_alpha[2 * i] = rgb[3 * i], gray_alpha[2 * i + 1] = 255;
    for (int c = 0; c < 3; ++c) rgba[4 * i + c] = rgb[3 * i + c];
    rgba[4 * i + 3] = i % 2 ? 255 : 0;  // every other pixel transparent
    indices[i] = static_cast<uint8_t>(i % 4);
  }
  write_png(path("rgb.png"), W, H, 3, rgb);
  write_png(path("gray.png"), W, H, 1, gray);
  write_png(path("ga.png"), W, H, 2, gray_alpha);
  write_png(path("rgba.png"), W, H, 4, rgba);
  write_palette_png(path("palette.png"), W, H, indices, palette);
  // At the image's own size (a 4 x 4 square from the centre of 6 x 4: columns 1..4) no resampling.
  auto at = [&](const Tensor& t, int c, int y, int x) { return int{t.data<uint8_t>()[(c * 4 + y) * 4 + x]}; };
  const Tensor a = data::load_image(path("rgb.png"), 4), g = data::load_image(path("gray.png"), 4),
               ga = data::load_image(path("ga.png"), 4), al = data::load_image(path("rgba.png"), 4),
               pal = data::load_image(path("palette.png"), 4);
  EXPECT_EQ(a.shape(), Shape({3, 4, 4}));
  for (int y = 0; y < H; ++y)
    for (int x = 0; x < 4; ++x) {
      const int i = y * W + x + 1;
      for (int c = 0; c < 3; ++c) {
        EXPECT_EQ(at(a, c, y, x), rgb[3 * i + c]);
        EXPECT_EQ(at(g, c, y, x), gray[i]);  // grayscale replicated
        EXPECT_EQ(at(ga, c, y, x), gray[i]);
        EXPECT_EQ(at(al, c, y, x), i % 2 ? rgb[3 * i + c] : 0);  // transparent: black
        EXPECT_EQ(at(pal, c, y, x), palette[3 * (i % 4) + c]);
      }
    }
}

TEST_F(Classify, JpegDecodesCloseToItsSourceInGrayRgbAndCmyk) {
  const int W = 48, H = 40;
  const Pixels rgb = gradient(W, H);
  Pixels gray(W * H), cmyk(W * H * 4);
  for (int i = 0; i < W * H; ++i) {
    gray[i] = rgb[3 * i + 1];
    for (int c = 0; c < 3; ++c) cmyk[4 * i + c] = rgb[3 * i + c];  // inverted CMYK with K = 255 is RGB
    cmyk[4 * i + 3] = 255;
  }
  write_jpeg(path("rgb.jpg"), W, H, 3, rgb, 98);
  write_jpeg(path("gray.jpeg"), W, H, 1, gray, 98);
  write_jpeg(path("cmyk.jpg"), W, H, 4, cmyk, 98);
  for (const char* name : {"rgb.jpg", "gray.jpeg", "cmyk.jpg"}) {
    SCOPED_TRACE(name);
    const Tensor t = data::load_image(path(name), H);  // the centred 40 x 40: columns 4..43
    const uint8_t* p = t.data<uint8_t>();
    double error = 0;
    for (int c = 0; c < 3; ++c)
      for (int y = 0; y < H; ++y)
        for (int x = 0; x < H; ++x) {
          const int i = y * W + x + 4;
          const int want = std::string(name) == "gray.jpeg" ? gray[i] : rgb[3 * i + c];
          error += std::abs(int{p[(c * H + y) * H + x]} - want);
        }
    EXPECT_LT(error / (3 * H * H), 3.0);  // mean absolute error in grey levels
  }
  const data::ImageHeader h = data::read_image_header(path("cmyk.jpg"));
  EXPECT_EQ(h.format, data::ImageFormat::Jpeg);
  EXPECT_EQ(h.width, W);
  EXPECT_EQ(h.height, H);
}

TEST_F(Classify, ResampleCopiesAtSizeAveragesWhenShrinkingInterpolatesWhenEnlarging) {
  // Planar 1-channel 4 x 8 image: the centred 4 x 4 square is columns 2..5.
  Pixels src(4 * 8);
  for (int i = 0; i < 32; ++i) src[i] = static_cast<uint8_t>(i * 7);
  Pixels out(16);
  data::resize_square(src.data(), 4, 8, 1, 8, 1, 0, out.data(), 4);
  for (int y = 0; y < 4; ++y)
    for (int x = 0; x < 4; ++x) EXPECT_EQ(out[y * 4 + x], src[y * 8 + x + 2]);
  // Halving a checkerboard of 2 x 2 blocks of 0 and 200: each output pixel is mostly its block,
  // blended symmetrically with its neighbours by the widened triangle (weights 3/7, 3/7, 1/7 per
  // axis: (0 * 6 + 200 * 1) / 7 across, and so on).
  Pixels checker(16);
  for (int y = 0; y < 4; ++y)
    for (int x = 0; x < 4; ++x) checker[y * 4 + x] = ((y / 2 + x / 2) % 2) ? 200 : 0;
  Pixels half(4);
  data::resize_square(checker.data(), 4, 4, 1, 4, 1, 0, half.data(), 2);
  EXPECT_EQ(half, Pixels({49, 151, 151, 49}));
  // Shrinking a one-pixel checkerboard 4-fold: an average, not an alias of one phase.
  Pixels fine(64);
  for (int i = 0; i < 64; ++i) fine[i] = ((i / 8 + i % 8) % 2) ? 200 : 0;
  Pixels quarter(4);
  data::resize_square(fine.data(), 8, 8, 1, 8, 1, 0, quarter.data(), 2);
  for (uint8_t v : quarter) EXPECT_NEAR(v, 100, 15);
  // Doubling a 2-pixel ramp 0, 200: ends held, midpoints interpolated.
  Pixels ramp = {0, 200, 0, 200};
  Pixels twice(16);
  data::resize_square(ramp.data(), 2, 2, 1, 2, 1, 0, twice.data(), 4);
  EXPECT_EQ(Pixels(twice.begin(), twice.begin() + 4), Pixels({0, 50, 150, 200}));
}

// --- ImageFolderDataset ----------------------------------------------------------------------

TEST_F(Classify, ImageFolderListsClassesAndFilesInOrderAndReadsThemPreloadedOrNot) {
  const std::string root = path("images");
  fs::create_directories(root + "/dog/nested");
  fs::create_directories(root + "/cat");
  fs::create_directories(root + "/.cache");  // hidden: not a class
  const Pixels px = gradient(10, 10);
  write_png(root + "/dog/b.png", 10, 10, 3, px);
  write_jpeg(root + "/dog/A.JPEG", 10, 10, 3, px);
  write_png(root + "/dog/nested/c.png", 10, 10, 3, px);
  write_png(root + "/cat/x.PNG", 10, 10, 3, px);
  write_png(root + "/cat/.hidden.png", 10, 10, 3, px);
  write_bytes(root + "/cat/notes.txt", "not an image");
  write_png(root + "/.cache/y.png", 10, 10, 3, px);

  data::ImageFolderOptions o;
  o.image_size = 8;
  const data::ImageFolderDataset preloaded(root, o);
  o.preload_bytes = 0;
  const data::ImageFolderDataset lazy(root, o);
  EXPECT_TRUE(preloaded.preloaded());
  EXPECT_FALSE(lazy.preloaded());
  EXPECT_EQ(preloaded.classes(), std::vector<std::string>({"cat", "dog"}));
  ASSERT_EQ(preloaded.size(), 4);
  EXPECT_EQ(preloaded.file(0), root + "/cat/x.PNG");
  EXPECT_EQ(preloaded.file(1), root + "/dog/A.JPEG");  // 'A' < 'b' < 'n' in byte order
  EXPECT_EQ(preloaded.file(2), root + "/dog/b.png");
  EXPECT_EQ(preloaded.file(3), root + "/dog/nested/c.png");
  EXPECT_EQ(preloaded.spec()[0].shape, Shape({3, 8, 8}));
  std::vector<Tensor> a = sample_fields(preloaded), b = sample_fields(lazy);
  for (int64_t i = 0; i < 4; ++i) {
    preloaded.read(i, 0, a);
    lazy.read(i, 0, b);
    EXPECT_EQ(a[1].item<int64_t>(), i == 0 ? 0 : 1);
    EXPECT_EQ(b[1].item<int64_t>(), a[1].item<int64_t>());
    EXPECT_EQ(std::memcmp(a[0].raw_data(), b[0].raw_data(), 3 * 8 * 8), 0) << i;
    const Tensor direct = data::load_image(preloaded.file(i), 8);
    EXPECT_EQ(std::memcmp(a[0].raw_data(), direct.raw_data(), 3 * 8 * 8), 0) << i;
  }
}

// Decoding on the loader's worker threads (per-thread buffers) gives the batches decoding up front
// gives, in the same order.
TEST_F(Classify, LazilyDecodedFolderBatchesMatchPreloadedOnesWithWorkers) {
  const std::string root = path("images");
  make_pattern_folder(root, 12, 20);
  data::ImageFolderOptions o;
  o.image_size = 12;
  auto preloaded = std::make_shared<const data::ImageFolderDataset>(root, o);
  o.preload_bytes = 0;
  auto lazy = std::make_shared<const data::ImageFolderDataset>(root, o);
  data::LoaderOptions lo;
  lo.batch_size = 5, lo.shuffle = true, lo.seed = 3;
  data::DataLoader in_thread(preloaded, lo);
  lo.num_workers = 3;
  data::DataLoader workers(lazy, lo);
  int batches = 0;
  for (const data::Batch* a = in_thread.next(); a != nullptr; a = in_thread.next(), ++batches) {
    const data::Batch* b = workers.next();
    ASSERT_NE(b, nullptr);
    ASSERT_EQ(a->rows, b->rows);
    EXPECT_EQ(std::memcmp(a->fields[0].raw_data(), b->fields[0].raw_data(), a->fields[0].nbytes()), 0);
    EXPECT_EQ(std::memcmp(a->fields[1].raw_data(), b->fields[1].raw_data(), a->fields[1].nbytes()), 0);
  }
  EXPECT_EQ(batches, 8);  // 36 images in batches of 5
  EXPECT_EQ(workers.next(), nullptr);
}

TEST_F(Classify, ImageFolderRefusesBadLayoutsAndNamesTheUnreadableFile) {
  const std::string root = path("images");
  expect_error([&] { data::ImageFolderDataset d(root); }, root + ": not a folder");
  fs::create_directories(root);
  expect_error([&] { data::ImageFolderDataset d(root); }, root + ": no class folders");
  fs::create_directories(root + "/a");
  fs::create_directories(root + "/b");
  write_png(root + "/a/1.png", 8, 8, 3, gradient(8, 8));
  write_bytes(root + "/b/readme.txt", "hello");
  expect_error([&] { data::ImageFolderDataset d(root); }, root + "/b: the class folder holds no images");

  write_png(root + "/b/1.png", 8, 8, 3, gradient(8, 8));
  write_bytes(root + "/b/2.jpg", "GIF89a this is no JPEG");
  write_bytes(root + "/b/3.png", "");
  data::ImageFolderOptions lazy;
  lazy.preload_bytes = 0;
  for (const data::ImageFolderOptions& o : {data::ImageFolderOptions{}, lazy}) {
    // The first bad file in order is named, with a count of the others.
    expect_error(
        [&] { data::ImageFolderDataset d(root, o); },
        root + "/b/2.jpg: not a JPEG or PNG image (starts with bytes 47 49 46 38) (and 1 more of the 4 images");
  }
  fs::remove(root + "/b/2.jpg");
  expect_error([&] { data::ImageFolderDataset d(root, lazy); }, root +
                                                                    "/b/3.png: not a JPEG or PNG image (starts "
                                                                    "with nothing (an empty file))");
}

TEST_F(Classify, TruncatedImagesAreRefusedWhenDecodedAndNamed) {
  const std::string root = path("images");
  fs::create_directories(root + "/a");
  fs::create_directories(root + "/b");
  // Large enough that most of the JPEG is its scan, where the cut falls.
  const Pixels px = gradient(256, 256);
  write_png(root + "/a/ok.png", 256, 256, 3, px);
  write_jpeg(root + "/b/cut.jpg", 256, 256, 3, px);
  const std::string jpeg = read_bytes(root + "/b/cut.jpg");
  write_bytes(root + "/b/cut.jpg", jpeg.substr(0, jpeg.size() * 2 / 3));
  expect_error([&] { data::ImageFolderDataset d(root); }, root + "/b/cut.jpg: truncated JPEG (Premature end");
  // Decoded lazily, the header passes and read() names the file.
  data::ImageFolderOptions lazy;
  lazy.preload_bytes = 0;
  const data::ImageFolderDataset d(root, lazy);
  std::vector<Tensor> f = sample_fields(d);
  expect_error([&] { d.read(1, 0, f); }, root + "/b/cut.jpg: truncated JPEG");

  fs::remove(root + "/b/cut.jpg");
  write_png(root + "/b/cut.png", 256, 256, 3, px);
  const std::string png = read_bytes(root + "/b/cut.png");
  write_bytes(root + "/b/cut.png", png.substr(0, png.size() - 40));
  expect_error([&] { data::ImageFolderDataset d2(root); }, root + "/b/cut.png: corrupt or truncated PNG");
  write_bytes(root + "/b/cut.png", png.substr(0, 20));  // not even a whole header
  expect_error([&] { data::ImageFolderDataset d3(root, lazy); }, root + "/b/cut.png: corrupt PNG header");
}

// --- the data sources of --task classify -----------------------------------------------------

TEST_F(Classify, FolderHoldsOutADisjointSeededSplitAndNormalisesWithTrainingStatistics) {
  const std::string root = path("images");
  make_pattern_folder(root, 10, 16);
  train::TrainerConfig c = config("folder:" + root);
  c.data.image_size = 12;  // resampled from 16
  c.data.val_fraction = 0.2;
  const train::ClassifyData d(c);
  const train::ClassifyInfo& info = d.info();
  EXPECT_EQ(info.classes, std::vector<std::string>({"checker", "horizontal", "vertical"}));
  EXPECT_EQ(info.train_samples, 24);
  EXPECT_EQ(info.val_samples, 6);
  EXPECT_TRUE(info.held_out);
  EXPECT_EQ(info.sample_shape(), Shape({3, 12, 12}));
  EXPECT_EQ(info.crop_padding, 4);
  EXPECT_TRUE(info.flip);
  std::set<int64_t> all(d.train_indices().begin(), d.train_indices().end());
  for (int64_t i : d.val_indices()) EXPECT_TRUE(all.insert(i).second) << "sample " << i << " in both splits";
  EXPECT_EQ(all.size(), 30u);

  // Same seed, same split; another seed, another split.
  EXPECT_EQ(train::ClassifyData(c).val_indices(), d.val_indices());
  train::TrainerConfig other = c;
  other.seed = c.seed + 1;
  EXPECT_NE(train::ClassifyData(other).val_indices(), d.val_indices());

  // The statistics are those of all 30 images as the model sees them (resampled, before cropping),
  // the held-out ones included: they depend on --data alone.
  data::ImageFolderOptions o;
  o.image_size = 12;
  const data::ImageFolderDataset folder(root, o);
  std::vector<Tensor> f = sample_fields(folder);
  for (int ch = 0; ch < 3; ++ch) {
    double sum = 0, squares = 0;
    for (int64_t i = 0; i < 30; ++i) {
      folder.read(i, 0, f);
      for (int k = 0; k < 144; ++k) {
        const double v = f[0].data<uint8_t>()[ch * 144 + k] / 255.0;
        sum += v, squares += v * v;
      }
    }
    const double n = 30.0 * 144, mean = sum / n;
    EXPECT_NEAR(info.mean[ch], mean, 1e-9);
    EXPECT_NEAR(info.std[ch], std::sqrt(squares / n - mean * mean), 1e-6);
  }
  // Validation samples are the normalised images, unaugmented; training samples are augmented
  // deterministically in (seed, epoch, index).
  const data::DatasetPtr val = d.val_data(8).dataset, tr = d.train_data(8).dataset;
  std::vector<Tensor> v = sample_fields(*val);
  val->read(0, 3, v);
  folder.read(d.val_indices()[0], 0, f);
  for (int k = 0; k < 3 * 144; ++k)
    ASSERT_NEAR(v[0].data<float>()[k], (f[0].data<uint8_t>()[k] / 255.0 - info.mean[k / 144]) / info.std[k / 144],
                1e-5);
  EXPECT_EQ(v[1].item<int64_t>(), folder.label(d.val_indices()[0]));
  std::vector<Tensor> t1 = sample_fields(*tr), t2 = sample_fields(*tr);
  tr->read(5, 2, t1);
  tr->read(5, 2, t2);
  EXPECT_EQ(std::memcmp(t1[0].raw_data(), t2[0].raw_data(), t1[0].nbytes()), 0);
  int differing = 0;
  for (int64_t e = 0; e < 8; ++e) {
    tr->read(5, e, t2);
    differing += std::memcmp(t1[0].raw_data(), t2[0].raw_data(), t1[0].nbytes()) != 0;
  }
  EXPECT_GE(differing, 5);  // 81 crops x 2 flips: epochs draw different ones
}

TEST_F(Classify, MnistTrainsOnTheTrainFilesAndValidatesOnTheTestFiles) {
  const std::string dir = path("mnist");
  write_mnist(dir, "train", 40);
  write_mnist(dir, "t10k", 12);
  fs::rename(dir + "/t10k-images-idx3-ubyte", dir + "/t10k-images.idx3-ubyte");  // a mirror's spelling
  train::TrainerConfig c = config("mnist:" + dir);
  c.data.val = "mnist:" + dir;
  c.data.image_size = 28;
  {
    const train::ClassifyData d(c);
    EXPECT_EQ(d.info().classes.size(), 10u);
    EXPECT_EQ(d.info().train_samples, 40);
    EXPECT_EQ(d.info().val_samples, 12);
    EXPECT_FALSE(d.info().held_out);
    EXPECT_FALSE(d.info().flip);  // digits are not mirrored
    EXPECT_EQ(d.info().crop_padding, 4);
    EXPECT_EQ(d.info().sample_shape(), Shape({1, 28, 28}));
    double mean = 0;
    for (int i = 0; i < 40; ++i) mean += (i * 37) % 256 / 255.0 / 40;
    EXPECT_NEAR(d.info().mean[0], mean, 1e-9);
  }
  c.data.val.clear();      // held out of the 40 training images instead
  c.data.image_size = 32;  // resampled: a constant image stays constant
  const train::ClassifyData d(c);
  EXPECT_EQ(d.info().val_samples, 4);
  EXPECT_EQ(d.info().train_samples, 36);
  const data::DatasetPtr val = d.val_data(8).dataset;
  std::vector<Tensor> f = sample_fields(*val);
  EXPECT_EQ(f[0].shape(), Shape({1, 32, 32}));
  val->read(0, 0, f);
  const int64_t i = d.val_indices()[0];
  const double want = ((i * 37) % 256 / 255.0 - d.info().mean[0]) / d.info().std[0];
  for (int k = 0; k < 32 * 32; ++k) ASSERT_NEAR(f[0].data<float>()[k], want, 1e-5);
  EXPECT_EQ(f[1].item<int64_t>(), i % 10);

  c.model.name = "mlp";  // a run: the quickest model that takes 1 x 32 x 32 images
  test::BuiltinRun run(c);
  const train::TrainResult r = run.fit();
  EXPECT_EQ(r.steps, 4);
  const auto task = nlohmann::json::parse(read_bytes(c.run_dir + "/task.json"));
  EXPECT_EQ(task["task"], "classify");
  EXPECT_EQ(task["classes"].size(), 10u);
  EXPECT_EQ(task["input"]["shape"], nlohmann::json({1, 32, 32}));
  EXPECT_EQ(task["normalisation"]["mean"][0].get<double>(), d.info().mean[0]);
  EXPECT_EQ(task["data"], "mnist:" + dir);
  EXPECT_EQ(task["split"]["held_out"], true);
  // The user's own data states no goal unless asked (--goal-accuracy); the run reports none.
  EXPECT_EQ(r.goal, "");
  EXPECT_FALSE(task.contains("goal"));
}

// The files as they are published (train-images-idx3-ubyte.gz ...) read without unpacking, to
// the same samples as the unpacked ones; a multi-member gzip file reads as its concatenation.
TEST_F(Classify, MnistReadsTheGzipCompressedDownloadAsItIs) {
  const std::string plain = path("plain"), packed = path("packed");
  write_mnist(plain, "train", 30);
  write_mnist(packed, "train", 30);
  gzip_in_place(packed + "/train-images-idx3-ubyte", 3);
  gzip_in_place(packed + "/train-labels-idx1-ubyte", 1);
  ASSERT_TRUE(fs::exists(packed + "/train-images-idx3-ubyte.gz"));
  ASSERT_FALSE(fs::exists(packed + "/train-images-idx3-ubyte"));
  const data::MnistDataset a(plain + "/train-images-idx3-ubyte", plain + "/train-labels-idx1-ubyte");
  const data::MnistDataset b(packed + "/train-images-idx3-ubyte.gz", packed + "/train-labels-idx1-ubyte.gz");
  ASSERT_EQ(b.size(), 30);
  std::vector<Tensor> fa = sample_fields(a), fb = sample_fields(b);
  for (int64_t i = 0; i < 30; ++i) {
    a.read(i, 0, fa);
    b.read(i, 0, fb);
    ASSERT_EQ(std::memcmp(fa[0].raw_data(), fb[0].raw_data(), 28 * 28), 0) << "image " << i;
    ASSERT_EQ(fb[1].item<int64_t>(), i % 10);
  }
  train::TrainerConfig c = config("mnist:" + packed);
  c.data.image_size = 28;
  const train::ClassifyData d(c);
  EXPECT_EQ(d.info().train_samples + d.info().val_samples, 30);

  // A truncated download is named as one, not read as a short MNIST file.
  const std::string whole = read_bytes(packed + "/train-labels-idx1-ubyte.gz");
  write_bytes(packed + "/train-labels-idx1-ubyte.gz", whole.substr(0, whole.size() - 6));
  expect_refused(config("mnist:" + packed), packed + "/train-labels-idx1-ubyte.gz: truncated gzip file");
  std::string corrupt = whole;  // the trailer's CRC-32 no longer matches the data
  corrupt[whole.size() - 8] = static_cast<char>(corrupt[whole.size() - 8] ^ 0x55);
  write_bytes(packed + "/train-labels-idx1-ubyte.gz", corrupt);
  expect_refused(config("mnist:" + packed), packed + "/train-labels-idx1-ubyte.gz: not a valid gzip file (zlib: ");
}

TEST_F(Classify, Cifar10ReadsTheBatchesOfTheUnpackedArchive) {
  const std::string dir = path("cifar") + "/cifar-10-batches-bin";
  fs::create_directories(dir);
  write_cifar(dir + "/data_batch_1.bin", 20);
  write_cifar(dir + "/data_batch_2.bin", 10);
  write_cifar(dir + "/test_batch.bin", 10);
  train::TrainerConfig c = config("cifar10:" + path("cifar"));
  c.data.val = "cifar10:" + path("cifar");
  c.model.name = "resnet20";
  const train::ClassifyData d(c);
  EXPECT_EQ(d.info().classes.front(), "airplane");
  EXPECT_EQ(d.info().classes.back(), "truck");
  EXPECT_EQ(d.info().train_samples, 30);
  EXPECT_EQ(d.info().val_samples, 10);
  EXPECT_TRUE(d.info().flip);
  EXPECT_NEAR(d.info().mean[1], 100 / 255.0, 1e-9);
  EXPECT_NEAR(d.info().mean[2], 200 / 255.0, 1e-9);
  EXPECT_EQ(d.info().std[1], 1.0);  // a constant channel is centred, not scaled
  test::BuiltinRun run(c);
  EXPECT_EQ(run.fit().steps, 4);
}

TEST_F(Classify, NpyFeatureVectorsAreStandardisedPerFeatureAndLearnedByTheMlp) {
  write_blobs(path("x.npy"), path("y.npy"), 300, 6, 3, 1);
  train::TrainerConfig c = config("npy:" + path("x.npy") + "," + path("y.npy"));
  c.model.name = "mlp";
  c.batch_size = 32;
  c.max_steps = 60;
  c.optimizer.lr = 3e-3;
  c.schedule.as<ft::train::CosineSchedule>().warmup_steps = 5;
  c.data.goal_accuracy = 0.95;
  const train::ClassifyData d(c);
  EXPECT_FALSE(d.info().images);
  EXPECT_EQ(d.info().features, 6);
  EXPECT_EQ(d.info().classes.size(), 3u);
  EXPECT_EQ(d.info().train_samples, 270);
  EXPECT_EQ(d.info().crop_padding, 0);
  // The rows the loaders read, training and held-out together (all of --data), have mean 0 and
  // std 1 per feature.
  const data::DatasetPtr tr = d.train_data(32).dataset, val = d.val_data(32).dataset;
  EXPECT_EQ(tr->spec()[0].name, "features");
  std::vector<Tensor> f = sample_fields(*tr);
  std::vector<double> sum(6, 0), squares(6, 0);
  for (const data::DatasetPtr& split : {tr, val})
    for (int64_t i = 0; i < split->size(); ++i) {
      split->read(i, 0, f);
      for (int j = 0; j < 6; ++j)
        sum[j] += f[0].data<float>()[j], squares[j] += f[0].data<float>()[j] * f[0].data<float>()[j];
    }
  for (int j = 0; j < 6; ++j) {
    EXPECT_NEAR(sum[j] / 300, 0.0, 1e-5);
    EXPECT_NEAR(squares[j] / 300, 1.0, 1e-4);
  }
  EXPECT_NEAR(d.info().std[2] / d.info().std[0], 100.0, 15.0);  // the features' scales 1 and 100
  test::BuiltinRun run(c);
  const train::TrainResult r = run.fit();
  EXPECT_TRUE(r.goal_met) << r.goal;
}

TEST_F(Classify, NpyImagesTakeTheCnnAndAreAugmentedOnlyInTraining) {
  // [n, H, W] images (one channel) of 8 x 8 and u8 labels.
  const int n = 40;
  std::vector<float> x(n * 64);
  std::vector<int64_t> labels(n);
  for (int i = 0; i < n; ++i) {
    labels[i] = i % 2;
    for (int k = 0; k < 64; ++k) x[i * 64 + k] = static_cast<float>((k % 8 < 4) == (i % 2 == 0)) + 0.01f * k;
  }
  save_npy(path("x.npy"), f32_tensor(x, Shape{n, 8, 8}));
  save_npy(path("y.npy"), i64_tensor(labels).to(DType::U8));
  train::TrainerConfig c = config("npy:" + path("x.npy") + "," + path("y.npy"));
  c.data.image_size = 8;
  const train::ClassifyData d(c);
  EXPECT_TRUE(d.info().images);
  EXPECT_EQ(d.info().sample_shape(), Shape({1, 8, 8}));
  EXPECT_EQ(d.info().crop_padding, 4);
  const data::DatasetPtr tr = d.train_data(8).dataset, val = d.val_data(8).dataset;
  std::vector<Tensor> a = sample_fields(*tr), b = sample_fields(*tr);
  int differing = 0;
  for (int64_t e = 0; e < 6; ++e) {
    tr->read(0, e, a);
    tr->read(0, e, b);
    EXPECT_EQ(std::memcmp(a[0].raw_data(), b[0].raw_data(), a[0].nbytes()), 0);
    tr->read(0, e + 1, b);
    differing += std::memcmp(a[0].raw_data(), b[0].raw_data(), a[0].nbytes()) != 0;
  }
  EXPECT_GE(differing, 4);
  std::vector<Tensor> v1 = sample_fields(*val), v2 = sample_fields(*val);
  val->read(0, 0, v1);
  val->read(0, 5, v2);
  EXPECT_EQ(std::memcmp(v1[0].raw_data(), v2[0].raw_data(), v1[0].nbytes()), 0);
  test::BuiltinRun run(c);
  EXPECT_EQ(run.fit().steps, 4);
}

TEST_F(Classify, ResumeContinuesExactlyOnTheSameSplitAndStatistics) {
  const std::string root = path("images");
  make_pattern_folder(root, 8, 16);
  train::TrainerConfig c = config("folder:" + root);
  c.data.image_size = 16;
  c.data.val_fraction = 0.25;  // 18 training images: 2 batches of 8 per epoch, so the run crosses epochs
  c.max_steps = 6;
  c.eval_every = 3;
  c.checkpoint.every = 3;
  c.workers = 2;
  test::BuiltinRun a(c);
  a.fit();
  train::TrainerConfig cb = c;
  cb.run_dir = path("run_b");
  test::BuiltinRun b(cb);
  b.resume(c.run_dir + "/checkpoints/step-00000003");
  b.fit();
  std::vector<train::MetricRow> tail;
  for (const train::MetricRow& r : a.history())
    if (r.step > 3) tail.push_back(r);
  ASSERT_EQ(tail.size(), b.history().size());
  ASSERT_FALSE(tail.empty());
  for (size_t k = 0; k < tail.size(); ++k) {
    EXPECT_EQ(tail[k].step, b.history()[k].step);
    EXPECT_EQ(tail[k].loss, b.history()[k].loss) << "step " << tail[k].step << " " << tail[k].split;
    EXPECT_EQ(tail[k].accuracy, b.history()[k].accuracy);
  }
  EXPECT_EQ(read_bytes(c.run_dir + "/task.json"), read_bytes(cb.run_dir + "/task.json"));
}

// --- malformed data, and data the model cannot take: refused, nothing written ----------------

TEST_F(Classify, MalformedFoldersAreRefusedBeforeAnythingIsWritten) {
  const std::string root = path("images");
  make_pattern_folder(root, 4, 16);
  fs::create_directories(root + "/empty");
  expect_refused(config("folder:" + root), root + "/empty: the class folder holds no images");
  fs::remove(root + "/empty");
  write_bytes(root + "/checker/bad.png", "\x89PNG\r\n\x1a\n garbage");
  expect_refused(config("folder:" + root), root + "/checker/bad.png: not a readable PNG");
  fs::remove(root + "/checker/bad.png");
  const std::string jpeg = read_bytes(root + "/vertical/001.jpg");
  write_bytes(root + "/vertical/001.jpg", jpeg.substr(0, jpeg.size() / 2));
  expect_refused(config("folder:" + root), root + "/vertical/001.jpg: truncated JPEG");
  write_bytes(root + "/vertical/001.jpg", jpeg);
  expect_refused(config("folder:" + path("nowhere")), path("nowhere") + ": not a folder");
  expect_refused(config("folder:" + root + "/checker"), root + "/checker: no class folders");
  fs::create_directories(path("one/only"));
  write_png(path("one/only/1.png"), 8, 8, 3, gradient(8, 8));
  expect_refused(config("folder:" + path("one")),
                 path("one") + ": one class folder (only); expected a sub-folder per class");

  // Validation folders must have the training folder's classes.
  make_pattern_folder(path("val"), 2, 16);
  fs::rename(path("val") + "/checker", path("val") + "/chequer");
  train::TrainerConfig c = config("folder:" + root);
  c.data.val = "folder:" + path("val");
  expect_refused(c, path("val") + ": its 3 class folders differ from the training folder's 3");
  c.data.val = "npy:" + path("x.npy") + "," + path("y.npy");
  expect_refused(c, "option val_data: expected folder: data like --data");
}

TEST_F(Classify, EmptySplitsAreRefused) {
  const std::string root = path("images");
  make_pattern_folder(root, 3, 16);  // 9 images
  train::TrainerConfig c = config("folder:" + root);
  c.data.val_fraction = 0.05;
  expect_refused(c, ": holding out val_fraction 0.05 of its 9 samples leaves the validation split empty");
  c.data.val_fraction = 0.97;
  expect_refused(c, "leaves the training split empty");
  c.data.val_fraction = 0.2;
  c.batch_size = 16;
  expect_refused(c, "folder:" + root + ": the training split holds 7 samples (after holding out val_fraction), " +
                        "fewer than batch_size x accumulate = 16");
}

TEST_F(Classify, ModelsThatCannotTakeTheDataAreRefused) {
  const std::string root = path("images");
  make_pattern_folder(root, 4, 16);
  train::TrainerConfig c = config("folder:" + root);
  c.model.name = "resnet18";
  c.data.image_size = 16;
  expect_refused(c,
                 "option model: resnet18 reduces images 32-fold (ImageNet stem and four stages) and takes 32x32 "
                 "pixels or more; folder:" +
                     root + " gives 16x16 images");
  write_mnist(path("mnist"), "train", 20);
  c = config("mnist:" + path("mnist"));
  c.model.name = "resnet20";
  expect_refused(
      c, "option model: resnet20 takes 3-channel (RGB) images; mnist:" + path("mnist") + " holds 1-channel images");
  write_blobs(path("x.npy"), path("y.npy"), 40, 5, 2, 3);
  c = config("npy:" + path("x.npy") + "," + path("y.npy"));
  c.model.name = "cnn-mini";
  expect_refused(c, "option model: cnn-mini takes images [C, H, W]; " + path("x.npy") +
                        " holds feature vectors of 5 values (use --model mlp)");
  // npy images are used at their own size, which must be the run's.
  std::vector<float> x(20 * 3 * 10 * 10, 0.5f);
  save_npy(path("xi.npy"), f32_tensor(x, Shape{20, 3, 10, 10}));
  save_npy(path("yi.npy"),
           i64_tensor(std::vector<int64_t>{0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1}));
  c = config("npy:" + path("xi.npy") + "," + path("yi.npy"));
  expect_refused(c, path("xi.npy") + ": holds 10x10 images; expected 32x32 (--image-size");
}

TEST_F(Classify, MalformedNpyAndMnistFilesAreRefusedNamingTheFile) {
  const std::string x = path("x.npy"), y = path("y.npy");
  auto npy = [&] {
    train::TrainerConfig c = config("npy:" + x + "," + y);
    c.model.name = "mlp";
    return c;
  };
  save_npy(x, f32_tensor({1, 2, 3, 4}, Shape{4}));
  save_npy(y, i64_tensor({0, 1, 0, 1}));
  expect_refused(npy(), x + ": expected [n, d] feature vectors or [n, C, H, W] images, found shape [4]");
  save_npy(x, f32_tensor(std::vector<float>(12, 1.0f), Shape{4, 3}));
  save_npy(y, f32_tensor({0, 1, 0, 1}, Shape{4}));
  expect_refused(npy(), y + ": expected integer labels (int64, int32 or uint8), found f32");
  save_npy(y, i64_tensor({0, 1, 0}));
  expect_refused(npy(), y + ": holds 3 labels but " + x + " holds 4 rows");
  save_npy(y, i64_tensor({0, 1, 0, 1}).reshape(Shape{2, 2}));
  expect_refused(npy(), y + ": expected labels of shape [n], found [2, 2]");
  save_npy(y, i64_tensor({0, -1, 0, 1}));
  expect_refused(npy(), y + ": row 1 holds label -1; expected a class in [0, classes)");
  save_npy(y, i64_tensor({0, 0, 0, 0}));
  expect_refused(npy(), y + ": every label is 0; expected at least 2 classes");
  std::vector<float> values(12, 1.0f);
  values[7] = std::nanf("");
  save_npy(x, f32_tensor(values, Shape{4, 3}));
  save_npy(y, i64_tensor({0, 1, 0, 1}));
  expect_refused(npy(), x + ": row 2 holds a non-finite value (nan)");
  write_bytes(x, "not an npy file");
  expect_refused(npy(), x);
  // Validation labels past the training file's classes.
  write_blobs(x, y, 40, 3, 2, 5);
  save_npy(path("vx.npy"), f32_tensor(std::vector<float>(6, 0.0f), Shape{2, 3}));
  save_npy(path("vy.npy"), i64_tensor({1, 2}));
  train::TrainerConfig c = npy();
  c.data.val = "npy:" + path("vx.npy") + "," + path("vy.npy");
  expect_refused(c, path("vy.npy") + ": row 1 holds label 2; expected a class in [0, 2) (the classes of " + y + ")");
  save_npy(path("vx.npy"), f32_tensor(std::vector<float>(8, 0.0f), Shape{2, 4}));
  expect_refused(c, path("vx.npy") + ": samples of shape [4]; expected [3]");
  expect_refused(config("npy:" + x), "option data: expected npy:X.npy,y.npy");
  expect_refused(config(path("images")), "option data: expected mnist:DIR, cifar10:DIR, folder:DIR or npy:X.npy,y.npy");

  const std::string mnist = path("mnist");
  fs::create_directories(mnist);
  expect_refused(config("mnist:" + mnist),
                 mnist + "/train-images-idx3-ubyte: not found, nor train-images-idx3-ubyte.gz");
  write_mnist(mnist, "train", 20);
  fs::remove(mnist + "/train-images-idx3-ubyte");
  write_bytes(mnist + "/train-images-idx3-ubyte.gz", "neither gzip nor IDX");  // read as IDX, and refused
  expect_refused(config("mnist:" + mnist), mnist + "/train-images-idx3-ubyte.gz: not an MNIST images file");
  fs::remove(mnist + "/train-images-idx3-ubyte.gz");
  write_mnist(mnist, "train", 20);
  train::TrainerConfig m = config("mnist:" + mnist);
  m.data.val = "mnist:" + mnist;  // no t10k files
  expect_refused(m, mnist + "/t10k-images-idx3-ubyte: not found");
  std::string labels = read_bytes(mnist + "/train-labels-idx1-ubyte");
  labels[8 + 3] = 12;
  write_bytes(mnist + "/train-labels-idx1-ubyte", labels);
  expect_refused(config("mnist:" + mnist), mnist + "/train-labels-idx1-ubyte: label 12 of sample 3 is out of range");
}

// --- end to end: the program --------------------------------------------------------------

// An image folder of three pattern classes (100 images each, 32 x 32, PNG and JPEG) through
// `fasttrain train --task classify` as a user runs it (resampled to 16 x 16, augmented): at least
// 90% validation accuracy on the held-out 20% after 60 steps, with task.json describing the data for a later
// evaluation. A refused run exits 2 with one message and writes nothing.
TEST_F(Classify, ProgramTrainsOnAnImageFolderToNinetyPercent) {
  const std::string root = path("patterns");
  make_pattern_folder(root, 100, 32);
  const std::string run = path("run");
  const CliRun r = run_cli("train --task classify --data folder:" + root +
                           " --model cnn-mini --image-size 16 --val-fraction 0.2 --max-steps 60 --batch-size 32 "
                           "--lr 3e-3 --warmup-steps 5 --eval-every 0 --goal-accuracy 0.9 --threads 2 --workers 1 "
                           "--progress false --run-dir " +
                           run);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("(goal >= 90.0%: met)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("on 60 images of 3 classes"), std::string::npos) << r.output;
  const auto task = nlohmann::json::parse(read_bytes(run + "/task.json"));
  EXPECT_EQ(task["classes"], nlohmann::json({"checker", "horizontal", "vertical"}));
  EXPECT_EQ(task["input"]["image_size"], 16);
  EXPECT_EQ(task["normalisation"]["mean"].size(), 3u);
  EXPECT_TRUE(fs::exists(run + "/model.safetensors"));

  // `fasttrain eval` rebuilds the task from the run's config: on the run's own validation split it
  // measures what training's final evaluation did (same split, same normalisation), and it takes
  // a new folder of the same classes.
  const auto summary = nlohmann::json::parse(read_bytes(run + "/summary.json"));
  char expected[96];
  std::snprintf(expected, sizeof expected, "loss %.4f, accuracy %.2f%%", summary["final_val_loss"].get<double>(),
                100 * summary["final_val_accuracy"].get<double>());
  const CliRun own = run_cli("eval --checkpoint " + run);
  ASSERT_EQ(own.code, 0) << own.output;
  EXPECT_NE(own.output.find(expected), std::string::npos) << own.output << "\nexpected: " << expected;
  make_pattern_folder(path("fresh"), 20, 32, /*seed=*/8);
  const CliRun fresh = run_cli("eval --checkpoint " + run + " --data folder:" + path("fresh"));
  ASSERT_EQ(fresh.code, 0) << fresh.output;
  const size_t at = fresh.output.find("accuracy ");
  ASSERT_NE(at, std::string::npos) << fresh.output;
  EXPECT_GE(std::stod(fresh.output.substr(at + 9)), 85.0) << fresh.output;

  const std::string bad = path("bad");
  fs::create_directories(bad + "/a");
  fs::create_directories(bad + "/b");
  write_png(bad + "/a/1.png", 8, 8, 3, gradient(8, 8));
  const CliRun e = run_cli("train --task classify --data folder:" + bad + " --run-dir " + path("bad_run"));
  EXPECT_EQ(e.code, 2) << e.output;
  EXPECT_NE(e.output.find("fasttrain: error: " + bad + "/b: the class folder holds no images"), std::string::npos)
      << e.output;
  EXPECT_FALSE(fs::exists(path("bad_run")));
}
