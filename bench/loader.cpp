// Loader benchmark (issue 4): samples/s through the DataLoader for
//   image: CIFAR-like u8 [3, 32, 32] held in memory, RandomCrop(32, padding 4) + horizontal flip +
//          Normalize in the workers (TransformedDataset), batch 256, shuffled;
//   token: gpt-mini batches, 16 windows of T = 128 next-token pairs from a generated token shard;
//   token-stream: the same batches read as a stream (TokenStreamDataset, an IterableDataset; no
//          PyTorch counterpart in torch_loader.py, it is compared with `token`).
// With --device cuda the batches go through DevicePrefetcher from page-locked buffers (the peer:
// pin_memory=True and .to("cuda", non_blocking=True)), and the clock stops after the device has
// every batch.
// Prints one JSON line, field for field the same as bench/torch_loader.py.
// Usage: loader --pipeline image|token|token-stream [--workers N] [--seconds S] [--device cpu|cuda]
#include <unistd.h>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>

#include "fasttrain/device_prefetcher.h"
#include "fasttrain/loader.h"
#include "fasttrain/random.h"
#include "fasttrain/token_shards.h"
#include "fasttrain/transforms.h"

using namespace ft;
using namespace ft::data;

namespace {

constexpr int64_t kImages = 10000, kTokens = 1 << 21, kContext = 128;

// N images u8 [3, 32, 32] in one array, pixel bytes from Philox (seed 0).
class InMemoryImages : public Dataset {
 public:
  InMemoryImages() : bytes_(kImages * 3072) {
    for (size_t k = 0; k < bytes_.size(); ++k) bytes_[k] = static_cast<uint8_t>(philox_word(0, 0, k));
  }
  int64_t size() const override { return kImages; }
  SampleSpec spec() const override { return {{"image", {3, 32, 32}, DType::U8}, {"label", {}, DType::I64}}; }
  void read(int64_t index, uint64_t, const std::vector<Tensor>& fields) const override {
    std::memcpy(fields[0].raw_data(), bytes_.data() + index * 3072, 3072);
    *fields[1].data<int64_t>() = bytes_[index * 3072] % 10;
  }

 private:
  std::vector<uint8_t> bytes_;
};

}  // namespace

int main(int argc, char** argv) {
  std::string pipeline = "image";
  int workers = 0;
  double seconds = 2.0;
  std::string device = "cpu";
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--pipeline")
      pipeline = argv[i + 1];
    else if (a == "--workers")
      workers = std::stoi(argv[i + 1]);
    else if (a == "--seconds")
      seconds = std::stod(argv[i + 1]);
    else if (a == "--device")
      device = argv[i + 1];
    else {
      std::fprintf(stderr, "loader: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  try {
    DatasetPtr ds;
    IterableDatasetPtr stream;
    LoaderOptions o;
    o.num_workers = workers, o.shuffle = true, o.seed = 0;
    const Device dev = Device::parse(device);
    o.pin_memory = dev.is_cuda();
    std::string shard;
    if (pipeline == "image") {
      ImageTransform t;
      t.crop_size = 32, t.padding = 4, t.horizontal_flip = true;
      t.mean = {0.4914f, 0.4822f, 0.4465f}, t.std = {0.2470f, 0.2435f, 0.2616f};
      ds = std::make_shared<TransformedDataset>(std::make_shared<InMemoryImages>(), t);
      o.batch_size = 256;
    } else if (pipeline == "token" || pipeline == "token-stream") {
      std::vector<uint16_t> tokens(kTokens);
      for (int64_t k = 0; k < kTokens; ++k) tokens[k] = static_cast<uint16_t>(philox_word(1, 0, k) % 512);
      shard = (std::filesystem::temp_directory_path() / ("ft_loader_bench_" + std::to_string(::getpid()) + ".bin"))
                  .string();
      write_token_shard(shard, tokens);
      if (pipeline == "token") {
        ds = std::make_shared<TokenWindowDataset>(shard, kContext);
      } else {
        stream = std::make_shared<TokenStreamDataset>(shard, kContext);
        o.shuffle = false;  // a stream keeps its order
      }
      o.batch_size = 16;
    } else {
      std::fprintf(stderr, "loader: --pipeline must be image, token or token-stream, found %s\n", pipeline.c_str());
      return 2;
    }
    auto loader = stream ? std::make_unique<DataLoader>(stream, o) : std::make_unique<DataLoader>(ds, o);
    DevicePrefetcher batches(*loader, dev);
    auto next = [&]() -> int64_t {
      const Batch* b = batches.next();
      if (!b) b = batches.next();  // epoch boundary
      return b->rows;
    };
    for (int i = 0; i < 3; ++i) next();  // warm-up: workers started, scratch made
    using clock = std::chrono::steady_clock;
    auto start = clock::now();
    int64_t samples = 0;
    double elapsed = 0;
    while (elapsed < seconds) {
      samples += next();
      elapsed = std::chrono::duration<double>(clock::now() - start).count();
    }
    synchronize(current_stream(dev));  // the last batch has reached the device
    elapsed = std::chrono::duration<double>(clock::now() - start).count();
    if (!shard.empty()) std::filesystem::remove(shard);
    std::printf(
        "{\"impl\": \"fasttrain\", \"pipeline\": \"%s\", \"device\": \"%s\", \"workers\": %d, \"batch\": %lld, "
        "\"samples_per_s\": %.1f}\n",
        pipeline.c_str(), dev.str().c_str(), workers, static_cast<long long>(o.batch_size), samples / elapsed);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loader: %s\n", e.what());
    return 1;
  }
}
