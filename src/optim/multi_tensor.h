// What the multi-tensor optimizers (SGD, Adam/AdamW, LAMB, LARS) share: per-parameter state
// with its save/load as named tensors, and the preparation of a step. A step gathers every
// parameter that has a gradient into a list of backend::Segments (raw pointers and dtypes, laid
// end to end in one flat index space) and hands it to its device's kernel-table entry
// (sgd_step, adam_step, lamb_step, lars_step), which updates all of them in one pass
// (backend/multi_tensor.h; the math is in backend/optim_math.h). No allocation happens in a step
// once the state exists (the segment list keeps its capacity).
//
// The per-parameter step count lives in the parameter's device memory (a 0-d i64 tensor per
// parameter, PyTorch's capturable style): the kernels read it and advance it by 1 - found_inf, so
// a skipped step leaves parameters, moments and step counts untouched without the host ever
// reading the flag.
#pragma once
#include <vector>

#include "backend/kernels.h"
#include "backend/multi_tensor.h"
#include "fasttrain/optim.h"

namespace ft::optim::detail {

struct ParamState {
  Tensor step;  // 0-d i64, created at the parameter's first step; 0 while every step was skipped
  int64_t buffers_first_step = 0;
  std::vector<Tensor> buffers;
  Tensor master;
};

class MultiTensorOptimizer : public Optimizer {
 public:
  // prepare_step, the optimizer's passes (update), finish_step, under NoGrad.
  void step() final { run_step(nullptr); }
  void step(const Tensor& found_inf) final { run_step(&found_inf); }
  TensorMap state_tensors() const override;
  void load_state_tensors(const TensorMap& state) override;
  void replayed_step() override { finish_step(); }

 protected:
  explicit MultiTensorOptimizer(std::vector<ParamGroup> groups);
  // The per-element buffers a parameter of a group with these options keeps.
  virtual int num_buffers(const GroupOptions& options) const = 0;
  virtual const char* buffer_name(int index) const = 0;
  // Throws ft::Error with PyTorch's message for an invalid hyper-parameter of group `g`.
  virtual void check_options(const GroupOptions& options, size_t g) const = 0;
  void check_all_options() const;           // call from the derived constructor
  std::string group_label(size_t g) const;  // "group 1 ('no_decay')", for messages
  // PyTorch's checks shared by a family, with its messages: lr, eps, betas and weight decay
  // (Adam, AdamW, LAMB); lr, momentum and weight decay (SGD, LARS).
  void check_adam_family_options(const GroupOptions& o, size_t g) const;
  void check_momentum_family_options(const GroupOptions& o, size_t g) const;

  // The optimizer's step over the segments: calls its entry of the device's kernel table.
  virtual void update(const backend::Kernels& kernels, const backend::MultiTensorStep& step) = 0;

  // Validates every group and gradient first, then creates missing state and fills segments_
  // (the kernel advances the step counts). Returns the number of elements.
  int64_t prepare_step(const Tensor* found_inf);
  // Bumps the version counters of the updated parameters and the optimizer's step count.
  void finish_step();

  std::vector<std::vector<ParamState>> state_;  // [group][parameter]
  std::vector<backend::Segment> segments_;
  std::vector<Tensor> contiguous_grads_;  // gradients copied into their parameter's memory order, held for the pass

 private:
  void run_step(const Tensor* found_inf);
};

}  // namespace ft::optim::detail
