#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "fasttrain/fasttrain.h"
#include "fasttrain/npy.h"

using namespace ft;

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(bf16::from_float(1.0f), 0x3f80);
  // 1 + 2^-8 is exactly halfway between two bf16 values: ties to even (down)
  EXPECT_EQ(bf16::from_float(1.00390625f), 0x3f80);
  // 1 + 3*2^-8 is halfway: ties to even (up)
  EXPECT_EQ(bf16::from_float(1.01171875f), 0x3f82);
  EXPECT_TRUE(std::isnan(static_cast<float>(bf16(NAN))));
  EXPECT_EQ(static_cast<float>(bf16(INFINITY)), INFINITY);
}

TEST(DType, F16ConversionsMatchIeee) {
  EXPECT_EQ(f16::from_float(1.0f), 0x3c00);
  EXPECT_EQ(f16::from_float(65504.0f), 0x7bff);
  EXPECT_EQ(f16::from_float(65520.0f), 0x7c00);                  // rounds to inf
  EXPECT_EQ(f16::from_float(5.960464477539063e-08f), 0x0001);    // smallest subnormal
  EXPECT_EQ(f16::from_float(2.98023223876953125e-08f), 0x0000);  // half of it: ties to even
  EXPECT_EQ(f16::from_float(-2.0f), 0xc000);
  for (uint32_t h = 0; h < 0x7c00; ++h) {  // every finite positive half round-trips
    EXPECT_EQ(f16::from_float(f16::to_float(static_cast<uint16_t>(h))), h);
  }
}

// The inlined hardware conversions (F16C builds) and the exact software ones agree on every half
// and on a sweep of floats covering every exponent, rounding tie and subnormal range. NaNs only
// need to stay NaN: the hardware quiets signalling payloads. Without F16C both sides are the
// software conversion and this checks nothing new.
TEST(DType, F16FastConversionsMatchTheSoftwareOnes) {
  auto is_nan16 = [](uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0; };
  for (uint32_t h = 0; h <= 0xffffu; ++h) {
    const float fast = f16::to_float(static_cast<uint16_t>(h)), soft = f16::to_float_software(static_cast<uint16_t>(h));
    if (is_nan16(static_cast<uint16_t>(h))) {
      ASSERT_TRUE(std::isnan(fast) && std::isnan(soft)) << std::hex << h;
    } else {
      ASSERT_EQ(std::memcmp(&fast, &soft, 4), 0) << std::hex << h;
    }
  }
  for (uint64_t u = 0; u <= 0xffffffffull; u += 97) {  // an odd step reaches every low-bit pattern
    float f;
    const auto bits = static_cast<uint32_t>(u);
    std::memcpy(&f, &bits, 4);
    const uint16_t fast = f16::from_float(f), soft = f16::from_float_software(f);
    if (std::isnan(f))
      ASSERT_TRUE(is_nan16(fast) && is_nan16(soft)) << std::hex << bits;
    else
      ASSERT_EQ(fast, soft) << std::hex << bits;
  }
}

// Kernels that write bf16 narrow dense runs with AVX512-BF16's vcvtneps2bf16 where the CPU has it
// (half_tiles.h), which flushes subnormals that bf16::from_float keeps. Both paths must give the
// bits of the scalar conversion: a conversion of a sweep of floats (every exponent, rounding tie,
// subnormal, infinity and NaN), and products of every bf16 with scalars that make subnormal,
// tied and overflowing results, dense and broadcast. Without AVX512-BF16 both sides are the
// scalar conversion.
TEST(DType, Bf16NarrowingInKernelsMatchesTheScalarConversion) {
  auto same = [](uint16_t got, float want) {
    const uint16_t w = bf16::from_float(want);
    return std::isnan(want) ? (got & 0x7fffu) > 0x7f80u : got == w;
  };
  std::vector<float> sweep;
  for (uint64_t u = 0; u <= 0xffffffffull; u += 997) {
    const auto bits = static_cast<uint32_t>(u);
    float f;
    std::memcpy(&f, &bits, 4);
    sweep.push_back(f);
  }
  Tensor narrowed = from_blob(sweep.data(), {static_cast<int64_t>(sweep.size())}).to(DType::BF16);
  const auto* nb = narrowed.data<bf16>();
  for (size_t i = 0; i < sweep.size(); ++i) ASSERT_TRUE(same(nb[i].bits, sweep[i])) << "narrowing " << sweep[i];

  std::vector<uint16_t> all(65536);
  for (uint32_t h = 0; h < 65536; ++h) all[h] = static_cast<uint16_t>(h);
  Tensor every = from_blob(all.data(), {65536}, DType::BF16);
  for (float s : {0.75f, 1.00390625f, 3.0e-30f, -1.0e-38f, 2.0e30f}) {
    SCOPED_TRACE(s);
    const Tensor dense = full({65536}, s, DType::BF16);
    const float sb = static_cast<float>(bf16(s));
    for (const Tensor& p : {every * dense, every * Scalar(static_cast<double>(sb))}) {
      ASSERT_EQ(p.dtype(), DType::BF16);
      const auto* pb = p.data<bf16>();
      for (uint32_t h = 0; h < 65536; ++h)
        ASSERT_TRUE(same(pb[h].bits, bf16::to_float(static_cast<uint16_t>(h)) * sb)) << "product of " << std::hex << h;
    }
  }
}

TEST(DType, Promotion) {
  EXPECT_EQ(promote_types(DType::F32, DType::F64), DType::F64);
  EXPECT_EQ(promote_types(DType::BF16, DType::F16), DType::F32);
  EXPECT_EQ(promote_types(DType::I64, DType::BF16), DType::BF16);
  EXPECT_EQ(promote_types(DType::Bool, DType::U8), DType::U8);
  EXPECT_EQ(promote_types(DType::U8, DType::I32), DType::I32);
}

TEST(Tensor, CreationAndMetadata) {
  Tensor t = zeros({2, 3, 4});
  EXPECT_EQ(t.dim(), 3);
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.strides(), (Strides{12, 4, 1}));
  EXPECT_TRUE(t.is_contiguous());
  Tensor o = ones({3}, DType::I32);
  EXPECT_EQ(o.to_vector(), (std::vector<double>{1, 1, 1}));
  Tensor f = full({2}, 2.5, DType::BF16);
  EXPECT_EQ(f.to_vector(), (std::vector<double>{2.5, 2.5}));
  Tensor a = arange(0, 5, 2);
  EXPECT_EQ(a.to_vector(), (std::vector<double>{0, 2, 4}));
  EXPECT_EQ(arange(5, DType::I64).dtype(), DType::I64);
}

TEST(Tensor, ViewsShareStorage) {
  Tensor t = arange(0, 24).reshape({2, 3, 4});
  Tensor tr = t.transpose(0, 2);
  EXPECT_EQ(tr.shape(), (Shape{4, 3, 2}));
  EXPECT_FALSE(tr.is_contiguous());
  EXPECT_EQ(tr.storage().get(), t.storage().get());
  // element [1][2][0] of the transpose is t[0][2][1] = 9
  EXPECT_EQ(tr.select(0, 1).select(0, 2).select(0, 0).item<double>(), 9);
  Tensor p = t.permute({2, 0, 1});
  EXPECT_EQ(p.shape(), (Shape{4, 2, 3}));
  EXPECT_EQ(p.contiguous().to_vector()[1], 4);
  Tensor s = t.slice(2, 1, 4, 2);
  EXPECT_EQ(s.shape(), (Shape{2, 3, 2}));
  EXPECT_EQ(s.contiguous().to_vector(), (std::vector<double>{1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23}));
  Tensor n = t.narrow(1, 1, 2);
  EXPECT_EQ(n.shape(), (Shape{2, 2, 4}));
  EXPECT_EQ(n.offset(), 4);
  Tensor e = arange(0, 3).reshape({3, 1}).expand({3, 4});
  EXPECT_EQ(e.strides(), (Strides{1, 0}));
  EXPECT_EQ(e.contiguous().to_vector()[5], 1);
  EXPECT_EQ(t.unsqueeze(1).shape(), (Shape{2, 1, 3, 4}));
  EXPECT_EQ(t.unsqueeze(-1).shape(), (Shape{2, 3, 4, 1}));
  EXPECT_EQ(t.unsqueeze(1).squeeze(1).shape(), t.shape());
  EXPECT_EQ(zeros({1, 3, 1}).squeeze().shape(), (Shape{3}));
  EXPECT_EQ(t.view({6, -1}).shape(), (Shape{6, 4}));
  EXPECT_EQ(t.flatten(1).shape(), (Shape{2, 12}));
}

TEST(Tensor, ViewOfNonContiguousNeedsReshape) {
  Tensor t = arange(0, 6).reshape({2, 3}).t();
  EXPECT_THROW(t.view({6}), Error);
  Tensor r = t.reshape({6});
  EXPECT_EQ(r.to_vector(), (std::vector<double>{0, 3, 1, 4, 2, 5}));
  // splitting a dimension of a transposed tensor is still a view
  Tensor u = arange(0, 24).reshape({4, 6}).t();  // [6,4]
  Tensor v = u.view({2, 3, 4});
  EXPECT_EQ(v.storage().get(), u.storage().get());
}

TEST(Tensor, EmptyTensorsAreContiguousAndFill) {
  // Zero elements: nothing is out of place whatever the strides say; random fills and copies of
  // them are no-ops rather than "expected a contiguous tensor" errors.
  for (const Shape& s : {Shape{0}, Shape{5, 0}, Shape{0, 3}, Shape{2, 0, 4}}) {
    Tensor t = randn(s);
    EXPECT_TRUE(t.is_contiguous()) << s.str();
    EXPECT_EQ(t.numel(), 0);
    EXPECT_EQ(t.clone().shape(), s);
  }
  EXPECT_TRUE(empty({3, 4}).t().slice(0, 0, 0).is_contiguous());
}

// fill_ writes the value into every element of a dense tensor and of a strided view, and
// nothing outside the view, for every dtype (dense runs take their own loop).
TEST(Tensor, FillWritesEveryElementOfDenseAndStridedTensors) {
  for (DType dt : {DType::F32, DType::F64, DType::BF16, DType::F16, DType::I32, DType::I64, DType::Bool}) {
    SCOPED_TRACE(dtype_name(dt));
    const double v = dt == DType::Bool ? 1 : 3;
    Tensor dense = zeros({1000 * 37}, TensorOptions(dt));
    dense.fill_(v);
    for (double x : dense.to_vector()) ASSERT_EQ(x, v);
    Tensor base = zeros({64, 37}, TensorOptions(dt));
    base.slice(1, 3, 20).fill_(v);       // columns 3..19: dense runs of 17 elements
    base.t().slice(0, 25, 30).fill_(v);  // columns 25..29 through the transpose: stride 37
    const std::vector<double> got = base.to_vector();
    for (int64_t r = 0; r < 64; ++r)
      for (int64_t c = 0; c < 37; ++c) {
        const bool inside = (c >= 3 && c < 20) || (c >= 25 && c < 30);
        ASSERT_EQ(got[r * 37 + c], inside ? v : 0.0) << r << ", " << c;
      }
  }
}

// Copies between layouts, for every dtype: dense runs of the same dtype (a permute that keeps
// the last dim) are copied as bytes, strided ones element by element; both against indices.
TEST(Tensor, CopiesOfPermutedViewsPutEveryElementInItsPlace) {
  for (DType dt : {DType::F32, DType::F64, DType::BF16, DType::F16, DType::I32, DType::I64}) {
    SCOPED_TRACE(dtype_name(dt));
    Tensor x = arange(0, 2 * 3 * 4 * 5).reshape({2, 3, 4, 5}).to(dt);
    for (const std::vector<int64_t>& perm : {std::vector<int64_t>{0, 2, 1, 3}, std::vector<int64_t>{3, 1, 0, 2}}) {
      Tensor p = x.permute(perm);
      const std::vector<double> got = p.contiguous().to_vector();
      int64_t k = 0;
      for (int64_t a = 0; a < p.size(0); ++a)
        for (int64_t b = 0; b < p.size(1); ++b)
          for (int64_t c = 0; c < p.size(2); ++c)
            for (int64_t d = 0; d < p.size(3); ++d, ++k) {
              int64_t idx[4];
              idx[perm[0]] = a, idx[perm[1]] = b, idx[perm[2]] = c, idx[perm[3]] = d;
              ASSERT_EQ(got[k], ((idx[0] * 3 + idx[1]) * 4 + idx[2]) * 5 + idx[3]);
            }
    }
  }
}

// empty_like / zeros_like / ones_like / full_like keep a dense tensor's layout (PyTorch's
// preserve_format) and give slices and broadcasts contiguous strides; values fill every element.
TEST(Tensor, LikeFunctionsPreserveTheLayoutOfDenseTensors) {
  Tensor x = randn({2, 3, 4, 5});
  Tensor cl = x.contiguous_channels_last();
  Tensor tr = randn({6, 7}).t();
  Tensor perm = x.permute({2, 0, 3, 1});
  for (const Tensor& t : {x, cl, tr, perm}) {
    SCOPED_TRACE(t.strides().str());
    EXPECT_EQ(empty_like(t).strides(), t.strides());
    EXPECT_EQ(zeros_like(t).strides(), t.strides());
    Tensor f = full_like(t, 2.5);
    EXPECT_EQ(f.strides(), t.strides());
    for (double v : f.to_vector()) ASSERT_EQ(v, 2.5);
    for (double v : ones_like(t).to_vector()) ASSERT_EQ(v, 1.0);
  }
  EXPECT_TRUE(ones_like(cl).is_channels_last());
  Tensor slice = randn({4, 6}).slice(1, 1, 4);  // gaps between rows
  EXPECT_EQ(ones_like(slice).strides(), (Strides{3, 1}));
  Tensor broadcast = randn({1, 5}).expand({3, 5});  // rows overlap
  EXPECT_EQ(zeros_like(broadcast).strides(), (Strides{5, 1}));
  EXPECT_EQ(empty_like(randn({3, 1, 4}).permute({2, 1, 0})).strides(), (Strides{1, 4, 4}));
}

TEST(Tensor, ChannelsLast) {
  Tensor x = arange(0, 2 * 3 * 4 * 5).reshape({2, 3, 4, 5});
  Tensor cl = x.contiguous_channels_last();
  EXPECT_TRUE(cl.is_channels_last());
  EXPECT_FALSE(cl.is_contiguous());
  EXPECT_EQ(cl.strides(), (Strides{60, 1, 15, 3}));
  EXPECT_EQ(cl.to_vector(), x.to_vector());
  // Dtype conversions keep the memory format (autocast's bf16 copies of NHWC tensors), and so
  // does the gradient flowing back through them.
  Tensor leaf = cl.to(DType::F32).detach().requires_grad_();
  ASSERT_TRUE(leaf.is_channels_last());
  Tensor b = leaf.to(DType::BF16);
  EXPECT_TRUE(b.is_channels_last());
  EXPECT_FALSE(b.is_contiguous());
  EXPECT_EQ(b.to_vector(), x.to_vector());
  sum(b.to(DType::F32)).backward();
  EXPECT_EQ(leaf.grad().dtype(), DType::F32);
  EXPECT_EQ(leaf.grad().to_vector(), std::vector<double>(120, 1.0));
}

TEST(Tensor, DtypeConversions) {
  Tensor x = from_vector({1.5, -2.25, 3.0, 1e-3}, {4});
  Tensor b = x.to(DType::BF16);
  EXPECT_EQ(b.dtype(), DType::BF16);
  EXPECT_NEAR(b.to_vector()[3], 1e-3, 1e-5);
  Tensor i = x.to(DType::I32);
  EXPECT_EQ(i.to_vector(), (std::vector<double>{1, -2, 3, 0}));
  Tensor bo = x.to(DType::Bool);
  EXPECT_EQ(bo.to_vector(), (std::vector<double>{1, 1, 1, 1}));
  Tensor h = x.to(DType::F16).to(DType::F64);
  EXPECT_EQ(h.to_vector()[0], 1.5);
  EXPECT_TRUE(x.to(DType::F32).same(x));  // no-op conversion returns self
  // strided source converts in logical order
  Tensor t = arange(0, 6).reshape({2, 3}).t().to(DType::I64);
  EXPECT_EQ(t.contiguous().to_vector(), (std::vector<double>{0, 3, 1, 4, 2, 5}));
}

TEST(Tensor, FromBlobIsZeroCopy) {
  std::vector<float> buf = {1, 2, 3, 4, 5, 6};
  AllocatorStats before = allocator_for(Device::cpu()).stats();
  Tensor t = from_blob(buf.data(), {2, 3});
  AllocatorStats after = allocator_for(Device::cpu()).stats();
  EXPECT_EQ(t.raw_data(), buf.data());
  EXPECT_EQ(after.num_allocs, before.num_allocs);
  EXPECT_EQ(after.allocated_bytes, before.allocated_bytes);
  buf[4] = 50;
  EXPECT_EQ(t.select(0, 1).select(0, 1).item<float>(), 50);
  bool deleted = false;
  {
    Tensor owned = from_blob(buf.data(), {6}, DType::F32, [&](void* p) {
      EXPECT_EQ(p, buf.data());
      deleted = true;
    });
    Tensor view = owned.slice(0, 2, 4);
    owned = Tensor();
    EXPECT_FALSE(deleted);  // a view keeps the storage alive
  }
  EXPECT_TRUE(deleted);
}

TEST(Tensor, CachingAllocatorReusesBlocks) {
  Allocator& a = allocator_for(Device::cpu());
  { Tensor warm = empty({1000, 1000}); }
  AllocatorStats s0 = a.stats();
  for (int i = 0; i < 10; ++i) Tensor t = empty({1000, 1000});
  AllocatorStats s1 = a.stats();
  EXPECT_EQ(s1.num_system_allocs, s0.num_system_allocs);
  EXPECT_EQ(s1.num_allocs, s0.num_allocs + 10);
  EXPECT_EQ(s1.allocated_bytes, s0.allocated_bytes);
  EXPECT_GE(s1.peak_allocated_bytes, 4000000);
}

// The size classes below 512 bytes (80, 96, 160, ...) are not multiples of the 64-byte alignment,
// which aligned_alloc requires: a sanitizer build stops there unless the allocator rounds up.
TEST(Tensor, CachingAllocatorServesSmallSizesAligned) {
  Allocator& a = allocator_for(Device::cpu());
  a.empty_cache();  // every class below comes from the system
  for (size_t n = 1; n <= 600; ++n) {
    DataPtr p = a.allocate(n, Stream{Device::cpu()});
    ASSERT_NE(p.get(), nullptr) << n;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p.get()) % 64, 0u) << n;
    std::memset(p.get(), 0xab, n);
  }
}

TEST(Tensor, MemoryLimitRaisesOutOfMemoryAndRecovers) {
  Allocator& a = allocator_for(Device::cpu());
  a.set_memory_limit(a.stats().allocated_bytes + (1 << 20));
  try {
    Tensor big = empty({1 << 20});  // 4 MiB
    a.set_memory_limit(0);
    FAIL() << "expected OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    EXPECT_NE(std::string(e.what()).find("requested 4194304 bytes"), std::string::npos) << e.what();
  }
  a.set_memory_limit(0);
  Tensor ok = empty({1 << 20});
  EXPECT_EQ(ok.numel(), 1 << 20);
}

TEST(Tensor, ClearErrors) {
  Tensor t = zeros({2, 3});
  try {
    t.view({4});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("invalid for a tensor of 6 elements"), std::string::npos) << e.what();
  }
  EXPECT_THROW(t.transpose(0, 2), Error);
  EXPECT_THROW(t.expand({3, 3}), Error);
  EXPECT_THROW(t.permute({0, 0}), Error);
  EXPECT_THROW(t.narrow(1, 2, 2), Error);
  EXPECT_THROW(t.to(Device::cuda(0)).numel(), Error);
  EXPECT_THROW(Device::parse("gpu"), Error);
  EXPECT_THROW(zeros({2}).item<float>(), Error);
  EXPECT_THROW(t.data<double>(), Error);
  EXPECT_THROW(zeros({2}, DType::I64).requires_grad_(), Error);
  EXPECT_THROW(dtype_from_name("float8"), Error);
}

TEST(Tensor, DeviceParsing) {
  EXPECT_EQ(Device::parse("cpu"), Device::cpu());
  EXPECT_EQ(Device::parse("cuda:1"), Device::cuda(1));
  EXPECT_EQ(Device::cuda(2).str(), "cuda:2");
}

TEST(Tensor, Printing) {
  Tensor t = from_vector({1, 2.5, -3, 4}, {2, 2});
  std::string s = to_string(t);
  EXPECT_NE(s.find("[[1.0000, 2.5000]"), std::string::npos) << s;
  EXPECT_NE(s.find("dtype=f32"), std::string::npos) << s;
  std::string big = to_string(zeros({2000}));
  EXPECT_NE(big.find("..."), std::string::npos);
  EXPECT_NE(to_string(arange(0, 3, 1, DType::I64)).find("[0, 1, 2]"), std::string::npos);
}

TEST(Random, SameSeedSameNumbersAnyThreadCount) {
  int saved = get_num_threads();
  Generator g1(42), g2(42);
  set_num_threads(1);
  Tensor a = randn({1000, 37}, {}, &g1);
  set_num_threads(2);
  Tensor b = randn({1000, 37}, {}, &g2);
  set_num_threads(saved);
  EXPECT_EQ(a.to_vector(), b.to_vector());
  Tensor c = randn({1000, 37}, {}, &g1);  // generator advanced: different numbers
  EXPECT_NE(a.to_vector(), c.to_vector());
}

TEST(Random, DistributionsHaveExpectedMoments) {
  Generator g(7);
  std::vector<double> n = randn({200000}, DType::F64, &g).to_vector();
  double m = 0, v = 0;
  for (double x : n) m += x;
  m /= n.size();
  for (double x : n) v += (x - m) * (x - m);
  v /= n.size();
  EXPECT_NEAR(m, 0.0, 0.01);
  EXPECT_NEAR(v, 1.0, 0.02);
  std::vector<double> u = rand({100000}, {}, &g).to_vector();
  double um = 0;
  for (double x : u) {
    ASSERT_GE(x, 0.0);
    ASSERT_LT(x, 1.0);
    um += x;
  }
  EXPECT_NEAR(um / u.size(), 0.5, 0.01);
  std::vector<double> r = randint(3, 7, {10000}, DType::I64, &g).to_vector();
  std::vector<int> counts(4, 0);
  for (double x : r) {
    ASSERT_GE(x, 3);
    ASSERT_LT(x, 7);
    counts[static_cast<int>(x) - 3]++;
  }
  for (int c : counts) EXPECT_NEAR(c, 2500, 200);
}

TEST(Random, PhiloxKnownAnswer) {
  // Known-answer vector from the Random123 distribution (philox4x32-10, ctr=0, key=0).
  Philox4 r = philox4x32(0, 0, 0);
  EXPECT_EQ(r.v[0], 0x6627e8d5u);
  EXPECT_EQ(r.v[1], 0xe169c58du);
  EXPECT_EQ(r.v[2], 0xbc57ac4cu);
  EXPECT_EQ(r.v[3], 0x9b00dbd8u);
}

TEST(Random, ManualSeedResetsDefaultGenerator) {
  manual_seed(3);
  Tensor a = rand({10});
  manual_seed(3);
  Tensor b = rand({10});
  EXPECT_EQ(a.to_vector(), b.to_vector());
}

TEST(Npy, RoundTrip) {
  Tensor x = randn({3, 4}, DType::F64);
  std::string path = ::testing::TempDir() + "/rt.npy";
  save_npy(path, x.t());
  Tensor y = load_npy(path);
  EXPECT_EQ(y.shape(), (Shape{4, 3}));
  EXPECT_EQ(y.to_vector(), x.t().contiguous().to_vector());
}

TEST(Npy, RejectsMalformedFiles) {
  std::string path = ::testing::TempDir() + "/bad.npy";
  {
    std::ofstream f(path, std::ios::binary);
    f << "not numpy at all";
  }
  try {
    load_npy(path);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bad.npy: not a .npy file"), std::string::npos) << e.what();
  }
  save_npy(path, zeros({10}));
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 4);
  try {
    load_npy(path);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("but the file holds 36 bytes"), std::string::npos) << e.what();
  }
}

TEST(Tensor, ItemReadsWithoutAllocating) {
  Tensor x = from_vector({1.5, -2.0, 3.25}, {3}, DType::BF16);
  Tensor one = x.slice(0, 2, 3);
  AllocatorStats before = allocator_for(Device::cpu()).stats();
  EXPECT_EQ(one.item<double>(), 3.25);
  EXPECT_EQ(arange(7, 8, 1, DType::I64).item<int64_t>(), 7);
  AllocatorStats after = allocator_for(Device::cpu()).stats();
  EXPECT_EQ(after.num_allocs, before.num_allocs + 1);  // only arange's own tensor
}

TEST(Npy, RejectsShapesWhoseByteSizeOverflows) {
  std::string path = ::testing::TempDir() + "/huge.npy";
  {
    std::string header = "{'descr': '<f8', 'fortran_order': False, 'shape': (4611686018427387904, 4), }";
    header.append((64 - (10 + header.size() + 1) % 64) % 64, ' ');
    header.push_back('\n');
    std::ofstream f(path, std::ios::binary);
    f.write("\x93NUMPY\x01\x00", 8);
    uint16_t len = static_cast<uint16_t>(header.size());
    f.write(reinterpret_cast<const char*>(&len), 2);
    f << header;  // 2^62 * 4 * 8 bytes wraps to 0 without a checked product: no data at all
  }
  try {
    load_npy(path);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is too large"), std::string::npos) << e.what();
  }
}

// --detect-sync's counter sees nothing on the CPU: item(), copies and synchronize() of the CPU
// stream wait on no device.
TEST(SyncTracker, CpuWorkWaitsOnNoDevice) {
  const SyncTracker syncs;
  Tensor x = randn({8, 8});
  (void)sum(x).item<double>();
  (void)x.to(Device::cpu(), DType::BF16);
  synchronize(current_stream(Device::cpu()));
  EXPECT_EQ(syncs.total(), 0);
  EXPECT_EQ(syncs.summary(), "none");
}
