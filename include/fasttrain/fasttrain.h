// Umbrella header: the whole public API. A program that includes only this header and links
// fasttrain::fasttrain (or `pkg-config --libs fasttrain`) can use every part of the engine.
// Every header under include/fasttrain is listed here; the test umbrella_header_complete fails
// when one is added without being listed.
#pragma once

// Tensors, ops and automatic differentiation.
#include "fasttrain/activation_checkpoint.h"
#include "fasttrain/allocator.h"
#include "fasttrain/autocast.h"
#include "fasttrain/autograd.h"
#include "fasttrain/cuda_graph.h"
#include "fasttrain/device.h"
#include "fasttrain/dtype.h"
#include "fasttrain/error.h"
#include "fasttrain/machine.h"
#include "fasttrain/names.h"
#include "fasttrain/ops.h"
#include "fasttrain/parallel.h"
#include "fasttrain/random.h"
#include "fasttrain/shape.h"
#include "fasttrain/switches.h"
#include "fasttrain/tensor.h"

// Models (their Hugging Face folders, generation with a key/value cache), optimizers, learning-rate
// schedules and mixed precision.
#include "fasttrain/amp.h"
#include "fasttrain/fp8.h"
#include "fasttrain/generation.h"
#include "fasttrain/hf_folder.h"
#include "fasttrain/kv_cache.h"
#include "fasttrain/models.h"
#include "fasttrain/nn.h"
#include "fasttrain/optim.h"
#include "fasttrain/schedule.h"

// Data: datasets, the loader and its transforms, device prefetching, token shards and the GPT-2
// tokenizer.
#include "fasttrain/data.h"
#include "fasttrain/dataset.h"
#include "fasttrain/device_prefetcher.h"
#include "fasttrain/image_datasets.h"
#include "fasttrain/loader.h"
#include "fasttrain/token_shards.h"
#include "fasttrain/tokenizer.h"
#include "fasttrain/transforms.h"

// Files: weights and arrays, atomic writes, TensorBoard logs.
#include "fasttrain/atomic_file.h"
#include "fasttrain/npy.h"
#include "fasttrain/safetensors.h"
#include "fasttrain/tensorboard.h"

// Training: one step, the Trainer, the module interface and the built-in tasks, its callbacks,
// the finders, the benchmark workloads.
#include "fasttrain/bench.h"
#include "fasttrain/callbacks.h"
#include "fasttrain/lr_finder.h"
#include "fasttrain/task_options.h"
#include "fasttrain/tasks.h"
#include "fasttrain/train.h"
#include "fasttrain/train_module.h"
#include "fasttrain/train_step.h"

// Insight: the profiler (Chrome trace, phases, FLOPs), the allocators' memory history, the
// advisor, the tuner and the run report.
#include "fasttrain/advisor.h"
#include "fasttrain/memory_history.h"
#include "fasttrain/profile_run.h"
#include "fasttrain/profiler.h"
#include "fasttrain/report.h"
#include "fasttrain/tune.h"
// Data- and model-parallel jobs: the communicator (MPI when launched by mpirun or srun), process
// groups, tensor and pipeline parallelism, ZeRO.
#include "fasttrain/ddp.h"
#include "fasttrain/dist.h"
#include "fasttrain/pipeline.h"
#include "fasttrain/process_groups.h"
#include "fasttrain/tensor_parallel.h"
#include "fasttrain/zero.h"
