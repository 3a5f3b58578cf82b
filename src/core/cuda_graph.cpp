// CudaGraph (fasttrain/cuda_graph.h): capture and replay through the CUDA backend's hooks, so the
// core stays free of CUDA headers and a build without CUDA reports "no CUDA support".
#include "fasttrain/cuda_graph.h"

#include <algorithm>
#include <atomic>
#include <utility>

#include "backend/device_backend.h"
#include "backend/kernels.h"
#include "fasttrain/random.h"

namespace ft {
namespace {

thread_local CudaGraph* tls_capturing = nullptr;

const backend::DeviceBackend& graph_backend(Device device) {
  FT_CHECK(device.is_cuda(), "CudaGraph: expected a CUDA device, found ", device.str());
  const backend::DeviceBackend& b = backend::require_backend(device, "CudaGraph");
  FT_CHECK(b.graph_begin != nullptr, "CudaGraph(", device.str(), "): this backend has no graphs");
  return b;
}

}  // namespace

CudaGraph* capturing_graph() { return tls_capturing; }

void refuse_in_graph_capture(const char* what, const char* why) {
  if (tls_capturing != nullptr)
    throw GraphCaptureError(detail::concat(what, " cannot be captured in a CUDA graph: ", why));
}

CudaGraph::CudaGraph(Device device)
    : device_(device),
      stream_{device, graph_backend(device).stream_create(device.index)},
      ready_(device),
      done_(device) {
  static std::atomic<uint64_t> next_pool{1};
  pool_ = next_pool.fetch_add(1);
}

CudaGraph::~CudaGraph() {
  // Work already queued may still run the graph: wait for it before the executable graph and the
  // memory it writes go.
  try {
    if (exec_ != nullptr) graph_backend(device_).synchronize_internal(stream_);
  } catch (const Error&) {  // a failed device: nothing to wait for any more
  }
  backend::find_backend(device_.type)->graph_destroy(exec_, pool_);
}

void CudaGraph::capture(const std::function<void()>& work) {
  FT_CHECK(exec_ == nullptr, "CudaGraph::capture: this graph was captured already");
  FT_CHECK(tls_capturing == nullptr, "CudaGraph::capture: this thread is capturing another graph");
  const backend::DeviceBackend& h = graph_backend(device_);
  // The captured work reads what the caller's stream queued before it (the inputs' copies).
  ready_.record(current_stream(device_));
  ready_.block(stream_);
  h.graph_begin(stream_, pool_);
  tls_capturing = this;
  // Ends a capture that did not finish; true when the runtime had refused part of it.
  auto discard = [&] {
    tls_capturing = nullptr;
    const bool invalidated = h.graph_abort(stream_);
    forget_capture();
    return invalidated;
  };
  try {
    const StreamGuard guard(stream_);
    work();
  } catch (const GraphCaptureError&) {
    discard();
    throw;
  } catch (const Error& e) {
    // A library call the capture refused (cuBLASLt, cuDNN) reports it in its own terms.
    if (discard()) throw GraphCaptureError(e.what());
    throw;
  } catch (...) {
    discard();
    throw;
  }
  tls_capturing = nullptr;
  try {
    exec_ = h.graph_end(stream_);
  } catch (...) {
    forget_capture();
    throw;
  }
}

void CudaGraph::forget_capture() {
  before_replay_.clear();
  after_replay_.clear();
  kept_.clear();
  random_.clear();
}

void CudaGraph::replay() {
  FT_CHECK(exec_ != nullptr, "CudaGraph::replay: nothing captured");
  const Stream caller = current_stream(device_);
  ready_.record(caller);
  ready_.block(stream_);
  {
    const StreamGuard guard(stream_);
    for (const auto& action : before_replay_) action();
    backend::find_backend(device_.type)->graph_launch(exec_, stream_);
    for (const auto& action : after_replay_) action();
  }
  done_.record(stream_);
  done_.block(caller);
}

void CudaGraph::before_replay(std::function<void()> action) {
  FT_CHECK(tls_capturing == this, "CudaGraph::before_replay: only while capturing");
  before_replay_.push_back(std::move(action));
}

void CudaGraph::after_replay(std::function<void()> action) {
  FT_CHECK(tls_capturing == this, "CudaGraph::after_replay: only while capturing");
  after_replay_.push_back(std::move(action));
}

void CudaGraph::keep_alive(Tensor t) { kept_.push_back(std::move(t)); }

std::pair<uint64_t, const uint64_t*> CudaGraph::random_counters(Generator& gen, uint64_t blocks) {
  FT_CHECK(tls_capturing == this, "CudaGraph::random_counters: only while capturing");
  auto it = std::find_if(random_.begin(), random_.end(), [&](const RandomSlot& s) { return s.gen == &gen; });
  if (it == random_.end()) {
    RandomSlot& s = random_.emplace_back(RandomSlot{&gen, {}, 0});
    {
      // Written before each replay, outside the graph: not memory a captured temporary had.
      const OutsideGraphPool outside_the_pool(device_);
      s.base = empty({1}, TensorOptions(DType::I64, device_));
    }
    before_replay([&s] {
      // Launched on the graph's stream, after the previous replay: the step's blocks, reserved
      // now, start at the counter the eager step would have started at.
      const uint64_t first = s.gen->reserve(s.blocks);
      backend::kernels(s.base).fill(s.base, Scalar(static_cast<int64_t>(first)));
    });
    it = random_.end() - 1;
  }
  const uint64_t relative = it->blocks;
  it->blocks += blocks;
  return {relative, static_cast<const uint64_t*>(it->base.raw_data())};
}

}  // namespace ft
