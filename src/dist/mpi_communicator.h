// The MPI backend of dist.h (Open MPI from Debian), private to the library: no public header
// includes mpi.h, so programs using fasttrain need neither MPI's headers nor its flags.
#pragma once
#include <memory>

#include "fasttrain/dist.h"

namespace ft::dist {

// Initialises MPI (once per process) and returns the world communicator over it.
std::shared_ptr<Communicator> make_mpi_world();
// MPI_Abort on the world when MPI is initialised; otherwise returns.
void mpi_abort(int exit_code);
// Checks shared by the backends: `t` is a defined, contiguous tensor (on a CPU, for MPI).
void check_contiguous(const Tensor& t, const char* who);
void check_cpu_contiguous(const Tensor& t, const char* who);

}  // namespace ft::dist
