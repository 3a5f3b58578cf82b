// The index checks that run on the device (indexing.cu, check_index_range): the host never waits
// for them; a failed one raises its op's message here, which the runtime calls after every host
// synchronisation (runtime.cu).
#pragma once

namespace ft::cuda {

// Throws the message of the first failed check among those the device has finished, if any.
void raise_failed_index_checks();

}  // namespace ft::cuda
