// ZeRO stages 1 and 2 (Rajbhandari et al. 2020; DeepSpeed's zero_optimization, PyTorch's
// ZeroRedundancyOptimizer): data parallelism where each of the N ranks keeps the optimizer state
// of 1/N of the parameters only (stage 1) and, after the step's communication, only that shard's
// gradient too (stage 2). Stage 3 (parameters sharded as well) is not implemented.
//
// Layout: every parameter group of the optimizer (decay / no_decay, each with its own options)
// is flattened in its parameter order into T_g elements, padded with zeros to P_g = N * s_g,
// s_g = ceil(T_g / N), so any size divides. Rank r owns elements [r s_g, (r + 1) s_g) of every
// group. A parameter that crosses a shard boundary is split; the part inside rank r's range is
// a "piece", a 1-d view of the parameter's own memory (no second copy of the weights), and the
// rank's optimizer is the Trainer's optimizer (same kind, same group options) over those
// pieces. Element-wise optimizers (SGD, Adam, AdamW) update a piece exactly
// as they would update those elements of the whole parameter, so a step equals DDP's;
// per-parameter step counts are kept per piece (all pieces of a parameter count alike). LAMB and
// LARS scale each parameter by the norm of the whole parameter, which a piece does not see: they
// are refused with ZeRO.
//
// One step, with Ψ parameters (elements), K bytes of optimizer state per element (AdamW, f32:
// 8), N ranks:
//   stage 1: gradients all-reduced in DDP's buckets during backward (dist/ddp.h), each rank
//            copies its shard's part; optimizer state per rank K Ψ / N; per-rank traffic of a
//            ring: all-reduce 2Ψ + all-gather Ψ = 3Ψ (x (N-1)/N).
//   stage 2: the full gradients reduce-scattered once backward ends: each rank receives only its
//            shard's mean gradient and frees the rest, so it keeps 4 Ψ / N bytes of gradient
//            after the step's communication; traffic reduce-scatter Ψ + all-gather Ψ = 2Ψ.
//   both:    clipping by global norm: ||g||^2 = sum over ranks of the shard's ||g_r||^2
//            (one all-reduce of a scalar); the optimizer updates the shard; the shards are
//            all-gathered into every rank's full parameters (the model stays whole for forward),
//            in chunks of at most the bucket cap so the gathered copy stays small.
// A parameter no rank produced a gradient for gets none (as in one process and DDP): one used
// flag per parameter travels with the gradients (stage 1 in DDP's buckets, stage 2 in one small
// all-reduce), and the optimizer skips its pieces.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dist/ddp.h"
#include "fasttrain/dist.h"
#include "fasttrain/optim.h"
#include "fasttrain/safetensors.h"
#include "fasttrain/train_step.h"

namespace ft::dist {

// 1 or 2 for "zero1" / "zero2"; 3 for "zero3" / "fsdp"; 0 for anything else (DDP).
int zero_stage(const std::string& strategy);

class ZeroSharding : public train::GradSync {
 public:
  // `full` is the optimizer the Trainer would use without sharding: its groups, their options
  // and its kind are taken; the parameters must be `model`'s. Starts from the model's current
  // weights (broadcast them first). Throws for stage 3 and for LAMB / LARS.
  ZeroSharding(nn::Module& model, const optim::Optimizer& full, std::shared_ptr<Communicator> comm, int stage,
               DdpOptions ddp = {});
  ~ZeroSharding() override;
  ZeroSharding(const ZeroSharding&) = delete;
  ZeroSharding& operator=(const ZeroSharding&) = delete;

  // The optimizer of this rank's shard (same kind and group options as `full`).
  std::unique_ptr<optim::Optimizer> make_shard_optimizer() const;

  void before_backward(bool last) override;
  void after_backward(bool last) override;
  void finish() override;
  Tensor clip_grad_norm(const std::vector<Tensor>& params, double max_norm) override;
  void clip_grad_value(const std::vector<Tensor>& params, double clip_value) override;
  void agree_found_inf(const Tensor& found_inf) override;
  void after_step() override;

  int stage() const { return stage_; }
  int64_t parameter_count() const;  // Ψ: the groups' elements, unpadded
  int64_t padded_count() const;     // sum of P_g
  int64_t shard_count() const;      // sum of s_g: this rank's elements
  int64_t used_flag_count() const;  // parameters (one used flag each)
  // Bytes of gradient held now: the shard's gradient buffers, stage 1's DDP buckets (the full
  // gradient and its used flags) and any gradient the model's parameters still hold (none
  // between steps).
  int64_t gradient_bytes(const nn::Module& model) const;

  // Pieces that are not views of their parameter (channels-last) copied from the model again
  // (after its weights were loaded; after every all-gather).
  void load_weights_from_model();

  // --- checkpoints: the optimizer state in the unsharded layout ---
  // Metadata describing this rank's pieces, saved beside its state_tensors() so a checkpoint of
  // N ranks can be read at any other number of ranks.
  std::map<std::string, std::string> shard_metadata() const;
  // The shard optimizer's state for this rank's pieces, cut from a state in the unsharded
  // layout ("<group>.<param>.<state>", the parameter's shape) as one process would save it.
  TensorMap shard_state_from_full(const TensorMap& full) const;

 private:
  struct Piece {
    int64_t param = -1;  // index in its group; -1: a padding placeholder (never has a gradient)
    int64_t offset = 0;  // first element of the parameter inside this piece
    int64_t numel = 0;   // elements in the piece
    int64_t at = 0;      // the piece's first element in the shard (and in `grad`)
    Tensor view;         // the parameter's elements [offset, offset + numel), 1-d
  };
  struct Group {
    std::vector<Tensor> params;    // the model's, in the group's order
    std::vector<int64_t> offsets;  // of each parameter in the flattened group
    int64_t total = 0, shard = 0;  // T_g, s_g
    Tensor grad;                   // f32 [s_g]: this rank's gradient (after finish())
    std::vector<Piece> pieces;
    optim::GroupOptions options;
    std::string name;
  };
  void copy_shards_to_pieces_grads(const std::vector<float>& used);
  void round_grads_to_param_dtype();
  void check_views() const;
  // Writes `values`, elements [begin, begin + numel) of group g's flattened parameters, into them.
  static void scatter_to_params(Group& g, int64_t begin, const Tensor& values);
  // The inverse: `out` = those elements (zeros past the group's end: the padding).
  static void gather_from_params(const Group& g, int64_t begin, const Tensor& out);

  std::shared_ptr<Communicator> comm_;
  int stage_;
  optim::OptimizerKind kind_;
  std::vector<Group> groups_;
  std::unique_ptr<DataParallel> ddp_;  // stage 1's gradient averaging
  int64_t gather_chunk_ = 1;           // elements per rank in one all-gather (the bucket cap / N)
  // Stage 2: the step's flattened gradients and used flags while their collectives run.
  std::vector<Tensor> flat_grads_;
  Tensor flags_;
  std::vector<WorkPtr> works_;
};

// The optimizer state in the unsharded layout, assembled from the per-rank files a ZeRO run of
// any number of ranks wrote (each file: that rank's state_tensors() and shard_metadata()).
// `groups` are the (unsharded) parameter groups of the model being resumed, for the shapes.
TensorMap consolidate_zero_state(const std::vector<SafetensorsFile>& shards,
                                 const std::vector<optim::ParamGroup>& groups);

}  // namespace ft::dist
