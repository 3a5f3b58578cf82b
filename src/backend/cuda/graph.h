// Fills the CUDA backend record's graph entries (graph.cpp).
#pragma once
#include "backend/device_backend.h"

namespace ft::cuda {

void set_graph_entries(backend::DeviceBackend& b);

}  // namespace ft::cuda
