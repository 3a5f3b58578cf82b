// The MPI communicator (dist.h over Open MPI). Every collective runs on one communication thread,
// in the order the caller issued it, so the training thread queues a gradient bucket and goes on
// with backward while MPI moves the bytes; a second thread, the watchdog, aborts the whole job
// when one collective outlives the timeout (a peer that died, threw or diverged must not leave
// the others blocked in MPI for ever).
//
// MPI is initialised with MPI_THREAD_MULTIPLE when the library offers it (MPI_Abort may then come
// from the watchdog or an error path while the communication thread is inside a collective), and
// finalised at exit; MPI_Finalize synchronises with the other ranks, so it is watched too.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <functional>
#include <iterator>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "dist/mpi_communicator.h"
#include "fasttrain/error.h"
#include "fasttrain/profiler.h"

namespace ft::dist {

namespace {

using Clock = std::chrono::steady_clock;

class MpiWork : public Work {
 public:
  MpiWork(std::string what, std::function<void()> run) : what_(std::move(what)), run_(std::move(run)) {}
  void wait() override {
    std::unique_lock<std::mutex> lock(m_);
    cv_.wait(lock, [&] { return done_; });
    if (!error_.empty()) FT_FAIL(error_);
  }
  bool done() const override {
    std::lock_guard<std::mutex> lock(m_);
    return done_;
  }
  const std::string& what() const { return what_; }
  void run() {
    std::string error;
    try {
      run_();
    } catch (const std::exception& e) {
      error = e.what();
    }
    run_ = nullptr;  // drops the tensors the collective held
    std::lock_guard<std::mutex> lock(m_);
    error_ = std::move(error);
    done_ = true;
    cv_.notify_all();
  }

 private:
  std::string what_;
  std::function<void()> run_;
  mutable std::mutex m_;
  std::condition_variable cv_;
  bool done_ = false;
  std::string error_;
};

void check_mpi(int code, const char* call) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  FT_FAIL(call, " failed: ", std::string(text, static_cast<size_t>(length)));
}

// The MPI type of a reduction over `dtype`.
MPI_Datatype reduce_type(DType dtype, const char* who) {
  switch (dtype) {
    case DType::F32: return MPI_FLOAT;
    case DType::F64: return MPI_DOUBLE;
    case DType::I32: return MPI_INT32_T;
    case DType::I64: return MPI_INT64_T;
    default:
      FT_FAIL(who, ": expected an f32, f64, i32 or i64 tensor to reduce, found ", dtype_name(dtype),
              " (reduce low-precision values in f32)");
  }
}

// x / n in place: the mean of a sum, computed the same way on every rank.
void divide(const Tensor& t, int n) {
  const int64_t count = t.numel();
  switch (t.dtype()) {
    case DType::F32: {
      float* p = t.data<float>();
      const auto d = static_cast<float>(n);
      for (int64_t i = 0; i < count; ++i) p[i] /= d;
      break;
    }
    case DType::F64: {
      double* p = t.data<double>();
      const auto d = static_cast<double>(n);
      for (int64_t i = 0; i < count; ++i) p[i] /= d;
      break;
    }
    case DType::I32: {
      int32_t* p = t.data<int32_t>();
      for (int64_t i = 0; i < count; ++i) p[i] /= n;
      break;
    }
    default: {
      int64_t* p = t.data<int64_t>();
      for (int64_t i = 0; i < count; ++i) p[i] /= n;
      break;
    }
  }
}

// MPI counts are ints: large buffers go in pieces of at most 2^30 elements.
constexpr int64_t kMaxCount = int64_t{1} << 30;

// send_recv's two peers in one Collective::argument: to * kPeerRadix + from.
constexpr int64_t kPeerRadix = int64_t{1} << 24;

// What a rank is about to run, as the debug mode compares it across ranks.
struct Collective {
  enum Kind : int64_t { Broadcast, AllReduce, ReduceScatter, AllGather, Barrier, Split, Send, Recv, SendRecv };
  int64_t sequence = 0;  // 1 for the first collective of this communicator
  int64_t kind = Barrier;
  int64_t dtype = 0;     // the input's DType
  int64_t count = 0;     // the input's elements
  int64_t argument = 0;  // broadcast: the root; reductions: the ReduceOp; split: the colour; p2p: the peer
  bool operator==(const Collective&) const = default;
};
static_assert(sizeof(Collective) == 5 * sizeof(int64_t), "exchanged as 5 int64 per rank");

std::string describe(const Collective& c) {
  static constexpr const char* kNames[] = {"broadcast", "all_reduce", "reduce_scatter", "all_gather", "barrier",
                                           "split",     "send",       "recv",           "send_recv"};
  static_assert(std::size(kNames) == Collective::SendRecv + 1, "one name per kind");
  const bool known = c.kind >= 0 && c.kind <= Collective::SendRecv;
  std::string s = known ? kNames[c.kind] : "unknown collective " + std::to_string(c.kind);
  if (c.kind == Collective::Barrier) return s;
  if (c.kind == Collective::Split) return s + detail::concat(" (colour ", c.argument, ")");
  s += detail::concat(" of ", c.count, " ", dtype_name(static_cast<DType>(c.dtype)), " elements");
  if (c.kind == Collective::Broadcast) s += detail::concat(" from root ", c.argument);
  if (c.kind == Collective::Send) s += detail::concat(" to rank ", c.argument);
  if (c.kind == Collective::Recv) s += detail::concat(" from rank ", c.argument);
  if (c.kind == Collective::SendRecv)
    s += detail::concat(" to rank ", c.argument / kPeerRadix, " and from rank ", c.argument % kPeerRadix);
  if (c.kind == Collective::AllReduce || c.kind == Collective::ReduceScatter) {
    const auto op = static_cast<ReduceOp>(c.argument);
    s += op == ReduceOp::Avg ? " (avg)" : op == ReduceOp::Max ? " (max)" : " (sum)";
  }
  return s;
}

// The communication thread and the watchdog of a process, shared by the world and every group
// split from it: one queue, so collectives of different groups run in the order this process
// issued them (MPI needs no more than MPI_THREAD_SERIALIZED between this thread and others, and
// two groups' collectives can never wait on each other from two threads), and one timeout over
// them all.
class Engine {
 public:
  Engine() {
    worker_ = std::thread([this] { work_loop(); });
    watchdog_ = std::thread([this] { watch_loop(); });
  }
  ~Engine() { stop_threads(); }

  // Runs `work` on the communication thread after everything queued before it.
  void push(const std::shared_ptr<MpiWork>& work) {
    queue_.push_back(work);
    cv_.notify_all();
  }
  std::mutex& mutex() const { return m_; }
  // Returns once nothing is queued or running (or the thread has stopped): a group's queued
  // collectives use the group, which must outlive them.
  void drain() {
    std::unique_lock<std::mutex> lock(m_);
    idle_.wait(lock, [&] { return stop_worker_ || (queue_.empty() && current_ == nullptr); });
  }
  bool stopped() const { return stop_worker_; }
  // A group's MPI communicator, freed at finalize() (before MPI_Finalize; never while a
  // collective may use it).
  void keep(MPI_Comm comm) {
    std::lock_guard<std::mutex> lock(m_);
    keep_locked(comm);
  }
  void keep_locked(MPI_Comm comm) { comms_.push_back(comm); }
  void set_timeout(double seconds) {
    std::lock_guard<std::mutex> lock(m_);
    timeout_s_ = seconds;
    cv_.notify_all();
  }
  void set_identity(int rank, int size) { rank_ = rank, size_ = size; }

  // At exit: the queue is drained, then MPI_Finalize, itself watched (it waits for every rank).
  void finalize(bool owns_mpi) {
    {
      std::unique_lock<std::mutex> lock(m_);
      idle_.wait(lock, [&] { return queue_.empty() && current_ == nullptr; });
      stop_worker_ = true;
      cv_.notify_all();
    }
    if (worker_.joinable()) worker_.join();
    {
      std::lock_guard<std::mutex> lock(m_);
      finalize_started_ = Clock::now();
      in_finalize_ = true;
      cv_.notify_all();
    }
    for (MPI_Comm& c : comms_) MPI_Comm_free(&c);
    if (owns_mpi) MPI_Finalize();
    stop_threads();
  }

 private:
  void work_loop() {
    profiler::set_thread_name("communication");
    for (;;) {
      std::shared_ptr<MpiWork> work;
      {
        std::unique_lock<std::mutex> lock(m_);
        cv_.wait(lock, [&] { return stop_worker_ || !queue_.empty(); });
        if (queue_.empty()) return;
        work = queue_.front();
        queue_.pop_front();
        current_ = work.get();
        started_ = Clock::now();
        cv_.notify_all();  // the watchdog starts timing this one
      }
      {
        // A profiled run shows each collective as a span on this thread's lane ("communication"),
        // beside the training thread's wait for it.
        std::optional<profiler::Range> span;
        if (profiler::tracing()) span.emplace(work->what(), "communication");
        work->run();
      }
      {
        std::lock_guard<std::mutex> lock(m_);
        current_ = nullptr;
        idle_.notify_all();
        cv_.notify_all();
      }
    }
  }

  // Wakes when a collective starts or ends or the timeout changes, and otherwise at the moment
  // the running collective (or MPI_Finalize) would pass the timeout; every wake-up re-reads the
  // state under the lock, so only a collective that has itself been running for the whole
  // timeout aborts the job.
  void watch_loop() {
    std::unique_lock<std::mutex> lock(m_);
    for (;;) {
      if (stop_watchdog_) return;
      const bool watching = timeout_s_ > 0 && (current_ != nullptr || in_finalize_);
      if (!watching) {
        cv_.wait(lock);
        continue;
      }
      const auto timeout = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s_));
      const auto since = in_finalize_ ? finalize_started_ : started_;
      if (Clock::now() - since < timeout) {
        cv_.wait_until(lock, since + timeout);
        continue;
      }
      const std::string what = in_finalize_ ? std::string("MPI_Finalize") : current_->what();
      std::fprintf(stderr,
                   "fasttrain: rank %d of %d: error: %s did not complete within %g s (dist_timeout); another rank "
                   "has failed or stopped communicating; aborting the job\n",
                   rank_, size_, what.c_str(), timeout_s_);
      std::fflush(stderr);
      if (in_finalize_) std::_Exit(3);  // the job is ending anyway: do not wait for the others
      MPI_Abort(MPI_COMM_WORLD, 3);
      std::_Exit(3);
    }
  }

  void stop_threads() {
    {
      std::lock_guard<std::mutex> lock(m_);
      stop_worker_ = stop_watchdog_ = true;
      cv_.notify_all();
      idle_.notify_all();
    }
    if (worker_.joinable()) worker_.join();
    if (watchdog_.joinable()) watchdog_.join();
  }

  int rank_ = 0, size_ = 1;  // in the world, for the watchdog's message
  std::thread worker_, watchdog_;
  mutable std::mutex m_;
  std::condition_variable cv_, idle_;
  std::deque<std::shared_ptr<MpiWork>> queue_;
  const MpiWork* current_ = nullptr;  // the collective the communication thread is inside
  Clock::time_point started_, finalize_started_;
  bool in_finalize_ = false, stop_worker_ = false, stop_watchdog_ = false;
  double timeout_s_ = 300;
  std::vector<MPI_Comm> comms_;
};

class MpiCommunicator;
MpiCommunicator* g_world = nullptr;  // for the exit handler and mpi_abort
bool g_finalizing = false;

class MpiCommunicator : public Communicator {
 public:
  // The world: initialises MPI and starts the communication thread.
  MpiCommunicator() : name_("world") {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided = 0;
      check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
      FT_CHECK(provided >= MPI_THREAD_SERIALIZED,
               "MPI: expected a library that allows calls from more than one thread (MPI_THREAD_SERIALIZED), found "
               "level ",
               provided);
      owns_mpi_ = true;
    }
    check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), "MPI_Comm_dup");
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    MPI_Comm local;
    check_mpi(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local), "MPI_Comm_split_type");
    MPI_Comm_rank(local, &local_rank_);
    MPI_Comm_size(local, &local_size_);
    MPI_Comm_free(&local);
    for (int r = 0; r < size_; ++r) world_ranks_.push_back(r);
    engine_ = std::make_shared<Engine>();
    engine_->set_identity(rank_, size_);
    engine_->keep(comm_);
  }

  // A group split from `parent` (split()): `world_ranks` lists its ranks' world ranks.
  MpiCommunicator(const MpiCommunicator& parent, MPI_Comm comm, std::string name, std::vector<int> world_ranks)
      : engine_(parent.engine_),
        comm_(comm),
        name_(std::move(name)),
        world_ranks_(std::move(world_ranks)),
        local_rank_(parent.local_rank_),
        local_size_(parent.local_size_) {
    const int me = parent.world_rank(parent.rank_);
    rank_ = static_cast<int>(std::find(world_ranks_.begin(), world_ranks_.end(), me) - world_ranks_.begin());
    size_ = static_cast<int>(world_ranks_.size());
    std::lock_guard<std::mutex> lock(engine_->mutex());
    debug_ = parent.debug_;
    engine_->keep_locked(comm_);
  }

  ~MpiCommunicator() override { engine_->drain(); }

  int rank() const override { return rank_; }
  int world_size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }
  std::string backend() const override { return "mpi"; }
  std::string name() const override { return name_; }
  int world_rank(int r) const override {
    FT_CHECK(r >= 0 && r < size_, name_, ": expected a rank in [0, ", size_, "), found ", r);
    return world_ranks_[static_cast<size_t>(r)];
  }

  std::shared_ptr<Communicator> split(int color, int key, const std::string& name) override {
    FT_CHECK(color >= 0, "split: expected a colour >= 0, found ", color);
    // On the communication thread, in order with this group's other collectives. The debug mode
    // compares the call, not the colour (which differs between the groups by design). Each rank
    // of the new group learns the world ranks of the others, for messages.
    MPI_Comm sub = MPI_COMM_NULL;
    std::vector<int> ranks;
    const int me = world_rank(rank_);
    enqueue({0, Collective::Split, 0, 0, 0}, 0, [this, color, key, me, &sub, &ranks] {
      check_mpi(MPI_Comm_split(comm_, color, key, &sub), "MPI_Comm_split");
      int size = 0;
      MPI_Comm_size(sub, &size);
      ranks.resize(static_cast<size_t>(size));
      check_mpi(MPI_Allgather(&me, 1, MPI_INT, ranks.data(), 1, MPI_INT, sub), "MPI_Allgather (split)");
    })->wait();
    return std::make_shared<MpiCommunicator>(*this, sub, name, std::move(ranks));
  }

  WorkPtr broadcast_async(const Tensor& t, int root) override {
    check_cpu_contiguous(t, "broadcast");
    FT_CHECK(root >= 0 && root < size_, "broadcast: expected a root rank in [0, ", size_, "), found ", root);
    return enqueue({0, Collective::Broadcast, static_cast<int64_t>(t.dtype()), t.numel(), root}, t.nbytes(),
                   [this, t, root] {
                     auto* p = static_cast<char*>(t.raw_data());
                     for (int64_t done = 0, n = static_cast<int64_t>(t.nbytes()); done < n; done += kMaxCount) {
                       const int count = static_cast<int>(std::min(kMaxCount, n - done));
                       check_mpi(MPI_Bcast(p + done, count, MPI_BYTE, root, comm_), "MPI_Bcast");
                     }
                   });
  }

  WorkPtr all_reduce_async(const Tensor& t, ReduceOp op) override {
    check_cpu_contiguous(t, "all_reduce");
    const MPI_Datatype type = reduce_type(t.dtype(), "all_reduce");
    return enqueue({0, Collective::AllReduce, static_cast<int64_t>(t.dtype()), t.numel(), static_cast<int64_t>(op)},
                   t.nbytes(), [this, t, op, type] {
                     auto* p = static_cast<char*>(t.raw_data());
                     const int64_t n = t.numel(), size = static_cast<int64_t>(t.element_size());
                     for (int64_t done = 0; done < n; done += kMaxCount) {
                       const int count = static_cast<int>(std::min(kMaxCount, n - done));
                       check_mpi(MPI_Allreduce(MPI_IN_PLACE, p + done * size, count, type, mpi_op(op), comm_),
                                 "MPI_Allreduce");
                     }
                     if (op == ReduceOp::Avg) divide(t, size_);
                   });
  }

  WorkPtr reduce_scatter_async(const Tensor& input, const Tensor& output, ReduceOp op) override {
    check_cpu_contiguous(input, "reduce_scatter");
    check_cpu_contiguous(output, "reduce_scatter");
    check_parts(input, output, "reduce_scatter", "input", "output");
    const MPI_Datatype type = reduce_type(input.dtype(), "reduce_scatter");
    return enqueue(
        {0, Collective::ReduceScatter, static_cast<int64_t>(input.dtype()), input.numel(), static_cast<int64_t>(op)},
        input.nbytes(), [this, input, output, op, type] {
          check_mpi(MPI_Reduce_scatter_block(input.raw_data(), output.raw_data(), static_cast<int>(output.numel()),
                                             type, mpi_op(op), comm_),
                    "MPI_Reduce_scatter_block");
          if (op == ReduceOp::Avg) divide(output, size_);
        });
  }

  WorkPtr all_gather_async(const Tensor& input, const Tensor& output) override {
    check_cpu_contiguous(input, "all_gather");
    check_cpu_contiguous(output, "all_gather");
    check_parts(output, input, "all_gather", "output", "input");
    return enqueue({0, Collective::AllGather, static_cast<int64_t>(input.dtype()), input.numel(), 0}, input.nbytes(),
                   [this, input, output] {
                     const int bytes = static_cast<int>(input.nbytes());
                     check_mpi(
                         MPI_Allgather(input.raw_data(), bytes, MPI_BYTE, output.raw_data(), bytes, MPI_BYTE, comm_),
                         "MPI_Allgather");
                   });
  }

  WorkPtr barrier_async() override {
    return enqueue({}, 0, [this] { check_mpi(MPI_Barrier(comm_), "MPI_Barrier"); });
  }

  WorkPtr send_async(const Tensor& t, int peer) override {
    check_cpu_contiguous(t, "send");
    check_peer(peer, "send");
    FT_CHECK(t.nbytes() <= static_cast<size_t>(INT_MAX), "send: expected at most ", INT_MAX, " bytes, found ",
             t.nbytes());
    return enqueue(
        {0, Collective::Send, static_cast<int64_t>(t.dtype()), t.numel(), peer}, t.nbytes(), [this, t, peer] {
          check_mpi(MPI_Send(t.raw_data(), static_cast<int>(t.nbytes()), MPI_BYTE, peer, 0, comm_), "MPI_Send");
        });
  }

  WorkPtr recv_async(const Tensor& t, int peer) override {
    check_cpu_contiguous(t, "recv");
    check_peer(peer, "recv");
    FT_CHECK(t.nbytes() <= static_cast<size_t>(INT_MAX), "recv: expected at most ", INT_MAX, " bytes, found ",
             t.nbytes());
    return enqueue({0, Collective::Recv, static_cast<int64_t>(t.dtype()), t.numel(), peer}, 0, [this, t, peer] {
      MPI_Status status;
      check_mpi(MPI_Recv(t.raw_data(), static_cast<int>(t.nbytes()), MPI_BYTE, peer, 0, comm_, &status), "MPI_Recv");
      int got = 0;
      MPI_Get_count(&status, MPI_BYTE, &got);
      FT_CHECK(static_cast<size_t>(got) == t.nbytes(), "recv: expected ", t.nbytes(), " bytes from rank ", peer,
               " of the ", name_, " group, found ", got);
    });
  }

  // One MPI_Sendrecv: the send and the receive progress together.
  WorkPtr send_recv_async(const Tensor& send, int send_peer, const Tensor& recv, int recv_peer) override {
    check_cpu_contiguous(send, "send_recv");
    check_cpu_contiguous(recv, "send_recv");
    check_peer(send_peer, "send_recv");
    check_peer(recv_peer, "send_recv");
    FT_CHECK(send.nbytes() <= static_cast<size_t>(INT_MAX) && recv.nbytes() <= static_cast<size_t>(INT_MAX),
             "send_recv: expected at most ", INT_MAX, " bytes each way, found ", send.nbytes(), " and ", recv.nbytes());
    return enqueue({0, Collective::SendRecv, static_cast<int64_t>(send.dtype()), send.numel(),
                    static_cast<int64_t>(send_peer) * kPeerRadix + recv_peer},
                   send.nbytes(), [this, send, send_peer, recv, recv_peer] {
                     MPI_Status status;
                     check_mpi(MPI_Sendrecv(send.raw_data(), static_cast<int>(send.nbytes()), MPI_BYTE, send_peer, 0,
                                            recv.raw_data(), static_cast<int>(recv.nbytes()), MPI_BYTE, recv_peer, 0,
                                            comm_, &status),
                               "MPI_Sendrecv");
                     int got = 0;
                     MPI_Get_count(&status, MPI_BYTE, &got);
                     FT_CHECK(static_cast<size_t>(got) == recv.nbytes(), "send_recv: expected ", recv.nbytes(),
                              " bytes from rank ", recv_peer, " of the ", name_, " group, found ", got);
                   });
  }

  int64_t bytes_issued() const override {
    std::lock_guard<std::mutex> lock(engine_->mutex());
    return bytes_;
  }

  void set_timeout(double seconds) override {
    FT_CHECK(seconds >= 0, "dist_timeout: expected seconds >= 0 (0: none), found ", seconds);
    engine_->set_timeout(seconds);
  }

  void set_debug(bool on) override {
    std::lock_guard<std::mutex> lock(engine_->mutex());
    debug_ = on;
  }

  void finalize() { engine_->finalize(owns_mpi_); }

 private:
  static MPI_Op mpi_op(ReduceOp op) { return op == ReduceOp::Max ? MPI_MAX : MPI_SUM; }

  void check_peer(int peer, const char* who) const {
    FT_CHECK(peer >= 0 && peer < size_ && peer != rank_, who, ": expected a peer rank in [0, ", size_,
             ") other than this rank (", rank_, ") of the ", name_, " group, found ", peer);
  }

  // `whole` holds world_size parts the size of `part`.
  void check_parts(const Tensor& whole, const Tensor& part, const char* who, const char* whole_name,
                   const char* part_name) const {
    FT_CHECK(whole.dtype() == part.dtype(), who, ": expected ", whole_name, " and ", part_name, " of one dtype, found ",
             dtype_name(whole.dtype()), " and ", dtype_name(part.dtype()));
    FT_CHECK(whole.numel() == part.numel() * size_, who, ": expected ", whole_name, " of world_size (", size_, ") x ",
             part.numel(), " elements, found ", whole.numel());
    FT_CHECK(part.nbytes() <= static_cast<size_t>(INT_MAX), who, ": expected at most ", INT_MAX,
             " bytes per rank, found ", part.nbytes());
  }

  // `counted`: a sequence number and the debug comparison (not for split()'s own exchange).
  WorkPtr enqueue(Collective c, size_t bytes, std::function<void()> run, bool counted = true) {
    std::lock_guard<std::mutex> lock(engine_->mutex());
    if (counted) c.sequence = ++issued_;
    FT_CHECK(!engine_->stopped(), describe(c), ": the communicator has shut down (after exit began)");
    // Whether to compare is decided here, in the caller's order, so every rank decides alike for
    // the same collective even when set_debug() races with the communication thread. Point to
    // point has no group-wide moment to compare at.
    const bool p2p = c.kind == Collective::Send || c.kind == Collective::Recv || c.kind == Collective::SendRecv;
    if (debug_ && counted && !p2p) run = [this, c, run = std::move(run)] { agree_on(c), run(); };
    const std::string group = name_ == "world" ? "" : " in the " + name_ + " group";
    auto work = std::make_shared<MpiWork>(
        detail::concat(describe(c), group, " (collective #", c.sequence, ", ", bytes, " bytes)"), std::move(run));
    bytes_ += static_cast<int64_t>(bytes);
    engine_->push(work);
    return work;
  }

  // Debug mode: every rank's next collective in this group, gathered, must be this one; else it
  // fails on every rank of the group (each sees the same gathered table) before MPI is handed
  // mismatched buffers.
  void agree_on(const Collective& mine) const {
    std::vector<Collective> all(static_cast<size_t>(size_));
    check_mpi(MPI_Allgather(&mine, 5, MPI_INT64_T, all.data(), 5, MPI_INT64_T, comm_), "MPI_Allgather (dist_debug)");
    if (std::all_of(all.begin(), all.end(), [&](const Collective& c) { return c == all.front(); })) return;
    std::string ranks;
    for (int r = 0; r < size_; ++r) {
      const std::string world = name_ == "world" ? "" : detail::concat(" (world rank ", world_ranks_[r], ")");
      ranks += detail::concat("\n  rank ", r, world, ": collective #", all[r].sequence, ": ", describe(all[r]));
    }
    const std::string group = name_ == "world" ? "" : " of the " + name_ + " group";
    FT_FAIL("collectives differ across ranks (dist_debug)", group,
            "; every rank must issue the same collectives with the same sizes in the same order:", ranks);
  }

  std::shared_ptr<Engine> engine_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  std::string name_;
  std::vector<int> world_ranks_;  // of this group's ranks
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
  bool owns_mpi_ = false;
  bool debug_ = false;              // under the engine's mutex
  int64_t issued_ = 0, bytes_ = 0;  // under the engine's mutex
};

void finalize_at_exit() {
  if (g_world == nullptr || g_finalizing) return;
  g_finalizing = true;
  g_world->finalize();
}

}  // namespace

std::shared_ptr<Communicator> make_mpi_world() {
  auto w = std::make_shared<MpiCommunicator>();
  g_world = w.get();
  std::atexit(finalize_at_exit);
  return w;
}

void mpi_abort(int exit_code) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, exit_code);
}

}  // namespace ft::dist
