// The pipeline executor (pipeline.h): one stage's part of a training step. It walks the stage's
// program (pipeline_program: the GPipe or 1F1B schedule with its sends and receives), keeping
// per micro-batch what backward needs: the received input (a leaf requiring grad, whose gradient
// goes back to the previous stage), the output (backpropagated from the gradient the next stage
// returns), or on the last stage the loss (divided by the micro-batch count and scaled as
// StepRunner::forward_backward does). Time blocked in communication and time computing are
// measured per step (the bubble: PipelineStats), and the communication shows in the profiler as
// "pipeline wait" ranges.
#include <chrono>

#include "core/fault_injection.h"
#include "fasttrain/autocast.h"
#include "fasttrain/autograd.h"
#include "fasttrain/ops.h"
#include "fasttrain/pipeline.h"
#include "fasttrain/profiler.h"
#include "fasttrain/random.h"
#include "fasttrain/tensor_parallel.h"

namespace ft::train {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The micro-batch's document ids, when the task packs documents (lm --doc-mask).
Tensor doc_ids_of(const data::Batch& b) {
  if (b.spec == nullptr) return Tensor();
  for (size_t f = 0; f < b.spec->size(); ++f)
    if ((*b.spec)[f].name == "doc_ids") return b.fields[f];
  return Tensor();
}

// The positions of a [b, T, C] activation a stage sends: under sequence parallelism each tensor
// rank holds its T / tp positions between blocks (the embedding gives them, the head gathers the
// whole sequence), so the stages exchange the rank's part, not the whole.
int64_t stage_positions(const nn::Module& model, int64_t T) {
  if (!dist::sequence_parallel(model)) return T;
  const std::shared_ptr<dist::Communicator> tensor = dist::tensor_group_of(model);
  return tensor ? T / tensor->world_size() : T;
}

}  // namespace

PipelineExecutor::PipelineExecutor(nn::Module& model, StepRunner& runner, dist::PipelineSync& sync,
                                   dist::PipelineSchedule schedule, StageLoss loss)
    : model_(model),
      stage_([&]() -> dist::PipelineStageModel& {
        dist::PipelineStageModel* s = dist::pipeline_stage_of(model);
        FT_CHECK(s != nullptr, "pipeline: the model (", model.type_name(),
                 ") is not built as a pipeline stage (built for GPT and Llama)");
        return *s;
      }()),
      runner_(&runner),
      sync_(sync),
      schedule_(schedule),
      loss_(std::move(loss)) {}

// Activations travel in the parameters' dtype: f32 (fp32 and the mixed modes, whose residual
// stream is f32) or bf16 (bf16-true). Both neighbours derive it alike, so no header is sent.
DType PipelineExecutor::wire_dtype() const {
  for (const Tensor& p : model_.parameters())
    if (is_floating(p.dtype())) return p.dtype();
  return DType::F32;
}

Tensor PipelineExecutor::run(const std::vector<data::Batch>& micro) {
  const dist::PipelineStage& st = stage_.pipeline_stage();
  const auto m = static_cast<int64_t>(micro.size());
  FT_CHECK(m == runner_->options().accumulate, "pipeline: ", m,
           " micro-batches for a step of accumulate = ", runner_->options().accumulate);
  const std::vector<dist::PipelineAction> actions = dist::pipeline_schedule(schedule_, st.index, st.count, m);
  const std::vector<dist::PipelineOp> program = dist::pipeline_program(actions, st.index, st.count);
  // Gradients are communicated by the data-parallel sync during the stage's final backward only.
  int64_t final_backward = 0;
  for (const dist::PipelineAction& a : actions)
    if (a.kind == dist::PipelineAction::Backward) final_backward = a.micro;
  const DType wire = wire_dtype();
  const Device device = model_.parameters().front().device();
  const bool mixed = precision_is_mixed(runner_->options().precision);
  const DType amp_dtype = mixed ? runner_->autocast_dtype() : DType::BF16;
  auto hidden_shape = [&](int64_t j) {
    const Tensor& ids = micro[j].fields[0];
    return Shape{ids.size(0), stage_positions(model_, ids.size(1)), stage_.hidden_size()};
  };

  // Per micro-batch: input leaf, output (or the last stage's loss to backpropagate), and the
  // messages in flight (the received gradient of the output, the gradient of the input to send).
  std::vector<Tensor> inputs(m), outputs(m), roots(m), sent_activation(m), received_grad(m), input_grad(m);
  Tensor loss_sum;
  stats_ = PipelineStats{};
  stats_.micro_batches = m;

  // Dropout as one process draws it: one process's forward of micro-batch j draws D counter
  // blocks (every stage's, in stage order) starting at start + j D, so stage s draws micro-batch
  // j's masks from start + j D + (the blocks of stages before s), whatever order the schedule
  // runs the forwards in; after the step every stage's generator is at start + m D, as one
  // process's. (Activation checkpointing saves the generator state at a block's forward and
  // replays it in the recomputation, so it draws the same masks.)
  const Shape shape = micro[0].fields[0].shape();
  if (shape != dropout_shape_) {
    Tensor mine = scalar_tensor(stage_.dropout_blocks(shape[0], shape[1]), DType::I64).reshape({1});
    Tensor all = empty({st.count}, DType::I64);
    st.group->all_gather(mine, all);
    dropout_blocks_.assign(all.data<int64_t>(), all.data<int64_t>() + st.count);
    dropout_shape_ = shape;
  }
  uint64_t per_micro = 0, before = 0;  // D, and the blocks of the stages before this one
  for (int s = 0; s < st.count; ++s) {
    if (s < st.index) before += static_cast<uint64_t>(dropout_blocks_[s]);
    per_micro += static_cast<uint64_t>(dropout_blocks_[s]);
  }
  Generator& gen = default_generator();
  const GeneratorState step_start = gen.state();
  const bool dropout = per_micro > 0 && model_.is_training();

  auto communicate = [&](const dist::PipelineOp& op) {
    using Msg = dist::PipelineMessage;
    Tensor out, in;
    if (op.send.peer >= 0)
      out = op.send.kind == Msg::Activation ? sent_activation[op.send.micro] : input_grad[op.send.micro];
    if (op.recv.peer >= 0) {
      in = empty(hidden_shape(op.recv.micro), wire);
      (op.recv.kind == Msg::Activation ? inputs : received_grad)[op.recv.micro] = in;
    }
    profiler::Range range("pipeline wait");
    const Clock::time_point start = Clock::now();
    if (out.defined() && in.defined())
      st.group->send_recv(out, op.send.peer, in, op.recv.peer);
    else if (out.defined())
      st.group->send(out, op.send.peer);
    else
      st.group->recv(in, op.recv.peer);
    stats_.wait_s += seconds_since(start);
    if (out.defined()) {
      stats_.bytes_sent += static_cast<int64_t>(out.nbytes());
      (op.send.kind == Msg::Activation ? sent_activation : input_grad)[op.send.micro] = Tensor();
    }
  };

  auto forward = [&](int64_t j) {
    fault::point("forward");
    Tensor input = micro[j].fields[0];
    if (!st.first()) {
      input = inputs[j].to(device);
      input.requires_grad_(true);  // a leaf: its gradient is what the previous stage backpropagates
      inputs[j] = input;
    }
    sync_.before_forward();
    const uint64_t draws_at = step_start.offset + static_cast<uint64_t>(j) * per_micro + before;
    if (dropout) gen.set_state({step_start.seed, draws_at});
    const uint64_t drawn_from = gen.state().offset;
    Tensor out, loss;
    {
      autocast::AutocastGuard amp(amp_dtype, mixed);  // forward and loss under autocast, backward outside
      profiler::PhaseScope phase(profiler::Phase::Forward);
      out = stage_.stage_forward(input, doc_ids_of(micro[j]));
      if (st.last()) loss = loss_(out, micro[j]);
    }
    if (model_.is_training()) {
      const uint64_t drawn = gen.state().offset - drawn_from;
      const auto expected = static_cast<uint64_t>(dropout_blocks_[st.index]);
      FT_CHECK(drawn == expected, "pipeline: ", st.describe(), " drew ", drawn,
               " random counter blocks in a forward, its model (dropout_blocks) says ", expected,
               "; the stages' dropout masks would not be one process's");
    }
    if (!st.last()) {
      outputs[j] = out;
      sent_activation[j] = out.detach().to(wire).to(Device::cpu()).contiguous();
      return;
    }
    const Tensor l = loss.detach().to(DType::F32);
    loss_sum = loss_sum.defined() ? add(loss_sum, l) : l;
    Tensor to_backprop = loss;
    if (m > 1) to_backprop = div(to_backprop, static_cast<double>(m));
    if (runner_->scaler().enabled()) to_backprop = runner_->scaler().scale(to_backprop);
    roots[j] = to_backprop;
  };

  auto backward = [&](int64_t j) {
    fault::point("backward");
    const bool last = j == final_backward;
    sync_.before_backward(last);
    {
      profiler::PhaseScope phase(profiler::Phase::Backward);
      if (st.last())
        roots[j].backward();
      else
        autograd::backward({outputs[j]}, {received_grad[j].to(device).to(outputs[j].dtype())});
    }
    sync_.after_backward(last);
    if (!st.first()) {
      const Tensor g = inputs[j].grad();
      FT_CHECK(g.defined(), "pipeline: ", st.describe(), ": micro-batch ", j, "'s input received no gradient");
      input_grad[j] = g.to(wire).to(Device::cpu()).contiguous();
    }
    inputs[j] = outputs[j] = roots[j] = received_grad[j] = Tensor();  // this micro-batch's graph is done
  };

  runner_->run_micro_batches([&] {
    for (const dist::PipelineOp& op : program) {
      if (!op.compute) {
        communicate(op);
        continue;
      }
      const Clock::time_point start = Clock::now();
      if (op.action.kind == dist::PipelineAction::Forward)
        forward(op.action.micro);
      else
        backward(op.action.micro);
      stats_.busy_s += seconds_since(start);
    }
  });
  if (dropout) gen.set_state({step_start.seed, step_start.offset + static_cast<uint64_t>(m) * per_micro});
  // Every stage reports the step's loss (logging, early stopping and the LR finder must agree):
  // the last stage's, broadcast over the pipeline group.
  Tensor loss = st.last() ? loss_sum.to(Device::cpu()).contiguous().clone().reshape({1}) : zeros({1}, DType::F32);
  st.group->broadcast(loss, st.count - 1);
  return loss.reshape({}).to(device);
}

void pipeline_trial_step(nn::Module& model, StepRunner& runner, dist::PipelineSchedule schedule, int64_t m,
                         const data::Batch& batch, const PipelineExecutor::StageLoss& loss) {
  dist::PipelineStageModel* stage = dist::pipeline_stage_of(model);
  FT_CHECK(stage != nullptr, "pipeline trial: the model (", model.type_name(), ") is not a pipeline stage");
  const dist::PipelineStage& st = stage->pipeline_stage();
  const std::vector<dist::PipelineAction> actions = dist::pipeline_schedule(schedule, st.index, st.count, m);
  const Tensor& ids = batch.fields[0];
  const Tensor first_param = model.parameters().front();
  const Shape hidden{ids.size(0), stage_positions(model, ids.size(1)), stage->hidden_size()};
  const bool mixed = precision_is_mixed(runner.options().precision);
  const DType amp_dtype = mixed ? runner.autocast_dtype() : DType::BF16;
  std::vector<Tensor> outputs(m), roots(m);
  runner.run_micro_batches([&] {
    for (const dist::PipelineAction& a : actions) {
      const int64_t j = a.micro;
      if (a.kind == dist::PipelineAction::Forward) {
        Tensor input = ids;
        if (!st.first()) {
          input = zeros(hidden, TensorOptions(first_param.dtype(), first_param.device()));
          input.requires_grad_(true);
        }
        autocast::AutocastGuard amp(amp_dtype, mixed);
        Tensor out = stage->stage_forward(input, doc_ids_of(batch));
        if (!st.last()) {
          outputs[j] = out;
          continue;
        }
        Tensor l = loss(out, batch);
        if (m > 1) l = div(l, static_cast<double>(m));
        roots[j] = runner.scaler().enabled() ? runner.scaler().scale(l) : l;
        continue;
      }
      if (st.last())
        roots[j].backward();
      else
        autograd::backward({outputs[j]}, {zeros_like(outputs[j])});
      outputs[j] = roots[j] = Tensor();
    }
  });
}

Tensor PipelineExecutor::evaluate(const data::Batch& batch) {
  const dist::PipelineStage& st = stage_.pipeline_stage();
  autograd::InferenceMode no_grad;
  const bool mixed = precision_is_mixed(runner_->options().precision);
  autocast::AutocastGuard amp(mixed ? runner_->autocast_dtype() : DType::BF16, mixed);
  const Device device = model_.parameters().front().device();
  Tensor input = batch.fields[0];
  if (!st.first()) {
    const Tensor& ids = batch.fields[0];
    Tensor in = empty({ids.size(0), stage_positions(model_, ids.size(1)), stage_.hidden_size()}, wire_dtype());
    st.group->recv(in, st.index - 1);  // one micro-batch down the stages: no two neighbours send at once
    input = in.to(device);
  }
  const Tensor out = stage_.stage_forward(input, doc_ids_of(batch));
  Tensor loss = zeros({1}, DType::F32);
  if (st.last())
    loss = loss_(out, batch).to(DType::F32).to(Device::cpu()).contiguous().clone().reshape({1});
  else
    st.group->send(out.to(wire_dtype()).to(Device::cpu()).contiguous(), st.index + 1);
  st.group->broadcast(loss, st.count - 1);
  return loss.reshape({}).to(device);
}

}  // namespace ft::train
