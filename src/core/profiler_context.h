// What the profiler and the memory history know about the calling thread (phase, the kernel and
// autograd node running, the module stack), and the scopes that set it: KernelScope at the kernel
// table's dispatch (backend/kernels.h), NodeScope in the autograd engine, ModuleScope in
// nn::UnaryModule::operator(). Every scope is built only after profiler::active() said yes, so a
// run without profiling pays one relaxed load per call and nothing else.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "backend/elementwise_math.h"
#include "backend/kernel_params.h"
#include "fasttrain/profiler.h"
#include "fasttrain/tensor.h"

namespace ft::profiler::detail {

int64_t now_ns();  // steady clock, nanoseconds since the current session's start

struct ThreadContext {
  Phase phase = Phase::None;
  const char* kernel = nullptr;      // innermost kernel running (string literal from the kernel list)
  const char* sub_op = nullptr;      // its unary/binary op name ("relu"), if any
  std::string node;                  // autograd node running
  std::vector<std::string> modules;  // module paths, innermost last
  std::string thread_name;
  // Memory events recorded on this thread before any kernel ran: an op allocates its outputs and
  // then calls its kernel, so the next kernel names them.
  std::vector<int64_t> pending_allocations;
  uint64_t pending_generation = 0;
};
ThreadContext& thread_context();

// What a kernel call looked like, gathered from its arguments (collect() overloads).
struct KernelCall {
  const char* kernel = nullptr;
  const char* sub_op = nullptr;  // unary / binary op name
  bool causal = false;           // attention
  struct TensorInfo {
    bool defined = false;
    std::vector<int64_t> shape;
    DType dtype = DType::F32;
    int64_t nbytes = 0;
  };
  std::vector<TensorInfo> tensors;  // every tensor argument in order (undefined ones kept as blanks)
  Device device;                    // of the first defined tensor argument
};
void collect(KernelCall& call, const Tensor& t);
void collect(KernelCall& call, const std::vector<Tensor>& ts);
void collect(KernelCall& call, math::UnaryOp op);
void collect(KernelCall& call, math::BinaryOp op);
void collect(KernelCall& call, const backend::AttentionParams& p);
template <class T>
requires(!std::is_same_v<std::decay_t<T>, Tensor> && !std::is_same_v<std::decay_t<T>, std::vector<Tensor>> &&
         !std::is_same_v<std::decay_t<T>, math::UnaryOp> && !std::is_same_v<std::decay_t<T>, math::BinaryOp> &&
         !std::is_same_v<std::decay_t<T>, backend::AttentionParams>) void collect(KernelCall&, const T&) {}

// FLOPs of a kernel call (src/core/op_flops.cpp); 0 for kernels without a formula.
double kernel_flops(const KernelCall& call);

// One kernel call while profiling: sets the thread's current kernel, names the allocations made
// for it, and when tracing records a span with the call's arguments.
class KernelScope {
 public:
  KernelScope(const char* kernel, KernelCall* call);  // call: non-null when tracing
  ~KernelScope();
  KernelScope(const KernelScope&) = delete;
  KernelScope& operator=(const KernelScope&) = delete;

 private:
  KernelCall* call_;
  const char* previous_kernel_;
  const char* previous_sub_op_;
  int64_t start_ns_ = -1;
};

// While tracing a GPU kernel: waits for the device's stream before the span starts and before
// it ends, so the span is the kernel's device time rather than its launch (CUDA_LAUNCH_BLOCKING's
// effect; a traced GPU step runs slower than an untraced one, by the lost overlap).
class DeviceWait {
 public:
  explicit DeviceWait(Device device);
  ~DeviceWait();
  DeviceWait(const DeviceWait&) = delete;
  DeviceWait& operator=(const DeviceWait&) = delete;

 private:
  Device device_;
};

// Runs a kernel with a KernelScope around it (the profiling branch of Kernel::operator()).
template <class Fn, class... Args>
decltype(auto) profiled_kernel_call(const char* name, Fn fn, Args&&... args) {
  if (tracing()) {
    KernelCall call;
    call.kernel = name;
    (collect(call, args), ...);
    const DeviceWait before(call.device);
    KernelScope scope(name, &call);
    const DeviceWait end(call.device);  // destroyed first: the span ends after the device's work
    return fn(std::forward<Args>(args)...);
  }
  KernelScope scope(name, nullptr);
  return fn(std::forward<Args>(args)...);
}

// An autograd node's backward while profiling (span "LinearBackward", category "autograd"); the
// module that recorded the node (Node::module) is the module of what its backward allocates.
class NodeScope {
 public:
  NodeScope(std::string name, const std::string& module);
  ~NodeScope();
  NodeScope(const NodeScope&) = delete;
  NodeScope& operator=(const NodeScope&) = delete;

 private:
  std::string previous_;
  bool pushed_module_ = false;
  int64_t start_ns_ = -1;
};
// The innermost module path of this thread ("" outside any module).
std::string current_module();

// A module's forward while profiling: pushes its path (registered names, else its type name).
class ModuleScope {
 public:
  explicit ModuleScope(std::string path);
  ~ModuleScope();
  ModuleScope(const ModuleScope&) = delete;
  ModuleScope& operator=(const ModuleScope&) = delete;
};

// Module paths by module address, registered by register_module_names (nn) for the model being
// profiled; "" when unknown.
void set_module_path(const void* module, std::string path);
std::optional<std::string> module_path(const void* module);
void clear_module_paths();

// Called by the memory history under an allocator's lock: the pieces of an event that depend on
// the calling thread.
struct AllocationContext {
  Phase phase;
  int64_t step;
  const char* kernel;
  const char* sub_op;
  const std::string* node;
  const std::string* module;  // nullptr: outside any module
};
AllocationContext allocation_context();
int64_t current_step();

}  // namespace ft::profiler::detail
