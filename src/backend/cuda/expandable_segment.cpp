// Expandable segments (expandable_segment.h): the driver's virtual memory calls behind one span.
#include "backend/cuda/expandable_segment.h"

#include <cuda.h>
#include <cuda_runtime.h>

#include "backend/cuda/cuda_check.h"
#include "core/switches.h"

namespace ft::cuda {
namespace {

// The driver entry points, looked up once through the runtime (no libcuda at link time).
struct DriverVm {
  decltype(&::cuMemAddressReserve) address_reserve = nullptr;
  decltype(&::cuMemAddressFree) address_free = nullptr;
  decltype(&::cuMemCreate) create = nullptr;
  decltype(&::cuMemRelease) release = nullptr;
  decltype(&::cuMemMap) map = nullptr;
  decltype(&::cuMemUnmap) unmap = nullptr;
  decltype(&::cuMemSetAccess) set_access = nullptr;
  decltype(&::cuMemGetAllocationGranularity) granularity = nullptr;
};

template <class F>
void look_up(const char* symbol, F& fn) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  // 12000: the signatures of CUDA 12.0, unchanged since for these calls.
  check(cudaGetDriverEntryPointByVersion(symbol, &p, 12000, cudaEnableDefault, &found),
        "expandable segments: driver entry point");
  FT_CHECK(found == cudaDriverEntryPointSuccess && p != nullptr, "expandable segments: the driver has no ", symbol,
           " (FT_CUDA_EXPANDABLE_SEGMENTS needs the driver's virtual memory management)");
  fn = reinterpret_cast<F>(p);
}

const DriverVm& driver_vm() {
  static const DriverVm vm = [] {
    DriverVm v;
    look_up("cuMemAddressReserve", v.address_reserve);
    look_up("cuMemAddressFree", v.address_free);
    look_up("cuMemCreate", v.create);
    look_up("cuMemRelease", v.release);
    look_up("cuMemMap", v.map);
    look_up("cuMemUnmap", v.unmap);
    look_up("cuMemSetAccess", v.set_access);
    look_up("cuMemGetAllocationGranularity", v.granularity);
    return v;
  }();
  return vm;
}

void check_driver(CUresult r, const char* what) {
  FT_CHECK(r == CUDA_SUCCESS, "expandable segments: ", what, " failed (CUresult ", static_cast<int>(r), ")");
}

CUmemAllocationProp device_memory(int device) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}

uint64_t granule_of(int device) {
  const CUmemAllocationProp prop = device_memory(device);
  size_t granule = 0;
  check_driver(driver_vm().granularity(&granule, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED), "granularity");
  return granule;
}

// The span: the device's memory, rounded up to granules (addresses are plentiful; memory is not).
RangeAllocator span_of(int device) {
  check(cudaSetDevice(device), "expandable segments: set device");
  const uint64_t granule = granule_of(device);
  size_t free_b = 0, total_b = 0;
  check(cudaMemGetInfo(&free_b, &total_b), "expandable segments: device memory");
  return RangeAllocator((total_b + granule - 1) / granule * granule, granule);
}

}  // namespace

ExpandableSegment::ExpandableSegment(int device) : device_(device), ranges_(span_of(device)) {
  CUdeviceptr base = 0;
  check_driver(driver_vm().address_reserve(&base, ranges_.capacity(), ranges_.granule(), 0, 0), "cuMemAddressReserve");
  base_ = base;
}

ExpandableSegment::~ExpandableSegment() {
  const DriverVm& vm = driver_vm();
  for (const auto& [granule, handle] : mapped_) {
    vm.unmap(base_ + granule * ranges_.granule(), ranges_.granule());
    vm.release(handle);
  }
  vm.address_free(base_, ranges_.capacity());
}

bool ExpandableSegment::map(uint64_t first, uint64_t last, int64_t& mapped_bytes, int64_t& created) {
  const DriverVm& vm = driver_vm();
  const uint64_t g = ranges_.granule();
  const CUmemAllocationProp prop = device_memory(device_);
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  for (uint64_t i = first; i < last; ++i) {
    if (mapped_.count(i) != 0) continue;
    CUmemGenericAllocationHandle handle = 0;
    const CUresult r = vm.create(&handle, g, &prop, 0);
    if (r == CUDA_ERROR_OUT_OF_MEMORY) return false;
    check_driver(r, "cuMemCreate");
    if (const CUresult m = vm.map(base_ + i * g, g, 0, handle, 0); m != CUDA_SUCCESS) {
      vm.release(handle);
      check_driver(m, "cuMemMap");
    }
    check_driver(vm.set_access(base_ + i * g, g, &access, 1), "cuMemSetAccess");
    mapped_.emplace(i, handle);
    mapped_bytes += static_cast<int64_t>(g);
    ++created;
  }
  return true;
}

ExpandableSegment::Placed ExpandableSegment::allocate(uint64_t size) {
  Placed placed;
  const std::optional<uint64_t> offset = ranges_.allocate(size);
  if (!offset) return placed;
  const auto [first, last] = ranges_.granules_of(*offset, size);
  if (!map(first, last, placed.mapped_bytes, placed.granules_created)) {
    ranges_.free(*offset);
    placed.out_of_memory = true;
    return placed;
  }
  placed.ptr = reinterpret_cast<void*>(base_ + *offset);
  return placed;
}

uint64_t ExpandableSegment::free(void* ptr) { return ranges_.free(reinterpret_cast<uint64_t>(ptr) - base_); }

int64_t ExpandableSegment::unmap_free() {
  const DriverVm& vm = driver_vm();
  const uint64_t g = ranges_.granule();
  int64_t unmapped = 0;
  ranges_.free_granules([&](uint64_t first, uint64_t last) {
    for (auto it = mapped_.lower_bound(first); it != mapped_.end() && it->first < last;) {
      check_driver(vm.unmap(base_ + it->first * g, g), "cuMemUnmap");
      check_driver(vm.release(it->second), "cuMemRelease");
      unmapped += static_cast<int64_t>(g);
      it = mapped_.erase(it);
    }
  });
  return unmapped;
}

bool expandable_segments_requested() { return switches::cuda_expandable_segments.get(); }

}  // namespace ft::cuda
