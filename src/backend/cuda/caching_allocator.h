// The process's device memory allocator (caching_allocator.cpp), registered for DeviceType::CUDA.
#pragma once
#include "fasttrain/allocator.h"

namespace ft::cuda {

Allocator& device_allocator_instance();

}  // namespace ft::cuda
