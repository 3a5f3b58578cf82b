// Registers the CUDA graph entry points of CudaHooks (graph.cpp).
#pragma once

namespace ft {
struct CudaHooks;
}

namespace ft::cuda {

void register_graph_hooks(CudaHooks& hooks);

}  // namespace ft::cuda
