// The NCCL communicator: dist.h's interface over NCCL, for data parallelism across GPUs
// (src/backend/nccl/nccl_communicator.cpp; built where the CUDA toolkit has NCCL, opened on first
// use). Device tensors move GPU to GPU; CPU tensors (a logged loss, a found-inf flag, a string)
// take the host communicator it was made from, the MPI communicator of the same ranks, which also
// carries NCCL's bootstrap (rank 0's unique id) and the debug mode's comparisons.
//
// Ordering, as on the MPI side: every collective of a process, whatever its group, is queued on
// one CUDA stream of the world's, in issue order, after an event that marks what the caller's
// stream had queued; wait() makes the caller's current stream wait for the collective on the
// device (the host goes on), so what the caller queues next sees the result. A watchdog thread
// aborts the job (ncclCommAbort, then dist::abort_job) when a collective outlives the timeout
// or NCCL reports an asynchronous error, so a dead or diverged rank does not hang the others.
#pragma once
#include <memory>

#include "fasttrain/dist.h"

namespace ft::dist {

// Whether this build has the NCCL communicator (a CUDA build whose toolkit has NCCL).
bool nccl_compiled();

// A communicator over the ranks of `host` on NCCL, this rank's GPU being `device`. A collective
// of `host`. NCCL does not run two ranks on one GPU: the ranks of one machine must have distinct
// devices (refused otherwise, naming them). Throws when the build has no NCCL or the library
// cannot be loaded.
std::shared_ptr<Communicator> make_nccl_communicator(std::shared_ptr<Communicator> host, Device device);

}  // namespace ft::dist
