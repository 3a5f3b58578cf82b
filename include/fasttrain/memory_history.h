// The allocators' history (torch.cuda.memory._record_memory_history): while recording, every block
// handed out or given back by a caching allocator is an event with its size (the size class the
// allocator counts), time, the thread's phase, the kernel and autograd node it was made for and the
// module whose forward was running. Labels name what a block holds (a parameter, a gradient,
// optimizer state, a data batch); analyze() replays the events to the allocator's peak and
// divides the peak into categories and modules.
//
// Categories of a block (first rule that applies):
//   a label                      parameters, gradients, optimizer state, data batches
//   made in the data phase       data batches
//   made in forward, alive after forward ended (freed in another phase, or never)
//                                activations (saved for backward, or outputs kept by the step)
//   anything else made while recording        temporaries
//   alive before recording began, unlabeled  other
// So the categories sum to the peak exactly, and a block's category is known at any moment.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "fasttrain/profiler.h"
#include "fasttrain/tensor.h"

namespace ft::memory {

enum class Category : uint8_t { Parameters, Gradients, OptimizerState, Activations, Temporaries, DataBatches, Other };
inline constexpr int kCategoryCount = 7;
const char* category_name(Category c);  // "parameters", "gradients", "optimizer_state", ...

struct Event {
  enum class Kind : uint8_t { Alloc, Free, Label };
  Kind kind = Kind::Alloc;
  int64_t seq = 0;              // order of the events
  int64_t time_ns = 0;          // since recording began
  std::string device;           // the allocator: "cpu", "cuda:0", "pinned"
  uint64_t ptr = 0;             // block address (a block is identified by device and address while live)
  int64_t bytes = 0;            // size class counted by the allocator (Label: the labeled block's size class)
  int64_t allocated_after = 0;  // the allocator's allocated bytes after this event (Alloc/Free)
  profiler::Phase phase = profiler::Phase::None;
  int64_t step = -1;
  std::string op;                       // kernel the block was made for (outputs are allocated just before it)
  std::string node;                     // autograd node running (backward), or ""
  std::string module;                   // module path ("transformer.h.0.attn"), or ""
  Category category = Category::Other;  // Label only
  std::string name;                     // Label only: parameter name, state name, "batch.0"
};

// Starts recording (clears a previous history). Only one history at a time.
void start_history();
void stop_history();
bool recording();
std::vector<Event> history();  // what was recorded (while recording: so far)

// Labels the block holding `t` (no-op when not recording or `t` is undefined) as held by `module`
// ("" or omitted: the name's prefix before its last '.', "fc1.weight" -> "fc1"; the root module's
// own tensors -> "(model)").
void label(const Tensor& t, Category category, const std::string& name, const std::string& module = "");

struct ModuleBytes {
  std::string module;
  int64_t bytes = 0;
};
struct PeakReport {
  std::string device;
  int64_t baseline_bytes = 0;  // allocated when recording began
  int64_t peak_bytes = 0;      // the replayed high-water mark (equals the allocator's peak)
  int64_t peak_seq = -1;       // the event that reached it (-1: the baseline was the peak)
  int64_t peak_time_ns = 0;
  profiler::Phase peak_phase = profiler::Phase::None;
  int64_t peak_step = -1;
  std::string peak_op;
  int64_t by_category[kCategoryCount] = {};  // at the peak; sums to peak_bytes
  std::vector<ModuleBytes> by_module;        // at the peak, largest first ("" = outside any module)
  bool consistent = true;                    // every Alloc/Free's running sum matched allocated_after
};
// Replays `events` of one device (default: "cpu").
PeakReport analyze(const std::vector<Event>& events, const std::string& device = "cpu");

// Memory in use by category over one step of `device`: a point after every allocation and free
// made in `step` (time since recording began); each point's categories sum to the allocator's
// allocated bytes at that moment, by the same rules as analyze().
struct TimelinePoint {
  int64_t time_ns = 0;
  int64_t bytes[kCategoryCount] = {};
};
std::vector<TimelinePoint> timeline(const std::vector<Event>& events, int64_t step, const std::string& device = "cpu");

// The history and its analysis as JSON text (<run_dir>/profile/memory.json; format in
// docs/ARCHITECTURE.md, "Profiler and memory history").
std::string history_json(const std::vector<Event>& events, const PeakReport& report);

}  // namespace ft::memory
