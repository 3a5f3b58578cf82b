// Activation checkpointing (torch.utils.checkpoint): a function or a module runs in forward
// without keeping its intermediate activations — only its inputs are saved — and backward runs
// it again with grad enabled to get them back, trading compute for memory. The default
// generator's state is saved before the forward and restored for the recomputation, so dropout
// masks match bit for bit. Implemented in src/autograd/activation_checkpoint.cpp.
#pragma once
#include <functional>
#include <memory>
#include <vector>

#include "fasttrain/tensor.h"

namespace ft::autograd {

using CheckpointFn = std::function<std::vector<Tensor>(const std::vector<Tensor>& inputs)>;

// outputs = fn(inputs), with fn's activations recomputed in backward. Gradients flow to the
// inputs and to every tensor requiring grad that fn uses (parameters it captures), exactly as
// without checkpointing. Outside grad mode (or when nothing requires grad) it is just fn(inputs).
std::vector<Tensor> checkpoint(const CheckpointFn& fn, const std::vector<Tensor>& inputs);
// Single-input, single-output convenience.
Tensor checkpoint(const std::function<Tensor(const Tensor&)>& fn, const Tensor& input);

// True while a checkpointed function is being re-run in backward. Layers with side effects that
// must happen once per forward skip them then: BatchNorm does not update its running statistics
// (or num_batches_tracked) a second time.
bool recomputing();

}  // namespace ft::autograd
