// Indexing on the GPU: cat, index_select and gather (copies: each output element is read once
// and written once), their gradients index_add and scatter_add, and the index validation
// (check_index_range).
//
// The copies move whole rows in the widest unit (up to 16 bytes) that the row width and the
// addresses allow. The gradients are deterministic, with no float atomics:
//   index_add (embedding and index_select backward): acc[o, v, :] += src[o, j, :] for every j
//     with index[j] == v. The (index, position) pairs are sorted by index with CUB's stable
//     radix sort, so each run of equal indices lists its positions in increasing order; the first
//     entry of a run then adds the run's source rows into its destination row in that order,
//     which is exactly the CPU's order (bitwise equal results). Traffic: the index sorted once,
//     src read once, each touched acc row read and written once.
//   scatter_add (gather backward): the elements of one line along `dim` of the index all share
//     the other coordinates, and so write to one line of acc that no other line touches: a thread
//     per line adds its elements in order.
// check_index_range runs on the device without making the host wait; a bad entry (the lowest
// position, as the CPU reports it) is raised at the host's next synchronisation or index check.
#include <cuda_runtime.h>
#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <cstdint>
#include <deque>
#include <initializer_list>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "backend/cuda/common.cuh"
#include "backend/cuda/index_checks.h"
#include "backend/cuda/kernels.h"
#include "backend/device_backend.h"
#include "fasttrain/cuda_graph.h"

namespace ft::cuda {

namespace {

constexpr int kThreads = 256;
constexpr unsigned long long kNone = ~0ull;  // "no bad entry" in a check's scratch

template <class T>
T* ptr(const Tensor& t) {
  return static_cast<T*>(t.raw_data());
}

int64_t prod(const Shape& s, int begin, int end) {
  int64_t p = 1;
  for (int d = begin; d < end; ++d) p *= s[d];
  return p;
}

// t itself when contiguous, else a contiguous copy (the kernels below index densely).
Tensor dense(const Tensor& t) {
  if (t.is_contiguous()) return t;
  Tensor c = empty(t.shape(), t.options());
  ft::cuda::copy(c, t);
  return c;
}

// The widest power-of-two unit, up to 16 bytes, dividing every byte count and address given.
int unit_for(std::initializer_list<uint64_t> values) {
  uint64_t all = 0;
  for (uint64_t v : values) all |= v;
  for (int u = 16; u > 1; u /= 2)
    if (all % u == 0) return u;
  return 1;
}

uint64_t addr(const void* p) { return reinterpret_cast<uint64_t>(p); }

// Calls f with a value of the unsigned type of `bytes` bytes (uint4 for 16).
template <class F>
void with_unit(int bytes, F&& f) {
  switch (bytes) {
    case 16: f(uint4{}); return;
    case 8: f(uint64_t{}); return;
    case 4: f(uint32_t{}); return;
    case 2: f(uint16_t{}); return;
    default: f(uint8_t{}); return;
  }
}

// --- copies --------------------------------------------------------------------------------------

// src [rows, width] dense into dst rows `pitch` units apart (n = rows * width).
template <class U>
__global__ void copy_rows_kernel(const U* __restrict__ src, int64_t width, U* __restrict__ dst, int64_t pitch,
                                 int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / width;
    dst[row * pitch + (i - row * width)] = src[i];
  }
}

// x [outer, V, width] and out [outer, n, width] dense, in units: out[o, j, :] = x[o, idx[j], :].
template <class U, class I>
__global__ void index_select_kernel(const U* __restrict__ x, const I* __restrict__ idx, int64_t n, int64_t V,
                                    int64_t width, U* __restrict__ out, int64_t total) {
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = e / width, c = e - row * width;
    const int64_t o = row / n, j = row - o * n;
    const int64_t v = static_cast<int64_t>(idx[j]);
    // An index out of range is reported by its check later (nothing waited for it): read nothing.
    out[e] = v >= 0 && v < V ? x[(o * V + v) * width + c] : U{};
  }
}

// The index's shape with another tensor's strides (elements): x for gather, acc for scatter_add.
struct IndexedShape {
  int ndim = 0, dim = 0;
  int64_t bound = 0;  // the other tensor's size along dim: an index outside [0, bound) touches nothing
  int64_t size[kMaxDims] = {};
  int64_t stride[kMaxDims] = {};
};

IndexedShape indexed_shape(const Tensor& index, const Tensor& other, int dim) {
  IndexedShape g;
  g.ndim = index.dim();
  g.dim = dim;
  g.bound = other.size(dim);
  for (int d = 0; d < g.ndim; ++d) {
    g.size[d] = index.size(d);
    g.stride[d] = other.stride(d);
  }
  return g;
}

// out[p] = x[p with coordinate dim replaced by idx[p]]; idx and out dense with the index's shape.
template <class E, class I>
__global__ void gather_kernel(const E* __restrict__ x, const I* __restrict__ idx, IndexedShape g, int64_t n,
                              E* __restrict__ out) {
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < n;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t rem = p, off = 0;
    for (int d = g.ndim - 1; d >= 0; --d) {
      const int64_t q = rem / g.size[d];
      const int64_t c = d == g.dim ? static_cast<int64_t>(idx[p]) : rem - q * g.size[d];
      off += c * g.stride[d];
      rem = q;
    }
    const int64_t v = static_cast<int64_t>(idx[p]);
    out[p] = v >= 0 && v < g.bound ? x[off] : E{};
  }
}

// --- gradients -----------------------------------------------------------------------------------

// A thread per line along g.dim of the index (idx and src dense with the index's shape; g.stride
// are acc's strides): acc[line, idx[line, j]] += src[line, j] for j in order.
template <class Acc, class Src, class I>
__global__ void scatter_add_kernel(Acc* acc, const Src* __restrict__ src, const I* __restrict__ idx, IndexedShape g,
                                   int64_t lines) {
  int64_t inner = 1;  // the index's dense stride along dim
  for (int d = g.dim + 1; d < g.ndim; ++d) inner *= g.size[d];
  const int64_t L = g.size[g.dim], acc_step = g.stride[g.dim];
  for (int64_t line = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; line < lines;
       line += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t rem = line, ib = 0, ab = 0, dense_stride = 1;
    for (int d = g.ndim - 1; d >= 0; --d) {
      if (d != g.dim) {
        const int64_t q = rem / g.size[d], c = rem - q * g.size[d];
        ib += c * dense_stride;
        ab += c * g.stride[d];
        rem = q;
      }
      dense_stride *= g.size[d];
    }
    for (int64_t j = 0; j < L; ++j) {
      const int64_t e = ib + j * inner, v = static_cast<int64_t>(idx[e]);
      if (v >= 0 && v < g.bound) acc[ab + v * acc_step] += convert<Acc>(src[e]);
    }
  }
}

template <class I>
__global__ void sort_input_kernel(const I* __restrict__ idx, int64_t n, uint64_t* keys, int64_t* pos) {
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < n;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    keys[j] = static_cast<uint64_t>(static_cast<int64_t>(idx[j]));  // negative ones sort last, as >= V
    pos[j] = j;
  }
}

// acc [outer, V, inner] += rows of src [outer, n, inner], by the sorted keys and their positions.
// An item is (o, p): `lanes` threads (a power of two dividing the block) take it, and only the
// first entry of a run of equal keys does work, walking the run's positions in increasing order.
template <class Acc, class Src>
__global__ void __launch_bounds__(kThreads)
    index_add_kernel(Acc* acc, const Src* __restrict__ src, const uint64_t* __restrict__ keys,
                     const int64_t* __restrict__ pos, int64_t n, int64_t outer, int64_t V, int64_t inner, int64_t skip,
                     int lanes) {
  const int per_block = kThreads / lanes, lane = threadIdx.x % lanes;
  const int64_t items = outer * n;
  for (int64_t item = static_cast<int64_t>(blockIdx.x) * per_block + threadIdx.x / lanes; item < items;
       item += static_cast<int64_t>(gridDim.x) * per_block) {
    const int64_t o = item / n, p = item - o * n;
    const uint64_t v = keys[p];
    if (p > 0 && keys[p - 1] == v) continue;        // inside a run: its first entry adds it
    if (static_cast<int64_t>(v) == skip) continue;  // padding_idx: the row gets nothing
    if (v >= static_cast<uint64_t>(V)) continue;    // out of range (or negative): reported by its check
    int64_t end = p + 1;
    while (end < n && keys[end] == v) ++end;
    Acc* dst = acc + (o * V + static_cast<int64_t>(v)) * inner;
    const Src* s = src + o * n * inner;
    for (int64_t c = lane; c < inner; c += lanes) {
      Acc a = dst[c];
      int64_t q = p;
      // Four loads in flight, added strictly in position order.
      for (; q + 4 <= end; q += 4) {
        const Acc g0 = convert<Acc>(s[pos[q] * inner + c]), g1 = convert<Acc>(s[pos[q + 1] * inner + c]);
        const Acc g2 = convert<Acc>(s[pos[q + 2] * inner + c]), g3 = convert<Acc>(s[pos[q + 3] * inner + c]);
        a += g0;
        a += g1;
        a += g2;
        a += g3;
      }
      for (; q < end; ++q) a += convert<Acc>(s[pos[q] * inner + c]);
      dst[c] = a;
    }
  }
}

// --- validation ----------------------------------------------------------------------------------
// An index check runs on the device and nothing waits for it (a training step's embedding and
// cross-entropy checks would otherwise stop the host twice a step). scratch (device memory):
// [0] the lowest bad position (kNone if none), [1] the value there. publish_kernel copies the
// verdict into the check's slot of page-locked, mapped host memory, and an event after it tells
// the host when the slot is final. Finished checks are looked at before every new check and after
// every host synchronisation (raise_failed_index_checks), and a failed one raises its op's message
// there.

template <class I>
__global__ void out_of_range_kernel(const I* __restrict__ idx, int64_t n, int64_t size, bool use_ignore, int64_t ignore,
                                    unsigned long long* scratch) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t v = static_cast<int64_t>(idx[i]);
    if (use_ignore && v == ignore) continue;
    if (v < 0 || v >= size) atomicMin(&scratch[0], static_cast<unsigned long long>(i));
  }
}

struct CheckSlot {
  long long position;  // -1: every entry valid (or ignored)
  long long value;
};

template <class I>
__global__ void publish_kernel(const I* __restrict__ idx, const unsigned long long* scratch, CheckSlot* slot) {
  const bool bad = scratch[0] != kNone;
  slot->value = bad ? static_cast<long long>(idx[scratch[0]]) : 0;
  slot->position = bad ? static_cast<long long>(scratch[0]) : -1;
  __threadfence_system();  // the host reads the slot once the event after this kernel is reached
}

// The checks in flight: a fixed pool of host slots and events, taken in order and given back once
// the host has read a finished slot.
class IndexChecks {
 public:
  static IndexChecks& instance() {
    static auto* checks = new IndexChecks();  // leaked: checks may finish after static destruction
    return *checks;
  }

  void launch(const Tensor& index, int64_t size, std::optional<int64_t> ignore, const backend::IndexErrorText& error) {
    std::unique_lock<std::mutex> lock(mu_);
    collect_and_raise(lock);
    if (free_.empty()) {
      // Every slot in flight: wait for the oldest (a host synchronisation, counted as one).
      note_host_sync("index checks: all " + std::to_string(kSlots) + " in flight");
      check(cudaEventSynchronize(pending_.front().done), "index check");
      collect_and_raise(lock);
    }
    const int slot = free_.back();
    free_.pop_back();
    cudaStream_t stream = stream_for(index);
    const int64_t n = index.numel();
    Tensor scratch = empty({2}, TensorOptions(DType::I64, index.device()));
    auto* sp = ptr<unsigned long long>(scratch);
    check(cudaMemsetAsync(sp, 0xFF, sizeof(unsigned long long), stream), "index check");
    FT_CUDA_DISPATCH_INDEX(index.dtype(), "index check", [&] {
      out_of_range_kernel<scalar_t><<<grid_for(n), kThreads, 0, stream>>>(ptr<const scalar_t>(index), n, size,
                                                                          ignore.has_value(), ignore.value_or(0), sp);
      check_launch("index check");
      publish_kernel<scalar_t><<<1, 1, 0, stream>>>(ptr<const scalar_t>(index), sp, device_slots_ + slot);
      check_launch("index check");
    });
    if (CudaGraph* graph = capturing_graph()) {
      // The slot is the graph's from now on: every replay publishes into it, and the event
      // recorded after each replay says when the host may look (an event recorded inside the
      // capture could not be waited on).
      graph->after_replay([this, slot, error, device = index.device()] {
        std::unique_lock<std::mutex> replay_lock(mu_);
        collect_and_raise(replay_lock);
        track_locked(slot, error, device, current_stream(device), /*owned_by_graph=*/true);
      });
      return;
    }
    track_locked(slot, error, index.device(), Stream{index.device(), stream}, /*owned_by_graph=*/false);
  }

  // Raises the first failed check among those finished (in launch order), if any.
  void raise_finished() {
    std::unique_lock<std::mutex> lock(mu_);
    collect_and_raise(lock);
  }

 private:
  static constexpr int kSlots = 1024;
  struct Pending {
    int slot;
    cudaEvent_t done;
    backend::IndexErrorText error;
    Device device;
    bool owned_by_graph;  // a captured check's slot: never given back
  };

  void track_locked(int slot, const backend::IndexErrorText& error, Device device, Stream stream, bool owned_by_graph) {
    cudaEvent_t done = events_[slot];
    check(cudaEventRecord(done, static_cast<cudaStream_t>(stream.handle)), "index check");
    pending_.push_back({slot, done, error, device, owned_by_graph});
  }

  IndexChecks() {
    void* host = nullptr;
    check(cudaHostAlloc(&host, kSlots * sizeof(CheckSlot), cudaHostAllocMapped | cudaHostAllocPortable),
          "index checks: page-locked slots");
    slots_ = static_cast<CheckSlot*>(host);
    void* device = nullptr;
    check(cudaHostGetDevicePointer(&device, host, 0), "index checks: slot address");
    device_slots_ = static_cast<CheckSlot*>(device);
    events_.resize(kSlots);
    for (int i = 0; i < kSlots; ++i) {
      check(cudaEventCreateWithFlags(&events_[i], cudaEventDisableTiming), "index checks: events");
      free_.push_back(kSlots - 1 - i);
    }
  }

  void collect_and_raise(std::unique_lock<std::mutex>& lock) {
    std::optional<std::string> failure;
    for (auto it = pending_.begin(); it != pending_.end();) {
      const cudaError_t st = cudaEventQuery(it->done);
      if (st == cudaErrorNotReady) {
        cudaGetLastError();
        ++it;
        continue;
      }
      check(st, "index check");
      const volatile CheckSlot& s = slots_[it->slot];
      if (s.position >= 0 && !failure)
        failure = it->error(s.value, s.position) + " (checked on " + it->device.str() +
                  " and reported at the first host synchronisation after it)";
      if (!it->owned_by_graph) free_.push_back(it->slot);
      it = pending_.erase(it);
    }
    if (!failure) return;
    lock.unlock();
    throw Error(*failure);
  }

  std::mutex mu_;
  CheckSlot* slots_ = nullptr;         // the host's view of the slots
  CheckSlot* device_slots_ = nullptr;  // the same memory as kernels address it
  std::vector<cudaEvent_t> events_;
  std::vector<int> free_;
  std::deque<Pending> pending_;
};

}  // namespace

void cat(const std::vector<Tensor>& inputs, int dim, const Tensor& out) {
  if (out.numel() == 0) return;
  const Shape& s = out.shape();
  const int64_t outer = prod(s, 0, dim), inner = prod(s, dim + 1, s.size());
  const uint64_t es = out.element_size();
  const uint64_t out_row = static_cast<uint64_t>(s[dim] * inner) * es;  // bytes per outer row of out
  cudaStream_t stream = stream_for(out);
  char* base = ptr<char>(out);
  int64_t off = 0;
  for (const Tensor& t : inputs) {
    const int64_t n = t.size(dim);
    if (n == 0) continue;
    if (t.is_contiguous() && t.dtype() == out.dtype()) {
      // t is [outer, n * inner] dense; its rows land out_row bytes apart at column `off`.
      const uint64_t width = static_cast<uint64_t>(n * inner) * es;
      char* dst = base + static_cast<uint64_t>(off * inner) * es;
      const char* src = ptr<const char>(t);
      with_unit(unit_for({width, out_row, addr(dst), addr(src)}), [&](auto unit) {
        using U = decltype(unit);
        const int64_t w = static_cast<int64_t>(width / sizeof(U));
        copy_rows_kernel<U><<<grid_for(outer * w), kThreads, 0, stream>>>(
            reinterpret_cast<const U*>(src), w, reinterpret_cast<U*>(dst), static_cast<int64_t>(out_row / sizeof(U)),
            outer * w);
        check_launch("cat");
      });
    } else {
      // Strided pieces (or another dtype): the elementwise copy into out's slice handles them.
      ft::cuda::copy(out.detach().narrow(dim, off, n), t);
    }
    off += n;
  }
}

void check_index_range(const Tensor& index, int64_t size, std::optional<int64_t> ignore,
                       const backend::IndexErrorText& error) {
  if (index.numel() == 0) return;
  IndexChecks::instance().launch(dense(index), size, ignore, error);
}

void raise_failed_index_checks() { IndexChecks::instance().raise_finished(); }

void index_select(const Tensor& x_in, int dim, const Tensor& index_in, const Tensor& out) {
  if (out.numel() == 0) return;
  const Tensor x = dense(x_in);
  const Tensor index = dense(index_in);
  const Shape& s = x.shape();
  const int64_t outer = prod(s, 0, dim), V = s[dim], inner = prod(s, dim + 1, s.size());
  const int64_t n = index.numel();
  const uint64_t row_bytes = static_cast<uint64_t>(inner) * x.element_size();
  cudaStream_t stream = stream_for(out);
  FT_CUDA_DISPATCH_INDEX(index.dtype(), "index_select", [&] {
    using I = scalar_t;
    with_unit(unit_for({row_bytes, addr(x.raw_data()), addr(out.raw_data())}), [&](auto unit) {
      using U = decltype(unit);
      const int64_t width = static_cast<int64_t>(row_bytes / sizeof(U)), total = outer * n * width;
      index_select_kernel<U, I><<<grid_for(total), kThreads, 0, stream>>>(ptr<const U>(x), ptr<const I>(index), n, V,
                                                                          width, ptr<U>(out), total);
      check_launch("index_select");
    });
  });
}

void gather(const Tensor& x, int dim, const Tensor& index_in, const Tensor& out) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const Tensor index = dense(index_in);
  const IndexedShape g = indexed_shape(index, x, dim);
  cudaStream_t stream = stream_for(out);
  FT_CUDA_DISPATCH_INDEX(index.dtype(), "gather", [&] {
    using I = scalar_t;
    // Elements move as raw bits of their size: one kernel per width, not per dtype.
    with_unit(static_cast<int>(x.element_size()), [&](auto unit) {
      using E = decltype(unit);
      gather_kernel<E, I>
          <<<grid_for(n), kThreads, 0, stream>>>(ptr<const E>(x), ptr<const I>(index), g, n, ptr<E>(out));
      check_launch("gather");
    });
  });
}

void index_add(const Tensor& acc, int dim, const Tensor& index_in, const Tensor& src_in, std::optional<int64_t> skip) {
  if (src_in.numel() == 0) return;
  FT_CHECK(acc.dtype() == DType::F32 || acc.dtype() == DType::F64,
           "index_add: internal error, accumulator must be f32 or f64");
  FT_CHECK(acc.is_contiguous(), "index_add: internal error, accumulator must be contiguous");
  const Tensor src = dense(src_in);
  const Tensor index = dense(index_in);
  const Shape& s = acc.shape();
  const int64_t outer = prod(s, 0, dim), V = s[dim], inner = prod(s, dim + 1, s.size());
  const int64_t n = index.numel();
  cudaStream_t stream = stream_for(acc);
  const TensorOptions i64(DType::I64, acc.device());

  // Sort (index, position) pairs by index; only the bits an index below V can have take part.
  Tensor buf = empty({4 * n}, i64);
  auto* keys_in = ptr<uint64_t>(buf);
  uint64_t* keys = keys_in + n;
  auto* pos_in = reinterpret_cast<int64_t*>(keys_in + 2 * n);
  int64_t* pos = pos_in + n;
  FT_CUDA_DISPATCH_INDEX(index.dtype(), "index_add", [&] {
    sort_input_kernel<scalar_t><<<grid_for(n), kThreads, 0, stream>>>(ptr<const scalar_t>(index), n, keys_in, pos_in);
    check_launch("index_add");
  });
  int end_bit = 1;
  while (end_bit < 64 && (static_cast<uint64_t>(V - 1) >> end_bit) != 0) ++end_bit;
  size_t temp_bytes = 0;
  check(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys_in, keys, pos_in, pos, n, 0, end_bit, stream),
        "index_add");
  Tensor temp = empty({static_cast<int64_t>(std::max<size_t>(temp_bytes, 1))}, TensorOptions(DType::U8, acc.device()));
  check(cub::DeviceRadixSort::SortPairs(temp.raw_data(), temp_bytes, keys_in, keys, pos_in, pos, n, 0, end_bit, stream),
        "index_add");

  // Threads per item: enough for the row's columns, at most half a block.
  int lanes = 1;
  while (lanes < 128 && lanes < inner) lanes *= 2;
  const int64_t skip_v = skip ? *skip : -1;
  auto run = [&](auto* acc_ptr) {
    using Acc = std::remove_pointer_t<decltype(acc_ptr)>;
    FT_CUDA_DISPATCH_FLOATING(src.dtype(), "index_add", [&] {
      index_add_kernel<Acc, scalar_t><<<grid_for(outer * n * lanes), kThreads, 0, stream>>>(
          acc_ptr, ptr<const scalar_t>(src), keys, pos, n, outer, V, inner, skip_v, lanes);
      check_launch("index_add");
    });
  };
  if (acc.dtype() == DType::F32)
    run(ptr<float>(acc));
  else
    run(ptr<double>(acc));
}

void scatter_add(const Tensor& acc, int dim, const Tensor& index_in, const Tensor& src_in) {
  if (src_in.numel() == 0) return;
  FT_CHECK(acc.dtype() == DType::F32 || acc.dtype() == DType::F64,
           "scatter_add: internal error, accumulator must be f32 or f64");
  // src has the index's shape (the gradient of gather's output); both dense, they share offsets.
  const Tensor src = dense(src_in);
  const Tensor index = dense(index_in);
  const IndexedShape g = indexed_shape(index, acc, dim);
  const int64_t lines = index.numel() / index.size(dim);
  cudaStream_t stream = stream_for(acc);
  auto run = [&](auto* acc_ptr) {
    using Acc = std::remove_pointer_t<decltype(acc_ptr)>;
    FT_CUDA_DISPATCH_FLOATING(src.dtype(), "scatter_add", [&] {
      using Src = scalar_t;
      FT_CUDA_DISPATCH_INDEX(index.dtype(), "scatter_add", [&] {
        scatter_add_kernel<Acc, Src, scalar_t><<<grid_for(lines), kThreads, 0, stream>>>(
            acc_ptr, ptr<const Src>(src), ptr<const scalar_t>(index), g, lines);
        check_launch("scatter_add");
      });
    });
  };
  if (acc.dtype() == DType::F32)
    run(ptr<float>(acc));
  else
    run(ptr<double>(acc));
}

}  // namespace ft::cuda
