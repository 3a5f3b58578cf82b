// ZeRO stages 1, 2 and 3 (Rajbhandari et al. 2020; DeepSpeed's zero_optimization, PyTorch's
// ZeroRedundancyOptimizer and FSDP): data parallelism where each of the N ranks keeps the
// optimizer state of 1/N of the parameters only (stage 1), after the step's communication only
// that shard's gradient too (stage 2), and between their uses only that shard of the parameters
// themselves (stage 3).
//
// Layout: every parameter group of the optimizer (decay / no_decay, each with its own options)
// is flattened in its parameter order into T_g elements, padded with zeros to P_g = N * s_g,
// s_g = ceil(T_g / N), so any size divides. Rank r owns elements [r s_g, (r + 1) s_g) of every
// group. A parameter that crosses a shard boundary is split; the part inside rank r's range is
// a "piece", and the rank's optimizer is the Trainer's optimizer (same kind, same group options)
// over those pieces. Stages 1 and 2: a piece is a 1-d view of the parameter's own memory (no
// second copy of the weights). Stage 3: the pieces live in the shard's own buffer and the
// parameters' memory is released between uses. Element-wise optimizers (SGD, Adam, AdamW)
// update a piece exactly as they would update those elements of the whole parameter, so a step
// equals DDP's; per-parameter step counts are kept per piece (all pieces of a parameter count
// alike). LAMB and LARS scale each parameter by the norm of the whole parameter, which a piece
// does not see: they are refused with ZeRO.
//
// Stage 3's units (FSDP's wrapped modules): every outermost nn::CheckpointableBlock (GPT's
// transformer blocks, the ResNets' residual blocks) is a unit, and the parameters outside any
// block (embeddings, head, final norm) are the root unit. The groups above are formed per unit
// (the decay and no-decay parameters of one block are two groups), so gathering a unit is one
// all-gather of equal parts per group. Through nn::BlockHooks a block's parameters are
// all-gathered just before its forward (the next block's gather is issued then, so it arrives
// while this one computes) and released after it; an autograd node on the block's output gathers
// them again just before the block's backward (prefetching the block whose backward comes
// next); once every parameter of the block has its gradient, the gradients are reduce-scattered
// to their owners and the parameters and full gradients released. The root unit is gathered
// before each micro-batch's forward and released after the step's last backward. Activation
// checkpointing recomputes a block inside its backward, after that gather.
//
// One step, with Ψ parameters (elements), K bytes of optimizer state per element (AdamW, f32:
// 8), N ranks:
//   stage 1: gradients all-reduced in DDP's buckets during backward (ddp.h), each rank
//            copies its shard's part; optimizer state per rank K Ψ / N; per-rank traffic of a
//            ring: all-reduce 2Ψ + all-gather Ψ = 3Ψ (x (N-1)/N).
//   stage 2: the full gradients reduce-scattered once backward ends: each rank receives only its
//            shard's mean gradient and frees the rest, so it keeps 4 Ψ / N bytes of gradient
//            after the step's communication; traffic reduce-scatter Ψ + all-gather Ψ = 2Ψ.
//   stage 3: parameters held between steps: Ψ / N per rank (plus the one unit being used);
//            traffic: all-gather Ψ in forward, all-gather Ψ - Ψ_root again in backward (the
//            root stays gathered through the step), reduce-scatter Ψ during backward: 3Ψ at most.
//   all:     clipping by global norm: ||g||^2 = sum over ranks of the shard's ||g_r||^2
//            (one all-reduce of a scalar); the optimizer updates the shard. Stages 1 and 2 then
//            all-gather the shards into every rank's full parameters (the model stays whole for
//            forward), in chunks of at most the bucket cap so the gathered copy stays small.
// A parameter no rank produced a gradient for gets none (as in one process and DDP): one used
// flag per parameter travels with the gradients (stage 1 in DDP's buckets, stages 2 and 3 in one
// small all-reduce), and the optimizer skips its pieces.
//
// Under tensor parallelism (set_tensor_parallel) the N ranks are a data group: the replicas of
// one tensor rank's parts, so every formula above holds with Ψ = this tensor rank's elements
// (its parts of the split parameters plus the replicated ones). The ranks of a tensor group
// flatten parameters of equal shapes in one order, so their shards line up element for element;
// what changes is the global norm: ||g||^2 = sum over the data group of
//   (sum over the tensor group of the split parameters' shard squares) + the replicated ones'
// (the replicated parameters are the same on every tensor rank: counted once), and found_inf,
// agreed over both groups.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "fasttrain/ddp.h"
#include "fasttrain/dist.h"
#include "fasttrain/nn.h"
#include "fasttrain/optim.h"
#include "fasttrain/safetensors.h"
#include "fasttrain/train_step.h"

namespace ft::dist {

class ZeroSharding : public train::GradSync, public nn::BlockHooks {
 public:
  // `full` is the optimizer the Trainer would use without sharding: its groups, their options
  // and its kind are taken; the parameters must be `model`'s. Starts from the model's current
  // weights (broadcast them first); stage 3 then releases the parameters' memory (gather_all()
  // brings it back). Throws for LAMB / LARS.
  // `tied` (optional): a parameter given a group of its own (pipeline parallelism's tied embedding,
  // whose first-stage and last-stage copies must shard alike: see set_tied_exchange).
  ZeroSharding(nn::Module& model, const optim::Optimizer& full, std::shared_ptr<Communicator> comm, int stage,
               DdpOptions ddp = {}, const Tensor& tied = Tensor());
  ~ZeroSharding() override;
  ZeroSharding(const ZeroSharding&) = delete;
  ZeroSharding& operator=(const ZeroSharding&) = delete;

  // The optimizer of this rank's shard (same kind and group options as `full`).
  std::unique_ptr<optim::Optimizer> make_shard_optimizer() const;

  // The model is tensor-parallel: `split` are its parameters that are parts over `tensor` (the
  // others are replicated over it) and this sharding's communicator is the data group. Clipping
  // and found_inf then span both groups, and the replicated parameters' shard gradients are
  // averaged over the tensor group (equal in exact arithmetic; averaged so they stay equal in
  // every bit, as TensorParallelSync does without ZeRO); under sequence parallelism, where each
  // rank's are its positions' part, `replicated` is Sum. Call before the first step.
  void set_tensor_parallel(std::shared_ptr<Communicator> tensor, const std::vector<Tensor>& split,
                           ReduceOp replicated = ReduceOp::Avg);

  // Pipeline parallelism: the tied parameter's two copies (first and last stage) are one
  // parameter of one process, whose gradient is the sum of both. Their groups hold only that
  // parameter, so rank r of the data group holds the same elements [r s, (r + 1) s) of it on both
  // stages; `exchange` is called in finish() with that shard's mean gradient (f32 [s]), after the
  // data group's reduction and before clipping, and replaces it in place by the two copies' sum.
  // A no-op without `tied`.
  void set_tied_exchange(std::function<void(const Tensor& shard_grad)> exchange);
  // ||g||^2 of the gradient after finish(), summed over the data group (and the tensor group's
  // split parts): the same f64 on every rank of both groups. skip_tied: the tied group left out
  // (the last stage's copy, counted on the first stage).
  double grad_squares(bool skip_tied) const;
  // Every shard gradient times `factor` (clipping), rounded to the parameters' dtype.
  void scale_grads(float factor);

  void before_forward() override;
  void before_backward(bool last) override;
  void after_backward(bool last) override;
  void finish() override;
  Tensor clip_grad_norm(const std::vector<Tensor>& params, double max_norm) override;
  void clip_grad_value(const std::vector<Tensor>& params, double clip_value) override;
  void agree_found_inf(const Tensor& found_inf) override;
  void agree_fp8_amax(const std::vector<Tensor>& amaxes) override;
  void after_step() override;

  // nn::BlockHooks (stage 3): the block's unit gathered before its forward, released after it.
  void before_forward(nn::CheckpointableBlock& block) override;
  Tensor after_forward(nn::CheckpointableBlock& block, const Tensor& output) override;

  // Stage 3 (no-ops otherwise): every parameter whole on every rank until release_all() (a
  // collective: every rank calls it), for what reads or writes the whole model outside a step:
  // saving, loading, the LR finder's snapshot. While gathered, the blocks' hooks do nothing.
  void gather_all();
  bool all_gathered() const { return all_gathered_; }
  // Every unit's memory released (after an evaluation, or the end of gather_all()'s scope).
  void release_all();
  // Bytes of parameter memory this rank holds now: gathered parameters and stage 3's shard.
  int64_t parameter_bytes(const nn::Module& model) const;

  int stage() const { return stage_; }
  int64_t parameter_count() const;  // Ψ: the groups' elements, unpadded
  int64_t padded_count() const;     // sum of P_g
  int64_t shard_count() const;      // sum of s_g: this rank's elements
  int64_t used_flag_count() const;  // parameters (one used flag each)
  // Bytes of gradient held now: the shard's gradient buffers, stage 1's DDP buckets (the full
  // gradient and its used flags) and any gradient the model's parameters still hold (none
  // between steps).
  int64_t gradient_bytes(const nn::Module& model) const;

  // Pieces that are not views of their parameter (channels-last; every piece in stage 3) copied
  // from the model again (after its weights were loaded; after every all-gather). Stage 3: only
  // while all_gathered().
  void load_weights_from_model();

  // --- checkpoints: the optimizer state in the unsharded layout ---
  // Metadata describing this rank's pieces, saved beside its state_tensors() so a checkpoint of
  // N ranks can be read at any other number of ranks.
  std::map<std::string, std::string> shard_metadata() const;
  // The shard optimizer's state for this rank's pieces, cut from a state in the unsharded
  // layout ("<group>.<param>.<state>", the parameter's shape) as one process would save it.
  TensorMap shard_state_from_full(const TensorMap& full) const;
  // The optimizer's metadata ("groups", per-group "<group>.<option>") between the shard
  // optimizer's groups and the unsharded optimizer's (stage 3 has one group per unit and
  // optimizer group), so checkpoints hold the unsharded form whatever the stage.
  std::map<std::string, std::string> full_metadata(const std::map<std::string, std::string>& shard) const;
  std::map<std::string, std::string> shard_metadata_from_full(const std::map<std::string, std::string>& full) const;
  // The optimizer state in the unsharded layout from every rank's `shard_state` (this rank's
  // optimizer's state_tensors()): a collective of the sharding's communicator (each rank's shard
  // and metadata broadcast to all, then consolidate_zero_state over `groups`, the unsharded
  // optimizer's). For checkpoints that must be one file whatever the layout (tensor parallelism).
  TensorMap full_state(const TensorMap& shard_state, const std::vector<optim::ParamGroup>& groups) const;

 private:
  struct Piece {
    int64_t param = -1;  // index in its group; -1: a padding placeholder (never has a gradient)
    int64_t offset = 0;  // first element of the parameter inside this piece
    int64_t numel = 0;   // elements in the piece
    int64_t at = 0;      // the piece's first element in the shard (and in `grad`)
    Tensor view;         // the parameter's elements [offset, offset + numel), 1-d
  };
  struct Group {
    std::vector<Tensor> params;       // the model's, in the group's order
    std::vector<int64_t> full_index;  // each parameter's index in the optimizer's group
    int64_t full_group = 0;           // that group's index in the optimizer
    size_t unit = 0;                  // stage 3's unit (0: the root)
    std::vector<int64_t> offsets;     // of each parameter in the flattened group
    int64_t total = 0, shard = 0;     // T_g, s_g
    int64_t first_flag = 0;           // its first parameter's used flag
    Tensor grad;                      // f32 [s_g]: this rank's gradient (after finish())
    Tensor data;                      // stage 3: this rank's parameter elements [s_g] (the pieces' memory)
    std::vector<Piece> pieces;
    optim::GroupOptions options;
    std::string name;
  };
  // Stage 3: a block (or the root) whose groups are gathered and released together.
  struct Gather {
    size_t group;
    Tensor out;  // [N s_g]: every rank's part
    WorkPtr work;
  };
  struct Unit {
    nn::CheckpointableBlock* block = nullptr;  // null: the root
    std::shared_ptr<nn::Module> owner;         // keeps the block alive until its hooks are removed
    std::vector<size_t> groups;
    std::vector<Gather> gathers;  // in flight
    bool gathered = false;
    int64_t slots = 0, ready = 0;  // parameters with a gradient hook; those done this backward
    std::vector<char> slot_ready;
    bool done = false;  // every gradient of this backward is in
  };
  void build_groups(nn::Module& model, const optim::Optimizer& full);
  void assign_units(nn::Module& model, std::vector<size_t>* unit_of_param,
                    const std::vector<const TensorImpl*>& params);
  void add_stage3_hooks();
  void launch_gather(Unit& u);
  void wait_gather(Unit& u);
  void release(Unit& u);
  size_t unit_of(const nn::CheckpointableBlock& block) const;
  void before_block_backward(size_t unit);
  void on_grad_ready(size_t unit, size_t slot);
  void launch_reductions();
  // The group's full gradients flattened and reduce-scattered (its used flags set); the full
  // gradients are dropped.
  void reduce_group(Group& g);
  void copy_shards_to_pieces_grads(const std::vector<float>& used);
  void round_grads_to_param_dtype();
  void check_views() const;
  bool is_split(const Tensor& param) const;  // a part over tensor_ (set_tensor_parallel)
  // The replicated parameters' shard gradients averaged (summed) over tensor_.
  void average_replicated_over_tensor_group();
  // Writes `values`, elements [begin, begin + numel) of group g's flattened parameters, into them.
  static void scatter_to_params(Group& g, int64_t begin, const Tensor& values);
  // The inverse: `out` = those elements (zeros past the group's end: the padding).
  static void gather_from_params(const Group& g, int64_t begin, const Tensor& out);

  std::shared_ptr<Communicator> comm_;
  const TensorImpl* tied_ = nullptr;  // the constructor's `tied`
  int64_t tied_group_ = -1;           // its own group's index in groups_
  std::function<void(const Tensor&)> tied_exchange_;
  std::shared_ptr<Communicator> tensor_;         // set_tensor_parallel's group (null: none)
  std::vector<const TensorImpl*> split_params_;  // its split parameters, sorted
  ReduceOp replicated_op_ = ReduceOp::Avg;
  int stage_;
  optim::OptimizerKind kind_;
  std::vector<Group> groups_;
  std::unique_ptr<DataParallel> ddp_;  // stage 1's gradient averaging
  int64_t gather_chunk_ = 1;           // elements per rank in one all-gather (the bucket cap / N)
  int64_t full_groups_ = 0;            // the unsharded optimizer's parameter groups
  // Stages 2 and 3: the step's flattened gradients and used flags while their collectives run.
  std::vector<Tensor> flat_grads_;
  Tensor flags_;
  std::vector<WorkPtr> works_;
  // Stage 3.
  std::vector<Unit> units_;
  std::vector<size_t> forward_order_;  // block units in the order their forward first ran
  std::vector<size_t> reduce_order_;   // this backward's: reverse forward order, the rest, the root
  size_t next_reduce_ = 0;
  bool syncing_ = false;  // the step's last micro-batch: gradients are reduced
  bool all_gathered_ = false;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);  // the hooks' guard (as DDP's)
};

// Stage 3's gather_all() for a scope: every rank must enter it. Leaves the sharding gathered if
// it was already (the end of fit() keeps the model whole). Null or stages 1, 2: nothing.
class GatheredParameters {
 public:
  explicit GatheredParameters(ZeroSharding* zero);
  ~GatheredParameters();
  GatheredParameters(const GatheredParameters&) = delete;
  GatheredParameters& operator=(const GatheredParameters&) = delete;

 private:
  ZeroSharding* zero_;
  bool was_gathered_ = false;
};

// The optimizer state in the unsharded layout, assembled from the per-rank files a ZeRO run of
// any number of ranks wrote (each file: that rank's state_tensors() and shard_metadata()).
// `groups` are the (unsharded) parameter groups of the model being resumed, for the shapes.
TensorMap consolidate_zero_state(const std::vector<SafetensorsFile>& shards,
                                 const std::vector<optim::ParamGroup>& groups);

}  // namespace ft::dist
