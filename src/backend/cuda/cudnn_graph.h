// cuDNN's graph API (the backend descriptors of cudnn_graph.h) in a few small pieces, for the
// operations the legacy API does not have (fused attention, attention_cudnn.cpp):
//   - Descriptor: one backend descriptor, created, given attributes, finalized, destroyed with it;
//   - tensor(): a tensor descriptor from its uid, type, dims and strides;
//   - make_plan(): the operation graph of some operations, an engine configuration from cuDNN's
//     heuristics, and the execution plan built from the first configuration that finalizes;
//   - execute(): the plan on a stream, with a variant pack binding each uid to a device pointer;
//   - Graph: the tensors and operations of one graph written as calls (matmul, pointwise,
//     reduction, reshape), kept alive with the plan built from them.
// Every failure is an ft::Error naming the caller's operation, the step and cuDNN's own message.
// The frontend library (cudnn-frontend) wraps the same calls; it is not a Debian package, and the
// few graphs here do not need its graph rewriting.
#pragma once
#include <cudnn.h>

#include <cstdint>
#include <deque>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace ft::cuda::cudnn_graph {

// The attribute type cuDNN expects for each C++ type given to Descriptor::set
// (cudnnBackendDescriptor_t is a void* as well: descriptors go through set_descriptors).
template <class V>
constexpr cudnnBackendAttributeType_t attribute_type() {
  if constexpr (std::is_same_v<V, int64_t>)
    return CUDNN_TYPE_INT64;
  else if constexpr (std::is_same_v<V, bool>)
    return CUDNN_TYPE_BOOLEAN;
  else if constexpr (std::is_same_v<V, float>)
    return CUDNN_TYPE_FLOAT;
  else if constexpr (std::is_same_v<V, double>)
    return CUDNN_TYPE_DOUBLE;
  else if constexpr (std::is_same_v<V, cudnnDataType_t>)
    return CUDNN_TYPE_DATA_TYPE;
  else if constexpr (std::is_same_v<V, cudnnHandle_t>)
    return CUDNN_TYPE_HANDLE;
  else if constexpr (std::is_same_v<V, cudnnBackendHeurMode_t>)
    return CUDNN_TYPE_HEUR_MODE;
  else if constexpr (std::is_same_v<V, cudnnPointwiseMode_t>)
    return CUDNN_TYPE_POINTWISE_MODE;
  else if constexpr (std::is_same_v<V, cudnnReduceTensorOp_t>)
    return CUDNN_TYPE_REDUCTION_OPERATOR_TYPE;
  else if constexpr (std::is_same_v<V, void*>)
    return CUDNN_TYPE_VOID_PTR;
  else
    static_assert(sizeof(V) == 0, "no cuDNN attribute type for this C++ type");
}

class Descriptor {
 public:
  Descriptor() = default;
  // Creates a descriptor of `type`; `op` names the caller in errors.
  Descriptor(cudnnBackendDescriptorType_t type, const char* op);
  ~Descriptor();
  Descriptor(Descriptor&& o) noexcept : d_(std::exchange(o.d_, nullptr)), op_(o.op_) {}
  Descriptor& operator=(Descriptor&& o) noexcept;
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;

  cudnnBackendDescriptor_t get() const { return d_; }
  bool defined() const { return d_ != nullptr; }

  template <class V>
  Descriptor& set(cudnnBackendAttributeName_t name, const V& value) {
    return set_raw(name, attribute_type<V>(), 1, &value);
  }
  template <class V>
  Descriptor& set(cudnnBackendAttributeName_t name, const std::vector<V>& values) {
    return set_raw(name, attribute_type<V>(), static_cast<int64_t>(values.size()), values.data());
  }
  Descriptor& set(cudnnBackendAttributeName_t name, const Descriptor& value) {
    return set_descriptors(name, {value.get()});
  }
  Descriptor& set_descriptors(cudnnBackendAttributeName_t name, const std::vector<cudnnBackendDescriptor_t>& values) {
    return set_raw(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, static_cast<int64_t>(values.size()), values.data());
  }
  Descriptor& set_raw(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count,
                      const void* values);
  Descriptor& finalize();
  // False, not an error, when cuDNN refuses to finalize (an engine configuration the problem does
  // not support): make_plan tries the next.
  bool try_finalize();

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
  const char* op_ = "cudnn";
};

// A finalized tensor descriptor: `uid` binds it to a pointer at execution; by_value tensors are
// scalars passed on the host (the attention scale).
struct TensorSpec {
  int64_t uid = 0;
  cudnnDataType_t dtype = CUDNN_DATA_FLOAT;
  std::vector<int64_t> dims, strides;
  bool is_virtual = false;
  bool by_value = false;
  int64_t alignment = 16;
};
Descriptor tensor(const TensorSpec& spec, const char* op);

struct Plan {
  Descriptor plan;
  int64_t workspace = 0;  // bytes of device memory execute() must be given
};

// Where a plan is for: the device of a cuDNN handle, or a device described by its properties
// (device_properties(), no GPU needed: cuDNN's deviceless ahead-of-time path, which the tests use
// to check on a CPU machine that cuDNN's engines take a graph).
struct Target {
  cudnnHandle_t handle = nullptr;
  const Descriptor* device = nullptr;
};

// A device-properties descriptor from cuDNN's JSON form of them (device_properties_json() on a
// machine with the GPU). Throws ft::Error with cuDNN's message for a JSON it does not accept.
Descriptor device_properties(const std::string& json, const char* op);
// The JSON form of the properties of the handle's device.
std::string device_properties_json(cudnnHandle_t handle, const char* op);

// The operation graph of `ops` (finalized operation descriptors) for `target`, and the execution
// plan of the first engine configuration that cuDNN's heuristics (mode A, then the fallback list)
// rank and that finalizes. Throws ft::Error naming `op` when none does: the problem is not one
// cuDNN's engines take (the caller then keeps its own kernels).
Plan make_plan(Target target, const std::vector<const Descriptor*>& ops, const char* op);

// Runs `plan` on the handle's current stream (the caller set it under the handle's mutex), each
// uid bound to its pointer; by-value uids point at host scalars.
void execute(cudnnHandle_t handle, const Plan& plan, const std::vector<int64_t>& uids,
             const std::vector<void*>& pointers, void* workspace, const char* op);

// One operation graph as it is written: tensors and operations appended in topological order,
// each finalized as it is added; all of them live as long as the Graph (the plan refers to them).
// Operations compute in f32 (matmul and reduction compute type, pointwise math precision) unless
// told otherwise.
class Graph {
 public:
  explicit Graph(const char* op) : op_(op) {}

  // A tensor bound to memory at execution (its uid in the variant pack).
  const Descriptor& io(int64_t uid, cudnnDataType_t dtype, std::vector<int64_t> dims, std::vector<int64_t> strides);
  // A host f32 scalar passed by value, dims [1, 1, 1, 1].
  const Descriptor& scalar(int64_t uid);
  // An intermediate that never exists in memory; uids from kFirstVirtualUid up.
  const Descriptor& virt(cudnnDataType_t dtype, std::vector<int64_t> dims, std::vector<int64_t> strides);

  void matmul(const Descriptor& a, const Descriptor& b, const Descriptor& c);  // c = a b, batch dims broadcast
  // y = mode(x[, b][, t]); axis: GEN_INDEX's dimension.
  void pointwise(cudnnPointwiseMode_t mode, const Descriptor& x, const Descriptor& y, const Descriptor* b = nullptr,
                 const Descriptor* t = nullptr, cudnnDataType_t precision = CUDNN_DATA_FLOAT, int64_t axis = -1);
  // y = the reduction of x over the dims where y has extent 1 (or fewer heads: a group sum).
  void reduction(cudnnReduceTensorOp_t mode, const Descriptor& x, const Descriptor& y);
  // y = x seen with y's dims and strides (a transpose) and possibly another type.
  void reshape(const Descriptor& x, const Descriptor& y);

  // Builds the plan (make_plan) of the operations added so far.
  void build(Target target);
  const Plan& plan() const { return plan_; }

  static constexpr int64_t kFirstVirtualUid = 1000;

 private:
  const Descriptor& add_tensor(const TensorSpec& spec);
  void add_op(Descriptor op) { ops_.push_back(std::move(op)); }

  const char* op_;
  std::deque<Descriptor> tensors_, parts_, ops_;  // deque: references stay valid as it grows
  int64_t next_virtual_ = kFirstVirtualUid;
  Plan plan_;
};

}  // namespace ft::cuda::cudnn_graph
