// The Trainer under pipeline parallelism (--pp; pipeline.h, docs/ARCHITECTURE.md "Pipeline
// parallelism"): the stage's PipelineSync around the tensor/data-parallel synchronisation, the
// executor that runs each step's micro-batches by the schedule, evaluation forward through the
// stages, and checkpoints that stay layout-independent: the whole model and the whole optimizer
// state (numbered as one process numbers them) are gathered from the stages to world rank 0, and
// on load each stage takes its part, so a run resumes at any (dp, tp, pp), one process included.
// Without --pp every function here is a no-op.
#include <cstdio>

#include "fasttrain/autograd.h"
#include "fasttrain/profiler.h"
#include "fasttrain/tasks.h"
#include "fasttrain/tensor_parallel.h"
#include "train/run_setup.h"
#include "train/trainer_impl.h"

namespace ft::train {

void Trainer::Impl::start_pipeline(const TrainerConfig& c) {
  if (!pipeline) return;
  nn::Module& model = module->model();
  FT_CHECK(dist::pipeline_stage_of(model) != nullptr, "option pp: ", c.dist.pp, " pipeline stages, but the model (",
           model.type_name(), ") is not built as a pipeline stage (built for GPT and Llama)");
  GradSync* inner = tp_sync ? static_cast<GradSync*>(tp_sync.get()) : ddp.get();
  pp_sync = std::make_unique<dist::PipelineSync>(model, inner);
}

void Trainer::Impl::make_pipeline_executor(const TrainerConfig& c) {
  if (!pp_sync) return;
  auto* decoder = dynamic_cast<nn::UnaryModule*>(&module->model());
  FT_CHECK(decoder != nullptr, "option pp: the model is not a decoder");
  // The last stage's loss: next-token cross-entropy of its logits (vocabulary-parallel under tp).
  auto loss = [decoder](const Tensor& logits, const data::Batch& b) {
    return next_token_cross_entropy(*decoder, logits, b.fields[1]);
  };
  pp_executor = std::make_unique<PipelineExecutor>(module->model(), *runner, *pp_sync, c.dist.pp_schedule, loss);
  const dist::PipelineStageModel& stage = *dist::pipeline_stage_of(module->model());
  // Numbered by the unsharded optimizer's groups (under ZeRO the Trainer's optimizer holds pieces).
  const std::unique_ptr<optim::Optimizer> full = zero ? make_optimizer(c, *module) : nullptr;
  pp_state_index = std::make_unique<dist::PipelineStateIndex>((full ? *full : *optimizer).param_groups(),
                                                              stage.tied_weight(), stage.pipeline_stage());
}

Tensor Trainer::Impl::pipeline_step(const std::vector<data::Batch>& micro) {
  Tensor loss = pp_executor->run(micro);
  runner->optimizer_step();
  const PipelineStats& s = pp_executor->stats();
  // The first step (allocations, first touches of every buffer) is not the steady state the
  // bubble formula describes: it is measured only when it is the only one.
  if (pp_first_only) {
    pp_total = PipelineStats{}, pp_steps = 0, pp_first_only = false;
  } else if (pp_steps == 0) {
    pp_first_only = true;
  }
  pp_total.busy_s += s.busy_s, pp_total.wait_s += s.wait_s, pp_total.bytes_sent += s.bytes_sent;
  pp_total.micro_batches = s.micro_batches;
  ++pp_steps;
  return loss;
}

EvalResult Trainer::Impl::evaluate_pipeline(const TrainerConfig& c) {
  nn::Module& model = module->model();
  model.eval();
  val_batches->load_state({0, 0, c.seed});  // the same batches at every evaluation
  // ZeRO stage 3: the root's parameters for the whole evaluation, each block's around its forward.
  if (zero) zero->before_forward();
  double loss_sum = 0;
  int64_t rows = 0;
  for (int64_t k = 0; c.eval_batches == 0 || k < c.eval_batches; ++k) {
    const data::Batch* next = val_batches->next();
    if (next == nullptr) break;
    // Batch means weighted by their rows, as evaluate_module does.
    loss_sum += pp_executor->evaluate(model_batch(*next)).item<double>() * static_cast<double>(next->rows);
    rows += next->rows;
  }
  if (zero) zero->release_all();
  model.train();
  FT_CHECK(rows > 0, "Trainer: the validation data is empty (no batch to evaluate)");
  EvalResult r;
  r.loss = loss_sum / static_cast<double>(rows);
  return r;
}

TensorMap Trainer::Impl::whole_model_state() const {
  const nn::Module& model = module->model();
  TensorMap stage = dist::gather_tensor_parallel_state(model);  // with the tensor group
  return pipeline ? dist::gather_pipeline_state(stage, *pipeline) : stage;
}

TensorMap Trainer::Impl::model_part_of(const TensorMap& whole) const {
  const nn::Module& model = module->model();
  const TensorMap stage = pipeline ? dist::stage_part_of_state(whole, model) : whole;
  return tensor ? dist::shard_tensor_parallel_state(stage, model) : stage;
}

TensorMap Trainer::Impl::whole_over_stages(const TensorMap& stage_state) const {
  if (!pipeline) return stage_state;
  TensorMap renumbered;
  for (const auto& [key, t] : stage_state) {
    const std::string whole = pp_state_index->to_whole(key);
    if (!whole.empty()) renumbered.emplace_back(whole, t);  // the head copy's state is the embedding's
  }
  return dist::gather_pipeline_state(renumbered, *pipeline);
}

TensorMap Trainer::Impl::stage_part_of_optimizer_state(const TensorMap& whole) const {
  if (!pipeline) return whole;
  TensorMap mine;
  for (const auto& [key, t] : whole) {
    const std::string local = pp_state_index->to_stage(key);
    if (!local.empty()) mine.emplace_back(local, t);
  }
  return mine;
}

std::string Trainer::Impl::pipeline_report(const TrainerConfig& c) const {
  if (!pipeline || pp_steps == 0) return "";
  // Every stage's busy and waiting time and bytes sent per step, gathered to report them side by side.
  const double steps = static_cast<double>(pp_steps);
  Tensor mine = empty({3}, DType::F64);
  mine.data<double>()[0] = pp_total.busy_s / steps;
  mine.data<double>()[1] = pp_total.wait_s / steps;
  mine.data<double>()[2] = static_cast<double>(pp_total.bytes_sent) / steps;
  Tensor all = empty({3 * pipeline->world_size()}, DType::F64);
  pipeline->all_gather(mine, all);
  const auto p = static_cast<double>(pipeline->world_size());
  const auto m = static_cast<double>(pp_total.micro_batches);
  const dist::PipelineStageModel& stage = *dist::pipeline_stage_of(module->model());
  const double bytes_per =
      static_cast<double>(c.batch_size) *
      static_cast<double>(dist::sequence_parallel(module->model()) ? c.model.context / c.dist.tp : c.model.context) *
      static_cast<double>(stage.hidden_size()) *
      static_cast<double>(dtype_size(c.precision.mode == Precision::BF16True ? DType::BF16 : DType::F32));
  std::string s = "pipeline bubble (" + std::string(name_of(c.dist.pp_schedule)) +
                  ", p = " + std::to_string(pipeline->world_size()) +
                  ", m = " + std::to_string(pp_total.micro_batches) + "): formula (p-1)/(m+p-1) = ";
  char buf[160];
  std::snprintf(buf, sizeof buf, "%.3f; measured idle fraction per stage:", (p - 1) / (m + p - 1));
  s += buf;
  for (int k = 0; k < pipeline->world_size(); ++k) {
    const double busy = all.data<double>()[3 * k], wait = all.data<double>()[3 * k + 1];
    std::snprintf(buf, sizeof buf, " %d: %.3f", k, busy + wait > 0 ? wait / (busy + wait) : 0.0);
    s += buf;
  }
  // Each boundary carries m activations one way and m gradients back: the stages' sends summed
  // over the p - 1 boundaries.
  double sent = 0;
  for (int k = 0; k < pipeline->world_size(); ++k) sent += all.data<double>()[3 * k + 2];
  std::snprintf(buf, sizeof buf, "; bytes per step per stage boundary %.0f (formula 2 m B T C bytes = %.0f)",
                sent / (p - 1), 2 * m * bytes_per);
  s += buf;
  return s;
}

}  // namespace ft::train
