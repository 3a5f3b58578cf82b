#include "fasttrain/autocast.h"

#include <unordered_map>

#include "fasttrain/autograd.h"

namespace ft::autocast {
namespace {

struct CachedCast {
  std::weak_ptr<TensorImpl> source;
  uint32_t version;
  Tensor cast;
};

struct State {
  bool enabled = false;
  DType dtype = DType::BF16;
  int depth = 0;  // nesting of guards; the cache lives until the outermost one exits
  std::unordered_map<const TensorImpl*, CachedCast> cache;
};
thread_local State tls;
std::atomic<int64_t> g_cache_hits{0};

}  // namespace

AutocastGuard::AutocastGuard(DType dtype, bool on) : prev_enabled_(tls.enabled), prev_dtype_(tls.dtype) {
  FT_CHECK(dtype == DType::BF16 || dtype == DType::F16, "autocast: the low-precision dtype must be bf16 or f16, found ",
           dtype_name(dtype));
  tls.enabled = on;
  tls.dtype = dtype;
  ++tls.depth;
}

AutocastGuard::~AutocastGuard() {
  tls.enabled = prev_enabled_;
  tls.dtype = prev_dtype_;
  if (--tls.depth == 0) tls.cache.clear();
}

bool enabled() { return tls.enabled; }
DType lowp_dtype() { return tls.dtype; }

bool needs_lowp(std::initializer_list<const Tensor*> inputs) {
  if (!tls.enabled) return false;
  for (const Tensor* t : inputs)
    if (t && t->defined() && t->dtype() == DType::F32) return true;
  return false;
}

bool needs_fp32(std::initializer_list<const Tensor*> inputs) {
  if (!tls.enabled) return false;
  for (const Tensor* t : inputs)
    if (t && t->defined() && (t->dtype() == DType::BF16 || t->dtype() == DType::F16)) return true;
  return false;
}

Tensor lowp(const Tensor& t) {
  if (!t.defined() || t.dtype() != DType::F32 || !tls.enabled) return t;
  // Parameters (leaves that require grad) are cast once per region: the same weight used by
  // several ops, or by every micro-step of a recurrent use, costs one conversion.
  const bool cacheable = t.is_leaf() && t.requires_grad() && autograd::grad_enabled();
  if (cacheable) {
    auto it = tls.cache.find(t.impl());
    if (it != tls.cache.end() && it->second.source.lock() == t.impl_ptr() && it->second.version == t.version()) {
      g_cache_hits.fetch_add(1, std::memory_order_relaxed);
      return it->second.cast;
    }
  }
  Tensor cast = t.to(tls.dtype);
  if (cacheable) tls.cache[t.impl()] = CachedCast{t.impl_ptr(), t.version(), cast};
  return cast;
}

Tensor fp32(const Tensor& t) {
  if (!t.defined() || (t.dtype() != DType::BF16 && t.dtype() != DType::F16)) return t;
  return t.to(DType::F32);
}

int64_t cache_hits() { return g_cache_hits.load(); }

}  // namespace ft::autocast
