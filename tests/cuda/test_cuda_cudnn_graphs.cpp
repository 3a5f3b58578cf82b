// cuDNN's fused-attention graphs (src/backend/cuda/attention_cudnn.cpp) taken by cuDNN's engines,
// checked without a GPU: cuDNN builds execution plans ahead of time for a device described by its
// properties (cuDNN's JSON form of them), so the heuristics and the plan's finalization run here
// for every device file in tests/data/cudnn_devices/ and every pass and shape below (GPT-2's and
// Llama's attention, GQA and MQA, causal and full, bf16 and f16, dense and [B, T, H, D] operands).
// A graph no engine takes fails here, on a CPU machine, rather than in the next GPU session. With
// a GPU, FT_CUDNN_DEVICE_JSON=FILE writes that device's properties to FILE (the GPU check does,
// so a session can add the GPU's recorded file beside the hand-written one).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "backend/cuda/attention_cudnn.h"
#include "fasttrain/fasttrain.h"
#include "support/require_gpu.h"

using namespace ft;
using cuda::attention_cudnn::PlanCheck;
using cuda::attention_cudnn::PlanVerdict;

namespace {

std::string read_file(const std::filesystem::path& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

std::string describe(const PlanCheck& c) {
  std::ostringstream s;
  s << (c.backward ? "backward" : "forward") << " " << dtype_name(c.dtype) << " B=" << c.B << " H=" << c.H
    << " Hkv=" << c.Hkv << " Tq=" << c.Tq << " Tk=" << c.Tk << " D=" << c.D << (c.causal ? " causal" : " full")
    << (c.bthd ? " [B, T, H, D]" : "") << (c.deterministic ? " deterministic" : "");
  return s.str();
}

// Each pass of each graph variant once (causal and full, MHA, GQA and MQA, bf16 and f16, the
// deterministic backward), at real models' shapes where they differ only in size.
std::vector<PlanCheck> problems() {
  std::vector<PlanCheck> list;
  for (bool backward : {false, true}) {
    for (bool causal : {true, false})
      list.push_back({backward, DType::BF16, 1, 9, 3, 1024, 1024, 64, causal, true});  // smollm-135m
    list.push_back({backward, DType::BF16, 16, 12, 12, 1024, 1024, 64, true, true});   // gpt2-124m
    list.push_back({backward, DType::F16, 2, 8, 1, 256, 256, 128, false, false});      // MQA, D 128
    list.push_back({backward, DType::BF16, 2, 4, 4, 100, 100, 32, true, false});       // partial tiles
    list.push_back({backward, DType::BF16, 1, 4, 2, 128, 256, 64, true, false});       // Tq != Tk
  }
  // The deterministic backward (deterministic_algorithms(), the Trainer's default).
  list.push_back({true, DType::BF16, 16, 12, 12, 1024, 1024, 64, true, true, true});
  list.push_back({true, DType::BF16, 1, 9, 3, 1024, 1024, 64, true, true, true});
  return list;
}

}  // namespace

TEST(CudnnGraphs, AttentionGraphsAreTakenOnRecordedDevices) {
  // FT_CUDNN_DEVICES_DIR: the folder where the binary runs away from this source tree (the GPU
  // check's bundle).
  const char* env = std::getenv("FT_CUDNN_DEVICES_DIR");
  const std::filesystem::path dir =
      env != nullptr ? std::filesystem::path(env) : std::filesystem::path(FT_TESTS_DIR) / "data" / "cudnn_devices";
  if (!std::filesystem::is_directory(dir)) GTEST_SKIP() << "no device folder " << dir << " here";
  std::vector<std::filesystem::path> devices;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".json") devices.push_back(e.path());
  ASSERT_FALSE(devices.empty()) << "no device files in " << dir;
  for (const auto& path : devices) {
    SCOPED_TRACE(path.filename().string());
    const std::string json = read_file(path);
    for (const PlanCheck& c : problems()) {
      PlanVerdict v;
      try {
        v = cuda::attention_cudnn::check_plan_for_device(json, c);
      } catch (const Error& e) {
        // Only the library itself missing skips (a CUDA build on a machine without cuDNN's files).
        if (std::string(e.what()).find("could not be loaded") != std::string::npos)
          GTEST_SKIP() << "cuDNN not loadable: " << e.what();
        throw;
      }
      if (v.kind == PlanVerdict::NoDriver)
        GTEST_SKIP() << "cuDNN's runtime-compiled engines need the CUDA driver library or the toolkit's stub "
                        "(lib64/stubs/libcuda.so as libcuda.so.1 on the library path; ctest sets it): "
                     << v.detail;
      EXPECT_NE(v.kind, PlanVerdict::Refused) << describe(c) << ": " << v.detail;
      // FT_CUDNN_GRAPHS_VERBOSE=1: every verdict with cuDNN's reasons, for work on the graphs.
      if (std::getenv("FT_CUDNN_GRAPHS_VERBOSE") != nullptr)
        std::printf("%s: %s\n%s\n", describe(c).c_str(),
                    v.kind == PlanVerdict::Built      ? "built"
                    : v.kind == PlanVerdict::Compiled ? "compiled"
                                                      : "refused",
                    v.detail.c_str());
    }
  }
}

TEST(CudnnGraphs, RecordTheDevicesProperties) {
  REQUIRE_GPU();
  const std::string json = cuda::attention_cudnn::device_properties_json(0);
  EXPECT_NE(json.find("maxGridSize"), std::string::npos) << json;
  // What this device's properties give must be taken as the hand-written ones are.
  const PlanVerdict v = cuda::attention_cudnn::check_plan_for_device(json, problems()[0]);
  EXPECT_EQ(v.kind, PlanVerdict::Built) << v.detail;
  if (const char* out = std::getenv("FT_CUDNN_DEVICE_JSON")) {
    std::ofstream(out) << json << "\n";
    std::printf("cuDNN device properties written to %s\n", out);
  }
}
