// The training loop: TrainerConfig (PyTorch Lightning's vocabulary), the learning-rate schedule,
// gradient clipping, and the Trainer that runs a task, evaluates it, logs, checkpoints and
// resumes exactly. Implemented in src/train/.
#pragma once
#include <algorithm>
#include <concepts>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "fasttrain/dist.h"
#include "fasttrain/lr_finder.h"
#include "fasttrain/names.h"
#include "fasttrain/optim.h"
#include "fasttrain/pipeline.h"
#include "fasttrain/schedule.h"
#include "fasttrain/task_options.h"
#include "fasttrain/tensor.h"
#include "fasttrain/train_module.h"
#include "fasttrain/train_step.h"

namespace ft::train {

// The metric that picks the best checkpoints and stops early (Lightning's `monitor`):
// val_loss (lower is better) or val_accuracy (higher is better).
enum class Monitor { ValLoss, ValAccuracy };
// How the batch-size finder searches (Lightning's `mode`): power (double until a batch fails)
// or binsearch (then bisect between the last that fitted and the first that failed).
enum class BatchSizeSearchMode { Power, Binsearch };
std::span<const NamedValue<Monitor>> option_names(Monitor);  // names.h
std::span<const NamedValue<BatchSizeSearchMode>> option_names(BatchSizeSearchMode);

// Options that are text where they enter (flags, TOML, config.toml, JSON) and are parsed once
// there: the value is kept with the text it was given as, which is what is written back.
// `parse(option, text)` throws "option <name>: expected ..., found '...'".
struct MemorySize {  // "8G", "512M", "1.5G", "1048576"; "" (0 bytes): none
  int64_t bytes = 0;
  std::string text;
  static MemorySize parse(const char* option, const std::string& text);
};
struct StepList {  // "100,200,300" ("": none); the multistep schedule checks they increase from 0
  std::vector<int64_t> steps;
  std::string text;
  static StepList parse(const char* option, const std::string& text);
};
struct StepRange {  // "START:END" or "N" (1-based, inclusive); "": none (first = last = 0)
  int64_t first = 0, last = 0;
  std::string text;
  bool empty() const { return first == 0; }
  static StepRange parse(const char* option, const std::string& text);
};
struct StageLayers {  // "3,3,2": blocks per pipeline stage (--pp-layers); "": balanced by parameters
  std::vector<int64_t> layers;
  std::string text;
  static StageLayers parse(const char* option, const std::string& text);
};
// A type of the above: what visit_fields' users treat as text at the edges.
template <class T>
concept TextOption = requires(const T& v, const std::string& s) {
  { T::parse("", s) } -> std::same_as<T>;
  { v.text } -> std::convertible_to<std::string>;
};

// [optimizer]: the optimizer, its hyper-parameters and gradient clipping.
struct OptimizerOptions {
  optim::OptimizerKind kind = optim::OptimizerKind::AdamW;  // --optimizer; TOML key `name`
  double lr = 5e-3;                                         // peak learning rate
  double weight_decay = 0.1;                                // not applied to biases and norm weights
  double momentum = 0.9;                                    // sgd, lars
  double beta1 = 0.9, beta2 = 0.99;                         // adam/adamw/lamb
  double trust_coefficient = 0.001;                         // lars
  double grad_clip = 1.0;                                   // max global gradient norm (or value); 0: off
  ClipAlgorithm gradient_clip_algorithm = ClipAlgorithm::Norm;
};

// [schedule]: the learning-rate schedule, one struct of parameters per kind, so a run holds only
// the parameters its schedule reads. Each lists its fields once in fields(self, f), which
// visit_fields() turns into options (flags and TOML keys of the same names; their help is
// schedule_parameter_help()). Defaults are PyTorch's where it has the schedule, except gamma.
struct CosineSchedule {  // linear warmup, then a half cosine from lr to min_lr at max_steps
  static constexpr optim::ScheduleKind kind = optim::ScheduleKind::Cosine;
  double min_lr = 5e-4;
  int64_t warmup_steps = 50;
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("min_lr", s.min_lr), f("warmup_steps", s.warmup_steps);
  }
};
struct ConstantSchedule {
  static constexpr optim::ScheduleKind kind = optim::ScheduleKind::Constant;
  template <class S, class F>
  static void fields(S&, F&&) {}
};
struct StepSchedule {  // lr * gamma^floor(step / step_size)
  static constexpr optim::ScheduleKind kind = optim::ScheduleKind::Step;
  int64_t step_size = 100;
  double gamma = 0.1;
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("step_size", s.step_size), f("gamma", s.gamma);
  }
};
struct MultiStepSchedule {  // lr * gamma^(milestones passed)
  static constexpr optim::ScheduleKind kind = optim::ScheduleKind::MultiStep;
  StepList milestones;
  double gamma = 0.1;
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("milestones", s.milestones), f("gamma", s.gamma);
  }
};
struct ExponentialSchedule {  // lr * gamma^step
  static constexpr optim::ScheduleKind kind = optim::ScheduleKind::Exponential;
  double gamma = 0.1;
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("gamma", s.gamma);
  }
};
struct LinearSchedule {  // the factor moves from start_factor to end_factor over linear_steps
  static constexpr optim::ScheduleKind kind = optim::ScheduleKind::Linear;
  double start_factor = 1.0 / 3, end_factor = 1.0;
  int64_t linear_steps = 5;
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("start_factor", s.start_factor), f("end_factor", s.end_factor), f("linear_steps", s.linear_steps);
  }
};
struct WsdSchedule {  // warmup, stable at lr, linear decay to min_lr over the last decay_steps
  static constexpr optim::ScheduleKind kind = optim::ScheduleKind::Wsd;
  double min_lr = 5e-4;
  int64_t warmup_steps = 50;
  int64_t decay_steps = 0;  // 0: a fifth of max_steps
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("min_lr", s.min_lr), f("warmup_steps", s.warmup_steps), f("decay_steps", s.decay_steps);
  }
};
struct OneCycleSchedule {  // OneCycleLR with max_lr = lr
  static constexpr optim::ScheduleKind kind = optim::ScheduleKind::OneCycle;
  double pct_start = 0.3;
  optim::AnnealStrategy anneal_strategy = optim::AnnealStrategy::Cos;
  double div_factor = 25, final_div_factor = 1e4;
  bool three_phase = false;
  bool cycle_momentum = true;
  double base_momentum = 0.85, max_momentum = 0.95;
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("pct_start", s.pct_start), f("anneal_strategy", s.anneal_strategy), f("div_factor", s.div_factor);
    f("final_div_factor", s.final_div_factor), f("three_phase", s.three_phase);
    f("cycle_momentum", s.cycle_momentum), f("base_momentum", s.base_momentum), f("max_momentum", s.max_momentum);
  }
};
struct CyclicSchedule {  // CyclicLR between min_lr and lr
  static constexpr optim::ScheduleKind kind = optim::ScheduleKind::Cyclic;
  double min_lr = 5e-4;
  int64_t step_size = 100;     // steps of the rising half cycle
  int64_t step_size_down = 0;  // steps of the falling half (0: step_size)
  optim::CyclicMode cyclic_mode = optim::CyclicMode::Triangular;
  double gamma = 0.1;  // exp_range
  bool cycle_momentum = true;
  double base_momentum = 0.85, max_momentum = 0.95;
  template <class S, class F>
  static void fields(S& s, F&& f) {
    f("min_lr", s.min_lr), f("step_size", s.step_size), f("step_size_down", s.step_size_down);
    f("cyclic_mode", s.cyclic_mode), f("gamma", s.gamma);
    f("cycle_momentum", s.cycle_momentum), f("base_momentum", s.base_momentum), f("max_momentum", s.max_momentum);
  }
};
// Alternative i is the schedule of ScheduleKind i (checked in config.cpp).
using ScheduleParams = std::variant<CosineSchedule, ConstantSchedule, StepSchedule, MultiStepSchedule,
                                    ExponentialSchedule, LinearSchedule, WsdSchedule, OneCycleSchedule, CyclicSchedule>;
// The help of a schedule parameter, by name ("" for none).
const char* schedule_parameter_help(std::string_view name);
// The kinds that have parameter `name` ("onecycle, cyclic"); "" when none has it.
std::string schedule_kinds_with(std::string_view name);

// The schedule of a run: which kind, with its parameters. Its text form is the kind's name
// (--schedule, TOML `[schedule] name`); parse() gives that kind with its default parameters.
struct ScheduleOptions {
  ScheduleParams params;
  std::string text;  // the kind's name

  ScheduleOptions(ScheduleParams p = CosineSchedule{});
  template <class S>
  requires requires { S::kind; }
  ScheduleOptions(S params) : ScheduleOptions(ScheduleParams(std::move(params))) {}
  optim::ScheduleKind kind() const { return static_cast<optim::ScheduleKind>(params.index()); }
  static ScheduleOptions parse(const char* option, const std::string& name);
  // Makes the schedule the kind `name`, keeping the parameters both kinds have (min_lr from
  // cosine to wsd); naming the kind it is changes nothing. How flags and TOML set it.
  void switch_to(const char* option, const std::string& name);
  // The parameters as kind S; ft::Error naming both kinds when the schedule is another.
  template <class S>
  S& as() {
    check_kind(S::kind);
    return std::get<S>(params);
  }
  template <class S>
  const S& as() const {
    check_kind(S::kind);
    return std::get<S>(params);
  }
  // min_lr of the kinds that have one (cosine, wsd, cyclic); nullptr for the others.
  double* min_lr();
  const double* min_lr() const { return const_cast<ScheduleOptions*>(this)->min_lr(); }

 private:
  void check_kind(optim::ScheduleKind wanted) const;
};

// [precision]: what a step computes in and keeps (autocast, activation checkpointing, layouts,
// graph capture).
struct PrecisionOptions {
  Precision mode = Precision::FP32;  // --precision; TOML key `mode`
  bool checkpoint_blocks = false;    // activation checkpointing of every transformer / residual block
  bool channels_last = false;        // NHWC weights and image batches for convolution models
  // CUDA: capture the step once and replay it (StepOptions); on by default, as the replays equal
  // eager steps bit for bit (tests/cuda/test_cuda_graphs.cpp). No effect on the CPU.
  bool cuda_graphs = true;
  // fp8-mixed's delayed scaling (fp8.h's Fp8Recipe): steps of amax history, how the history gives
  // the scale, and the margin (scales divided by 2^margin).
  int64_t fp8_amax_history = 1024;
  Fp8AmaxAlgo fp8_amax_algo = Fp8AmaxAlgo::Max;
  int64_t fp8_margin = 0;
};

// [checkpoint]: checkpoints, the metric that ranks them, and early stopping on it.
struct CheckpointOptions {
  int64_t every = 0;      // --checkpoint-every; 0: no checkpoints
  int64_t keep_last = 2;  // newest checkpoints kept (0: all)
  int64_t keep_best = 1;  // best checkpoints by `monitor` kept besides
  Monitor monitor = Monitor::ValLoss;
  int64_t early_stopping_patience = 0;  // evaluations without improvement before stopping (0: off)
  double early_stopping_min_delta = 0;
};

// [dist]: jobs of several processes started by mpirun or srun (dist.h). The strategy when the job
// has more than one rank: "ddp" (replicated weights, gradients averaged in buckets during
// backward); "zero1" (optimizer state sharded over the ranks), "zero2" (gradients too), "zero3"
// or its alias "fsdp" (parameters too, gathered block by block for forward and backward).
// batch_size is per rank: the global batch is batch_size x ranks.
// Model parallelism (process_groups.h, tensor_parallel.h, pipeline.h): tp ranks split each layer
// (Megatron-LM's tensor parallelism), pp ranks hold consecutive stages of blocks (GPipe or 1F1B
// over the accumulate micro-batches), and the world / (tp x pp) data-parallel replicas use the
// strategy above (ddp under model parallelism); the global batch is then batch_size x (world /
// (tp x pp)).
struct DistOptions {
  dist::Strategy strategy = dist::Strategy::Ddp;
  dist::Backend backend = dist::Backend::Auto;  // --dist-backend: mpi, nccl (auto: mpi until NCCL is verified)
  int64_t tp = 1;                               // --tp: tensor-parallel ranks (adjacent world ranks)
  int64_t pp = 1;                               // --pp: pipeline stages (the outermost world ranks)
  dist::PipelineSchedule pp_schedule = dist::PipelineSchedule::OneFOneB;  // --pp-schedule
  StageLayers pp_layers;                                                  // --pp-layers
  bool sequence_parallel = false;  // --sequence-parallel: with tp, activations split along the sequence
  double bucket_cap_mb = 25;  // ddp: gradient bucket size in MiB (the first bucket is at most 1 MiB); 0: one bucket
  double timeout = 300;       // --dist-timeout: seconds a collective may wait before the job is aborted (0: never)
  bool debug = false;         // --dist-debug: compare every collective across ranks first (dist.h set_debug)
};

// [profile]: profile_run.h.
struct ProfileOptions {
  StepRange steps;              // --profile: steps to profile; none: off
  bool memory_history = false;  // record every allocation over the profiled steps (default 1:3)
  bool detect_sync = false;     // count and name each step's host-device synchronisations (CUDA)
};

// Every option of a run, in tables as TOML has them. The CLI (`fasttrain train --help`), TOML run
// files and the config.toml written into each run folder all go through visit_fields(), so the
// flag names (with '-' for '_') are the names there; the command line stays flat.
struct TrainerConfig {
  // The built-in task `fasttrain train` runs (tasks.h): "char" (char-level GPT on the Markov
  // text) or "images" (shapes). For a module of one's own it only names the run folder.
  std::string task = "char";
  // --- loop ---
  int64_t max_steps = 600;    // 0 with max_epochs: as many steps as max_epochs passes over the data take
  int64_t max_epochs = 0;     // 0: no epoch limit; otherwise stop after this many passes as well
  int64_t eval_every = 100;   // Lightning's val_check_interval, in steps; 0: only at the end
  int64_t eval_batches = 16;  // validation batches per evaluation (0: the whole split; images' default)
  int64_t log_every_n_steps = 25;
  uint64_t seed = 1337;
  bool deterministic = true;     // no nondeterministic kernels (all CPU kernels are deterministic)
  bool cudnn_benchmark = false;  // autotune each convolution shape once (CUDA; cudnn.benchmark)
  int64_t threads = 0;           // 0: all cores
  std::string device = "cpu";
  std::string run_dir;      // "": runs/<task>-<timestamp>
  bool progress = true;     // the live progress line on stderr
  bool tensorboard = true;  // TensorBoard event file in <run_dir>/tensorboard
  // --- data loading (the DataLoader that feeds training batches) ---
  int64_t workers = 0;      // loader threads; 0: batches are read in the training thread
  bool pin_memory = false;  // page-locked batch buffers (CUDA); aligned host memory otherwise
  int64_t prefetch = 2;     // batches in flight per worker
  // --- batch and memory ---
  int64_t batch_size = 32;  // 0 ("auto" on the command line): the batch-size finder picks it
  int64_t accumulate = 1;   // micro-batches per optimizer step (Lightning's accumulate_grad_batches)
  MemorySize memory_limit;  // CPU memory budget for tensors ("8G", "512M"; none by default)
  BatchSizeSearchMode batch_size_search = BatchSizeSearchMode::Power;
  int64_t max_batch_size = 4096;  // batch-size finder: upper bound
  // --- the tables ---
  OptimizerOptions optimizer;
  ScheduleOptions schedule;
  PrecisionOptions precision;
  CheckpointOptions checkpoint;
  DistOptions dist;
  ProfileOptions profile;
  // --- the built-in tasks' model and data: [model] and [data] tables in TOML ---
  ModelOptions model;
  DataOptions data;

  // The defaults of a built-in task ("char", "images", "lm" or "classify"): the fields above with
  // the task's own loop, optimisation and model settings; another name gets the member defaults.
  // Defined with the tasks (src/tasks/task_options.cpp); the Trainer's --batch-size auto scales
  // the lr by the found batch over the task's default one.
  static TrainerConfig defaults_for(const std::string& task);
  // Checks every option of the run; throws ft::Error naming the option, expected, found. The
  // built-in tasks' [model] and [data] options are checked by validate_task_options (tasks.h),
  // which make_builtin_task calls.
  void validate() const;
};

// Whether a checkpoint resumes under another value of an option. MustMatch: the option defines
// the model, the data or the optimizer state. The optimizer's hyper-parameters other than the
// learning rate travel in its state, so they must match too (the learning rate is set from the
// schedule every step); precision and accumulate change what a step computes and how far the
// data advances per step. The others (steps, intervals, the lr schedule, threads, folders) may
// change.
enum class OnResume { MayChange, MustMatch };

// Where an option lives in a TOML run file: at the top level or in one of the tables.
enum class Section { Run, Model, Data, Optimizer, Schedule, Precision, Checkpoint, Dist, Profile };
inline constexpr Section kSections[] = {Section::Run,        Section::Model,    Section::Data,
                                        Section::Optimizer,  Section::Schedule, Section::Precision,
                                        Section::Checkpoint, Section::Dist,     Section::Profile};
const char* section_name(Section s);  // "" for Run, else the table's name ("model", "optimizer", ...)

// One option as visit_fields() describes it.
struct OptionInfo {
  const char* name;  // the flag (with '-' for '_'), unique over all sections
  const char* help;  // starts with "char, lm: " when only those built-in tasks use the option
  OnResume on_resume = OnResume::MayChange;
  Section section = Section::Run;
  const char* key = nullptr;  // the TOML key inside its section; nullptr: the name
  const char* toml_key() const { return key != nullptr ? key : name; }
};

// Calls visitor(info, field) for every option of `c` in a fixed order, the options of a section
// together; field is a reference to an int64_t, uint64_t, double, bool or std::string member, or
// to an enum with a name table (names.h: NamedEnum), whose names are its text everywhere.
// One list for CLI, TOML, JSON and the checks of resume(). The schedule's parameters are those of
// its kind; ScheduleKinds::Every visits every kind's (for --help and the checks of names).
enum class ScheduleKinds { Active, Every };
template <class Config, class V>
void visit_fields(Config& c, V&& visitor, ScheduleKinds kinds = ScheduleKinds::Active) {
  // in(section)(name, field, help[, on_resume[, key]]): one option of that table; key is its TOML
  // key inside the table when it differs from the flag name.
  auto in = [&visitor](Section section) {
    return [&visitor, section](const char* name, auto& field, const char* help,
                               OnResume on_resume = OnResume::MayChange, const char* key = nullptr) {
      visitor(OptionInfo{name, help, on_resume, section, key}, field);
    };
  };
  const auto v = in(Section::Run), model = in(Section::Model), data = in(Section::Data);
  const auto opt = in(Section::Optimizer), sched = in(Section::Schedule), prec = in(Section::Precision);
  const auto ckpt = in(Section::Checkpoint), dist = in(Section::Dist), prof = in(Section::Profile);
  constexpr OnResume locked = OnResume::MustMatch, may_change = OnResume::MayChange;
  v("task", c.task, "task: char (char-level GPT on generated text) or images (procedural shapes)", locked);
  v("max_steps", c.max_steps,
    "optimisation steps (0 with max_epochs: as many as the epochs take, which also sizes the schedule; given "
    "--max-epochs without --max-steps, the command line chooses 0)");
  v("max_epochs", c.max_epochs, "stop after this many passes over the training data as well (0: no limit)");
  v("eval_every", c.eval_every, "evaluate on the validation split every N steps (0: only at the end)");
  v("eval_batches", c.eval_batches, "validation batches per evaluation (0: the whole split, the images default)");
  v("log_every_n_steps", c.log_every_n_steps, "log training metrics every N steps");
  v("seed", c.seed, "seed of the data, the initial weights and every random stream", locked);
  v("deterministic", c.deterministic,
    "require deterministic kernels (every CPU kernel is: results do not depend on threads; on CUDA, cuDNN "
    "convolutions choose among deterministic algorithms)");
  v("cudnn_benchmark", c.cudnn_benchmark,
    "CUDA: time every cuDNN algorithm on each convolution shape's first call and keep the fastest "
    "(torch.backends.cudnn.benchmark); with deterministic on, among the deterministic ones");
  v("threads", c.threads, "CPU threads (0: all cores)");
  v("device", c.device, "device: cpu, cuda or cuda:N");
  v("run_dir", c.run_dir, "run folder (default runs/<task>-<timestamp>)");
  v("progress", c.progress, "show the live progress line on stderr");
  v("tensorboard", c.tensorboard, "write TensorBoard event files to <run_dir>/tensorboard");
  v("workers", c.workers, "data loader worker threads (0: read batches in the training thread)");
  v("pin_memory", c.pin_memory, "page-locked batch buffers for asynchronous host-to-device copies (CUDA)");
  v("prefetch", c.prefetch, "batches each data loader worker prepares ahead");
  v("batch_size", c.batch_size,
    "sequences (char) or images per micro-batch; auto (0): the largest that fits memory, lr scaled linearly", locked);
  v("accumulate", c.accumulate, "micro-batches per optimizer step (gradient accumulation)", locked);
  v("memory_limit", c.memory_limit,
    "budget for tensor memory, e.g. 8G or 512M (empty: none); allocations past it fail cleanly");
  v("batch_size_search", c.batch_size_search,
    "batch-size finder: power (double until it fails) or binsearch (then bisect)");
  v("max_batch_size", c.max_batch_size, "batch-size finder: largest batch tried");
  // --- [optimizer] ---
  opt("optimizer", c.optimizer.kind, "adamw, adam, sgd, lamb or lars", locked, "name");
  opt("lr", c.optimizer.lr, "peak learning rate (onecycle: max_lr; cyclic: the top of the cycle)");
  opt("weight_decay", c.optimizer.weight_decay, "weight decay (decoupled for adamw/lamb; none on biases and norms)",
      locked);
  opt("momentum", c.optimizer.momentum, "sgd/lars momentum", locked);
  opt("beta1", c.optimizer.beta1, "adam/adamw/lamb beta1", locked);
  opt("beta2", c.optimizer.beta2, "adam/adamw/lamb beta2", locked);
  opt("trust_coefficient", c.optimizer.trust_coefficient, "lars trust coefficient (eta)", locked);
  opt("grad_clip", c.optimizer.grad_clip,
      "clip gradients to this global norm (or value, see gradient_clip_algorithm; 0: off)");
  opt("gradient_clip_algorithm", c.optimizer.gradient_clip_algorithm, "norm (global L2 norm) or value (each element)");
  // --- [schedule] ---
  sched("schedule", c.schedule,
        "cosine (warmup + cosine to min_lr), constant, step, multistep, exponential, linear, wsd "
        "(warmup-stable-decay), onecycle or cyclic; each has its own parameters, below",
        may_change, "name");
  // The parameters of the run's schedule kind, or of every kind (each name once; the run's own
  // values for its kind, the defaults for the others).
  std::vector<std::string_view> seen;
  auto param = [&](const char* name, auto& field) {
    if (std::find(seen.begin(), seen.end(), name) != seen.end()) return;
    seen.push_back(name);
    sched(name, field, schedule_parameter_help(name));
  };
  auto visit_kind = [&](auto& params) { std::decay_t<decltype(params)>::fields(params, param); };
  if (kinds == ScheduleKinds::Active) {
    std::visit(visit_kind, c.schedule.params);
  } else {
    [&]<size_t... I>(std::index_sequence<I...>) {
      (
          [&] {
            if (c.schedule.params.index() == I) return visit_kind(std::get<I>(c.schedule.params));
            std::variant_alternative_t<I, ScheduleParams> defaults{};
            visit_kind(defaults);
          }(),
          ...);
    }
    (std::make_index_sequence<std::variant_size_v<ScheduleParams>>{});
  }
  // --- [precision] ---
  prec("precision", c.precision.mode,
       "32, tf32, bf16-mixed, fp16-mixed (with dynamic loss scaling), bf16-true or fp8-mixed (bf16-mixed with linear "
       "layers in FP8, delayed scaling; emulated on the CPU)",
       locked, "mode");
  prec("fp8_amax_history", c.precision.fp8_amax_history,
       "fp8-mixed: steps of amax history each FP8 scale comes from (Transformer Engine's amax_history_len)", locked);
  prec("fp8_amax_algo", c.precision.fp8_amax_algo,
       "fp8-mixed: max (the history's largest amax) or most_recent (the last step's)", locked);
  prec("fp8_margin", c.precision.fp8_margin, "fp8-mixed: FP8 scales are divided by 2^margin (headroom)", locked);
  prec("checkpoint_blocks", c.precision.checkpoint_blocks,
       "activation checkpointing: recompute each transformer/residual block in backward to save memory");
  prec("cuda_graphs", c.precision.cuda_graphs,
       "CUDA (on by default): capture the whole training step as a CUDA graph after 3 eager steps and replay it for "
       "batches of the same shapes (accumulate 1, one process); what cannot be captured (a host read such as item()) "
       "is reported and the steps run eagerly");
  prec("channels_last", c.precision.channels_last,
       "channels-last (NHWC) memory format for the model's 4-d weights and the image batches (convolution models)");
  // --- [checkpoint] ---
  ckpt("checkpoint_every", c.checkpoint.every, "write a checkpoint every N steps (0: none)", may_change, "every");
  ckpt("keep_last", c.checkpoint.keep_last, "checkpoints: keep the newest N (0: keep all)");
  ckpt("keep_best", c.checkpoint.keep_best, "checkpoints: also keep the best N by monitor");
  ckpt("monitor", c.checkpoint.monitor, "metric for best checkpoints and early stopping: val_loss or val_accuracy");
  ckpt("early_stopping_patience", c.checkpoint.early_stopping_patience,
       "stop after N evaluations without improvement of monitor (0: off)");
  ckpt("early_stopping_min_delta", c.checkpoint.early_stopping_min_delta,
       "smallest change of monitor that counts as an improvement");
  // --- [profile] ---
  prof("profile", c.profile.steps,
       "profile steps START:END (or N): <run_dir>/profile/trace.json (Chrome trace, Perfetto), summary.json and a "
       "per-step breakdown printed at the end (\"\": off)",
       may_change, "steps");
  prof("memory_history", c.profile.memory_history,
       "record every allocation over the profiled steps (--profile, else steps 1:3) to <run_dir>/profile/memory.json "
       "with the peak split by category and module");
  prof("detect_sync", c.profile.detect_sync,
       "count and name the host-device synchronisations of every step (CUDA); printed to stderr for the first step "
       "and whenever they change, the last step's in summary.json");
  // --- [dist] ---
  dist("strategy", c.dist.strategy,
       "data parallelism when launched by mpirun/srun with several ranks: ddp, zero1 (optimizer state sharded), "
       "zero2 (gradients too), zero3 or fsdp (parameters too); batch_size is per rank; with tp, over each data group "
       "(the replicas of one tensor rank's parts)");
  dist("dist_backend", c.dist.backend,
       "what moves the tensors of a job of several ranks: mpi (host memory; GPU tensors staged through host copies) "
       "or nccl (GPU to GPU, one GPU per rank; no tp or pp yet); auto: mpi (nccl is not yet verified on a GPU)",
       may_change, "backend");
  dist(
      "tp", c.dist.tp,
      "tensor-parallel ranks: each GPT or Llama block's heads and MLP and the vocabulary split over this many adjacent "
      "ranks (Megatron-LM); the world size must be a multiple of tp x pp; data parallel (ddp, zero1-3) over world / "
      "(tp x pp)");
  dist("pp", c.dist.pp,
       "pipeline-parallel stages: GPT's and Llama's blocks cut into this many consecutive stages (balanced by "
       "parameters, or --pp-layers), the micro-batches (accumulate) flowing through them by --pp-schedule; idle "
       "fraction (pp - 1) / (accumulate + pp - 1)");
  dist("pp_schedule", c.dist.pp_schedule,
       "pipeline schedule: 1f1b (at most pp - stage micro-batches' activations held; needs accumulate >= pp) or "
       "gpipe (all forwards, then all backwards)");
  dist("pp_layers", c.dist.pp_layers, "blocks per pipeline stage, e.g. 3,3,2 (\"\": balanced by parameters)");
  dist("sequence_parallel", c.dist.sequence_parallel,
       "with tp: sequence parallelism (Megatron-LM's): the norms, residual adds and embeddings between the parallel "
       "layers run on this rank's 1/tp of the positions (all-gather and reduce-scatter instead of all-reduce: the "
       "same bytes, 1/tp of those activations' memory); the same numbers as without it",
       may_change);
  dist("bucket_cap_mb", c.dist.bucket_cap_mb,
       "ddp: gradients are averaged in buckets of at most this many MiB (the first at most 1 MiB; 0: one bucket)");
  dist("dist_timeout", c.dist.timeout,
       "seconds a collective may wait for the other ranks before the whole job is aborted (0: never)", may_change,
       "timeout");
  dist("dist_debug", c.dist.debug,
       "check before each collective that every rank issues the same one (kind, dtype, size); a mismatch fails on "
       "every rank, naming each rank's collective (one small extra all-gather per collective)",
       may_change, "debug");
  model("model", c.model.name,
        "images, lm, classify: images: cnn-mini (BENCH.md) or cnn-tiny; lm: gpt-mini, gpt2, gpt2-medium, gpt2-large or "
        "custom (a GPT of --layers/--dim/--heads/--context), llama-mini, smollm-135m, smollm-360m, tinyllama-1.1b, "
        "llama-3.2-1b or llama (a Llama of --layers/--dim/--heads/--kv-heads/--ffn-dim/--rope-theta/--context; a "
        "Llama preset takes --context, its training window); classify: mlp, cnn-mini, resnet18, resnet20 or resnet50",
        locked, "name");
  model("context", c.model.context, "char, lm: tokens of context", locked);
  model("layers", c.model.layers, "char, lm: transformer blocks", locked);
  model("dim", c.model.dim, "char, lm: model width", locked);
  model("heads", c.model.heads, "char, lm: attention heads", locked);
  model("kv_heads", c.model.kv_heads,
        "lm: --model llama: key/value heads (0: heads; fewer: grouped-query attention, 1: multi-query)", locked);
  model("ffn_dim", c.model.ffn_dim, "lm: --model llama: gated MLP width (0: 8/3 of dim, rounded up to 64)", locked);
  model("rope_theta", c.model.rope_theta, "lm: --model llama: rotary embedding base (rope_theta)", locked);
  model("dropout", c.model.dropout, "char, lm: dropout probability", may_change);
  model("init_from", c.model.init_from,
        "lm: initial weights from a .safetensors file (Hugging Face GPT-2 and Llama names accepted)", may_change);
  data("data", c.data.train,
       "lm, classify: training data; lm: a glob of token shards ('dir/*train*.bin'); classify: mnist:DIR, cifar10:DIR, "
       "folder:DIR (a sub-folder of JPEG/PNG images per class) or npy:X.npy,y.npy",
       locked, "train");
  data("val_data", c.data.val,
       "lm, classify: validation data in the same form (classify: empty holds out val_fraction of the training data)",
       locked, "val");
  data("val_fraction", c.data.val_fraction,
       "classify: share of the training data held out for validation without val_data", locked);
  data("vocab_size", c.data.vocab_size, "lm: vocabulary size (0: from the tokenizer or vocab file beside the shards)",
       locked);
  data("doc_mask", c.data.doc_mask,
       "lm: document masking: a token attends only to earlier tokens of its own document in the packed window "
       "(Llama 3's block-diagonal causal mask); a document begins at each document-start token the shards' vocab.json "
       "names (GPT-2: <|endoftext|>; tokenizer.json: begin-of-text, else end-of-text). Positions (learned or "
       "rotary) are not reset per document, as in Llama 3",
       may_change);
  data("augment", c.data.augment, "classify: random crop with 4-pixel padding and horizontal flip of training images",
       may_change);
  data("train_chars", c.data.train_chars, "char: characters in the generated training text", locked);
  data("val_chars", c.data.val_chars, "char: characters in the generated validation text", locked);
  data("image_size", c.data.image_size, "images, classify: image side in pixels (classify: images are resized to it)",
       locked);
  data("classes", c.data.classes, "images: number of shape classes (2-6)", locked);
  data("train_images", c.data.train_images, "images: training images", locked);
  data("val_images", c.data.val_images, "images: validation images", locked);
  data("goal_gap", c.data.goal_gap, "char: goal, validation loss within this many nats of the entropy floor",
       may_change);
  data(
      "goal_accuracy", c.data.goal_accuracy,
      "images, classify: goal, validation accuracy to reach (0: none; the images task's own is 0.95, data of one's own "
      "has none unless given)",
      may_change);
}

// The config as TOML text (every field, resolved), and back. Parsing rejects unknown keys and
// values of the wrong type, naming the key; keys absent from the text keep their value in `into`.
std::string config_to_toml(const TrainerConfig& c);
void apply_toml(TrainerConfig& into, const std::string& toml_text, const std::string& source_name);
// Sets one field from its text form ("--lr 0.01" -> set_field(c, "lr", "0.01")).
void set_field(TrainerConfig& c, const std::string& name, const std::string& value);
// The built-in tasks an option applies to, as its help in visit_fields starts ("char, lm"), or ""
// for every task.
std::string option_scope(const std::string& name);
// Whether option `name` applies to built-in task `task`.
bool option_applies(const std::string& name, const std::string& task);

// The learning-rate schedule of the config (schedule and its parameters; lr, min_lr, max_steps).
std::unique_ptr<optim::Schedule> make_schedule(const TrainerConfig& c);
// memory_limit as bytes ("8G", "512M", "1.5G", "1048576"; "" is 0: none); ft::Error otherwise.
int64_t parse_memory_size(const std::string& text);

// One logged row of metrics.csv (and of Trainer::history()). Values a row does not measure are
// empty, not placeholders.
struct MetricRow {
  int64_t step = 0;
  double epoch = 0;   // steps x accumulate / batches per epoch (iterable data: epochs begun)
  std::string split;  // "train" or "val"
  double loss = 0;
  std::optional<double> accuracy;  // the module's "accuracy" metric, where it reports one
  double lr = 0;
  std::optional<double> momentum;    // momentum or beta1 in use (train rows)
  std::optional<double> grad_norm;   // train rows: global gradient norm before clipping (norm clipping)
  std::optional<double> loss_scale;  // train rows, fp16-mixed: the loss scale
  double items_per_s = 0;            // train rows: tokens/s or samples/s (the module's unit)
  double elapsed_s = 0;
  double data_wait_ms = 0;  // train rows: mean time per step blocked waiting for the batch
  // The module's other metrics (interval means on train rows, split means on val rows).
  std::vector<std::pair<std::string, double>> metrics;
};

struct TrainResult {
  std::string run_dir;
  int64_t steps = 0;
  double final_train_loss = 0;
  double final_val_loss = 0;
  std::optional<double> final_val_accuracy;  // where the module reports an accuracy
  std::optional<double> floor;               // the module's loss floor, where it knows one
  bool goal_met = false;
  std::string goal;  // human sentence: what the goal was and how the run did ("" without a goal)
  double seconds = 0;
  double items_per_s = 0;  // training throughput (evaluation time excluded)
  double data_wait_s = 0;  // total time the steps were blocked waiting for their batch
  std::string unit;        // what items_per_s counts: "tokens" or "samples"
  std::string model;       // the model's type name
  int64_t parameters = 0;
  int64_t batch_size = 0;       // as trained (the finder's choice with --batch-size auto)
  bool interrupted = false;     // SIGINT/SIGTERM: a checkpoint was saved and the run stopped
  bool stopped_early = false;   // early stopping ended the run
  std::string last_checkpoint;  // the newest checkpoint folder written ("" if none)
};

class Trainer {
 public:
  // Validates the config and applies its process-wide settings (threads, memory limit, the seed
  // of the dropout stream; under mpirun/srun: the job's communicator, its timeout, threads per
  // rank).
  explicit Trainer(TrainerConfig config);
  ~Trainer();
  // Trains `module` on `data` to max_steps (or max_epochs), evaluating, logging and
  // checkpointing on the way; writes the run folder (metrics.csv, config.toml, task.json,
  // model.safetensors, summary.json). The first call builds the optimizer and the loaders for
  // the module (after the batch-size finder when batch_size is auto) and applies a checkpoint
  // given to resume(); later calls with the same module continue from where the last one ended.
  // Module and data must outlive the Trainer.
  // In a job of several ranks (dist.h) each rank trains its share of every batch with DDP
  // (batch_size is per rank) and only rank 0 prints and writes the run folder; an error on any
  // rank ends the whole job (dist::abort_job) instead of returning, since the other ranks cannot
  // go on without it.
  TrainResult fit(TrainModule& module, const DataModule& data);
  // Continue from a checkpoint folder written by a Trainer: model, optimizer, step, data position
  // and RNG state are restored. The folder and its config are checked here (complete, the model
  // and data options matching this config); its tensors are read and applied as the next fit()
  // starts, or at once when a module is attached already (after a failed fit(), say). A bad
  // checkpoint is an error that leaves the module and the trainer as they were.
  void resume(const std::string& checkpoint_dir);

  // Loss and metrics of `module` on data.val_data() (its first eval_batches batches; 0: all) in
  // the config's precision, without training (Lightning's Trainer.validate; `fasttrain eval`).
  // In bf16-true the module's weights are converted to bf16 first, as training converts them.
  EvalResult validate(TrainModule& module, const DataModule& data);

  const TrainerConfig& config() const { return config_; }
  int64_t step() const { return step_; }
  const std::vector<MetricRow>& history() const { return history_; }
  // Writes a checkpoint of the current state into `dir` (atomically: a temporary folder renamed).
  // Only after fit() or lr_find() has attached a module. Under ZeRO (strategy zero1/2/3 with
  // several ranks) every rank must call it: each writes its optimizer shard, rank 0 the rest.
  void save_checkpoint(const std::string& dir) const;
  // Asks fit() to save a checkpoint and return after the current step (what SIGINT and SIGTERM
  // do during fit(); safe to call from a signal handler or another thread).
  void request_stop();
  // The learning-rate range test on this run's module, optimizer and data; the model, the
  // optimizer state and the data position are restored afterwards.
  LrFindResult lr_find(TrainModule& module, const DataModule& data, const LrFindOptions& options);

 private:
  struct Impl;
  struct Run;
  void attach(TrainModule& module, const DataModule& data);
  void apply_resume();
  void make_loaders();
  void size_steps_from_epochs();
  TrainerConfig config_;
  std::unique_ptr<Impl> impl_;
  int64_t step_ = 0;
  std::vector<MetricRow> history_;
  std::string resume_dir_;         // the checkpoint resume() named, applied by attach()
  std::string batch_size_report_;  // what the batch-size finder did, shown when fit() starts
};

// The batch-size finder (Lightning's BatchSizeFinder): trial optimisation steps of the config's
// model at growing batch sizes under the memory budget (memory_limit, or on the CPU 80% of the
// memory available when unset) until one fails for lack of memory; "power" doubles from 2,
// "binsearch" then bisects between the last success and the first failure. A failed trial leaves
// the engine usable (the allocator unwinds). The module's weights are restored afterwards; the
// trial optimizer is discarded. Batches come from data.train_data(trial batch size).
struct BatchSizeSearch {
  int64_t batch_size = 0;                        // the largest batch that fitted
  std::vector<std::pair<int64_t, bool>> trials;  // (batch size, fitted) in order
  int64_t memory_limit = 0;                      // the budget used, bytes
  std::string report;                            // one line for the log
};
BatchSizeSearch find_batch_size(const TrainerConfig& config, TrainModule& module, const DataModule& data);

// "runs/<name>-YYYYMMDD-HHMMSS" (with a numeric suffix if that folder already exists).
std::string default_run_dir(const std::string& name);
// Makes `dir` and its parents; an error names the folder.
void make_dirs(const std::string& dir);
// The whole file; a missing or unreadable file is an error naming it and `what` it should be.
std::string read_text(const std::string& path, const char* what);

// The checkpoint folder `--resume ARG` names: ARG itself when it is a checkpoint folder; the
// newest complete checkpoint of ARG when it is a run folder; for ARG "last", the newest complete
// checkpoint of `run_dir` or, when that is empty, of the run folder under `runs_root` written
// last. An error names the folders looked at and any checkpoint left unfinished by a killed write.
std::string find_resume_checkpoint(const std::string& arg, const std::string& run_dir = "",
                                   const std::string& runs_root = "runs");

// The config a checkpoint or run folder was trained with (its config.toml).
TrainerConfig load_run_config(const std::string& dir);

}  // namespace ft::train
