// The launch environment, the world of one process, and the helpers of dist.h shared by every
// backend. A process nobody launched never touches MPI: its collectives return at once.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

#include "core/name_table.h"
#include "dist/host_staging.h"
#include "dist/mpi_communicator.h"
#include "dist/nccl.h"
#include "fasttrain/autograd.h"
#include "fasttrain/dist.h"
#include "fasttrain/error.h"
#include "fasttrain/ops.h"

namespace ft::dist {

namespace {

// Rank 0 of 1: a broadcast or a reduction over one rank leaves the tensor as it is, on whatever
// device it lives (nothing moves).
class DoneWork : public Work {
 public:
  void wait() override {}
  bool done() const override { return true; }
};

class SingleProcessCommunicator : public Communicator {
 public:
  explicit SingleProcessCommunicator(std::string name = "world") : name_(std::move(name)) {}
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  int local_rank() const override { return 0; }
  int local_size() const override { return 1; }
  std::string backend() const override { return "single"; }
  std::string name() const override { return name_; }
  int world_rank(int r) const override {
    FT_CHECK(r == 0, name_, ": expected rank 0 in a group of one process, found ", r);
    return 0;
  }
  // Every group of a world of one is that one process.
  std::shared_ptr<Communicator> split(int, int, const std::string& name) override {
    return std::make_shared<SingleProcessCommunicator>(name);
  }
  WorkPtr broadcast_async(const Tensor& t, int root) override {
    FT_CHECK(root == 0, "broadcast: expected root 0 in a world of one process, found ", root);
    check_contiguous(t, "broadcast");
    return done();
  }
  WorkPtr all_reduce_async(const Tensor& t, ReduceOp) override {
    check_contiguous(t, "all_reduce");
    return done();
  }
  WorkPtr reduce_scatter_async(const Tensor& input, const Tensor& output, ReduceOp) override {
    check_sizes(input, output, "reduce_scatter");
    output.detach().copy_(input.detach().view(output.shape()));
    return done();
  }
  WorkPtr all_gather_async(const Tensor& input, const Tensor& output) override {
    check_sizes(output, input, "all_gather");
    output.detach().copy_(input.detach().view(output.shape()));
    return done();
  }
  WorkPtr barrier_async() override { return done(); }
  // No peer to talk to: a pipeline of one stage never sends (a send to itself would wait forever).
  WorkPtr send_async(const Tensor&, int peer) override {
    FT_FAIL("send: a group of one process has no peer (rank ", peer, " asked for)");
  }
  WorkPtr recv_async(const Tensor&, int peer) override {
    FT_FAIL("recv: a group of one process has no peer (rank ", peer, " asked for)");
  }
  WorkPtr send_recv_async(const Tensor&, int send_peer, const Tensor&, int) override {
    FT_FAIL("send_recv: a group of one process has no peer (rank ", send_peer, " asked for)");
  }
  int64_t bytes_issued() const override { return 0; }
  void set_timeout(double) override {}
  void set_debug(bool) override {}  // one rank: nothing to disagree with

 private:
  static WorkPtr done() {
    static const WorkPtr work = std::make_shared<DoneWork>();
    return work;
  }
  static void check_sizes(const Tensor& whole, const Tensor& part, const char* who) {
    check_contiguous(whole, who);
    check_contiguous(part, who);
    FT_CHECK(whole.numel() == part.numel() && whole.dtype() == part.dtype() && whole.device() == part.device(), who,
             ": expected input and output of the same size, dtype and device in a world of one process, found ",
             whole.numel(), " ", dtype_name(whole.dtype()), " on ", whole.device().str(), " and ", part.numel(), " ",
             dtype_name(part.dtype()), " on ", part.device().str());
  }
  std::string name_;
};

int env_int(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::atoi(v) : 0;
}

}  // namespace

void check_contiguous(const Tensor& t, const char* who) {
  FT_CHECK(t.defined(), who, ": expected a tensor, found an undefined one");
  FT_CHECK(t.is_contiguous(), who, ": expected a contiguous tensor, found a strided view of shape ", t.shape().str());
}

void check_cpu_contiguous(const Tensor& t, const char* who) {
  check_contiguous(t, who);
  FT_CHECK(t.device().is_cpu(), who, ": expected a CPU tensor (MPI moves host memory), found one on ",
           t.device().str());
}

bool launched() {
  // Open MPI's mpirun; PMI (MPICH's launchers, srun --mpi=pmi2); Slurm's srun, through the size
  // of the job step: SLURM_NTASKS is also set in a batch script, where a command runs alone.
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS"})
    if (env_int(name) > 1) return true;
  return false;
}

std::shared_ptr<Communicator> single_process() {
  static const std::shared_ptr<Communicator> single = std::make_shared<SingleProcessCommunicator>();
  return single;
}

std::shared_ptr<Communicator> world() {
  static std::once_flag once;
  static std::shared_ptr<Communicator> w;
  // Device tensors reach MPI through host copies (host_staging.h); CPU tensors go straight.
  std::call_once(once, [] { w = launched() ? with_host_staging(make_mpi_world()) : single_process(); });
  return w;
}

#ifndef FASTTRAIN_WITH_NCCL
// A build without NCCL (no CUDA, or a toolkit without it): the communicator is refused by name.
bool nccl_compiled() { return false; }
std::shared_ptr<Communicator> make_nccl_communicator(std::shared_ptr<Communicator>, Device) {
  FT_FAIL("NCCL: this build has no NCCL communicator (",
          cuda_compiled() ? "the CUDA toolkit it was built with has no nccl.h" : "it has no CUDA support",
          "); use --dist-backend mpi");
}
#endif

namespace {
constexpr NamedValue<Backend> kBackends[] = {{Backend::Auto, "auto"}, {Backend::Mpi, "mpi"}, {Backend::Nccl, "nccl"}};
static_assert(ft::detail::rows_start_in_enum_order(kBackends, std::size(kBackends)), "in enum order");
}  // namespace

std::span<const NamedValue<Backend>> option_names(Backend) { return kBackends; }

Backend choose_backend(Backend asked, bool cuda_device, int world_size, int64_t tp, int64_t pp, bool nccl_built,
                       bool nccl_by_default) {
  if (asked == Backend::Mpi) return Backend::Mpi;
  if (asked == Backend::Nccl) {
    FT_CHECK(cuda_device, "option dist_backend: nccl moves GPU memory; expected --device cuda, found a CPU run");
    FT_CHECK(tp * pp == 1, "option dist_backend: nccl with tensor or pipeline parallelism (tp ", tp, ", pp ", pp,
             ") is not built yet; use mpi, which stages device tensors through host memory");
    FT_CHECK(nccl_built, "option dist_backend: nccl: this build has no NCCL communicator; use mpi");
    return Backend::Nccl;
  }
  const bool nccl = nccl_by_default && cuda_device && world_size > 1 && tp * pp == 1 && nccl_built;
  return nccl ? Backend::Nccl : Backend::Mpi;
}

Device local_device(const std::string& device, int local_rank, int gpus) {
  const Device parsed = Device::parse(device);
  if (device != "cuda") return parsed;  // cpu, or an index chosen by the user
  FT_CHECK(gpus > 0, "device cuda: expected a CUDA device on this machine, found none");
  FT_CHECK(local_rank >= 0, "device cuda: expected a local rank >= 0, found ", local_rank);
  return Device::cuda(local_rank % gpus);
}

WorkPtr Communicator::send_recv_async(const Tensor&, int send_peer, const Tensor&, int recv_peer) {
  FT_FAIL("send_recv: the ", backend(), " communicator has no point-to-point exchange (to rank ", send_peer,
          ", from rank ", recv_peer, ")");
}

std::string broadcast_string(Communicator& comm, const std::string& s, int root) {
  if (comm.world_size() == 1) return s;
  Tensor length = scalar_tensor(static_cast<int64_t>(s.size()), DType::I64);
  comm.broadcast(length, root);
  const int64_t n = length.item<int64_t>();
  Tensor bytes = empty({std::max<int64_t>(n, 1)}, DType::U8);
  if (comm.rank() == root) std::copy(s.begin(), s.end(), bytes.data<uint8_t>());
  comm.broadcast(bytes, root);
  const char* p = reinterpret_cast<const char*>(bytes.data<uint8_t>());
  return std::string(p, p + n);
}

std::vector<std::string> all_gather_strings(Communicator& comm, const std::string& s) {
  const int n = comm.world_size();
  if (n == 1) return {s};
  Tensor mine = scalar_tensor(static_cast<int64_t>(s.size()), DType::I64).reshape({1});
  Tensor lengths = empty({n}, DType::I64);
  comm.all_gather(mine, lengths);
  const int64_t* len = lengths.data<int64_t>();
  // all_gather moves equal parts: every string padded to the longest.
  const int64_t longest = std::max<int64_t>(1, *std::max_element(len, len + n));
  Tensor part = zeros({longest}, DType::U8);
  std::copy(s.begin(), s.end(), part.data<uint8_t>());
  Tensor all = empty({n * longest}, DType::U8);
  comm.all_gather(part, all);
  std::vector<std::string> out;
  const char* p = reinterpret_cast<const char*>(all.data<uint8_t>());
  for (int r = 0; r < n; ++r) out.emplace_back(p + r * longest, p + r * longest + len[r]);
  return out;
}

void all_reduce_together(Communicator& comm, const std::vector<Tensor>& tensors, ReduceOp op) {
  if (tensors.empty() || comm.world_size() == 1) return;
  autograd::NoGradGuard no_grad;
  std::vector<Tensor> flat;
  for (const Tensor& t : tensors) flat.push_back(t.reshape({-1}));
  Tensor all = cat(flat, 0);
  comm.all_reduce(all, op);
  int64_t at = 0;
  for (const Tensor& t : tensors) {
    Tensor dst = t;  // written in place
    dst.copy_(all.narrow(0, at, t.numel()).view(t.shape()));
    at += t.numel();
  }
}

std::string rank_prefix() {
  if (!launched()) return "";
  const std::shared_ptr<Communicator> w = world();
  return "rank " + std::to_string(w->rank()) + " of " + std::to_string(w->world_size()) + ": ";
}

void abort_job(const std::string& message, int exit_code) {
  std::fprintf(stderr, "fasttrain: %serror: %s\n", rank_prefix().c_str(), message.c_str());
  std::fflush(stderr);
  if (launched()) mpi_abort(exit_code);
  std::_Exit(exit_code);
}

}  // namespace ft::dist
