// The CPU's caching allocator (core/allocator.cpp), which the CPU backend's record hands out as
// its device memory (backend/cpu/runtime.cpp).
#pragma once
#include "fasttrain/allocator.h"

namespace ft {

Allocator& host_allocator();

}  // namespace ft
