// The Trainer's set-up around the loop (train.h): attaching a module (batch-size finder,
// optimizer, step runner, loaders, callbacks), one training step and one evaluation over the
// module's data, checkpoints written and applied, and the learning-rate finder. The loop itself
// is fit.cpp.
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <tuple>

#include <nlohmann/json.hpp>

#include "core/fault_injection.h"
#include "dist/nccl.h"
#include "fasttrain/atomic_file.h"
#include "fasttrain/autocast.h"
#include "fasttrain/autograd.h"
#include "fasttrain/callbacks.h"
#include "fasttrain/device_prefetcher.h"
#include "fasttrain/loader.h"
#include "fasttrain/optim.h"
#include "fasttrain/parallel.h"
#include "fasttrain/profile_run.h"
#include "fasttrain/profiler.h"
#include "fasttrain/random.h"
#include "fasttrain/safetensors.h"
#include "fasttrain/train_step.h"
#include "train/run_files.h"
#include "train/run_setup.h"
#include "train/seeds.h"
#include "train/trainer_impl.h"

namespace ft::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

json config_to_json(const TrainerConfig& c) {
  json j = json::object();
  visit_fields(c, [&](const OptionInfo& o, const auto& v) {
    using T = std::decay_t<decltype(v)>;
    if constexpr (NamedEnum<T>)
      j[o.name] = name_of(v);
    else if constexpr (TextOption<T>)
      j[o.name] = v.text;
    else
      j[o.name] = v;
  });
  return j;
}

// A folder whose writing was interrupted (checkpoints/step-N.tmp) is refused whatever it holds.
void check_finished(const std::string& dir, const char* who) {
  fs::path folder = fs::path(dir).lexically_normal();
  if (folder.filename().empty()) folder = folder.parent_path();  // "step-N/"
  FT_CHECK(!is_temporary_name(folder.filename().string()), who, dir,
           " is an unfinished checkpoint folder (its writing was interrupted); use a complete one, "
           "checkpoints/step-N without .tmp");
}

json parse_json(const std::string& text, const std::string& path) {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    FT_FAIL(path, ": invalid JSON: ", e.what());
  }
}

json sums_to_json(const std::vector<std::pair<std::string, Tensor>>& sums) {
  json j = json::array();
  for (const auto& [name, sum] : sums) j.push_back({name, sum.item<double>()});
  return j;
}

// NaN (a value no evaluation measured) is written as null.
double number_or_nan(const json& v) { return v.is_null() ? std::nan("") : v.get<double>(); }

json evaluation_to_json(const EvalResult& r) {
  json metrics = json::object();
  for (const auto& [name, value] : r.metrics) metrics[name] = value;
  return {{"loss", r.loss}, {"metrics", metrics}};
}

EvalResult evaluation_from_json(const json& j) {
  EvalResult r;
  r.loss = number_or_nan(j.at("loss"));
  if (j.contains("metrics"))
    for (const auto& [name, value] : j.at("metrics").items()) r.metrics.emplace_back(name, number_or_nan(value));
  return r;
}

}  // namespace

const data::Batch& Trainer::Impl::next_batch() {
  fault::point("data");
  const data::Batch* b = batches->next();
  if (b == nullptr) b = batches->next();
  FT_CHECK(b != nullptr, "Trainer: the data loader produced an empty epoch");
  return *b;
}

void Trainer::Impl::make_runner(const TrainerConfig& c) {
  runner = std::make_unique<StepRunner>(module->model(), *optimizer, step_options(c));
  runner->set_grad_sync(grad_sync());  // none with one rank
  make_pipeline_executor(c);           // none without --pp
}

namespace {

// Adds `value` (f32) to the sum named `name` in `sums`, in first-seen order.
void accumulate_metric(std::vector<std::pair<std::string, Tensor>>& sums, const std::string& name, Tensor value) {
  if (value.dtype() != DType::F32) value = value.to(DType::F32);
  for (auto& [n, sum] : sums)
    if (n == name) {
      sum = add(sum, value);
      return;
    }
  sums.emplace_back(name, value);
}

void check_loss(const StepOutput& out, const char* who) {
  FT_CHECK(out.loss.defined() && out.loss.numel() == 1, who, ": expected a loss with one element, found ",
           out.loss.defined() ? out.loss.shape().str() : std::string("none"));
}

// The batch as a module reads it: floating fields in bf16 for bf16-true runs.
// The batch as the model takes it: bf16 fields in bf16-true; image fields (4-d, floating) in
// NHWC memory when the model's weights are (channels_last), so the first convolution does not
// reorder its input.
data::Batch batch_for_model(const data::Batch& b, Precision precision, bool channels_last) {
  if (precision != Precision::BF16True && !channels_last) return b;
  data::Batch converted = b;
  for (Tensor& f : converted.fields) {
    if (!is_floating(f.dtype())) continue;
    if (precision == Precision::BF16True && f.dtype() != DType::BF16) f = f.to(DType::BF16);
    if (channels_last && f.dim() == 4) f = f.contiguous_channels_last();
  }
  return converted;
}

// Loss and metrics over the validation batches (the first eval_batches, 0: all), in the run's
// precision, under inference mode with the model in eval mode.
EvalResult evaluate_module(TrainModule& module, data::DevicePrefetcher& val_batches, const TrainerConfig& c,
                           Precision precision) {
  autograd::InferenceMode guard;
  // Evaluation runs in the training precision (Lightning does the same).
  const bool mixed = precision_is_mixed(precision);
  autocast::AutocastGuard amp(precision == Precision::FP16Mixed ? DType::F16 : DType::BF16, mixed);
  nn::Module& model = module.model();
  model.eval();
  val_batches.load_state({0, 0, c.seed});  // the same batches at every evaluation
  Tensor loss_sum;
  std::vector<std::pair<std::string, Tensor>> sums;
  int64_t rows = 0;
  for (int64_t k = 0; c.eval_batches == 0 || k < c.eval_batches; ++k) {
    const data::Batch* next = val_batches.next();
    if (next == nullptr) break;
    const data::Batch b = batch_for_model(*next, precision, c.precision.channels_last);
    const StepOutput out = module.validation_step(b);
    check_loss(out, "validation_step");
    // Batch means weighted by their rows: the split's mean however its last batch falls.
    const double w = static_cast<double>(b.rows);
    Tensor l = mul(out.loss.to(DType::F32), w);
    loss_sum = loss_sum.defined() ? add(loss_sum, l) : l;
    for (const Metric& m : out.metrics) accumulate_metric(sums, m.name, mul(m.value.to(DType::F32), w));
    rows += b.rows;
  }
  model.train();
  FT_CHECK(rows > 0, "Trainer: the validation data is empty (no batch to evaluate)");
  EvalResult r;
  r.loss = loss_sum.item<double>() / static_cast<double>(rows);
  for (const auto& [name, sum] : sums) r.metrics.emplace_back(name, sum.item<double>() / static_cast<double>(rows));
  return r;
}

// A loader over the validation data, read in order.
std::unique_ptr<data::DataLoader> make_val_loader(const DataModule& data, const TrainerConfig& c) {
  const ValData val = data.val_data(c.batch_size);
  FT_CHECK((val.dataset != nullptr) != (val.stream != nullptr),
           "Trainer: expected the validation data as a dataset or a stream (exactly one), found ",
           val.dataset ? "both" : "neither");
  data::LoaderOptions vo;
  vo.batch_size = c.batch_size;
  vo.pin_memory = c.pin_memory;
  vo.seed = c.seed;
  if (!val.dataset) return std::make_unique<data::DataLoader>(val.stream, vo);
  FT_CHECK(val.dataset->size() > 0, "Trainer: the validation dataset is empty");
  return std::make_unique<data::DataLoader>(val.dataset, vo,
                                            std::make_shared<data::SequentialSampler>(val.dataset->size()));
}

}  // namespace

data::Batch Trainer::Impl::model_batch(const data::Batch& b) const {
  return batch_for_model(b, runner->options().precision, channels_last);
}

EvalResult Trainer::validate(TrainModule& module, const DataModule& data) {
  FT_CHECK(config_.batch_size > 0, "validate: expected a batch size, found auto (0)");
  const Precision precision = config_.precision.mode;
  module.model().to(impl_->device);
  if (precision == Precision::BF16True) module.model().to(DType::BF16);
  std::unique_ptr<data::DataLoader> loader = make_val_loader(data, config_);
  data::DevicePrefetcher batches(*loader, impl_->device);
  return evaluate_module(module, batches, config_, precision);
}

Tensor Trainer::Impl::train_step(int64_t accumulate, double* data_wait) {
  auto fetch = [&] {
    const auto wait_start = std::chrono::steady_clock::now();
    data::Batch batch = [&] {
      profiler::PhaseScope phase(profiler::Phase::Data);
      return model_batch(next_batch());  // valid until the next call: used before it
    }();
    *data_wait += std::chrono::duration<double>(std::chrono::steady_clock::now() - wait_start).count();
    if (profiler::active()) [[unlikely]]
      label_batch(batch);
    items += module->items_in(batch);
    return batch;
  };
  // The module's training step on `fields` (the batch's, or the copies a CUDA graph reads); the
  // metrics' values go to `outputs`, their names to metric_names (a graph replay does not run
  // the module: its metrics are those of the step captured, names and all).
  auto micro_step = [&](const data::Batch& batch, const std::vector<Tensor>& fields, std::vector<Tensor>& outputs) {
    data::Batch b = batch;
    b.fields = fields;
    StepOutput out = module->training_step(b);
    check_loss(out, "training_step");
    metric_names.clear();
    for (Metric& m : out.metrics) {
      metric_names.push_back(m.name);
      outputs.push_back(std::move(m.value));
    }
    return out.loss;
  };
  auto add_metrics = [&](const std::vector<Tensor>& values) {
    for (size_t i = 0; i < values.size(); ++i) accumulate_metric(metric_sums, metric_names[i], values[i].detach());
  };
  if (pp_executor) {
    // Pipeline: the step's micro-batches all at once, for the schedule to interleave (copies: a
    // fetched batch is valid until the next fetch).
    std::vector<data::Batch> micro;
    for (int64_t k = 0; k < accumulate; ++k) {
      data::Batch b = fetch();
      for (Tensor& f : b.fields) f = f.clone();
      micro.push_back(std::move(b));
    }
    return pipeline_step(micro);
  }
  if (accumulate == 1) {
    // One batch a step: StepRunner's step, which a CUDA graph can capture and replay.
    const data::Batch batch = fetch();
    StepResult r = runner->step(batch.fields, [&](const std::vector<Tensor>& fields, std::vector<Tensor>& outputs) {
      return micro_step(batch, fields, outputs);
    });
    add_metrics(r.outputs);
    return r.loss;
  }
  Tensor step_loss;
  for (int64_t micro = 0; micro < accumulate; ++micro) {
    const data::Batch batch = fetch();
    std::vector<Tensor> outputs;
    Tensor l = runner->forward_backward([&] { return micro_step(batch, batch.fields, outputs); });
    add_metrics(outputs);
    step_loss = step_loss.defined() ? add(step_loss, l) : l;
  }
  runner->optimizer_step();
  return step_loss;
}

EvalResult Trainer::Impl::evaluate(const TrainerConfig& c) {
  if (pp_executor) return evaluate_pipeline(c);
  if (!zero) return evaluate_module(*module, *val_batches, c, runner->options().precision);
  // ZeRO stage 3: the root's parameters for the whole evaluation, each block's around its forward.
  zero->before_forward();
  EvalResult r = evaluate_module(*module, *val_batches, c, runner->options().precision);
  zero->release_all();
  return r;
}

double Trainer::Impl::momentum_in_use() const {
  const auto& o = optimizer->param_groups().front().options;
  return optim::optimizer_family(optimizer->kind()) == optim::OptimizerFamily::Adam ? o.beta1 : o.momentum;
}

double Trainer::Impl::epoch_at(int64_t step, int64_t accumulate) const {
  const int64_t per_epoch = loader->batches_per_epoch();
  if (per_epoch <= 0) return static_cast<double>(batches->state().epoch);
  return static_cast<double>(step * accumulate) / static_cast<double>(per_epoch);
}

std::string task_description(const TrainModule& module) {
  json j;
  try {
    j = json::parse(module.description_json());
  } catch (const json::exception& e) {
    FT_FAIL("TrainModule::description_json: expected a JSON object, found invalid JSON: ", e.what());
  }
  FT_CHECK(j.is_object(), "TrainModule::description_json: expected a JSON object, found ", j.type_name());
  return j.dump(2) + "\n";
}

double monitored(const TrainerConfig& c, const EvalResult& r) {
  if (c.checkpoint.monitor == Monitor::ValAccuracy) return r.metric("accuracy").value_or(std::nan(""));
  return r.loss;
}

Trainer::Trainer(TrainerConfig config) : config_(std::move(config)), impl_(std::make_unique<Impl>()) {
  config_.validate();
  // threads 0 is all cores, also after an earlier Trainer in this process asked for fewer.
  set_num_threads(config_.threads > 0 ? static_cast<int>(config_.threads) : default_num_threads());
  const int64_t limit = config_.memory_limit.bytes;
  if (limit > 0) allocator_for(Device::cpu()).set_memory_limit(static_cast<size_t>(limit));
  impl_->job = impl_->comm = dist::world();
  impl_->device =
      dist::local_device(config_.device, impl_->job->local_rank(), config_.device == "cpu" ? 0 : cuda_device_count());
  // NCCL when asked for (auto stays on MPI until a GPU run has verified the NCCL communicator:
  // docs/ARCHITECTURE.md, "Data parallelism on GPUs"). MPI stays the host channel under it.
  constexpr bool kNcclByDefault = false;
  if (dist::choose_backend(config_.dist.backend, impl_->device.is_cuda(), impl_->job->world_size(), config_.dist.tp,
                           config_.dist.pp, dist::nccl_compiled(), kNcclByDefault) == dist::Backend::Nccl)
    impl_->job = impl_->comm = dist::make_nccl_communicator(impl_->job, impl_->device);
  if (config_.dist.tp * config_.dist.pp > 1) {
    // The groups of the layout (refused here, on every rank, when the world does not split).
    const dist::ProcessGroups& g =
        dist::process_groups(static_cast<int>(config_.dist.tp), static_cast<int>(config_.dist.pp));
    impl_->comm = g.data;
    if (g.tp > 1) impl_->tensor = g.tensor;
    if (g.pp > 1) impl_->pipeline = g.pipeline;
  }
  // Dropout draws from the default generator: seeded here, each data-parallel rank its own
  // stream, saved (rank 0's) and restored by checkpoints. The ranks of a tensor group share one
  // stream: their replicated activations must drop the same units.
  default_generator().set_state({rank_stream(derive_seed(config_.seed, SeedUse::Dropout), impl_->comm->rank()), 0});
  apply_distributed_settings(config_, *impl_->job);
  if (config_.dist.tp * config_.dist.pp > 1) {
    const dist::ProcessGroups& g =
        dist::process_groups(static_cast<int>(config_.dist.tp), static_cast<int>(config_.dist.pp));
    for (const auto& group : {g.tensor, g.data, g.pipeline}) group->set_debug(config_.dist.debug);
  }
}

// The memory budget is the run's: a later Trainer (or program) without one must not inherit it.
Trainer::~Trainer() {
  if (config_.memory_limit.bytes > 0) allocator_for(Device::cpu()).set_memory_limit(0);
}

void Trainer::request_stop() { impl_->stop_requested.store(true); }

void Trainer::attach(TrainModule& module, const DataModule& data) {
  Impl& im = *impl_;
  if (im.module == &module && im.data == &data) return;
  FT_CHECK(im.module == nullptr, "Trainer: already attached to another module; use one Trainer per module and data");
  if (config_.batch_size == 0) {  // --batch-size auto
    const BatchSizeSearch found = find_batch_size(config_, module, data);
    const double scale = static_cast<double>(found.batch_size) /
                         static_cast<double>(TrainerConfig::defaults_for(config_.task).batch_size);
    config_.batch_size = found.batch_size;
    config_.optimizer.lr *= scale;  // the linear scaling rule
    if (double* min_lr = config_.schedule.min_lr()) *min_lr *= scale;
    batch_size_report_ = found.report;
  }
  nn::Module& model = module.model();
  model.to(im.device);  // before the optimizer: its state follows the parameters
  // The GPU libraries' switches (Lightning's `deterministic` and `benchmark`); the CPU's kernels are
  // deterministic whatever they say.
  set_deterministic_algorithms(config_.deterministic);
  set_cudnn_benchmark(config_.cudnn_benchmark);
  model.train();
  if (config_.precision.checkpoint_blocks) set_block_checkpointing(model, true);
  if (config_.precision.channels_last) model.to_channels_last();
  im.channels_last = config_.precision.channels_last;
  im.module = &module;
  im.data = &data;
  im.start_data_parallel(config_);
  im.start_pipeline(config_);
  im.optimizer = im.sharded(make_optimizer(config_, module), config_);
  make_loaders();
  size_steps_from_epochs();  // before the schedule, which spans max_steps
  im.schedule = make_schedule(config_);
  im.make_runner(config_);
  const MonitorMode mode = config_.checkpoint.monitor == Monitor::ValAccuracy ? MonitorMode::Max : MonitorMode::Min;
  if (config_.checkpoint.early_stopping_patience > 0)
    im.early_stopping = std::make_unique<EarlyStopping>(mode, config_.checkpoint.early_stopping_patience,
                                                        config_.checkpoint.early_stopping_min_delta);
  if (config_.checkpoint.keep_last > 0)  // keep_last 0 keeps every checkpoint
    im.keeper = std::make_unique<CheckpointKeeper>(config_.checkpoint.keep_last, config_.checkpoint.keep_best, mode);
  if (!resume_dir_.empty()) apply_resume();
}

// max_steps 0 with max_epochs (Lightning's max_steps=-1): as many optimisation steps as the epochs
// hold, known once the loader has counted the batches of an epoch. The resolved count is what the
// schedule spans and what the run folder's config.toml records, so a resumed run keeps it.
void Trainer::size_steps_from_epochs() {
  if (config_.max_steps > 0) return;
  const int64_t per_epoch = impl_->loader->batches_per_epoch();
  FT_CHECK(per_epoch > 0,
           "option max_epochs: sizing the run by epochs alone needs training data of known length, found a stream "
           "(it has no epochs to count); give --max-steps");
  config_.max_steps = std::max<int64_t>(1, config_.max_epochs * per_epoch / config_.accumulate);
}

void Trainer::make_loaders() {
  Impl& im = *impl_;
  const Device device = im.device;
  data::LoaderOptions lo;
  lo.batch_size = config_.batch_size;
  lo.num_workers = static_cast<int>(config_.workers);
  lo.pin_memory = config_.pin_memory;
  lo.prefetch_factor = static_cast<int>(config_.prefetch);
  lo.drop_last = true;  // every step sees batch_size samples
  lo.seed = config_.seed;
  const TrainData train = im.data->train_data(config_.batch_size);
  FT_CHECK((train.dataset != nullptr) != (train.stream != nullptr),
           "Trainer: expected the training data as a dataset or a stream (exactly one), found ",
           train.dataset ? "both" : "neither");
  if (train.dataset) {
    const data::SamplerPtr sampler = train.sampler
                                         ? train.sampler
                                         : std::make_shared<data::RandomSampler>(
                                               train.dataset->size(), derive_seed(config_.seed, SeedUse::TrainBatches));
    im.loader = std::make_unique<data::DataLoader>(train.dataset, lo, im.rank_sampler(sampler));
    FT_CHECK(im.loader->batches_per_epoch() >= config_.accumulate, "Trainer: the training data holds ", sampler->size(),
             " samples per epoch, fewer than batch_size x accumulate", im.world() > 1 ? " x ranks" : "", " = ",
             config_.batch_size * config_.accumulate * im.world());
  } else {
    im.loader = std::make_unique<data::DataLoader>(im.rank_stream(train.stream), lo);
  }
  im.batches = std::make_unique<data::DevicePrefetcher>(*im.loader, device);

  im.val_loader = make_val_loader(*im.data, config_);
  im.val_batches = std::make_unique<data::DevicePrefetcher>(*im.val_loader, device);
}

void Trainer::save_checkpoint(const std::string& dir) const {
  const std::string tmp = dir + ".tmp";
  const dist::GatheredParameters whole(impl_->zero.get());  // stage 3: the consolidated model
  // ZeRO: every rank writes its optimizer shard into rank 0's temporary folder (distributed.cpp).
  if (impl_->zero && !impl_->tensor && !impl_->pipeline && !impl_->rank0()) return impl_->save_optimizer_shard(tmp);
  // Tensor parallelism: rank 0's tensor group gathers the model and the optimizer state (the
  // files one process would write: a checkpoint does not depend on the layout); rank 0 writes.
  // Under ZeRO every rank takes part: each data group consolidates its shards first.
  TensorMap whole_model, whole_optimizer;
  const bool model_parallel = impl_->tensor || impl_->pipeline;
  if (model_parallel) {
    whole_model = impl_->whole_model_state();  // the stages' and tensor parts, on rank 0
    whole_optimizer = impl_->whole_optimizer_state(config_);
    if (!impl_->rank0()) return;
  }
  std::error_code ec;
  fs::remove_all(tmp, ec);
  // A half-written folder helps nobody (its name already says it is unfinished): gone on any error.
  struct RemoveUnlessCommitted {
    const std::string& path;
    bool committed = false;
    ~RemoveUnlessCommitted() {
      std::error_code ignored;
      if (!committed) fs::remove_all(path, ignored);
    }
  } cleanup{tmp};
  FT_CHECK(impl_->module != nullptr, "save_checkpoint: no module yet (fit() or lr_find() attaches one)");
  make_dirs(tmp);
  if (model_parallel) {
    save_safetensors(tmp + "/model.safetensors", whole_model, {{"format", "pt"}});  // as Module::save
  } else {
    impl_->module->model().save(tmp + "/model.safetensors");
  }
  fault::point("checkpoint-file", tmp + "/model.safetensors");
  if (impl_->zero && !model_parallel) {
    impl_->save_optimizer_shard(tmp);  // returns once every rank's shard is in tmp
  } else {
    save_safetensors(tmp + "/optimizer.safetensors",
                     model_parallel ? whole_optimizer : impl_->optimizer->state_tensors(),
                     impl_->zero ? impl_->zero->full_metadata(impl_->optimizer->state_metadata())
                                 : impl_->optimizer->state_metadata());
    fault::point("checkpoint-file", tmp + "/optimizer.safetensors");
  }
  save_safetensors(tmp + "/loss_scaler.safetensors", impl_->runner->scaler().state_tensors());
  fault::point("checkpoint-file", tmp + "/loss_scaler.safetensors");
  if (config_.precision.mode == Precision::FP8Mixed) {  // the layers' delayed scales and amax histories
    save_safetensors(tmp + "/fp8_scales.safetensors", fp8_state_tensors(impl_->module->model()));
    fault::point("checkpoint-file", tmp + "/fp8_scales.safetensors");
  }
  write_file_atomically(tmp + "/config.toml", config_to_toml(config_));
  fault::point("checkpoint-file", tmp + "/config.toml");
  write_file_atomically(tmp + "/task.json", task_description(*impl_->module));
  fault::point("checkpoint-file", tmp + "/task.json");
  const GeneratorState g = default_generator().state();
  const data::LoaderState ls = impl_->batches->state();
  json state = {{"step", step_},
                {"epoch", impl_->epoch_at(step_, config_.accumulate)},
                {"loader", {{"epoch", ls.epoch}, {"position", ls.position}, {"seed", ls.seed}}},
                {"default_generator", {{"seed", g.seed}, {"offset", g.offset}}},
                {"pending_loss_sum", impl_->loss_count ? impl_->loss_sum.item<double>() : 0.0},
                {"pending_loss_count", impl_->loss_count},
                {"pending_items", impl_->items},
                {"pending_metric_sums", sums_to_json(impl_->metric_sums)},
                {"optimizer", impl_->optimizer->name()},
                {"ranks", impl_->world()},  // batch_size is per rank: the global batch is batch_size x ranks
                {"monitored", impl_->checkpoint_metric},
                {"config", config_to_json(config_)}};
  if (impl_->checkpoint_eval_step == step_) state["evaluation"] = evaluation_to_json(impl_->checkpoint_eval);
  if (impl_->early_stopping) state["early_stopping"] = json::parse(impl_->early_stopping->state());
  // Last: a folder holding trainer_state.json holds every other file too.
  write_file_atomically(tmp + "/trainer_state.json", state.dump(2) + "\n");
  fault::point("checkpoint-file", tmp + "/trainer_state.json");
  fault::point("checkpoint-commit", dir);
  replace_folder(tmp, dir);
  cleanup.committed = true;
}

TrainerConfig load_run_config(const std::string& dir) {
  FT_CHECK(fs::is_directory(dir), dir, ": no such run or checkpoint folder");
  check_finished(dir, "");
  const std::string path = dir + "/config.toml";
  TrainerConfig c;
  apply_toml(c, read_text(path, "the run configuration"), path);
  return c;
}

void Trainer::resume(const std::string& dir) {
  const std::string state_path = dir + "/trainer_state.json";
  FT_CHECK(fs::is_directory(dir), "resume: ", dir, ": no such checkpoint folder");
  check_finished(dir, "resume: ");
  FT_CHECK(fs::exists(state_path), "resume: ", dir, " is not a checkpoint folder (it has no trainer_state.json)");
  json saved = config_to_json(load_run_config(dir)), now = config_to_json(config_);
  // A job may resume at another number of ranks (ZeRO's shards are cut anew on load): the
  // global batch must match, not the per-rank one.
  const int64_t saved_ranks = parse_json(read_text(state_path, "the trainer state"), state_path).value("ranks", 1);
  if (saved["batch_size"].is_number_integer() && now["batch_size"].is_number_integer() &&
      saved["batch_size"].get<int64_t>() * saved_ranks == now["batch_size"].get<int64_t>() * impl_->world())
    saved["batch_size"] = now["batch_size"];
  visit_fields(config_, [&](const OptionInfo& o, const auto&) {
    const char* key = o.name;
    if (o.on_resume == OnResume::MustMatch)
      FT_CHECK(saved[key] == now[key], "resume: the checkpoint was trained with ", key, " = ", saved[key].dump(),
               ", this run has ", key, " = ", now[key].dump());
  });
  resume_dir_ = dir;
  if (impl_->module != nullptr) apply_resume();  // attached already: e.g. after a failed fit()
}

void Trainer::apply_resume() {
  const std::string& dir = resume_dir_;
  const std::string state_path = dir + "/trainer_state.json";
  const json st = parse_json(read_text(state_path, "the trainer state"), state_path);
  int64_t step = 0, pending_count = 0, pending_items = 0;
  double pending_sum = 0;
  std::vector<std::pair<std::string, double>> pending_metrics;
  GeneratorState g;
  data::LoaderState ls;
  EvalResult evaluation;
  const bool evaluated = st.contains("evaluation");
  try {
    if (evaluated) evaluation = evaluation_from_json(st.at("evaluation"));
    step = st.at("step").get<int64_t>();
    pending_count = st.at("pending_loss_count").get<int64_t>();
    pending_sum = st.at("pending_loss_sum").get<double>();
    pending_items = st.value("pending_items", int64_t{0});
    if (st.contains("pending_metric_sums"))
      pending_metrics = st.at("pending_metric_sums").get<std::vector<std::pair<std::string, double>>>();
    // Rank 0's stream was saved; every rank draws the same count per step, so each continues its
    // own stream at the same offset (also at another number of ranks).
    g.seed = rank_stream(st.at("default_generator").at("seed").get<uint64_t>(), impl_->comm->rank());
    g.offset = st.at("default_generator").at("offset").get<uint64_t>();
    ls.epoch = st.at("loader").at("epoch").get<uint64_t>();
    ls.position = st.at("loader").at("position").get<int64_t>();
    ls.seed = st.at("loader").at("seed").get<uint64_t>();
  } catch (const json::exception& e) {
    FT_FAIL(state_path, ": malformed trainer state: ", e.what());
  }
  FT_CHECK(step >= 0 && pending_count >= 0, state_path, ": malformed trainer state: negative step or count");
  // Read and check every file before changing anything: a truncated or altered checkpoint is an
  // error that leaves the module and this trainer as they were (safetensors checks sizes,
  // offsets and CRCs).
  SafetensorsFile weights = load_safetensors(dir + "/model.safetensors");
  SafetensorsFile opt_state = impl_->load_optimizer_state(dir, config_);  // this rank's shard under ZeRO
  SafetensorsFile scaler_state = load_safetensors(dir + "/loss_scaler.safetensors");
  const bool fp8 = config_.precision.mode == Precision::FP8Mixed;
  SafetensorsFile fp8_state = fp8 ? load_safetensors(dir + "/fp8_scales.safetensors") : SafetensorsFile{};
  Impl& im = *impl_;
  {
    const dist::GatheredParameters whole(im.zero.get());  // stage 3: memory to load into
    im.module->model().load_state_dict(im.model_part_of(weights.tensors), /*strict=*/true);
    if (im.zero) im.zero->load_weights_from_model();  // the shards' master weights are the loaded ones
  }
  im.optimizer->load_state_tensors(opt_state.tensors);
  im.optimizer->load_state_metadata(opt_state.metadata);
  im.runner->scaler().load_state_tensors(scaler_state.tensors);
  if (fp8)
    load_fp8_state_tensors(im.module->model(), im.runner->options().fp8, fp8_state.tensors,
                           dir + "/fp8_scales.safetensors");
  try {
    // The checkpoint keeper is not restored: it manages the folders of this run, not the old one's.
    if (im.early_stopping && st.contains("early_stopping"))
      im.early_stopping->load_state(st.at("early_stopping").dump());
  } catch (const json::exception& e) {
    FT_FAIL(state_path, ": malformed trainer state: ", e.what());
  }
  im.batches->load_state(ls);
  step_ = step;
  default_generator().set_state(g);
  im.loss_count = pending_count;
  im.loss_sum = pending_count ? scalar_tensor(pending_sum, DType::F32) : Tensor();
  im.items = pending_items;
  im.metric_sums.clear();
  for (const auto& [name, sum] : pending_metrics) im.metric_sums.emplace_back(name, scalar_tensor(sum, DType::F32));
  im.resumed_from = dir;
  im.checkpoint_eval_step = evaluated ? step : -1;
  im.checkpoint_eval = evaluation;
  resume_dir_.clear();
}

LrFindResult Trainer::lr_find(TrainModule& module, const DataModule& data, const LrFindOptions& options) {
  attach(module, data);
  Impl& im = *impl_;
  nn::Module& model = module.model();
  // Snapshot everything the sweep changes; state_dict and state tensors are live views: clone.
  TensorMap weights;
  {
    const dist::GatheredParameters whole(im.zero.get());
    for (const auto& [name, t] : model.state_dict()) weights.emplace_back(name, t.clone());
  }
  const bool had_optimizer_state = im.optimizer->step_count() > 0;
  TensorMap opt_tensors;
  for (const auto& [name, t] : im.optimizer->state_tensors()) opt_tensors.emplace_back(name, t.clone());
  const auto opt_meta = im.optimizer->state_metadata();
  TensorMap scaler_state;
  for (const auto& [name, t] : im.runner->scaler().state_tensors()) scaler_state.emplace_back(name, t.clone());
  const data::LoaderState loader_state = im.batches->state();
  const GeneratorState generator = default_generator().state();
  const auto metric_sums = im.metric_sums;
  const int64_t items = im.items;

  double data_wait = 0;
  auto sweep_step = [&](double lr) {
    im.optimizer->set_lr(lr);
    Tensor loss = im.train_step(config_.accumulate, &data_wait);
    // Every rank must see the same loss, or the ranks would end the sweep at different steps.
    if (im.world() > 1) {
      loss = loss.to(DType::F64);
      im.comm->all_reduce(loss, dist::ReduceOp::Avg);
    }
    return loss.item<double>() / static_cast<double>(config_.accumulate);
  };
  LrFindResult result = find_lr(sweep_step, options);

  // Restore: weights, a fresh optimizer (and its state if it had one), scaler, data, RNG.
  if (im.zero) im.zero->gather_all();  // stage 3: sharded() below shards the restored weights anew
  model.load_state_dict(weights, /*strict=*/true);
  im.optimizer = im.sharded(make_optimizer(config_, module), config_);
  if (had_optimizer_state) {
    im.optimizer->load_state_tensors(opt_tensors);
    im.optimizer->load_state_metadata(opt_meta);
  }
  im.make_runner(config_);
  im.runner->scaler().load_state_tensors(scaler_state);
  im.batches->load_state(loader_state);
  default_generator().set_state(generator);
  im.metric_sums = metric_sums;
  im.items = items;
  return result;
}

}  // namespace ft::train
