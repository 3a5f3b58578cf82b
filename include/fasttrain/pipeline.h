// Pipeline parallelism (GPipe, Huang et al. 2019; 1F1B, PipeDream-Flush / Megatron-LM, Narayanan
// et al. 2021): a decoder's blocks cut into p consecutive stages, one per rank of a pipeline group
// (process_groups.h), each step's batch cut into m micro-batches (the accumulation count) that
// flow through the stages: stage s receives micro-batch j's activation [b, T, C] from stage s-1,
// runs its blocks and sends the result to stage s+1; in backward it receives the gradient of its
// output from s+1 and sends the gradient of its input to s-1. The loss is formed on the last
// stage only.
//
// Schedules (the order of one stage's actions; F j = forward of micro-batch j, B j = backward):
//   GPipe  F 0 .. F m-1, then B 0 .. B m-1: every stage holds all m micro-batches' activations.
//   1F1B   w = min(p - s - 1, m) warm-up forwards, then m - w pairs (F, B), then w backwards:
//          stage s never holds more than p - s micro-batches' activations (needs m >= p).
// Either way each stage idles while the pipeline fills and drains: with equal stages of forward
// time f and backward time b, a step takes (m + p - 1)(f + b), of which m(f + b) is work, so the
// idle ("bubble") fraction is (p - 1) / (m + p - 1) on every stage.
//
// Communication per step, per stage boundary: m activations forward and m gradients back, each
// b x T x C elements of the wire dtype (f32, bf16 under bf16-true): 2 m b T C bytes(dtype).
//
// Deadlock freedom: the Communicator's point-to-point operations block (a send may wait for the
// peer's receive), and 1F1B's steady state has neighbours sending to each other at once. The
// program a stage runs (pipeline_program) therefore fuses a send with the receive that follows it
// when both go to the same peer into one send_recv (MPI_Sendrecv), as Megatron-LM's
// send_forward_recv_backward does; the test suite checks the programs of every stage against a
// simulated rendezvous for many (p, m).
//
// The stage models (GPT and Llama built with a PipelineStage) hold only their blocks, under the
// single-process model's state_dict names (global block indices), so the union of the stages'
// state dicts is the single-process one. A tied head on the last stage holds its own copy of the
// embedding (Megatron-LM's scheme): both start equal, and PipelineSync adds the two gradients over
// the first and last stages before clipping, so the copies stay equal in every bit.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "fasttrain/dist.h"
#include "fasttrain/loader.h"
#include "fasttrain/names.h"
#include "fasttrain/nn.h"
#include "fasttrain/safetensors.h"
#include "fasttrain/train_step.h"

namespace ft::dist {

class ZeroSharding;

// --pp-schedule.
enum class PipelineSchedule { GPipe, OneFOneB };
inline constexpr size_t kPipelineScheduleCount = 2;
std::span<const NamedValue<PipelineSchedule>> option_names(PipelineSchedule);  // gpipe, 1f1b

// One stage's action on one micro-batch.
struct PipelineAction {
  enum Kind { Forward, Backward };
  Kind kind = Forward;
  int64_t micro = 0;
  bool operator==(const PipelineAction&) const = default;
};

// Stage `stage` of `stages`'s actions for one step of `micro_batches`. Refused (ft::Error naming
// the numbers) for 1F1B with fewer micro-batches than stages.
std::vector<PipelineAction> pipeline_schedule(PipelineSchedule schedule, int stage, int stages, int64_t micro_batches);

// What a stage sends or receives: micro-batch `micro`'s activation (to the next stage) or the
// gradient of that activation (to the previous one).
struct PipelineMessage {
  enum Kind { Activation, Gradient };
  Kind kind = Activation;
  int64_t micro = 0;
  int peer = -1;  // the stage sent to / received from; -1: none
  bool operator==(const PipelineMessage&) const = default;
};

// One step of a stage's program: an action, or communication (a send, a receive, or both at once).
struct PipelineOp {
  bool compute = false;
  PipelineAction action;       // when compute
  PipelineMessage send, recv;  // otherwise: peer -1 where there is none
};

// The schedule with its communication: each forward preceded by the receive of its input (not on
// stage 0) and followed by the send of its output (not on the last stage); each backward preceded
// by the receive of its output's gradient (not on the last stage) and followed by the send of its
// input's gradient (not on stage 0). A send is held back until the next receive: fused with it
// into one op when both go to the same peer (no deadlock between neighbours that send to each
// other), issued alone before it otherwise.
std::vector<PipelineOp> pipeline_program(const std::vector<PipelineAction>& actions, int stage, int stages);

// Blocks per stage: `given` when not empty (checked: `stages` positive counts summing to the
// blocks), otherwise balanced by parameters: the consecutive split of the blocks (each of
// block_params[i] elements) minimising the largest stage, where stage 0 also holds `first_extra`
// (the embeddings) and the last stage `last_extra` (final norm and head). Refused with the numbers
// for more stages than blocks.
std::vector<int64_t> stage_layers(const std::vector<int64_t>& block_params, int64_t first_extra, int64_t last_extra,
                                  int stages, const std::vector<int64_t>& given, const std::string& model);

// Which part of a decoder this process holds.
struct PipelineStage {
  int index = 0, count = 1;                // this stage and the number of stages
  int64_t first_block = 0, end_block = 0;  // the blocks [first_block, end_block) (global indices)
  std::shared_ptr<Communicator> group;     // the pipeline group (rank = stage); null when count is 1
  bool first() const { return index == 0; }
  bool last() const { return index == count - 1; }
  bool split() const { return count > 1; }
  std::string describe() const;  // "stage 1 of 2: blocks 2-3"
};

// What a model needs to be built as a stage: its place, and the blocks per stage (empty: balanced).
struct PipelinePart {
  int index = 0, count = 1;
  std::shared_ptr<Communicator> group;
  std::vector<int64_t> layers;  // --pp-layers
};

// A decoder built for one pipeline stage (GPT, Llama).
class PipelineStageModel {
 public:
  virtual ~PipelineStageModel() = default;
  virtual const PipelineStage& pipeline_stage() const = 0;
  // Stage 0: ids [B, T] -> hidden [B, T, C]; a middle stage: hidden -> hidden; the last stage:
  // hidden -> logits (this rank's vocabulary columns under tensor parallelism). doc_ids [B, T]
  // (undefined: plain causal) confine attention on every stage.
  virtual Tensor stage_forward(const Tensor& input, const Tensor& doc_ids) = 0;
  virtual int64_t hidden_size() const = 0;
  // The tied embedding's parameter on the first stage, the head's copy of it on the last stage;
  // undefined on other stages, without a tied head, or with one stage.
  virtual Tensor tied_weight() const = 0;
  // The Philox counter blocks this stage's training forward of one micro-batch of `batch` rows of
  // `length` positions draws from the default generator (its dropout masks; 0 without dropout).
  // The executor places each stage's draws where one process's forward of that micro-batch makes
  // them, so the masks equal one process's; it checks the count against what the forward drew.
  virtual int64_t dropout_blocks(int64_t batch, int64_t length) const {
    (void)batch, (void)length;
    return 0;
  }
};

// The pipeline stage of `model` (null when it is not a split stage model).
PipelineStageModel* pipeline_stage_of(nn::Module& model);

// The state of the whole model from every stage's (each rank passes its stage's state, tensor
// parallel parts already gathered), on stage 0 only: every stage's tensors in stage order (the
// other stages send theirs point to point and get an empty map). A collective of the pipeline
// group; no stage but the first ever holds more than its own part.
TensorMap gather_pipeline_state(const TensorMap& stage_state, Communicator& pipeline);
// The entries of `whole` that `model` holds (by its state_dict names).
TensorMap stage_part_of_state(const TensorMap& whole, const nn::Module& model);

// The layout-independent numbering of optimizer state across stages: the single-process model's
// parameter groups are the stages' groups concatenated in stage order (decay_groups keeps the
// parameter order), less the last stage's head copy, which shares the embedding's state. Made
// by a collective of the pipeline group.
class PipelineStateIndex {
 public:
  PipelineStateIndex(const std::vector<optim::ParamGroup>& groups, const Tensor& tied_copy, const PipelineStage& stage);
  // "g.i.state" of this stage -> "g.I.state" of the whole model; "" for the head copy's entries.
  std::string to_whole(const std::string& key) const;
  // The inverse: "" when the entry belongs to another stage.
  std::string to_stage(const std::string& key) const;

 private:
  std::vector<std::vector<int64_t>> whole_;                      // [g][i] -> whole index (-1: the head copy)
  std::vector<int64_t> offset_;                                  // [g]: this stage's first whole index
  std::vector<int64_t> count_;                                   // [g]: this stage's own entries
  int64_t tied_group_ = -1, tied_whole_ = -1, tied_local_ = -1;  // the head copy <- the embedding's entry
};

// The gradient synchronisation of a pipeline stage, wrapping the tensor- or data-parallel one:
// after the inner finish(), the tied embedding's gradient and the head copy's are added over the
// first and last stages; clipping by the global norm sums the stages' squared norms (the head
// copy counted once, split parameters' parts over the tensor group as TensorParallelSync counts
// them); fp16's found-inf flag is agreed over the pipeline group.
//
// Wrapping ZeRO (1-3 over each stage's data group): each stage's parameters are sharded over its
// own data group. The tied embedding has a ZeRO group of its own on the first and the last stage
// (ZeroSharding's `tied`), so data rank d of both stages holds the same elements of it; inside
// ZeRO's finish(), after the data group's reduction, those two shards of the mean gradient are
// added over the (first, last) pair: (mean of the embedding's) + (mean of the head's) is the
// mean of their sum, which is what one process's gradient is. Both copies' optimizer states
// start equal (the state index maps both to the embedding's entry) and see the same gradient, so
// the copies stay equal in every bit. Clipping takes each stage's sharded ||g||^2 from ZeRO
// (already summed over the data and tensor groups; the last stage's tied shard left out) and adds
// the stages'.
class PipelineSync : public train::GradSync {
 public:
  // `inner` (not owned; null: none) is the tensor- or data-parallel synchronisation.
  PipelineSync(nn::Module& model, train::GradSync* inner);
  void before_forward() override;
  void before_backward(bool last) override;
  void after_backward(bool last) override;
  void finish() override;
  Tensor clip_grad_norm(const std::vector<Tensor>& params, double max_norm) override;
  void clip_grad_value(const std::vector<Tensor>& params, double clip_value) override;
  void agree_found_inf(const Tensor& found_inf) override;
  void after_step() override;
  train::GradSync* inner() const { return inner_; }

 private:
  nn::Module& model_;
  PipelineStageModel& stage_model_;
  train::GradSync* inner_;
  ZeroSharding* zero_ = nullptr;          // inner_ when it is ZeRO
  std::shared_ptr<Communicator> tensor_;  // null without tensor parallelism
};

}  // namespace ft::dist

namespace ft::train {

// Time and bytes of a stage's last step (the bubble measurement).
struct PipelineStats {
  double busy_s = 0;       // forward and backward compute
  double wait_s = 0;       // blocked in send / receive
  int64_t bytes_sent = 0;  // activations and gradients this stage sent
  int64_t micro_batches = 0;
};

// Runs a step's micro-batches on one stage by its schedule, through `runner` (precision, loss
// scaling, accumulation; the caller runs runner.optimizer_step() after) and `sync`.
class PipelineExecutor {
 public:
  // loss(output, micro-batch): the last stage's loss of a micro-batch from its logits.
  using StageLoss = std::function<Tensor(const Tensor& logits, const data::Batch& micro)>;
  PipelineExecutor(nn::Module& model, StepRunner& runner, dist::PipelineSync& sync, dist::PipelineSchedule schedule,
                   StageLoss loss);
  // One step over these micro-batches (fields: tokens, targets, optionally doc_ids; the same on
  // every stage): the sum of the micro-batch losses, on every rank of the pipeline group.
  Tensor run(const std::vector<data::Batch>& micro_batches);
  // The loss of one batch without autograd, forward through the stages (evaluation); every rank
  // of the pipeline group gets it.
  Tensor evaluate(const data::Batch& batch);
  const PipelineStats& stats() const { return stats_; }
  void set_runner(StepRunner& runner) { runner_ = &runner; }

 private:
  nn::Module& model_;
  dist::PipelineStageModel& stage_;
  StepRunner* runner_;
  dist::PipelineSync& sync_;
  dist::PipelineSchedule schedule_;
  StageLoss loss_;
  PipelineStats stats_;
  // The stages' dropout counter blocks per micro-batch (dropout_blocks, gathered over the
  // pipeline group) for the micro-batch shape they were gathered for.
  Shape dropout_shape_;
  std::vector<int64_t> dropout_blocks_;
  DType wire_dtype() const;
};

// The batch-size finder's trial on one stage: the stage's part of a step of `micro_batches`
// copies of `batch` in the schedule's order, holding what the executor holds (GPipe: every
// micro-batch's activations; 1F1B: at most p - s), but without communicating: the input from
// the previous stage and the gradient from the next are zeros of their shapes, so a stage that
// runs out of memory leaves no peer waiting in a receive. The caller agrees the outcome over the
// job and runs runner.optimizer_step() (the trial's optimizer state counts too).
void pipeline_trial_step(nn::Module& model, StepRunner& runner, dist::PipelineSchedule schedule, int64_t micro_batches,
                         const data::Batch& batch, const PipelineExecutor::StageLoss& loss);

}  // namespace ft::train
