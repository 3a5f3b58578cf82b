// What SGD and Adam/AdamW share: per-parameter state with its save/load as named tensors, and
// the multi-tensor pass. A step gathers every parameter that has a gradient into a list of
// Segments laid end to end in one flat index space, then runs ONE parallel_for over all of it:
// each thread takes an equal share of the elements, whatever the tensor sizes (a big tensor is
// split between threads, many small ones share one), and applies the whole update to each
// element in one read and one write of p, g and the moments. No allocation happens in a step
// once the state exists (the segment list keeps its capacity).
#pragma once
#include <algorithm>
#include <vector>

#include "fasttrain/optim.h"
#include "fasttrain/parallel.h"

namespace ft::optim::detail {

// Per-element work of one parameter, as raw pointers for the kernels.
struct Segment {
  int64_t begin = 0;  // position of the first element in the flat index space of the step
  int64_t numel = 0;
  void* param = nullptr;
  DType param_dtype = DType::F32;
  const void* grad = nullptr;
  DType grad_dtype = DType::F32;
  float* master = nullptr;        // fp32 copy of a bf16/f16 parameter; null otherwise
  void* buffers[2] = {nullptr, nullptr};  // the optimizer's buffers, f32 (f64 for f64 parameters)
  bool fresh_buffers = false;     // allocated (zeroed) this step: SGD's first momentum step
  int64_t step = 0;               // this parameter's step count, including this step
  const GroupOptions* options = nullptr;
};

struct ParamState {
  int64_t step = 0;
  std::vector<Tensor> buffers;
  Tensor master;
};

class MultiTensorOptimizer : public Optimizer {
 public:
  TensorMap state_tensors() const override;
  void load_state_tensors(const TensorMap& state) override;

 protected:
  explicit MultiTensorOptimizer(std::vector<ParamGroup> groups);
  // The per-element buffers a parameter of a group with these options keeps.
  virtual int num_buffers(const GroupOptions& options) const = 0;
  virtual const char* buffer_name(int index) const = 0;
  // Throws ft::Error with PyTorch's message for an invalid hyper-parameter of group `g`.
  virtual void check_options(const GroupOptions& options, size_t g) const = 0;
  void check_all_options() const;  // call from the derived constructor
  std::string group_label(size_t g) const;  // "group 1 ('no_decay')", for messages

  // Validates every group and gradient first, then creates missing state, counts the step of
  // each parameter with a gradient, and fills segments_. Returns the number of elements.
  int64_t prepare_step();
  // Bumps the version counters of the updated parameters and the optimizer's step count.
  void finish_step();

  // Calls kernel(segment, first, count) for each piece of [0, total) a thread owns.
  template <class Kernel>
  void run_pass(int64_t total, const Kernel& kernel) const;

  std::vector<std::vector<ParamState>> state_;  // [group][parameter]
  std::vector<Segment> segments_;
  std::vector<Tensor> contiguous_grads_;  // gradients copied into their parameter's memory order, held for the pass
};

template <class Kernel>
void MultiTensorOptimizer::run_pass(int64_t total, const Kernel& kernel) const {
  // ~64 KiB of f32 per chunk at least: smaller work is not worth waking a thread for.
  constexpr int64_t kGrain = 16384;
  struct Context {
    const std::vector<Segment>* segments;
    const Kernel* kernel;
  } ctx{&segments_, &kernel};
  // The lambda captures one pointer, so std::function stores it inline (no allocation).
  parallel_for(0, total, kGrain, [c = &ctx](int64_t begin, int64_t end) {
    const auto& segs = *c->segments;
    auto it = std::upper_bound(segs.begin(), segs.end(), begin,
                               [](int64_t x, const Segment& s) { return x < s.begin; }) - 1;
    for (; it != segs.end() && it->begin < end; ++it) {
      const int64_t lo = std::max(begin, it->begin), hi = std::min(end, it->begin + it->numel);
      if (lo < hi) (*c->kernel)(*it, lo - it->begin, hi - lo);
    }
  });
}

// Calls f(P{}, G{}) with the C++ types of a segment's parameter and gradient (the combinations
// prepare_step accepts: f64 with f64; f32/bf16/f16 parameters with f32/bf16/f16 gradients).
template <class F>
void dispatch_param_grad(DType param, DType grad, F&& f) {
  auto with_grad = [&](auto p) {
    switch (grad) {
      case DType::F32: return f(p, float{});
      case DType::BF16: return f(p, bf16{});
      case DType::F16: return f(p, f16{});
      default: FT_FAIL("optimizer: unsupported gradient dtype ", dtype_name(grad));
    }
  };
  switch (param) {
    case DType::F64:
      FT_CHECK(grad == DType::F64, "optimizer: f64 parameter with a ", dtype_name(grad), " gradient");
      return f(double{}, double{});
    case DType::F32: return with_grad(float{});
    case DType::BF16: return with_grad(bf16{});
    case DType::F16: return with_grad(f16{});
    default: FT_FAIL("optimizer: unsupported parameter dtype ", dtype_name(param));
  }
}

// The arithmetic type of an update: f64 for f64 parameters, f32 for everything else.
template <class P>
using update_t = std::conditional_t<std::is_same_v<P, double>, double, float>;
template <class P>
inline constexpr bool has_master_v = std::is_same_v<P, bf16> || std::is_same_v<P, f16>;

}  // namespace ft::optim::detail
