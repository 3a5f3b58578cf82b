// Collectives of device tensors over a communicator that moves host memory (MPI): the "staged"
// path of data parallelism on GPUs (device -> page-locked host -> MPI -> device). It is what a job
// uses where NCCL cannot run (two ranks sharing one GPU, a machine without libnccl) and what
// checks the GPU side of DDP and ZeRO against one process on a machine with a single GPU.
//
// Every operation of the wrapped communicator is forwarded; one whose tensors live on a device is
// staged: at issue, on the caller's thread, each input is copied to a host tensor (the copy waits
// for the device's stream, so it sees what the caller queued before); the inner communicator runs
// the collective on those host tensors on its own thread; wait() copies each result back to its
// device tensor before it returns. CPU tensors pass straight through, unless the switch
// FT_DIST_STAGING=always stages them too (through a second host tensor), which lets the CPU
// machines of CI run the staging itself under mpirun.
#pragma once
#include <memory>

#include "fasttrain/dist.h"

namespace ft::dist {

std::shared_ptr<Communicator> with_host_staging(std::shared_ptr<Communicator> inner);

}  // namespace ft::dist
