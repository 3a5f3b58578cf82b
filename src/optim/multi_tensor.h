// What the multi-tensor optimizers (SGD, Adam/AdamW, LAMB, LARS) share: per-parameter state
// with its save/load as named tensors, and the multi-tensor pass. A step gathers every parameter
// that has a gradient into a list of Segments laid end to end in one flat index space, then runs
// ONE parallel_for over all of it: each thread takes an equal share of the elements, whatever
// the tensor sizes (a big tensor is split between threads, many small ones share one), and
// applies the whole update to each element in one read and one write of p, g and the moments. No allocation happens in a step
// once the state exists (the segment list keeps its capacity).
//
// The per-parameter step count lives in memory (a 0-d i64 tensor per parameter, PyTorch's
// capturable style) and the kernels read it there: step(found_inf) advances it by
// 1 - found_inf and every pass returns at once when the flag is set, so a skipped step leaves
// parameters, moments and step counts untouched without the host ever reading the flag (the
// CUDA backend launches the same kernels on device memory).
//
// LAMB and LARS also need per-tensor norms: run_norm_pass splits every segment into blocks of a
// fixed size, sums each block in one parallel loop, then adds a segment's blocks in order, so
// the norms (and the result) do not depend on the thread count.
#pragma once
#include <algorithm>
#include <cmath>
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
  // The step at which the buffers were created: the momentum buffer's first update copies the
  // gradient (PyTorch). A skipped step does not advance *step, so the next one is "first" again.
  int64_t buffers_first_step = 0;
  const int64_t* step = nullptr;  // this parameter's step count in memory, including this step
  const GroupOptions* options = nullptr;
  double norms[2] = {0, 0};       // LAMB/LARS: per-tensor norms from run_norm_pass
};

struct ParamState {
  Tensor step;  // 0-d i64, created at the parameter's first step; 0 while every step was skipped
  int64_t buffers_first_step = 0;
  std::vector<Tensor> buffers;
  Tensor master;
};

// Fixed-size pieces of the segments for order-stable reductions.
struct Block {
  int64_t segment = 0, first = 0, numel = 0;
};
inline constexpr int64_t kNormBlock = 16384;

// Fills `out` with the blocks of `count` arrays of numel(i) elements, in array order.
template <class Numel>
void split_into_blocks(int64_t count, const Numel& numel, std::vector<Block>& out) {
  out.clear();
  for (int64_t i = 0; i < count; ++i)
    for (int64_t lo = 0; lo < numel(i); lo += kNormBlock) out.push_back({i, lo, std::min(kNormBlock, numel(i) - lo)});
}

class MultiTensorOptimizer : public Optimizer {
 public:
  // prepare_step, the optimizer's passes (update), finish_step, under NoGrad.
  void step() final { run_step(nullptr); }
  void step(const Tensor& found_inf) final { run_step(&found_inf); }
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
  // PyTorch's checks shared by a family, with its messages: lr, eps, betas and weight decay
  // (Adam, AdamW, LAMB); lr, momentum and weight decay (SGD, LARS).
  void check_adam_family_options(const GroupOptions& o, size_t g) const;
  void check_momentum_family_options(const GroupOptions& o, size_t g) const;

  // The optimizer's passes over the `total` elements of segments_.
  virtual void update(int64_t total) = 0;

  // Validates every group and gradient first, then creates missing state, advances the step
  // count of each parameter with a gradient (by 1, or by 1 - *found_inf when a flag is given:
  // the skip decision is taken here and in the passes, by reading the flag's memory), remembers
  // the flag for the passes and fills segments_. Returns the number of elements.
  int64_t prepare_step(const Tensor* found_inf);
  // Bumps the version counters of the updated parameters and the optimizer's step count.
  void finish_step();

  // Calls kernel(segment, first, count) for each piece of [0, total) a thread owns; nothing when
  // the step's found_inf flag is set.
  template <class Kernel>
  void run_pass(int64_t total, const Kernel& kernel) const;
  // Per-tensor norms for LAMB/LARS: kernel(segment, first, count, sums) adds its squared sums to
  // sums[0..1] (f64) for one block; afterwards segment.norms[k] = sqrt(sum over its blocks, in
  // order). Segments for which wanted(segment) is false are left out. Nothing when skipped.
  template <class Kernel, class Wanted>
  void run_norm_pass(const Kernel& kernel, const Wanted& wanted);
  bool step_skipped() const { return skip_flag_ != nullptr && *skip_flag_ != 0; }

  std::vector<std::vector<ParamState>> state_;  // [group][parameter]
  std::vector<Segment> segments_;
  std::vector<Tensor> contiguous_grads_;  // gradients copied into their parameter's memory order, held for the pass
  const float* skip_flag_ = nullptr;      // found_inf of the current step(found_inf); null for step()
  std::vector<Block> blocks_;             // run_norm_pass scratch, kept for its capacity
  std::vector<double> block_sums_;

 private:
  void run_step(const Tensor* found_inf);
};

template <class Kernel>
void MultiTensorOptimizer::run_pass(int64_t total, const Kernel& kernel) const {
  // ~64 KiB of f32 per chunk at least: smaller work is not worth waking a thread for.
  constexpr int64_t kGrain = 16384;
  struct Context {
    const std::vector<Segment>* segments;
    const Kernel* kernel;
    const float* skip;
  } ctx{&segments_, &kernel, skip_flag_};
  // The lambda captures one pointer, so std::function stores it inline (no allocation).
  parallel_for(0, total, kGrain, [c = &ctx](int64_t begin, int64_t end) {
    if (c->skip != nullptr && *c->skip != 0) return;  // GradScaler found an inf/NaN
    const auto& segs = *c->segments;
    auto it = std::upper_bound(segs.begin(), segs.end(), begin,
                               [](int64_t x, const Segment& s) { return x < s.begin; }) - 1;
    for (; it != segs.end() && it->begin < end; ++it) {
      const int64_t lo = std::max(begin, it->begin), hi = std::min(end, it->begin + it->numel);
      if (lo < hi) (*c->kernel)(*it, lo - it->begin, hi - lo);
    }
  });
}

template <class Kernel, class Wanted>
void MultiTensorOptimizer::run_norm_pass(const Kernel& kernel, const Wanted& wanted) {
  if (step_skipped()) return;
  split_into_blocks(
      static_cast<int64_t>(segments_.size()),
      [&](int64_t i) { return wanted(segments_[i]) ? segments_[i].numel : int64_t{0}; }, blocks_);
  block_sums_.assign(2 * blocks_.size(), 0.0);
  struct Context {
    MultiTensorOptimizer* self;
    const Kernel* kernel;
  } ctx{this, &kernel};
  parallel_for(0, static_cast<int64_t>(blocks_.size()), 1, [c = &ctx](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const Block& blk = c->self->blocks_[b];
      (*c->kernel)(c->self->segments_[blk.segment], blk.first, blk.numel, c->self->block_sums_.data() + 2 * b);
    }
  });
  for (auto& s : segments_) s.norms[0] = s.norms[1] = 0;
  for (size_t b = 0; b < blocks_.size(); ++b)  // in block order: fixed whatever the threads
    for (int k = 0; k < 2; ++k) segments_[blocks_[b].segment].norms[k] += block_sums_[2 * b + k];
  for (auto& s : segments_)
    for (double& n : s.norms) n = std::sqrt(n);
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

// The values an update works on: the f32 master copy of a bf16/f16 parameter, else the parameter.
template <class P>
update_t<P>* weights(const Segment& s) {
  if constexpr (has_master_v<P>) return s.master;
  else return static_cast<P*>(s.param);
}

}  // namespace ft::optim::detail
