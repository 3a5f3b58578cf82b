// The NCCL communicator (dist/nccl.h). What is where:
// - Shared: the world's CUDA stream (every collective of the process, any group, in issue order),
//   its device, the timeout, and the watchdog thread, shared by the world and its groups.
// - NcclCommunicator: one ncclComm_t and the host (MPI) communicator of the same ranks; a device
//   collective waits for an event of the caller's stream, runs on the shared stream and records
//   its own event, which wait() makes the caller's stream wait for. Tensors handed to a collective
//   are recorded on the shared stream with the allocator, so their blocks are not reused before it
//   ends, and held by the work besides.
// - The watchdog polls the collectives in flight every 50 ms: one NCCL reports failed
//   (ncclCommGetAsyncError) or one older than the timeout aborts its communicator and then the
//   whole job, naming the collective and the group.
#include <cuda_runtime.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <list>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backend/nccl/nccl_library.h"
#include "dist/nccl.h"
#include "fasttrain/allocator.h"
#include "fasttrain/error.h"

namespace ft::dist {

namespace {

using Clock = std::chrono::steady_clock;
using cuda::nccl;

void check_nccl(ncclResult_t r, const char* call) {
  if (r == ncclSuccess) return;
  FT_FAIL(call, " failed: ", nccl().ncclGetErrorString(r));
}

void check_cuda(cudaError_t e, const char* call) {
  if (e == cudaSuccess) return;
  FT_FAIL(call, " failed: ", cudaGetErrorString(e));
}

// NCCL's type for a reduction over `dtype`: the four MPI reduces (dist.h's contract is the same on
// both backends).
ncclDataType_t reduce_type(DType dtype, const char* who) {
  switch (dtype) {
    case DType::F32: return ncclFloat32;
    case DType::F64: return ncclFloat64;
    case DType::I32: return ncclInt32;
    case DType::I64: return ncclInt64;
    default:
      FT_FAIL(who, ": expected an f32, f64, i32 or i64 tensor to reduce, found ", dtype_name(dtype),
              " (reduce low-precision values in f32)");
  }
}

ncclRedOp_t reduce_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Avg: return ncclAvg;
    case ReduceOp::Max: return ncclMax;
  }
  return ncclSum;
}

const char* op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Max: return "max";
  }
  return "?";
}

// What one collective in flight needs to be watched and waited for.
struct Pending {
  std::string what;  // "all_reduce f32 x 1024 (sum) on group data"
  ncclComm_t comm = nullptr;
  Clock::time_point issued;
  cudaEvent_t done = nullptr;  // recorded after the collective on the shared stream
  std::atomic<bool> finished{false};
  ~Pending() {
    if (done != nullptr) cudaEventDestroy(done);
  }
};

class Shared {
 public:
  explicit Shared(Device device) : device_(device) {
    check_cuda(cudaSetDevice(device.index), "cudaSetDevice");
    cudaStream_t s = nullptr;
    check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    stream_ = s;
    watchdog_ = std::thread([this] { watch(); });
  }
  ~Shared() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    watchdog_.join();
    // The stream is left to the process's end: a collective may still be queued on it.
  }
  Device device() const { return device_; }
  cudaStream_t stream() const { return stream_; }
  void set_timeout(double seconds) { timeout_.store(seconds); }
  void watch_work(const std::shared_ptr<Pending>& p) {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.push_back(p);
  }

 private:
  void watch() {
    cudaSetDevice(device_.index);
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      cv_.wait_for(lock, std::chrono::milliseconds(50));
      for (auto it = pending_.begin(); it != pending_.end();) {
        const std::shared_ptr<Pending>& p = *it;
        if (p->finished.load() || cudaEventQuery(p->done) == cudaSuccess) {
          p->finished.store(true);
          it = pending_.erase(it);
          continue;
        }
        cudaGetLastError();  // cudaErrorNotReady is not an error to keep
        ncclResult_t async = ncclSuccess;
        nccl().ncclCommGetAsyncError(p->comm, &async);
        const double timeout = timeout_.load();
        const double age = std::chrono::duration<double>(Clock::now() - p->issued).count();
        if (async != ncclSuccess && async != ncclInProgress) {
          nccl().ncclCommAbort(p->comm);
          abort_job(detail::concat("NCCL: ", p->what, " failed: ", nccl().ncclGetErrorString(async)), 1);
        }
        if (timeout > 0 && age > timeout) {
          nccl().ncclCommAbort(p->comm);
          abort_job(detail::concat(p->what, " did not complete within ", timeout,
                                   " s (a rank died, hangs or issued different collectives); aborting the job"),
                    1);
        }
        ++it;
      }
    }
  }

  Device device_;
  cudaStream_t stream_ = nullptr;
  std::atomic<double> timeout_{300};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::list<std::shared_ptr<Pending>> pending_;
  std::thread watchdog_;
};

class NcclWork : public Work {
 public:
  NcclWork(std::shared_ptr<Pending> pending, Device device, std::vector<Tensor> held)
      : pending_(std::move(pending)), device_(device), held_(std::move(held)) {}
  void wait() override {
    // The caller's stream waits on the device; the host goes on. A failure surfaces through the
    // watchdog, which ends the job. (The legacy stream, handle 0, is the current device's: set it.)
    check_cuda(cudaSetDevice(device_.index), "cudaSetDevice");
    check_cuda(cudaStreamWaitEvent(static_cast<cudaStream_t>(current_stream(device_).handle), pending_->done, 0),
               "cudaStreamWaitEvent");
  }
  bool done() const override {
    if (pending_->finished.load()) return true;
    const bool reached = cudaEventQuery(pending_->done) == cudaSuccess;
    if (!reached) cudaGetLastError();
    return reached;
  }

 private:
  std::shared_ptr<Pending> pending_;
  Device device_;
  std::vector<Tensor> held_;  // alive until the work is dropped (their blocks are also recorded)
};

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(std::shared_ptr<Shared> shared, std::shared_ptr<Communicator> host, ncclComm_t comm)
      : shared_(std::move(shared)), host_(std::move(host)), comm_(comm) {}
  ~NcclCommunicator() override {
    // Collectives still queued must finish before the communicator goes.
    cudaStreamSynchronize(shared_->stream());
    nccl().ncclCommDestroy(comm_);
  }

  int rank() const override { return host_->rank(); }
  int world_size() const override { return host_->world_size(); }
  int local_rank() const override { return host_->local_rank(); }
  int local_size() const override { return host_->local_size(); }
  std::string backend() const override { return "nccl"; }
  std::string name() const override { return host_->name(); }
  int world_rank(int r) const override { return host_->world_rank(r); }
  Device buffer_device(Device device) const override { return device.is_cuda() ? device : Device::cpu(); }

  std::shared_ptr<Communicator> split(int color, int key, const std::string& name) override {
    FT_CHECK(color >= 0, "split: expected a colour >= 0, found ", color);
    std::shared_ptr<Communicator> host = host_->split(color, key, name);
    check_cuda(cudaSetDevice(shared_->device().index), "cudaSetDevice");
    ncclComm_t sub = nullptr;
    check_nccl(nccl().ncclCommSplit(comm_, color, key, &sub, nullptr), "ncclCommSplit");
    return std::make_shared<NcclCommunicator>(shared_, std::move(host), sub);
  }

  WorkPtr broadcast_async(const Tensor& t, int root) override {
    if (on_host(t, "broadcast")) return host_->broadcast_async(t, root);
    FT_CHECK(root >= 0 && root < world_size(), "broadcast: expected a root in [0, ", world_size(), "), found ", root);
    return issue(detail::concat("broadcast ", describe(t), " from ", root), {t}, t.nbytes(), [&](cudaStream_t s) {
      return nccl().ncclBroadcast(t.raw_data(), t.raw_data(), t.nbytes(), ncclUint8, root, comm_, s);
    });
  }
  WorkPtr all_reduce_async(const Tensor& t, ReduceOp op) override {
    if (on_host(t, "all_reduce")) return host_->all_reduce_async(t, op);
    const ncclDataType_t type = reduce_type(t.dtype(), "all_reduce");
    return issue(detail::concat("all_reduce ", describe(t), " (", op_name(op), ")"), {t}, t.nbytes(),
                 [&](cudaStream_t s) {
                   return nccl().ncclAllReduce(t.raw_data(), t.raw_data(), t.numel(), type, reduce_op(op), comm_, s);
                 });
  }
  WorkPtr reduce_scatter_async(const Tensor& input, const Tensor& output, ReduceOp op) override {
    if (on_host(input, output, "reduce_scatter")) return host_->reduce_scatter_async(input, output, op);
    const ncclDataType_t type = reduce_type(input.dtype(), "reduce_scatter");
    check_parts(input, output, "reduce_scatter");
    return issue(detail::concat("reduce_scatter ", describe(input), " (", op_name(op), ")"), {input, output},
                 input.nbytes(), [&](cudaStream_t s) {
                   return nccl().ncclReduceScatter(input.raw_data(), output.raw_data(), output.numel(), type,
                                                   reduce_op(op), comm_, s);
                 });
  }
  WorkPtr all_gather_async(const Tensor& input, const Tensor& output) override {
    if (on_host(input, output, "all_gather")) return host_->all_gather_async(input, output);
    check_parts(output, input, "all_gather");
    return issue(detail::concat("all_gather ", describe(input)), {input, output}, input.nbytes(), [&](cudaStream_t s) {
      return nccl().ncclAllGather(input.raw_data(), output.raw_data(), input.nbytes(), ncclUint8, comm_, s);
    });
  }
  WorkPtr barrier_async() override {
    // NCCL has no barrier: a one-element sum on the device, after which the host waits for it.
    Tensor one = ones({1}, TensorOptions(DType::F32, shared_->device()));
    const WorkPtr w = all_reduce_async(one, ReduceOp::Sum);
    w->wait();
    synchronize(current_stream(shared_->device()));
    return w;
  }
  WorkPtr send_async(const Tensor& t, int peer) override {
    if (on_host(t, "send")) return host_->send_async(t, peer);
    check_peer(peer, "send");
    return issue(detail::concat("send ", describe(t), " to ", peer), {t}, t.nbytes(),
                 [&](cudaStream_t s) { return nccl().ncclSend(t.raw_data(), t.nbytes(), ncclUint8, peer, comm_, s); });
  }
  WorkPtr recv_async(const Tensor& t, int peer) override {
    if (on_host(t, "recv")) return host_->recv_async(t, peer);
    check_peer(peer, "recv");
    return issue(detail::concat("recv ", describe(t), " from ", peer), {t}, 0,
                 [&](cudaStream_t s) { return nccl().ncclRecv(t.raw_data(), t.nbytes(), ncclUint8, peer, comm_, s); });
  }
  WorkPtr send_recv_async(const Tensor& send, int send_peer, const Tensor& recv, int recv_peer) override {
    if (on_host(send, recv, "send_recv")) return host_->send_recv_async(send, send_peer, recv, recv_peer);
    check_peer(send_peer, "send_recv");
    check_peer(recv_peer, "send_recv");
    return issue(
        detail::concat("send_recv ", describe(send), " to ", send_peer, ", ", describe(recv), " from ", recv_peer),
        {send, recv}, send.nbytes(), [&](cudaStream_t s) {
          // One group: both are posted before either waits (MPI_Sendrecv's guarantee).
          ncclResult_t r = nccl().ncclGroupStart();
          if (r != ncclSuccess) return r;
          r = nccl().ncclSend(send.raw_data(), send.nbytes(), ncclUint8, send_peer, comm_, s);
          const ncclResult_t r2 = nccl().ncclRecv(recv.raw_data(), recv.nbytes(), ncclUint8, recv_peer, comm_, s);
          const ncclResult_t r3 = nccl().ncclGroupEnd();
          return r != ncclSuccess ? r : r2 != ncclSuccess ? r2 : r3;
        });
  }

  int64_t bytes_issued() const override { return bytes_.load() + host_->bytes_issued(); }
  void set_timeout(double seconds) override {
    shared_->set_timeout(seconds);
    host_->set_timeout(seconds);
  }
  void set_debug(bool on) override {
    debug_ = on;
    host_->set_debug(on);
  }

 private:
  // CPU tensors take the host communicator; device tensors must be on this rank's GPU.
  bool on_host(const Tensor& t, const char* who) const {
    FT_CHECK(t.defined(), who, ": expected a tensor, found an undefined one");
    if (t.device().is_cpu()) return true;
    FT_CHECK(t.device() == shared_->device(), who, ": expected a tensor on ", shared_->device().str(),
             " (this rank's GPU) or the CPU, found one on ", t.device().str());
    FT_CHECK(t.is_contiguous(), who, ": expected a contiguous tensor, found a strided view of shape ", t.shape().str());
    return false;
  }
  bool on_host(const Tensor& a, const Tensor& b, const char* who) const {
    const bool ha = on_host(a, who), hb = on_host(b, who);
    FT_CHECK(ha == hb, who, ": expected both tensors on the CPU or both on ", shared_->device().str(), ", found ",
             a.device().str(), " and ", b.device().str());
    return ha;
  }
  void check_parts(const Tensor& whole, const Tensor& part, const char* who) const {
    FT_CHECK(whole.dtype() == part.dtype() && whole.numel() == part.numel() * world_size(), who,
             ": expected the whole to hold world_size (", world_size(), ") x the part's elements of one dtype, found ",
             whole.numel(), " ", dtype_name(whole.dtype()), " and ", part.numel(), " ", dtype_name(part.dtype()));
  }
  void check_peer(int peer, const char* who) const {
    FT_CHECK(peer >= 0 && peer < world_size() && peer != rank(), who, ": expected a peer in [0, ", world_size(),
             ") other than this rank (", rank(), "), found ", peer);
  }
  static std::string describe(const Tensor& t) { return detail::concat(dtype_name(t.dtype()), " x ", t.numel()); }

  // Queues `run` on the shared stream after the caller's stream's work so far; the returned work
  // makes the caller's stream wait for it.
  template <class Run>
  WorkPtr issue(std::string what, std::vector<Tensor> tensors, size_t bytes, Run run) {
    what += " on group " + name();
    if (debug_) compare_across_ranks(what);
    const Device device = shared_->device();
    check_cuda(cudaSetDevice(device.index), "cudaSetDevice");
    const auto caller = static_cast<cudaStream_t>(current_stream(device).handle);
    auto p = std::make_shared<Pending>();
    p->what = what;  // abort_job names the rank
    p->comm = comm_;
    cudaEvent_t ready = nullptr;
    check_cuda(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    check_cuda(cudaEventCreateWithFlags(&p->done, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    check_cuda(cudaEventRecord(ready, caller), "cudaEventRecord");
    check_cuda(cudaStreamWaitEvent(shared_->stream(), ready, 0), "cudaStreamWaitEvent");
    cudaEventDestroy(ready);  // released once reached; the wait above is already queued
    for (const Tensor& t : tensors)
      if (t.numel() > 0) allocator_for(device).record_stream(t.raw_data(), {device, shared_->stream()});
    check_nccl(run(shared_->stream()), what.c_str());
    check_cuda(cudaEventRecord(p->done, shared_->stream()), "cudaEventRecord");
    p->issued = Clock::now();
    shared_->watch_work(p);
    bytes_ += static_cast<int64_t>(bytes);
    ++sequence_;
    return std::make_shared<NcclWork>(std::move(p), device, std::move(tensors));
  }

  // The debug mode: every rank's description of its next collective, compared before it is
  // queued; a difference fails on every rank, naming each rank's.
  void compare_across_ranks(const std::string& what) {
    const std::string mine = detail::concat("#", sequence_, " ", what);
    const std::vector<std::string> all = all_gather_strings(*host_, mine);
    for (const std::string& s : all) {
      if (s == mine) continue;
      std::string listing;
      for (size_t r = 0; r < all.size(); ++r) listing += detail::concat("\n  rank ", r, ": ", all[r]);
      FT_FAIL("collectives differ across the ranks of group ", name(), ":", listing);
    }
  }

  std::shared_ptr<Shared> shared_;
  std::shared_ptr<Communicator> host_;
  ncclComm_t comm_ = nullptr;
  std::atomic<int64_t> bytes_{0};
  int64_t sequence_ = 0;
  bool debug_ = false;
};

}  // namespace

bool nccl_compiled() { return true; }

std::shared_ptr<Communicator> make_nccl_communicator(std::shared_ptr<Communicator> host, Device device) {
  FT_CHECK(host != nullptr, "make_nccl_communicator: expected a host communicator, found none");
  FT_CHECK(device.is_cuda(), "NCCL: expected a CUDA device for this rank, found ", device.str());
  // Two ranks of one machine on one GPU: NCCL would fail later with a less helpful message.
  char machine[256] = {0};
  gethostname(machine, sizeof(machine) - 1);
  const std::string mine = detail::concat(machine, " cuda:", device.index);
  const std::vector<std::string> placed = all_gather_strings(*host, mine);
  for (size_t a = 0; a < placed.size(); ++a)
    for (size_t b = a + 1; b < placed.size(); ++b)
      FT_CHECK(placed[a] != placed[b], "NCCL: ranks ", a, " and ", b, " of group ", host->name(), " share one GPU (",
               placed[a],
               "), which NCCL does not run; give each local rank its own GPU (--device cuda) or use "
               "--dist-backend mpi, which stages through host memory");
  int version = 0;
  check_nccl(nccl().ncclGetVersion(&version), "ncclGetVersion");
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  if (host->rank() == 0) check_nccl(nccl().ncclGetUniqueId(&id), "ncclGetUniqueId");
  Tensor bytes = empty({static_cast<int64_t>(sizeof(id))}, DType::U8);
  std::memcpy(bytes.data<uint8_t>(), &id, sizeof(id));
  host->broadcast(bytes, 0);
  std::memcpy(&id, bytes.data<uint8_t>(), sizeof(id));
  auto shared = std::make_shared<Shared>(device);
  ncclComm_t comm = nullptr;
  check_nccl(nccl().ncclCommInitRank(&comm, host->world_size(), id, host->rank()), "ncclCommInitRank");
  return std::make_shared<NcclCommunicator>(std::move(shared), std::move(host), comm);
}

}  // namespace ft::dist
