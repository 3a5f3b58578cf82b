#include "backend/cuda/cudnn_graph.h"

#include <cstring>

#include "backend/cuda/cudnn_library.h"
#include "fasttrain/error.h"

namespace ft::cuda::cudnn_graph {

namespace {

// What cuDNN reports when a compiled kernel could not be loaded: without a GPU (deviceless plans,
// the CUDA driver being the toolkit's stub library) the last step of building a plan.
constexpr const char* kDriverLoad = "cuLibraryLoadData";
constexpr const char* kDriverLoadNote =
    "\n  (the engine compiled its kernel; loading it needs a GPU and the CUDA driver)";

void check(cudnnStatus_t st, const char* op, const char* what) {
  if (st != CUDNN_STATUS_SUCCESS) FT_FAIL(op, ": cuDNN ", what, " failed: ", cudnn_status_text(st));
}

}  // namespace

Descriptor::Descriptor(cudnnBackendDescriptorType_t type, const char* op) : op_(op) {
  check(cudnn().cudnnBackendCreateDescriptor(type, &d_), op, "descriptor creation");
}

Descriptor::~Descriptor() {
  if (d_ != nullptr) cudnn().cudnnBackendDestroyDescriptor(d_);
}

Descriptor& Descriptor::operator=(Descriptor&& o) noexcept {
  if (this != &o) {
    if (d_ != nullptr) cudnn().cudnnBackendDestroyDescriptor(d_);
    d_ = std::exchange(o.d_, nullptr);
    op_ = o.op_;
  }
  return *this;
}

Descriptor& Descriptor::set_raw(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, int64_t count,
                                const void* values) {
  const cudnnStatus_t st = cudnn().cudnnBackendSetAttribute(d_, name, type, count, values);
  if (st != CUDNN_STATUS_SUCCESS)
    FT_FAIL(op_, ": cuDNN refused attribute ", static_cast<int>(name), " (a cudnnBackendAttributeName_t) of type ",
            static_cast<int>(type), " with ", count, " value(s): ", cudnn_status_text(st));
  return *this;
}

Descriptor& Descriptor::finalize() {
  check(cudnn().cudnnBackendFinalize(d_), op_, "descriptor finalization");
  return *this;
}

bool Descriptor::try_finalize() { return cudnn().cudnnBackendFinalize(d_) == CUDNN_STATUS_SUCCESS; }

Descriptor tensor(const TensorSpec& s, const char* op) {
  FT_CHECK(s.dims.size() == s.strides.size(), op, ": a cuDNN tensor needs as many strides as dims, found ",
           s.dims.size(), " dims and ", s.strides.size(), " strides");
  Descriptor t(CUDNN_BACKEND_TENSOR_DESCRIPTOR, op);
  t.set(CUDNN_ATTR_TENSOR_UNIQUE_ID, s.uid)
      .set(CUDNN_ATTR_TENSOR_DATA_TYPE, s.dtype)
      .set(CUDNN_ATTR_TENSOR_DIMENSIONS, s.dims)
      .set(CUDNN_ATTR_TENSOR_STRIDES, s.strides)
      .set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, s.alignment);
  if (s.is_virtual) t.set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, true);
  if (s.by_value) t.set(CUDNN_ATTR_TENSOR_IS_BY_VALUE, true);
  t.finalize();
  return t;
}

namespace {

// The engine configurations the heuristics rank for `graph` in `mode`, best first; empty when the
// heuristics themselves refuse the graph.
std::vector<Descriptor> engine_configs(const Descriptor& graph, cudnnBackendHeurMode_t mode, Target target,
                                       const char* op) {
  Descriptor heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, op);
  heur.set(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph).set(CUDNN_ATTR_ENGINEHEUR_MODE, mode);
  if (target.device != nullptr) heur.set(CUDNN_ATTR_ENGINEHEUR_DEVICEPROP, *target.device);
  if (!heur.try_finalize()) return {};
  int64_t count = 0;
  check(cudnn().cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0,
                                         &count, nullptr),
        op, "heuristics result count");
  // cuDNN fills descriptors the caller created, one per result.
  std::vector<Descriptor> configs;
  std::vector<cudnnBackendDescriptor_t> raw;
  for (int64_t i = 0; i < count; ++i) {
    configs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, op);
    raw.push_back(configs.back().get());
  }
  int64_t got = 0;
  if (count > 0)
    check(cudnn().cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                           count, &got, raw.data()),
          op, "heuristics results");
  configs.resize(static_cast<size_t>(got));
  return configs;
}

}  // namespace

Descriptor device_properties(const std::string& json, const char* op) {
  Descriptor d(CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR, op);
  d.set_raw(CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR, static_cast<int64_t>(json.size()), json.data());
  d.finalize();
  return d;
}

std::string device_properties_json(cudnnHandle_t handle, const char* op) {
  Descriptor d(CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR, op);
  d.set(CUDNN_ATTR_DEVICEPROP_HANDLE, handle).finalize();
  int64_t size = 0;
  check(cudnn().cudnnBackendGetAttribute(d.get(), CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR, 0, &size,
                                         nullptr),
        op, "device properties size");
  std::string json(static_cast<size_t>(size), '\0');
  check(cudnn().cudnnBackendGetAttribute(d.get(), CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION, CUDNN_TYPE_CHAR, size,
                                         &size, json.data()),
        op, "device properties");
  json.resize(std::strlen(json.c_str()));  // without the terminating zero cuDNN may count
  return json;
}

Plan make_plan(Target target, const std::vector<const Descriptor*>& ops, const char* op) {
  FT_CHECK((target.handle != nullptr) != (target.device != nullptr), op,
           ": a cuDNN plan is for a handle's device or for device properties, one of the two");
  std::vector<cudnnBackendDescriptor_t> raw_ops;
  for (const Descriptor* o : ops) raw_ops.push_back(o->get());
  Descriptor graph(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, op);
  graph.set_descriptors(CUDNN_ATTR_OPERATIONGRAPH_OPS, raw_ops);
  // cuDNN before 9.8 wants the handle here; deviceless, the heuristics get the properties instead.
  if (target.handle != nullptr) graph.set(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, target.handle);
  graph.finalize();
  int tried = 0;
  std::string reasons;  // cuDNN's message for each configuration that did not finalize
  bool reached_driver = false;
  for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    if (reached_driver) break;
    for (Descriptor& config : engine_configs(graph, mode, target, op)) {
      ++tried;
      Plan p{Descriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, op), 0};
      if (target.handle != nullptr) p.plan.set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, target.handle);
      p.plan.set(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, config);
      if (!p.plan.try_finalize()) {
        const std::string reason = cudnn_last_error();
        reasons += "\n  configuration " + std::to_string(tried) + ": " + reason;
        // Deviceless, an engine that got as far as loading its compiled kernel has taken the graph;
        // the other configurations would only compile theirs to fail the same way.
        reached_driver = target.device != nullptr && reason.find(kDriverLoad) != std::string::npos;
        if (reached_driver) break;
        continue;
      }
      int64_t n = 0;
      check(cudnn().cudnnBackendGetAttribute(p.plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64,
                                             1, &n, &p.workspace),
            op, "workspace size");
      return p;
    }
  }
  if (tried == 0) reasons = "\n  " + cudnn_last_error();
  if (reasons.find(kDriverLoad) != std::string::npos) reasons += kDriverLoadNote;
  FT_FAIL(op, ": cuDNN ", cudnn().cudnnGetVersion(), " has no engine for this graph (", tried,
          " configurations from its heuristics, none finalized):", reasons);
}

void execute(cudnnHandle_t handle, const Plan& plan, const std::vector<int64_t>& uids,
             const std::vector<void*>& pointers, void* workspace, const char* op) {
  FT_CHECK(uids.size() == pointers.size(), op, ": ", uids.size(), " uids and ", pointers.size(), " pointers");
  Descriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, op);
  pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, uids)
      .set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, pointers)
      .set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, workspace)
      .finalize();
  check(cudnn().cudnnBackendExecute(handle, plan.plan.get(), pack.get()), op, "execution");
}

const Descriptor& Graph::add_tensor(const TensorSpec& spec) {
  tensors_.push_back(tensor(spec, op_));
  return tensors_.back();
}

const Descriptor& Graph::io(int64_t uid, cudnnDataType_t dtype, std::vector<int64_t> dims,
                            std::vector<int64_t> strides) {
  FT_CHECK(uid < kFirstVirtualUid, op_, ": uid ", uid, " is in the virtual tensors' range");
  return add_tensor({.uid = uid, .dtype = dtype, .dims = std::move(dims), .strides = std::move(strides)});
}

const Descriptor& Graph::scalar(int64_t uid) {
  FT_CHECK(uid < kFirstVirtualUid, op_, ": uid ", uid, " is in the virtual tensors' range");
  return add_tensor(
      {.uid = uid, .dtype = CUDNN_DATA_FLOAT, .dims = {1, 1, 1, 1}, .strides = {1, 1, 1, 1}, .by_value = true});
}

const Descriptor& Graph::virt(cudnnDataType_t dtype, std::vector<int64_t> dims, std::vector<int64_t> strides) {
  return add_tensor({.uid = next_virtual_++,
                     .dtype = dtype,
                     .dims = std::move(dims),
                     .strides = std::move(strides),
                     .is_virtual = true});
}

void Graph::matmul(const Descriptor& a, const Descriptor& b, const Descriptor& c) {
  parts_.emplace_back(CUDNN_BACKEND_MATMUL_DESCRIPTOR, op_);
  parts_.back().set(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_DATA_FLOAT).finalize();
  Descriptor o(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, op_);
  o.set(CUDNN_ATTR_OPERATION_MATMUL_ADESC, a)
      .set(CUDNN_ATTR_OPERATION_MATMUL_BDESC, b)
      .set(CUDNN_ATTR_OPERATION_MATMUL_CDESC, c)
      .set(CUDNN_ATTR_OPERATION_MATMUL_DESC, parts_.back())
      .finalize();
  add_op(std::move(o));
}

void Graph::pointwise(cudnnPointwiseMode_t mode, const Descriptor& x, const Descriptor& y, const Descriptor* b,
                      const Descriptor* t, cudnnDataType_t precision, int64_t axis) {
  parts_.emplace_back(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, op_);
  Descriptor& pw = parts_.back();
  pw.set(CUDNN_ATTR_POINTWISE_MODE, mode).set(CUDNN_ATTR_POINTWISE_MATH_PREC, precision);
  if (axis >= 0) pw.set(CUDNN_ATTR_POINTWISE_AXIS, axis);
  pw.finalize();
  Descriptor o(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, op_);
  o.set(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw).set(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
  if (b != nullptr) o.set(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, *b);
  if (t != nullptr) o.set(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, *t);
  o.set(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y)
      .set(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, 1.0f)
      .set(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, 1.0f)
      .finalize();
  add_op(std::move(o));
}

void Graph::reduction(cudnnReduceTensorOp_t mode, const Descriptor& x, const Descriptor& y) {
  parts_.emplace_back(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, op_);
  parts_.back()
      .set(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_DATA_FLOAT)
      .set(CUDNN_ATTR_REDUCTION_OPERATOR, mode)
      .finalize();
  Descriptor o(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, op_);
  o.set(CUDNN_ATTR_OPERATION_REDUCTION_DESC, parts_.back())
      .set(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x)
      .set(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y)
      .finalize();
  add_op(std::move(o));
}

void Graph::reshape(const Descriptor& x, const Descriptor& y) {
  Descriptor o(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, op_);
  o.set(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x).set(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y).finalize();
  add_op(std::move(o));
}

void Graph::build(Target target) {
  std::vector<const Descriptor*> ops;
  for (const Descriptor& o : ops_) ops.push_back(&o);
  plan_ = make_plan(target, ops, op_);
}

}  // namespace ft::cuda::cudnn_graph
