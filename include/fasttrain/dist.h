// Communication between the processes of a data-parallel job: the communicator interface (what
// a collective engine offers: MPI, and NCCL on GPUs), the process-wide world
// communicator and the launch environment it is read from. Implemented in src/dist/.
//
// One process started without a launcher is a world of one: no MPI is initialised, and every
// collective returns at once. Started by `mpirun` (Open MPI), `srun` (Slurm) or another launcher
// that sets OMPI_COMM_WORLD_SIZE, PMI_SIZE or SLURM_STEP_NUM_TASKS above 1, the process joins the
// job's MPI world the first time world() is called.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fasttrain/names.h"
#include "fasttrain/tensor.h"

namespace ft::dist {

// How a job of several processes trains (TrainerConfig::strategy): DDP (replicated weights,
// gradients averaged), ZeRO stage 1, 2 or 3 (optimizer state, then gradients, then parameters
// sharded over the ranks); FSDP is stage 3 under PyTorch's name.
enum class Strategy { Ddp, Zero1, Zero2, Zero3, Fsdp };
std::span<const NamedValue<Strategy>> option_names(Strategy);  // names.h: ddp, zero1, zero2, zero3, fsdp
// The ZeRO stage of a strategy: 0 (DDP), 1, 2 or 3 (zero3 and fsdp).
int zero_stage(Strategy strategy);

// Which library moves a job's tensors (TrainerConfig's dist_backend): MPI (host memory; device
// tensors staged through host copies: dist/host_staging.h) or NCCL (GPU to GPU; dist/nccl.h).
// Auto is MPI until NCCL has been verified on a GPU machine (choose_backend).
enum class Backend { Auto, Mpi, Nccl };
std::span<const NamedValue<Backend>> option_names(Backend);  // names.h: auto, mpi, nccl

// The backend a job's data-parallel group uses, from what was asked and the job: NCCL needs CUDA
// devices, a build with NCCL, and no model parallelism yet (its groups stay on MPI); asked for
// without them, it is refused with the reason. `nccl_by_default`: whether auto picks NCCL for a
// CUDA job of several ranks (false until a GPU run has verified the NCCL communicator).
Backend choose_backend(Backend asked, bool cuda_device, int world_size, int64_t tp, int64_t pp, bool nccl_built,
                       bool nccl_by_default);

// Max: the element-wise maximum (tensor parallelism's cross-entropy takes the largest logit of
// the whole vocabulary from every rank's part of it).
enum class ReduceOp { Sum, Avg, Max };

// A collective in flight. wait() returns once its result is in the output tensor (and rethrows
// an error the collective met); the output must not be read or written before.
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
  virtual bool done() const = 0;
};
using WorkPtr = std::shared_ptr<Work>;

// Collectives over contiguous tensors: CPU tensors on MPI; device tensors GPU to GPU on NCCL
// (dist/nccl.h) or, on MPI, through host copies (dist/host_staging.h). Every rank must issue the
// same collectives, with the same sizes and dtypes, in the same order (as with MPI and NCCL). A
// communicator spans a group of the job's processes: the world, or a sub-group made by split()
// (process_groups.h: the tensor-, data- and pipeline-parallel groups), and every collective runs
// over the group of the communicator it is issued on. The asynchronous forms queue the collective
// on the communicator's own thread (NCCL: its stream) and return at once, so callers overlap it
// with computation; collectives run in the order they were issued. Reductions take f32, f64, i32
// and i64 tensors; broadcast and all_gather take any dtype (they move bytes).
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual int local_rank() const = 0;       // rank among the processes of this machine
  virtual int local_size() const = 0;       // processes of this job on this machine
  virtual std::string backend() const = 0;  // "mpi", "nccl" or "single"
  // "world" for the job's communicator, the name given to split() for a sub-group ("tensor",
  // "data", "pipeline"); error messages name the group.
  virtual std::string name() const = 0;
  // The world rank of this group's rank `r` (the identity on the world).
  virtual int world_rank(int r) const = 0;
  // Where a buffer this communicator reduces should live for tensors on `device` (DDP's gradient
  // buckets): host memory for MPI (a device tensor is staged), the device itself for NCCL.
  virtual Device buffer_device(Device /*device*/) const { return Device::cpu(); }

  // A communicator over the ranks of this one that pass the same `color` (MPI_Comm_split), ranked
  // by `key`. A collective of this communicator: every rank calls it, in the same order as the
  // others. Sub-groups share the world's communication thread and watchdog (so collectives of all
  // groups run in the order this process issued them, and the timeout covers them all) and take
  // its debug setting; each keeps its own sequence numbers and byte count.
  virtual std::shared_ptr<Communicator> split(int color, int key, const std::string& name) = 0;

  // `t` on every rank becomes `root`'s `t`.
  virtual WorkPtr broadcast_async(const Tensor& t, int root) = 0;
  // `t` becomes the element-wise sum (or mean) of every rank's `t`. Every rank gets the same bits.
  virtual WorkPtr all_reduce_async(const Tensor& t, ReduceOp op) = 0;
  // `input` (world_size x n elements) is reduced across ranks; rank r's `output` (n elements)
  // becomes part r of the result.
  virtual WorkPtr reduce_scatter_async(const Tensor& input, const Tensor& output, ReduceOp op) = 0;
  // `output` (world_size x n elements) becomes every rank's `input` (n elements), in rank order.
  virtual WorkPtr all_gather_async(const Tensor& input, const Tensor& output) = 0;
  virtual WorkPtr barrier_async() = 0;
  // Point to point (for pipeline stages): `t` to rank `peer` of this group, or `t` filled from it.
  // They run on the communication thread in issue order like the collectives, and a send may
  // not complete before the peer's matching recv is posted: two ranks must not both send first
  // (order them, e.g. the earlier stage sends first). Not compared by the debug mode.
  virtual WorkPtr send_async(const Tensor& t, int peer) = 0;
  virtual WorkPtr recv_async(const Tensor& t, int peer) = 0;
  // Both at once (MPI_Sendrecv): `send` to rank `send_peer` while `recv` is filled from
  // `recv_peer`, so two neighbours that send to each other at the same moment (1F1B's steady
  // state) cannot both wait for the other's receive. (Not pure: a communicator without point to
  // point, a test's fake, need not have it; the default refuses.)
  virtual WorkPtr send_recv_async(const Tensor& send, int send_peer, const Tensor& recv, int recv_peer);

  void broadcast(const Tensor& t, int root) { broadcast_async(t, root)->wait(); }
  void all_reduce(const Tensor& t, ReduceOp op) { all_reduce_async(t, op)->wait(); }
  void reduce_scatter(const Tensor& input, const Tensor& output, ReduceOp op) {
    reduce_scatter_async(input, output, op)->wait();
  }
  void all_gather(const Tensor& input, const Tensor& output) { all_gather_async(input, output)->wait(); }
  void barrier() { barrier_async()->wait(); }
  void send(const Tensor& t, int peer) { send_async(t, peer)->wait(); }
  void recv(const Tensor& t, int peer) { recv_async(t, peer)->wait(); }
  void send_recv(const Tensor& send, int send_peer, const Tensor& recv, int recv_peer) {
    send_recv_async(send, send_peer, recv, recv_peer)->wait();
  }

  // Payload bytes of the collectives issued so far (each collective counts its input tensor's
  // bytes once), for accounting in tests and benchmarks.
  virtual int64_t bytes_issued() const = 0;
  // A collective that has not completed after this many seconds aborts the whole job, naming
  // itself and this rank (a peer that died or diverged must not hang the others). 0: never.
  // One setting for the world and every group split from it.
  virtual void set_timeout(double seconds) = 0;
  // Debug mode: before each collective the ranks exchange what they are about to run (its
  // sequence number, kind, dtype, element count and root or reduction), and a collective that
  // differs on any rank fails on every rank with an error naming each rank's version, instead
  // of corrupting the result or hanging. Costs one small all-gather per collective.
  virtual void set_debug(bool on) = 0;
};

// Whether a launcher started this process as part of a job of more than one process (reads
// OMPI_COMM_WORLD_SIZE, PMI_SIZE, SLURM_STEP_NUM_TASKS; no MPI call).
bool launched();
// The job's communicator: MPI when launched(), otherwise a world of one (created once).
std::shared_ptr<Communicator> world();
// The single-process communicator (rank 0 of 1), for runs that must not communicate.
std::shared_ptr<Communicator> single_process();

// The device a rank of a job computes on: "cuda" without an index names this rank's own GPU,
// local_rank mod the `gpus` of its machine (torchrun's LOCAL_RANK convention), so `mpirun -np 8`
// on an 8-GPU node gives each rank one; "cpu" and "cuda:N" are kept as given.
Device local_device(const std::string& device, int local_rank, int gpus);

// root's string on every rank.
std::string broadcast_string(Communicator& comm, const std::string& s, int root = 0);
// Every rank's string, in rank order, on every rank (a collective of `comm`).
std::vector<std::string> all_gather_strings(Communicator& comm, const std::string& s);
// Small tensors of one dtype and device reduced in one collective (concatenated, reduced,
// written back in place), e.g. FP8's amaxes: one all-reduce instead of one per layer.
void all_reduce_together(Communicator& comm, const std::vector<Tensor>& tensors, ReduceOp op);

// Ends a failed job: prints "fasttrain: rank R of N: error: <message>" on stderr, then, when
// this process is part of an MPI job, aborts every rank (MPI_Abort) so that none waits forever
// for this one; otherwise only this process exits. Never returns.
[[noreturn]] void abort_job(const std::string& message, int exit_code);
// "rank R of N: " when world() has more than one rank, "" otherwise (for error messages).
std::string rank_prefix();

}  // namespace ft::dist
