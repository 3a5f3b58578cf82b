// CUDA kernels of copy (with dtype conversion, any strides and broadcast) and fill (kernel-table
// entries copy, fill; the CPU's are in backend/cpu/copy.cpp).
//
// copy: dst[i] = convert(src[i]) through the compute type, rounding to nearest even into 16-bit
// floats as the CPU does; same dtype and layout, both dense, is one device-to-device memcpy.
// fill: every element gets the bit pattern of the value converted to dst's dtype on the host;
// a dense fill whose bytes are all equal (zeros above all) is one memset, any other an
// elementwise loop storing an unsigned integer of the element's size (elementwise.cuh).
#include <cstring>

#include "backend/cuda/common.cuh"
#include "backend/cuda/elementwise.cuh"
#include "backend/cuda/kernels.h"
#include "fasttrain/dtype.h"

namespace ft::cuda {

namespace {

struct IdentityFn {
  template <class C>
  __device__ __forceinline__ C operator()(C v) const {
    return v;
  }
};

// A fill writes the element's bit pattern, an unsigned integer of the element's size.
template <class U>
struct ConstantFn {
  U bits;
  __device__ __forceinline__ U operator()() const { return bits; }
};

// The element bit pattern fill writes, converted on the host exactly as the CPU's fill converts
// the value (integers from the integer value, floats through the compute type, 16-bit floats with
// ft::bf16/ft::f16's round-to-nearest-even).
template <class T>
uint64_t bits_of(T v) {
  static_assert(sizeof(T) <= sizeof(uint64_t));
  uint64_t b = 0;
  std::memcpy(&b, &v, sizeof(T));  // little-endian: the element is the low bytes
  return b;
}

uint64_t fill_bits(DType dt, Scalar value) {
  switch (dt) {
    case DType::F32: return bits_of(static_cast<float>(value.to_double()));
    case DType::F64: return bits_of(value.to_double());
    case DType::BF16: return bits_of(ft::bf16(static_cast<float>(value.to_double())));
    case DType::F16: return bits_of(ft::f16(static_cast<float>(value.to_double())));
    case DType::I32: return bits_of(static_cast<int32_t>(value.to_int()));
    case DType::I64: return bits_of(static_cast<int64_t>(value.to_int()));
    case DType::U8: return bits_of(static_cast<uint8_t>(value.to_int()));
    case DType::Bool: return bits_of(static_cast<bool>(value.to_double() != 0));
  }
  FT_FAIL("fill: invalid dtype code ", static_cast<int>(dt));
}

}  // namespace

// --- kernel-table entries ---

void copy(const Tensor& dst, const Tensor& src) {
  if (dst.numel() == 0) return;
  // Same dtype, both dense in the same layout: one device-to-device copy.
  if (dst.dtype() == src.dtype() && dst.shape() == src.shape() && dst.is_contiguous() && src.is_contiguous()) {
    if (dst.raw_data() == src.raw_data()) return;
    cudaStream_t stream = stream_for(dst);
    check(cudaMemcpyAsync(dst.raw_data(), src.raw_data(), dst.nbytes(), cudaMemcpyDeviceToDevice, stream), "copy");
    return;
  }
  FT_CUDA_DISPATCH_ALL(dst.dtype(), "copy", [&] {
    using To = scalar_t;
    FT_CUDA_DISPATCH_ALL(src.dtype(), "copy",
                         [&] { launch_elementwise<To, scalar_t>("copy", dst, {&src}, IdentityFn{}); });
  });
}

void fill(const Tensor& dst, Scalar value) {
  if (dst.numel() == 0) return;
  const uint64_t bits = fill_bits(dst.dtype(), value);
  const size_t es = dst.element_size();
  // A dense fill whose bytes are all equal (zeros above all) is a memset.
  const backend::StridedLoop L = backend::make_loop(dst, {});
  const bool dense = L.ndim == 1 && (L.numel == 1 || L.strides[0][0] == static_cast<int64_t>(es));
  bool uniform_bytes = true;
  for (size_t k = 1; k < es; ++k) uniform_bytes &= ((bits >> (8 * k)) & 0xff) == (bits & 0xff);
  if (dense && uniform_bytes) {
    cudaStream_t stream = stream_for(dst);
    check(cudaMemsetAsync(L.base[0], static_cast<int>(bits & 0xff), L.numel * es, stream), "fill");
    return;
  }
  switch (es) {
    case 1: return launch_elementwise<uint8_t>("fill", dst, {}, ConstantFn<uint8_t>{static_cast<uint8_t>(bits)});
    case 2: return launch_elementwise<uint16_t>("fill", dst, {}, ConstantFn<uint16_t>{static_cast<uint16_t>(bits)});
    case 4: return launch_elementwise<uint32_t>("fill", dst, {}, ConstantFn<uint32_t>{static_cast<uint32_t>(bits)});
    case 8: return launch_elementwise<uint64_t>("fill", dst, {}, ConstantFn<uint64_t>{bits});
  }
  FT_FAIL("fill: unexpected element size ", es);
}
}  // namespace ft::cuda
