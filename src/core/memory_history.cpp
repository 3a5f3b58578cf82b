// The allocators' history and its analysis (fasttrain/memory_history.h).
//
// Recording: the allocators call record_allocation / record_free under their own lock (so the
// events of one allocator are in the order its statistics saw them) and this file takes its own
// lock after it, always in that order. An op allocates its output before it calls its kernel, so
// an allocation made outside any kernel is named by the next kernel that thread dispatches.
//
// Replay (analyze): running = baseline + sum(Alloc bytes) - sum(Free bytes), where baseline is the
// allocated bytes before the first event (allocated_after - bytes of the first Alloc, + bytes of a
// first Free). Its maximum is the allocator's peak since recording began (when the peak was reset
// at the start). The live blocks at that maximum, each with its category (header comment) and
// module, are the peak's attribution; blocks alive before recording began are known only through
// labels, and the rest of the baseline is "other", so the categories sum to the peak.
#include "fasttrain/memory_history.h"

#include <algorithm>
#include <chrono>
#include <iterator>
#include <mutex>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "core/allocator_bookkeeping.h"
#include "core/profiler_context.h"
#include "core/size_class.h"
#include "fasttrain/error.h"

namespace ft::memory {

namespace {

struct Recorder {
  std::mutex mu;
  bool recording = false;
  uint64_t generation = 0;
  int64_t t0_ns = 0;
  std::vector<Event> events;
};
Recorder& recorder() {
  static Recorder* r = new Recorder();  // leaked: blocks are freed during exit
  return *r;
}

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string op_name(const char* kernel, const char* sub_op) {
  if (kernel == nullptr) return {};
  std::string name = sub_op != nullptr ? sub_op : kernel;
  if (sub_op != nullptr && std::string_view(kernel).ends_with("_backward")) name += "_backward";
  return name;
}

// Appends an event with the calling thread's context; the caller holds r.mu.
Event& append_locked(Recorder& r, Event::Kind kind, const std::string& device, uint64_t ptr, int64_t bytes) {
  const profiler::detail::AllocationContext ctx = profiler::detail::allocation_context();
  Event e;
  e.kind = kind;
  e.seq = static_cast<int64_t>(r.events.size());
  e.time_ns = steady_ns() - r.t0_ns;
  e.device = device;
  e.ptr = ptr;
  e.bytes = bytes;
  e.phase = ctx.phase;
  e.step = ctx.step;
  e.op = op_name(ctx.kernel, ctx.sub_op);
  if (ctx.node != nullptr) e.node = *ctx.node;
  if (ctx.module != nullptr) e.module = *ctx.module;
  r.events.push_back(std::move(e));
  return r.events.back();
}

void record(Event::Kind kind, const char* device, void* p, int64_t bytes, int64_t allocated_after) {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mu);
  if (!r.recording) return;
  Event& e = append_locked(r, kind, device, reinterpret_cast<uint64_t>(p), bytes);
  e.allocated_after = allocated_after;
  if (kind == Event::Kind::Alloc && e.op.empty()) {
    profiler::detail::ThreadContext& c = profiler::detail::thread_context();
    if (c.pending_generation != r.generation) {
      c.pending_allocations.clear();
      c.pending_generation = r.generation;
    }
    c.pending_allocations.push_back(e.seq);
  }
}

}  // namespace

namespace detail {
void record_allocation(const char* device, void* p, int64_t bytes, int64_t allocated_after) {
  record(Event::Kind::Alloc, device, p, bytes, allocated_after);
}
void record_free(const char* device, void* p, int64_t bytes, int64_t allocated_after) {
  record(Event::Kind::Free, device, p, bytes, allocated_after);
}
}  // namespace detail

}  // namespace ft::memory

namespace ft::profiler::detail {
// Names this thread's allocations still waiting for a kernel (KernelScope's constructor).
void memory_name_pending(const char* kernel, const char* sub_op) {
  ThreadContext& c = thread_context();
  memory::Recorder& r = memory::recorder();
  std::lock_guard<std::mutex> lock(r.mu);
  if (r.recording && c.pending_generation == r.generation) {
    const std::string name = memory::op_name(kernel, sub_op);
    for (int64_t seq : c.pending_allocations)
      if (seq < static_cast<int64_t>(r.events.size())) r.events[seq].op = name;
  }
  c.pending_allocations.clear();
}
}  // namespace ft::profiler::detail

namespace ft::memory {

const char* category_name(Category c) {
  static constexpr const char* kNames[kCategoryCount] = {
      "parameters", "gradients", "optimizer_state", "activations", "temporaries", "data_batches", "other"};
  return kNames[static_cast<int>(c)];
}

void start_history() {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mu);
  FT_CHECK(!r.recording, "memory history: expected no history to be recording, found one recording");
  r.events.clear();
  r.recording = true;
  ++r.generation;
  r.t0_ns = steady_ns();
  profiler::detail::g_flags.fetch_or(profiler::detail::kMemoryHistory, std::memory_order_release);
}

void stop_history() {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mu);
  profiler::detail::g_flags.fetch_and(~profiler::detail::kMemoryHistory, std::memory_order_release);
  r.recording = false;
}

bool recording() {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.recording;
}

std::vector<Event> history() {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.events;
}

void label(const Tensor& t, Category category, const std::string& name, const std::string& module) {
  if (!t.defined() || !detail::history_on()) return;
  const std::shared_ptr<Storage>& st = t.storage();
  if (!st || st->ptr() == nullptr) return;
  const std::string device = st->pinned ? std::string("pinned") : st->device.is_cpu() ? "cpu" : "cuda";
  const auto bytes = static_cast<int64_t>(allocation_size_class(std::max<size_t>(st->nbytes, 1)));
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mu);
  if (!r.recording) return;
  Event& e = append_locked(r, Event::Kind::Label, device, reinterpret_cast<uint64_t>(st->ptr()), bytes);
  e.category = category;
  e.name = name;
  const size_t dot = name.rfind('.');
  e.module = !module.empty() ? module : dot == std::string::npos ? "(model)" : name.substr(0, dot);
}

// --- analysis ---

namespace {

struct Block {
  int64_t bytes = 0;
  int64_t alloc_seq = -1;  // -1: alive before recording began (known through a label)
  Category category = Category::Temporaries;
  bool labeled = false;
  profiler::Phase phase = profiler::Phase::None;
  std::string module;
  bool freed_in_forward = false;
};

// Every block's lifetime and category (pass 1 of the analysis): blocks[i] is one allocation (or
// a labeled block from before recording); block_of_event maps an Alloc/Free to its block, or -1
// for the free of an unlabeled block from before recording.
struct Blocks {
  std::vector<Block> blocks;
  std::vector<int64_t> block_of_event;
  int64_t baseline_bytes = 0;  // allocated when recording began
};

Blocks classify(const std::vector<Event>& events, const std::string& device) {
  Blocks out;
  out.block_of_event.assign(events.size(), -1);
  std::unordered_map<uint64_t, size_t> live;
  bool have_baseline = false;
  for (size_t i = 0; i < events.size(); ++i) {
    const Event& e = events[i];
    if (e.device != device) continue;
    if (e.kind == Event::Kind::Alloc) {
      if (!have_baseline) {
        out.baseline_bytes = e.allocated_after - e.bytes;
        have_baseline = true;
      }
      Block b;
      b.bytes = e.bytes;
      b.alloc_seq = e.seq;
      b.phase = e.phase;
      b.module = e.module;
      live[e.ptr] = out.blocks.size();
      out.block_of_event[i] = static_cast<int64_t>(out.blocks.size());
      out.blocks.push_back(std::move(b));
    } else if (e.kind == Event::Kind::Free) {
      if (!have_baseline) {
        out.baseline_bytes = e.allocated_after + e.bytes;
        have_baseline = true;
      }
      auto it = live.find(e.ptr);
      if (it == live.end()) continue;  // alive before recording and never labeled: "other"
      Block& b = out.blocks[it->second];
      out.block_of_event[i] = static_cast<int64_t>(it->second);
      b.freed_in_forward = e.phase == profiler::Phase::Forward;
      live.erase(it);
    } else {  // Label
      auto it = live.find(e.ptr);
      if (it == live.end()) {
        Block b;  // alive since before recording began
        b.bytes = e.bytes;
        b.alloc_seq = -1;
        b.labeled = true;
        b.category = e.category;
        b.module = e.module;
        live[e.ptr] = out.blocks.size();
        out.blocks.push_back(std::move(b));
      } else {
        Block& b = out.blocks[it->second];
        b.labeled = true;
        b.category = e.category;
        if (!e.module.empty() || b.module.empty()) b.module = e.module;
      }
    }
  }
  // Unlabeled blocks made while recording: by the phase that made them (header comment).
  for (Block& b : out.blocks) {
    if (b.labeled || b.alloc_seq < 0) continue;
    if (b.phase == profiler::Phase::Data)
      b.category = Category::DataBatches;
    else if (b.phase == profiler::Phase::Forward && !b.freed_in_forward)
      b.category = Category::Activations;
    else
      b.category = Category::Temporaries;
  }
  return out;
}

}  // namespace

PeakReport analyze(const std::vector<Event>& events, const std::string& device) {
  PeakReport rep;
  rep.device = device;
  Blocks classified = classify(events, device);
  std::vector<Block>& blocks = classified.blocks;
  const std::vector<int64_t>& block_of_event = classified.block_of_event;
  rep.baseline_bytes = classified.baseline_bytes;

  // Pass 2: replay to the peak.
  int64_t running = rep.baseline_bytes;
  rep.peak_bytes = running;
  rep.peak_seq = -1;
  size_t peak_index = 0;
  bool peak_after_events = false;
  for (size_t i = 0; i < events.size(); ++i) {
    const Event& e = events[i];
    if (e.device != device || e.kind == Event::Kind::Label) continue;
    running += e.kind == Event::Kind::Alloc ? e.bytes : -e.bytes;
    if (running != e.allocated_after) rep.consistent = false;
    if (running > rep.peak_bytes) {
      rep.peak_bytes = running;
      rep.peak_seq = e.seq;
      rep.peak_time_ns = e.time_ns;
      rep.peak_phase = e.phase;
      rep.peak_step = e.step;
      rep.peak_op = e.op;
      peak_index = i;
      peak_after_events = true;
    }
  }

  // Pass 3: the live set at the peak. Labeled blocks from before recording count from the start
  // until freed; the rest of the baseline is "other".
  std::vector<char> alive(blocks.size(), 0);
  for (size_t bi = 0; bi < blocks.size(); ++bi)
    if (blocks[bi].alloc_seq < 0) alive[bi] = 1;
  int64_t unknown_freed = 0;  // baseline blocks without a label freed before the peak
  const size_t stop = peak_after_events ? peak_index + 1 : 0;
  for (size_t i = 0; i < stop; ++i) {
    const Event& e = events[i];
    if (e.device != device || e.kind == Event::Kind::Label) continue;
    if (block_of_event[i] < 0) {
      if (e.kind == Event::Kind::Free) unknown_freed += e.bytes;
      continue;
    }
    alive[block_of_event[i]] = e.kind == Event::Kind::Alloc ? 1 : 0;
  }
  // baseline = labeled pre-recording blocks + unlabeled ones; of the unlabeled, those freed
  // before the peak (unknown_freed) are gone and the rest is "other".
  std::unordered_map<std::string, int64_t> modules;
  int64_t labeled_baseline = 0;
  for (size_t bi = 0; bi < blocks.size(); ++bi) {
    const Block& b = blocks[bi];
    if (b.alloc_seq < 0) labeled_baseline += b.bytes;
    if (!alive[bi]) continue;
    rep.by_category[static_cast<int>(b.category)] += b.bytes;
    modules[b.module] += b.bytes;
  }
  const int64_t other = rep.baseline_bytes - labeled_baseline - unknown_freed;
  rep.by_category[static_cast<int>(Category::Other)] += other;
  if (other != 0) modules["(before recording)"] += other;
  for (auto& [m, bytes] : modules) rep.by_module.push_back({m, bytes});
  std::sort(rep.by_module.begin(), rep.by_module.end(),
            [](const ModuleBytes& a, const ModuleBytes& b) { return a.bytes > b.bytes; });
  return rep;
}

std::vector<TimelinePoint> timeline(const std::vector<Event>& events, int64_t step, const std::string& device) {
  const Blocks classified = classify(events, device);
  // The live bytes per category when recording began: labeled blocks from before it in their
  // category, the rest of the baseline "other".
  int64_t bytes[kCategoryCount] = {};
  int64_t labeled_baseline = 0;
  for (const Block& b : classified.blocks)
    if (b.alloc_seq < 0) {
      bytes[static_cast<int>(b.category)] += b.bytes;
      labeled_baseline += b.bytes;
    }
  bytes[static_cast<int>(Category::Other)] += classified.baseline_bytes - labeled_baseline;
  std::vector<TimelinePoint> points;
  for (size_t i = 0; i < events.size(); ++i) {
    const Event& e = events[i];
    if (e.device != device || e.kind == Event::Kind::Label) continue;
    const int64_t block = classified.block_of_event[i];
    const int c = block < 0 ? static_cast<int>(Category::Other) : static_cast<int>(classified.blocks[block].category);
    bytes[c] += e.kind == Event::Kind::Alloc ? e.bytes : -e.bytes;
    if (e.step != step) continue;
    TimelinePoint p;
    p.time_ns = e.time_ns;
    std::copy(std::begin(bytes), std::end(bytes), std::begin(p.bytes));
    points.push_back(p);
  }
  return points;
}

std::string history_json(const std::vector<Event>& events, const PeakReport& report) {
  using nlohmann::json;
  static constexpr const char* kKinds[] = {"alloc", "free", "label"};
  json ev = json::array();
  for (const Event& e : events) {
    json j = {{"seq", e.seq},
              {"kind", kKinds[static_cast<int>(e.kind)]},
              {"t_us", static_cast<double>(e.time_ns) * 1e-3},
              {"device", e.device},
              {"ptr", e.ptr},
              {"bytes", e.bytes},
              {"phase", profiler::phase_name(e.phase)},
              {"step", e.step},
              {"op", e.op},
              {"node", e.node},
              {"module", e.module}};
    if (e.kind != Event::Kind::Label) j["allocated_after"] = e.allocated_after;
    if (e.kind == Event::Kind::Label) {
      j["category"] = category_name(e.category);
      j["name"] = e.name;
    }
    ev.push_back(std::move(j));
  }
  json categories = json::object();
  for (int c = 0; c < kCategoryCount; ++c) categories[category_name(static_cast<Category>(c))] = report.by_category[c];
  json modules = json::array();
  for (const ModuleBytes& m : report.by_module) modules.push_back({{"module", m.module}, {"bytes", m.bytes}});
  json peak = {{"device", report.device},
               {"baseline_bytes", report.baseline_bytes},
               {"peak_bytes", report.peak_bytes},
               {"peak_seq", report.peak_seq},
               {"peak_t_us", static_cast<double>(report.peak_time_ns) * 1e-3},
               {"peak_phase", profiler::phase_name(report.peak_phase)},
               {"peak_step", report.peak_step},
               {"peak_op", report.peak_op},
               {"by_category", categories},
               {"by_module", modules},
               {"consistent", report.consistent}};
  // Memory by category over the step that reached the peak, for the report's picture.
  json times = json::array(), layers = json::object();
  const std::vector<TimelinePoint> points = timeline(events, report.peak_step, report.device);
  for (int c = 0; c < kCategoryCount; ++c) layers[category_name(static_cast<Category>(c))] = json::array();
  for (const TimelinePoint& p : points) {
    times.push_back(static_cast<double>(p.time_ns) * 1e-3);
    for (int c = 0; c < kCategoryCount; ++c) layers[category_name(static_cast<Category>(c))].push_back(p.bytes[c]);
  }
  json step_timeline = {{"step", report.peak_step}, {"t_us", times}, {"bytes_by_category", layers}};
  json doc = {{"format", "fasttrain.memory_history.v1"}, {"peak", peak}, {"timeline", step_timeline}, {"events", ev}};
  return doc.dump() + "\n";
}

}  // namespace ft::memory
