// Tensor parallelism (Megatron-LM, Shoeybi et al. 2019): one layer's weights split over the t
// ranks of a tensor group (process_groups.h), each rank computing its part of the layer.
//
// A transformer MLP y = B(gelu(A x)) splits A by rows (output features: "column parallel", rank r
// holds A_r and computes h_r = gelu(A_r x) alone, as GELU is element-wise) and B by columns (input
// features: "row parallel", rank r holds B_r and computes the partial sum y_r = B_r h_r), so that
// y = sum_r y_r costs one all-reduce. Attention splits the same way by heads: q, k and v of the
// heads [r H/t, (r+1) H/t) on rank r, the output projection row-parallel. Two autograd functions
// carry the communication, each the other's transpose:
//   f (copy_to_tensor_group):     forward y = x (every rank has x);  backward dx = sum_r dy_r
//   g (reduce_from_tensor_group): forward y = sum_r x_r;             backward dx_r = dy
// f sits before a column-parallel layer (each rank's part of dx is the gradient through its own
// columns only), g after a row-parallel one: one all-reduce of [B, T, C] in forward and one in
// backward per pair of layers.
//
// The vocabulary (embedding and tied output head) is split by rows: rank r holds the padded rows
// [r V_p/t, (r+1) V_p/t). The embedding looks up the ids in its range (zeros for the others) and
// g sums the parts. The head yields rank r's columns of the logits, and the cross-entropy
// never gathers them (vocab_parallel_cross_entropy):
//   m = max_r max_j z_rj                (all-reduce max: any common shift works, this one is safe)
//   S = sum_r sum_j exp(z_rj - m)       (g: all-reduce sum in forward)
//   z_y = z_{r(y), y - start_r(y)} - m  (the target's logit, from the rank owning it; g again)
//   loss = mean_i (log S_i - z_y,i)
// whose gradient on rank r, through g's identity backward, is softmax(z)_rj - [j = y - start_r]
// over its own columns: exactly the single-process gradient's slice.
//
// Every rank computes the same loss and the same replicated activations (layer norms, residual
// stream, position embeddings), so the replicated parameters' gradients are equal on every rank
// of the group; TensorParallelSync averages them over the group anyway (a few KB per block), so
// nothing drifts whatever the kernels' reduction order.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "fasttrain/dist.h"
#include "fasttrain/nn.h"
#include "fasttrain/safetensors.h"
#include "fasttrain/train_step.h"

namespace ft::dist {

// How one parameter lies over the tensor group.
struct TensorShard {
  int64_t dim = -1;    // the split dimension; -1: replicated (every rank holds it whole)
  int64_t blocks = 1;  // `dim` holds this many equal blocks (q | k | v: 3), each split in t parts
  bool sharded() const { return dim >= 0; }
  bool operator==(const TensorShard&) const = default;
};

// Rank `rank` of `size`'s part of `full` (a contiguous copy): along `s.dim`, block by block.
Tensor shard_tensor(const Tensor& full, TensorShard s, int rank, int size);
// The whole tensor from every rank's part (a collective of `group`: one all-gather).
Tensor unshard_tensor(const Tensor& part, TensorShard s, Communicator& group);

// f: identity forward, all-reduce (sum) of the gradient in backward.
Tensor copy_to_tensor_group(const Tensor& x, const std::shared_ptr<Communicator>& group);
// g: all-reduce (sum) forward, identity backward.
Tensor reduce_from_tensor_group(const Tensor& x, const std::shared_ptr<Communicator>& group);

// Sequence parallelism (Korthikanti et al. 2022, Megatron-LM's --sequence-parallel): between
// the parallel regions (norms, dropout, residual adds) the activations [B, T, C] are split along
// the sequence, rank r holding positions [r T/t, (r+1) T/t), so their memory is 1/t. f and g
// become the pair
//   gather_sequence:         forward all-gather along T;      backward reduce-scatter (sum) along T
//   reduce_scatter_sequence: forward reduce-scatter along T;  backward all-gather along T
// each the other's transpose. A ring's all-reduce is a reduce-scatter then an all-gather, so the
// bytes moved per step are the same as without it; the norms and the rest run on T/t positions.
// The replicated parameters' gradients are then partial sums over each rank's positions: the
// tensor group sums them (TensorParallelSync) instead of averaging equal values. T must be a
// multiple of t.
Tensor gather_sequence(const Tensor& x, const std::shared_ptr<Communicator>& group);
Tensor reduce_scatter_sequence(const Tensor& x, const std::shared_ptr<Communicator>& group);

// Mean cross-entropy of logits [N, V_r] (this rank's vocabulary columns [vocab_start,
// vocab_start + V_r)) against targets [N] (ids of the whole vocabulary), as cross_entropy over
// the gathered [N, V] would give, without gathering them. f32 or f64 logits (others computed in
// f32). The same loss on every rank.
Tensor vocab_parallel_cross_entropy(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                                    const std::shared_ptr<Communicator>& group);

// A Linear split by output features: weight [out / t, in] (rank r's rows, block by block when
// `blocks` > 1: a fused q | k | v projection keeps each of q, k and v split by heads), bias
// [out / t]. forward(x) = linear(f(x), weight, bias): this rank's features. The parameters are
// uninitialised: the model fills them from its single-process initialisation.
class ColumnParallelLinear : public nn::UnaryModule {
 public:
  ColumnParallelLinear(int64_t in, int64_t out, bool bias, std::shared_ptr<Communicator> group, int64_t blocks = 1);
  // Wraps an existing weight (a head tied to a vocabulary-parallel embedding).
  ColumnParallelLinear(Tensor weight, std::shared_ptr<Communicator> group);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "ColumnParallelLinear"; }
  TensorShard shard() const { return {0, blocks}; }
  // What enters the layer: f(x), or under sequence parallelism gather_sequence(x) (x is then
  // this rank's positions). Layers sharing one input (q, k and v) call it once.
  Tensor enter(const Tensor& x) const;
  Tensor weight, bias;
  std::shared_ptr<Communicator> group;
  int64_t blocks;
  bool sequence_parallel = false;  // set_sequence_parallel
};

// A Linear split by input features: weight [out, in / t], bias [out] (replicated, added once
// after the sum). forward(x_r) = g(linear(x_r, weight)) + bias, x_r: this rank's in / t features.
class RowParallelLinear : public nn::UnaryModule {
 public:
  RowParallelLinear(int64_t in, int64_t out, bool bias, std::shared_ptr<Communicator> group);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "RowParallelLinear"; }
  // The partial sums' way out: g, or under sequence parallelism reduce_scatter_sequence.
  Tensor leave(const Tensor& partial) const;
  // Dropout of this layer's output: under sequence parallelism (this rank's positions) that part
  // of the mask one process draws for the whole output, else ft::dropout.
  Tensor dropout(const Tensor& y, double p, bool training) const;
  Tensor weight, bias;
  std::shared_ptr<Communicator> group;
  bool sequence_parallel = false;
};

// An Embedding split by rows: weight [num / t, dim], rank r's rows [r num / t, (r+1) num / t).
// forward(ids) = g(lookup of the ids in this rank's rows, zeros for the others).
class VocabParallelEmbedding : public nn::UnaryModule {
 public:
  VocabParallelEmbedding(int64_t num, int64_t dim, std::shared_ptr<Communicator> group);
  Tensor forward(const Tensor& ids) override;
  std::string type_name() const override { return "VocabParallelEmbedding"; }
  int64_t first_row() const { return start_; }
  // The first position of this rank's part of a sequence of T (0 without sequence parallelism,
  // whose output is then [B, T / t, dim]).
  int64_t sequence_start(int64_t T) const { return sequence_parallel ? group->rank() * (T / group->world_size()) : 0; }
  // Dropout of what follows the embedding (as RowParallelLinear::dropout).
  Tensor dropout(const Tensor& y, double p, bool training) const;
  Tensor weight;
  std::shared_ptr<Communicator> group;
  bool sequence_parallel = false;

 private:
  int64_t start_ = 0;
};

// GPT-2's attention with rank r's heads [r H/t, (r+1) H/t): c_attn column-parallel in three
// blocks (q, k, v), c_proj row-parallel; dropout on the attention probabilities (this rank's heads'
// part of the whole layer's mask: src/ops/mask_parts.h) and on the output (after g: replicated, so the
// tensor group must draw the same mask: the Trainer seeds dropout by data-parallel rank). Both
// equal one process's masks, which is what makes a split GPT with dropout train like one.
class ParallelCausalSelfAttention : public nn::UnaryModule {
 public:
  ParallelCausalSelfAttention(int64_t dim, int64_t heads, double dropout, std::shared_ptr<Communicator> group);
  Tensor forward(const Tensor& x) override;
  // Under DocumentMask{doc_ids} when doc_ids is defined (as CausalSelfAttention's).
  Tensor forward(const Tensor& x, const Tensor& doc_ids);
  std::string type_name() const override { return "ParallelCausalSelfAttention"; }
  std::shared_ptr<ColumnParallelLinear> c_attn;
  std::shared_ptr<RowParallelLinear> c_proj;
  int64_t local_heads;
  double dropout;

 private:
  Tensor attend(const Tensor& x, const Tensor& doc_ids);
};

// A model that returns this rank's vocabulary columns of the logits (GPT built with a tensor
// group of more than one rank): its loss is vocab_parallel_cross_entropy.
class VocabParallelOutput {
 public:
  virtual ~VocabParallelOutput() = default;
  // Null when the model is not split (its logits are whole).
  virtual std::shared_ptr<Communicator> vocab_group() const = 0;
  virtual int64_t vocab_start() const = 0;  // the first vocabulary id of this rank's columns
};

// How each parameter and buffer of `model` (by its state_dict() name) lies over the tensor group:
// the parallel layers' split parameters, every other one replicated.
std::map<std::string, TensorShard> tensor_shards(const nn::Module& model);
// The tensor group of `model`'s parallel layers; null when it has none (or the group has 1 rank).
std::shared_ptr<Communicator> tensor_group_of(const nn::Module& model);
// The state one process would hold: every split tensor gathered (a collective of the model's
// tensor group; every rank gets the whole state). state_dict() itself without a tensor group.
TensorMap gather_tensor_parallel_state(const nn::Module& model);
// This rank's parts of a whole state (for load_state_dict): the inverse of the above. On a
// pipeline stage (pipeline.h) only the stage's entries, so a whole file loads into any stage.
TensorMap shard_tensor_parallel_state(const TensorMap& whole, const nn::Module& model);

// Turns sequence parallelism on or off for every parallel layer of `model` (the model's code
// sees it through them: enter, leave, sequence_start). Refused for a model without a tensor group.
void set_sequence_parallel(nn::Module& model, bool on);
// Whether `model`'s parallel layers run sequence parallel.
bool sequence_parallel(const nn::Module& model);

// The gradient synchronisation of a tensor-parallel model (wrapping the data-parallel one, if
// any, over the data group): after the data-parallel average, the replicated parameters'
// gradients are averaged over the tensor group (summed under sequence parallelism: each rank's
// are its positions' part of the whole); clipping by global norm counts each split
// parameter's parts once (||g||^2 = sum over the tensor group of the parts' squares, plus the
// replicated parameters' squares once); fp16's found-inf flag is agreed over the tensor group.
class TensorParallelSync : public train::GradSync {
 public:
  TensorParallelSync(nn::Module& model, std::shared_ptr<Communicator> tensor_group,
                     std::unique_ptr<train::GradSync> data_parallel);
  void before_forward() override;
  void before_backward(bool last) override;
  void after_backward(bool last) override;
  void finish() override;
  Tensor clip_grad_norm(const std::vector<Tensor>& params, double max_norm) override;
  void clip_grad_value(const std::vector<Tensor>& params, double clip_value) override;
  void agree_found_inf(const Tensor& found_inf) override;
  void after_step() override;

  // Elements of the split parameters (this rank's parts) and of the replicated ones.
  int64_t sharded_elements() const;
  int64_t replicated_elements() const;

 private:
  std::shared_ptr<Communicator> group_;
  std::unique_ptr<train::GradSync> inner_;
  std::vector<Tensor> sharded_, replicated_;  // unique parameters requiring grad
  bool last_ = false;
  ReduceOp replicated_op_ = ReduceOp::Avg;  // Sum under sequence parallelism
};

}  // namespace ft::dist
