// The device backend records (backend/device_backend.h): one per device type this build has, made
// on first use, with the CPU's filled like any other; clear errors for a type without a backend or
// a device that is missing; and the CUDA libraries left unloaded by work that never touches a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "backend/device_backend.h"
#include "backend/kernels.h"
#include "backend/shared_library.h"
#include "fasttrain/allocator.h"
#include "fasttrain/machine.h"
#include "fasttrain/nn.h"
#include "fasttrain/ops/reduce.h"
#include "fasttrain/random.h"
#include "fasttrain/tensor.h"
#include "support/expect_error.h"

#ifdef FASTTRAIN_WITH_CUDA
#include "backend/cuda/cublaslt_library.h"
#include "backend/cuda/cudnn_library.h"
#endif

using namespace ft;
using backend::DeviceBackend;
using test::error_of;

namespace {

// The shared objects this process has mapped whose file name contains `part`.
std::vector<std::string> mapped(const std::string& part) {
  std::ifstream maps("/proc/self/maps");
  std::vector<std::string> found;
  std::string line;
  while (std::getline(maps, line)) {
    const auto slash = line.find('/');
    if (slash == std::string::npos) continue;
    const std::string path = line.substr(slash);
    if (path.find(part) != std::string::npos && (found.empty() || found.back() != path)) found.push_back(path);
  }
  return found;
}

}  // namespace

TEST(DeviceBackend, TheCpuRecordIsFilledLikeAnyOther) {
  const DeviceBackend* cpu = backend::find_backend(DeviceType::CPU);
  ASSERT_NE(cpu, nullptr);
  EXPECT_EQ(cpu->type, DeviceType::CPU);
  EXPECT_EQ(cpu, backend::find_backend(DeviceType::CPU)) << "one record, made once";
  EXPECT_EQ(&cpu->kernels(), &backend::kernels(Device::cpu()));
  EXPECT_EQ(cpu->kernels().device, DeviceType::CPU);
  EXPECT_EQ(&cpu->allocator(), &allocator_for(Device::cpu()));
  EXPECT_EQ(cpu->device_count(), 1);
  EXPECT_EQ(cpu->device_name(0), "cpu");
  // Work on the CPU is done when a kernel returns: no streams, events, graphs or waits.
  EXPECT_EQ(cpu->stream_create, nullptr);
  EXPECT_EQ(cpu->event_create, nullptr);
  EXPECT_EQ(cpu->graph_begin, nullptr);
  EXPECT_EQ(cpu->synchronize, nullptr);
  EXPECT_EQ(cpu->pinned_host_allocator, nullptr);
  const float src[3] = {1.5f, -2.0f, 7.25f};
  float dst[3] = {};
  cpu->memcpy(dst, Device::cpu(), src, Device::cpu(), sizeof src, current_stream(Device::cpu()), false);
  EXPECT_EQ(std::memcmp(dst, src, sizeof src), 0);
  // The core's CPU paths go through the record and its empty entries.
  synchronize(current_stream(Device::cpu()));
  Event e(Device::cpu());
  e.record(current_stream(Device::cpu()));
  EXPECT_TRUE(e.query());
  EXPECT_EQ(side_stream(Device::cpu()).handle, nullptr);
}

TEST(DeviceBackend, EveryDeviceTypeHasARecordOrAClearError) {
  for (int t = 0; t < kNumDeviceTypes; ++t) {
    const auto type = static_cast<DeviceType>(t);
    const std::string label = device_type_label(type);
    const DeviceBackend* b = backend::find_backend(type);
    if (b == nullptr) {
      EXPECT_EQ(error_of([&] { backend::require_backend(Device(type, 0), "probe"); }),
                "probe(" + Device(type, 0).str() + "): this build has no " + label + " support");
      EXPECT_EQ(error_of([&] { allocator_for(Device(type, 0)); }),
                "device " + Device(type, 0).str() + " is not available: this build has no " + label + " support");
      continue;
    }
    EXPECT_EQ(b->type, type);
    // Every record fills what the core calls unconditionally.
    EXPECT_NE(b->kernels, nullptr) << label;
    EXPECT_NE(b->allocator, nullptr) << label;
    EXPECT_NE(b->device_count, nullptr) << label;
    EXPECT_NE(b->device_name, nullptr) << label;
    EXPECT_NE(b->memcpy, nullptr) << label;
    // Streams and events come together, and a device with streams can be waited for.
    EXPECT_EQ(b->stream_create == nullptr, b->event_create == nullptr) << label;
    if (b->event_create != nullptr) {
      EXPECT_NE(b->event_destroy, nullptr);
      EXPECT_NE(b->event_record, nullptr);
      EXPECT_NE(b->stream_wait_event, nullptr);
      EXPECT_NE(b->event_synchronize, nullptr);
      EXPECT_NE(b->event_query, nullptr);
      EXPECT_NE(b->synchronize, nullptr);
      EXPECT_NE(b->synchronize_internal, nullptr);
    }
    if (b->graph_begin != nullptr) {
      EXPECT_NE(b->graph_end, nullptr);
      EXPECT_NE(b->graph_abort, nullptr);
      EXPECT_NE(b->graph_launch, nullptr);
      EXPECT_NE(b->graph_destroy, nullptr);
      EXPECT_NE(b->exchange_capture_pool, nullptr);
    }
    const int n = b->device_count();
    const Device past(type, n);
    EXPECT_EQ(
        error_of([&] { backend::require_backend(past, "probe"); }),
        "probe(" + past.str() + "): device is not available (" + std::to_string(n) + " " + label + " devices found)");
  }
}

TEST(DeviceBackend, DeviceStringsFollowTheTypeTable) {
  for (int t = 0; t < kNumDeviceTypes; ++t) {
    const auto type = static_cast<DeviceType>(t);
    const Device d(type, type == DeviceType::CPU ? 0 : 3);
    EXPECT_EQ(Device::parse(d.str()), d);
  }
  EXPECT_EQ(Device::parse("cuda"), Device::cuda(0));
  EXPECT_EQ(error_of([] { Device::parse("tpu:0"); }), "device 'tpu:0': expected 'cpu', 'cuda' or 'cuda:N'");
  EXPECT_EQ(error_of([] { Device::parse("cuda:x"); }), "device 'cuda:x': expected 'cpu', 'cuda' or 'cuda:N'");
}

TEST(SharedLibrary, AMissingLibraryNamesEveryFileTried) {
  const std::string e = error_of([] {
    backend::open_shared_library("cuFake", {"libfasttrain_no_such_library.so.1", "/nonexistent/libfake.so"});
  });
  EXPECT_EQ(
      e.rfind("cuFake could not be loaded (tried libfasttrain_no_such_library.so.1, /nonexistent/libfake.so): ", 0), 0u)
      << e;
  // A library that loads, and a symbol it lacks.
  void* libc = backend::open_shared_library("libc", {"libc.so.6"});
  ASSERT_NE(libc, nullptr);
  EXPECT_NE(backend::library_symbol(libc, "libc", "strlen"), nullptr);
  EXPECT_EQ(error_of([&] { backend::library_symbol(libc, "libc", "ft_no_such_function"); }),
            "libc: the loaded library has no ft_no_such_function (it is older than the one this build was compiled "
            "against)");
}

// Each ctest case is its own process, so what this one maps is what CPU work maps. The check is
// shown able to fail: in a CUDA build, loading cuBLASLt and cuDNN afterwards makes them appear.
TEST(SharedLibrary, CpuWorkMapsNoCudaLibrary) {
  nn::Linear layer(64, 32);
  Tensor x = randn({8, 64});
  x.requires_grad_(true);
  sum(layer.forward(x)).backward();
  (void)cuda_device_count();  // asks the CUDA record, which loads the driver only
  EXPECT_EQ(mapped("libcublas").size(), 0u) << mapped("libcublas")[0];
  EXPECT_EQ(mapped("libcudnn").size(), 0u) << mapped("libcudnn")[0];
#ifdef FASTTRAIN_WITH_CUDA
  // cuBLASLt and cuDNN load without a driver, and every entry the backend calls resolves.
  const auto& lt = cuda::cublaslt();
  EXPECT_STREQ(lt.cublasLtGetStatusName(CUBLAS_STATUS_SUCCESS), "CUBLAS_STATUS_SUCCESS");
  const auto& dnn = cuda::cudnn();
  EXPECT_STREQ(dnn.cudnnGetErrorString(CUDNN_STATUS_SUCCESS), "CUDNN_STATUS_SUCCESS");
#define FT_EXPECT_RESOLVED(f) EXPECT_NE(lt.f, nullptr) << #f;
  FT_CUBLASLT_FUNCTIONS(FT_EXPECT_RESOLVED)
#undef FT_EXPECT_RESOLVED
#define FT_EXPECT_RESOLVED(f) EXPECT_NE(dnn.f, nullptr) << #f;
  FT_CUDNN_FUNCTIONS(FT_EXPECT_RESOLVED)
#undef FT_EXPECT_RESOLVED
  EXPECT_GT(mapped("libcublasLt").size(), 0u);
  EXPECT_GT(mapped("libcudnn").size(), 0u);
#else
  GTEST_SKIP() << "CPU-only build: no CUDA libraries to load";
#endif
}

// fasttrain/machine.h: what tools over the public API read about the CPU, from the CPU backend.
TEST(Machine, CpuInfoNamesTheDetectedLevelAndItsBf16Hardware) {
  const CpuInfo info = cpu_info();
  const std::vector<std::string> levels = {"generic", "avx2", "avx512", "avx512_bf16", "amx"};
  const auto at = std::find(levels.begin(), levels.end(), info.detected_level);
  ASSERT_NE(at, levels.end()) << info.detected_level;
  EXPECT_EQ(info.bf16_hardware, at - levels.begin() >= 3) << info.detected_level;
  EXPECT_FALSE(info.model.empty());
  if (info.detected_level != "generic") EXPECT_NE(info.isa_flags.find("avx2"), std::string::npos) << info.isa_flags;
  const std::string path = half_gemm_path();
  EXPECT_TRUE(path == "onednn" || path == "packed") << path;
}
