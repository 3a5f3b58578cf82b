// CUDA graphs: the kernels, copies and memsets one thread issues on a device, recorded once and
// replayed with one launch (cudaStreamBeginCapture / cudaGraphLaunch). A replay costs the host one
// call however many kernels the step has, which is what launch-bound steps (small models, small
// batches) wait for in eager mode.
//
// What a replay does is fixed at capture: the same kernels on the same addresses with the same
// arguments. So:
// - Memory allocated while capturing comes from a pool of the graph's own (the device allocator
//   keeps it from every other allocation) and stays the graph's until the graph is destroyed:
//   each replay writes its intermediates and outputs to the addresses captured.
// - Values that change between replays (a learning-rate schedule, a new batch) must live in device
//   memory the graph reads: inputs are copied into the tensors captured, and the CUDA backend
//   registers `before_replay` actions that write what the host owns (the optimizer's group
//   options) into device memory with a kernel launched before each replay.
// - Random draws on the device (dropout, random fills) take their Philox counters relative to a
//   device value per generator that each replay sets first, reserving on the host what the step
//   draws: a replay draws exactly what the same step run eagerly would (random_counters).
// - What cannot be replayed is refused while capturing with a GraphCaptureError naming the op: a
//   host-device synchronisation (item(), a blocking copy, a new scalar constant), random numbers
//   drawn for the CPU, a cuDNN algorithm search. The caller (StepRunner) then runs the step
//   eagerly.
#pragma once
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "fasttrain/device.h"
#include "fasttrain/error.h"
#include "fasttrain/tensor.h"

namespace ft {

class Generator;

// Thrown while capturing by whatever cannot be part of a graph; the message names it.
class GraphCaptureError : public Error {
 public:
  explicit GraphCaptureError(const std::string& what) : Error(what) {}
};

class CudaGraph {
 public:
  // The graph runs on a stream of its own on `device` (capture is not allowed on the default
  // stream); each replay is ordered after the work already queued on the caller's current stream,
  // and the caller's stream waits for the replay.
  explicit CudaGraph(Device device);
  ~CudaGraph();
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  // Records, on this thread, what `work` issues on the device; nothing runs on the device while
  // recording. Throws GraphCaptureError (the capture discarded, the graph left empty) when
  // something in `work` cannot be captured, or rethrows what `work` threw.
  void capture(const std::function<void()>& work);
  // Runs the recorded work once more: the before_replay actions, the graph, the after_replay
  // actions.
  void replay();
  bool captured() const { return exec_ != nullptr; }
  Device device() const { return device_; }

  // For the backend, while capturing: `action` runs on the host before (after) every replay, with
  // the graph's stream current: to launch the kernels that refresh device values, to record
  // an event after the replay. `t` is kept alive as long as the graph (host memory a captured
  // copy reads).
  void before_replay(std::function<void()> action);
  void after_replay(std::function<void()> action);
  void keep_alive(Tensor t);
  // For a random draw of `blocks` Philox counter blocks from `gen` while capturing: the draw's
  // first block relative to a device value (u64) that every replay sets, before it runs, to gen's
  // counter at that time, reserving there the blocks the whole step draws. `gen` must outlive the
  // graph.
  std::pair<uint64_t, const uint64_t*> random_counters(Generator& gen, uint64_t blocks);

 private:
  struct RandomSlot {
    Generator* gen;
    Tensor base;          // i64 [1] on the device: the counter at the replay's start
    uint64_t blocks = 0;  // what one replay draws from gen
  };
  Device device_;
  Stream stream_;         // created for the graph; never destroyed (as side streams: handles stay valid)
  Event ready_, done_;    // the caller's work before a replay; the replay's end
  void* exec_ = nullptr;  // cudaGraphExec_t
  uint64_t pool_ = 0;     // the allocator pool of what the capture allocated
  std::vector<std::function<void()>> before_replay_, after_replay_;
  std::vector<Tensor> kept_;
  std::deque<RandomSlot> random_;  // one per generator drawn from; a deque: actions hold pointers
  void forget_capture();           // what a capture that failed registered
};

// The graph this thread is capturing, or null.
CudaGraph* capturing_graph();
// Throws GraphCaptureError("<what> cannot be captured in a CUDA graph: <why>") while this thread
// captures; nothing otherwise.
void refuse_in_graph_capture(const char* what, const char* why);

}  // namespace ft
