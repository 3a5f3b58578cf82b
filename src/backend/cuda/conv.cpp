// 2-d convolutions on CUDA through cuDNN 9's legacy descriptor API: forward, input gradient and
// weight (and bias) gradient, for f32 (exact FMA kernels; TF32 only when allow_tf32()), bf16 and
// f16 (tensor cores, f32 accumulation) and f64. The math is the CPU reference's (conv.cpp in
// backend/cpu): y = conv(x, w) + b, gx = conv_transpose(gy, w), gw = sum over the batch of
// gy (x) x, gb = sum of gy over N, H, W; every output is overwritten, never accumulated into.
// The legacy API is deprecated in cuDNN 9 but still shipped and complete for these three passes;
// its successor, the graph API, is best used through cudnn-frontend, a further dependency.
//
// Layouts. The op hands dense tensors: activations NCHW or NHWC (channels_last), the weight OIHW
// or OHWI. cuDNN is told CUDNN_TENSOR_NCHW or CUDNN_TENSOR_NHWC for all of x, y and the filter,
// the activations' layout, because its fast NHWC kernels want an NHWC filter too: a weight in the
// other layout (a grouped convolution's weight, which the op keeps OIHW, beside NHWC activations)
// is copied, and its gradient produced in cuDNN's layout and copied back; weights are small.
// f64 runs NCHW whatever the activations' layout, as PyTorch runs it: cuDNN's NHWC paths serve
// the float and tensor-core types, and double NHWC is not worth depending on (f64 is for checks,
// not speed). An operand whose address is not 16-byte
// aligned (a batch slice of a larger tensor) is copied as well, so an algorithm chosen for one
// call never meets a pointer it cannot take.
//
// Plans. Descriptors and the chosen algorithm are built once per problem: pass, dtype, layout,
// every size, stride, padding, dilation, groups, and the TF32, deterministic and benchmark
// switches (device.h), so flipping a switch selects another plan rather than invalidating one.
// They live as long as the process, under a mutex, like matmul.cpp's cuBLASLt plans.
//
// Algorithm choice. cudnn_benchmark() off: cuDNN's heuristics (cudnnGet*Algorithm_v7), which run
// nothing; the first listed algorithm that qualifies is taken. On: cudnnFind*AlgorithmEx times
// every algorithm on this call's own buffers (the weight gradient's search writes to a scratch
// buffer: with a batch in slices, gw holds the sum of the slices so far) and the fastest that
// qualifies is kept. Qualifies: succeeded, needs at most kMaxWorkspaceBytes, is deterministic
// when deterministic_algorithms() asks for it, and, for exact f32, uses no tensor-op math. The
// algorithm's math type is set on the descriptor with it (cuDNN picks kernels by the pair),
// except for exact f32, whose descriptor stays CUDNN_FMA_MATH so no TF32 kernel can run.
//
// Workspace. Each call takes exactly what its algorithm needs from the caching allocator
// (ft::empty on the current stream, returned when the call is issued: the allocator's stream
// order keeps it alive for the kernel). The search gets a separate buffer, as large as the
// hungriest algorithm wants up to the cap (halved on out-of-memory), freed after the search.
//
// Handles. One cudnnHandle_t per device (cudnn_handle, shared with attention_cudnn.cpp), its
// stream set and the call issued under the handle's mutex.
//
// Bias. The forward adds b with the engine's own elementwise kernel and the bias gradient is the
// engine's sum kernel over N, H, W, rather than cudnnAddTensor / cudnnConvolutionBackwardBias:
// ours take every dtype here (the legacy cuDNN calls' bf16 support is not something to rely on),
// accumulate in f32 or wider, and the sum is deterministic and the same as the op's own
// bias-only gradient.
//
// Sizes. The legacy API indexes with 32-bit ints: a batch whose activations pass 2^31 - 1
// elements runs in slices of whole images (N is outermost in NCHW and NHWC alike, so a slice is
// dense); the weight gradient accumulates the slices (beta = 1 after the first).
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cudnn_library.h"
#include "backend/cuda/kernels.h"
#include "backend/device_backend.h"

namespace ft::cuda {
namespace {

// Workspace one algorithm may use: an algorithm that wants more is passed over for the next one,
// so a convolution never takes memory on a scale that would crowd out the activations.
constexpr size_t kMaxWorkspaceBytes = size_t(1) << 30;
// The least an autotuning search gets, whatever the heuristics list.
constexpr size_t kMinSearchWorkspaceBytes = size_t(64) << 20;
// cuDNN's vectorised kernels want 16-byte aligned data.
constexpr uintptr_t kAlignment = 16;

enum class Pass : int { forward, backward_data, backward_weight };

const char* op_name(Pass pass) {
  switch (pass) {
    case Pass::forward: return "conv2d_forward";
    case Pass::backward_data: return "conv2d_backward_data";
    case Pass::backward_weight: return "conv2d_backward_weight";
  }
  return "conv2d";
}

std::string describe(const ConvParams& p, DType dt) {
  return detail::concat(dtype_name(dt), " input [", p.N, ", ", p.C, ", ", p.H, ", ", p.W, "] ",
                        p.channels_last ? "NHWC" : "NCHW", ", weight [", p.O, ", ", p.C / p.groups, ", ", p.kH, ", ",
                        p.kW, "] ", p.weight_channels_last ? "OHWI" : "OIHW", ", output [", p.N, ", ", p.O, ", ", p.OH,
                        ", ", p.OW, "], stride [", p.stride[0], ", ", p.stride[1], "], padding [", p.padding[0], ", ",
                        p.padding[1], "], dilation [", p.dilation[0], ", ", p.dilation[1], "], groups ", p.groups);
}

// One kernel-table call: what errors name, and the layout cuDNN is given.
struct Call {
  Pass pass;
  const ConvParams& p;
  DType dt;

  const char* op() const { return op_name(pass); }
  bool nhwc() const { return p.channels_last && dt != DType::F64; }
  void check(cudnnStatus_t st, const char* what) const {
    if (st == CUDNN_STATUS_SUCCESS) return;
    FT_FAIL(op(), ": cuDNN ", what, " failed: ", cudnn_status_text(st), "; ", describe(p, dt));
  }
};

cudnnDataType_t data_type(const Call& c) {
  switch (c.dt) {
    case DType::F32: return CUDNN_DATA_FLOAT;
    case DType::F64: return CUDNN_DATA_DOUBLE;
    case DType::BF16: return CUDNN_DATA_BFLOAT16;
    case DType::F16: return CUDNN_DATA_HALF;
    default: FT_FAIL(c.op(), ": cuDNN has no convolution for dtype ", dtype_name(c.dt), "; ", describe(c.p, c.dt));
  }
}

// One problem as cuDNN sees it. N is the images of one call (a slice of a large batch).
struct Key {
  int device;
  Pass pass;
  DType dtype;
  bool nhwc;
  int64_t N, C, H, W, O, kH, kW, OH, OW;
  int64_t sH, sW, pH, pW, dH, dW, groups;
  bool tf32, deterministic, benchmark;
  auto tie() const {
    return std::tie(device, pass, dtype, nhwc, N, C, H, W, O, kH, kW, OH, OW, sH, sW, pH, pW, dH, dW, groups, tf32,
                    deterministic, benchmark);
  }
  bool operator<(const Key& o) const { return tie() < o.tie(); }
};

Key key_for(const Call& c, int64_t images, int device) {
  const ConvParams& p = c.p;
  Key k{};
  k.device = device;
  k.pass = c.pass;
  k.dtype = c.dt;
  k.nhwc = c.nhwc();
  k.N = images, k.C = p.C, k.H = p.H, k.W = p.W, k.O = p.O, k.kH = p.kH, k.kW = p.kW, k.OH = p.OH, k.OW = p.OW;
  k.sH = p.stride[0], k.sW = p.stride[1], k.pH = p.padding[0], k.pW = p.padding[1];
  k.dH = p.dilation[0], k.dW = p.dilation[1], k.groups = p.groups;
  k.tf32 = c.dt == DType::F32 && allow_tf32();
  k.deterministic = deterministic_algorithms();
  k.benchmark = cudnn_benchmark();
  return k;
}

// f32 with TF32 not allowed: products must be exact f32, as on the CPU.
bool exact_f32(const Key& k) { return k.dtype == DType::F32 && !k.tf32; }

cudnnMathType_t math_type(const Key& k) {
  switch (k.dtype) {
    case DType::F32: return k.tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH;  // DEFAULT permits TF32 on Ampere+
    case DType::F64: return CUDNN_DEFAULT_MATH;
    default: return CUDNN_TENSOR_OP_MATH;
  }
}

struct Plan {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  int algo = 0;          // a cudnnConvolution{Fwd,BwdData,BwdFilter}Algo_t, by pass
  size_t workspace = 0;  // bytes the algorithm needs

  void destroy() {
    if (x) cudnn().cudnnDestroyTensorDescriptor(x);
    if (y) cudnn().cudnnDestroyTensorDescriptor(y);
    if (w) cudnn().cudnnDestroyFilterDescriptor(w);
    if (conv) cudnn().cudnnDestroyConvolutionDescriptor(conv);
  }
};

// One call's device pointers, named by cuDNN's x / w / y descriptors whatever the pass (the
// pass's output among them is written).
struct Operands {
  void* x;
  void* w;
  void* y;
};

int to_int(int64_t v) { return static_cast<int>(v); }  // ranges checked by check_int_range

void make_descriptors(Plan& plan, const Key& k, const Call& c) {
  c.check(cudnn().cudnnCreateTensorDescriptor(&plan.x), "tensor descriptor creation");
  c.check(cudnn().cudnnCreateTensorDescriptor(&plan.y), "tensor descriptor creation");
  c.check(cudnn().cudnnCreateFilterDescriptor(&plan.w), "filter descriptor creation");
  c.check(cudnn().cudnnCreateConvolutionDescriptor(&plan.conv), "convolution descriptor creation");
  const cudnnDataType_t type = data_type(c);
  const cudnnTensorFormat_t format = k.nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
  c.check(cudnn().cudnnSetTensor4dDescriptor(plan.x, format, type, to_int(k.N), to_int(k.C), to_int(k.H), to_int(k.W)),
          "input descriptor");
  c.check(
      cudnn().cudnnSetTensor4dDescriptor(plan.y, format, type, to_int(k.N), to_int(k.O), to_int(k.OH), to_int(k.OW)),
      "output descriptor");
  c.check(cudnn().cudnnSetFilter4dDescriptor(plan.w, type, format, to_int(k.O), to_int(k.C / k.groups), to_int(k.kH),
                                             to_int(k.kW)),
          "filter descriptor");
  // Products accumulate in f32 for the 16-bit types (cuDNN's "pseudo half" configuration).
  const cudnnDataType_t compute = k.dtype == DType::F64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
  c.check(cudnn().cudnnSetConvolution2dDescriptor(plan.conv, to_int(k.pH), to_int(k.pW), to_int(k.sH), to_int(k.sW),
                                                  to_int(k.dH), to_int(k.dW), CUDNN_CROSS_CORRELATION, compute),
          "convolution descriptor");
  c.check(cudnn().cudnnSetConvolutionGroupCount(plan.conv, to_int(k.groups)), "group count");
  c.check(cudnn().cudnnSetConvolutionMathType(plan.conv, math_type(k)), "math type");
  int n = 0, o = 0, oh = 0, ow = 0;
  c.check(cudnn().cudnnGetConvolution2dForwardOutputDim(plan.conv, plan.x, plan.w, &n, &o, &oh, &ow), "output size");
  FT_CHECK(n == k.N && o == k.O && oh == k.OH && ow == k.OW, c.op(), ": internal error, cuDNN computes output [", n,
           ", ", o, ", ", oh, ", ", ow, "] where the op allocated [", k.N, ", ", k.O, ", ", k.OH, ", ", k.OW, "]; ",
           describe(c.p, c.dt));
}

// The three passes' algorithm queries, under one interface for choose().
struct ForwardAlgos {
  using Perf = cudnnConvolutionFwdAlgoPerf_t;
  static cudnnStatus_t max_count(cudnnHandle_t h, int* n) {
    return cudnn().cudnnGetConvolutionForwardAlgorithmMaxCount(h, n);
  }
  static cudnnStatus_t heuristics(cudnnHandle_t h, const Plan& p, int want, int* got, Perf* r) {
    return cudnn().cudnnGetConvolutionForwardAlgorithm_v7(h, p.x, p.w, p.conv, p.y, want, got, r);
  }
  static cudnnStatus_t search(cudnnHandle_t h, const Plan& p, const Operands& o, int want, int* got, Perf* r, void* ws,
                              size_t bytes) {
    return cudnn().cudnnFindConvolutionForwardAlgorithmEx(h, p.x, o.x, p.w, o.w, p.conv, p.y, o.y, want, got, r, ws,
                                                          bytes);
  }
  static cudnnStatus_t workspace(cudnnHandle_t h, const Plan& p, size_t* bytes) {
    return cudnn().cudnnGetConvolutionForwardWorkspaceSize(h, p.x, p.w, p.conv, p.y,
                                                           static_cast<cudnnConvolutionFwdAlgo_t>(p.algo), bytes);
  }
};

struct BackwardDataAlgos {
  using Perf = cudnnConvolutionBwdDataAlgoPerf_t;
  static cudnnStatus_t max_count(cudnnHandle_t h, int* n) {
    return cudnn().cudnnGetConvolutionBackwardDataAlgorithmMaxCount(h, n);
  }
  static cudnnStatus_t heuristics(cudnnHandle_t h, const Plan& p, int want, int* got, Perf* r) {
    return cudnn().cudnnGetConvolutionBackwardDataAlgorithm_v7(h, p.w, p.y, p.conv, p.x, want, got, r);
  }
  static cudnnStatus_t search(cudnnHandle_t h, const Plan& p, const Operands& o, int want, int* got, Perf* r, void* ws,
                              size_t bytes) {
    return cudnn().cudnnFindConvolutionBackwardDataAlgorithmEx(h, p.w, o.w, p.y, o.y, p.conv, p.x, o.x, want, got, r,
                                                               ws, bytes);
  }
  static cudnnStatus_t workspace(cudnnHandle_t h, const Plan& p, size_t* bytes) {
    return cudnn().cudnnGetConvolutionBackwardDataWorkspaceSize(
        h, p.w, p.y, p.conv, p.x, static_cast<cudnnConvolutionBwdDataAlgo_t>(p.algo), bytes);
  }
};

struct BackwardWeightAlgos {
  using Perf = cudnnConvolutionBwdFilterAlgoPerf_t;
  static cudnnStatus_t max_count(cudnnHandle_t h, int* n) {
    return cudnn().cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(h, n);
  }
  static cudnnStatus_t heuristics(cudnnHandle_t h, const Plan& p, int want, int* got, Perf* r) {
    return cudnn().cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, p.x, p.y, p.conv, p.w, want, got, r);
  }
  static cudnnStatus_t search(cudnnHandle_t h, const Plan& p, const Operands& o, int want, int* got, Perf* r, void* ws,
                              size_t bytes) {
    return cudnn().cudnnFindConvolutionBackwardFilterAlgorithmEx(h, p.x, o.x, p.y, o.y, p.conv, p.w, o.w, want, got, r,
                                                                 ws, bytes);
  }
  static cudnnStatus_t workspace(cudnnHandle_t h, const Plan& p, size_t* bytes) {
    return cudnn().cudnnGetConvolutionBackwardFilterWorkspaceSize(
        h, p.x, p.y, p.conv, p.w, static_cast<cudnnConvolutionBwdFilterAlgo_t>(p.algo), bytes);
  }
};

bool uses_tensor_ops(cudnnMathType_t m) {
  return m == CUDNN_TENSOR_OP_MATH || m == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
}

// The first result that qualifies (cuDNN lists them best first: by expected or measured time).
template <class Perf>
const Perf* pick(const std::vector<Perf>& results, int count, const Key& k, size_t max_workspace) {
  for (int i = 0; i < count; ++i) {
    const Perf& r = results[i];
    if (r.status != CUDNN_STATUS_SUCCESS || r.memory > max_workspace) continue;
    if (k.deterministic && r.determinism != CUDNN_DETERMINISTIC) continue;
    if (exact_f32(k) && uses_tensor_ops(r.mathType)) continue;
    return &r;
  }
  return nullptr;
}

// The search's workspace: `want` bytes, or less when the device cannot spare them (the search then
// skips the algorithms that need more). Undefined for 0 bytes.
Tensor search_workspace(size_t want, int device) {
  while (want > 0) {
    try {
      return empty({static_cast<int64_t>(want)}, TensorOptions(DType::U8, Device::cuda(device)));
    } catch (const OutOfMemoryError&) {
      want = want >= (size_t(1) << 20) ? want / 2 : 0;
    }
  }
  return Tensor();
}

template <class Algos>
void choose(Plan& plan, const Key& k, const Call& c, Operands o, cudnnHandle_t handle, cudaStream_t stream) {
  using Perf = typename Algos::Perf;
  int count = 0;
  c.check(Algos::max_count(handle, &count), "algorithm count");
  std::vector<Perf> results(static_cast<size_t>(std::max(count, 1)));
  int got = 0;
  c.check(Algos::heuristics(handle, plan, count, &got, results.data()), "algorithm heuristics");
  const std::vector<Perf> heuristic = results;
  const int heuristic_count = got;
  size_t max_workspace = kMaxWorkspaceBytes;
  const Perf* r = nullptr;
  if (k.benchmark) {
    // The heuristics' sizes, with a floor: they can list 0 for algorithms whose search then wants
    // some, and a search with no workspace finds only the algorithms that need none.
    size_t want = kMinSearchWorkspaceBytes;
    for (int i = 0; i < got; ++i)
      if (results[i].status == CUDNN_STATUS_SUCCESS) want = std::max(want, results[i].memory);
    const Tensor ws = search_workspace(std::min(want, kMaxWorkspaceBytes), k.device);
    max_workspace = ws.defined() ? static_cast<size_t>(ws.numel()) : 0;
    Tensor gw_scratch;
    if (k.pass == Pass::backward_weight) {
      const int64_t bytes = k.O * (k.C / k.groups) * k.kH * k.kW * static_cast<int64_t>(dtype_size(k.dtype));
      gw_scratch = empty({bytes}, TensorOptions(DType::U8, Device::cuda(k.device)));
      o.w = gw_scratch.raw_data();
    }
    c.check(cudnn().cudnnSetStream(handle, stream), "set stream");
    note_host_sync(std::string("cudnn algorithm search: ") + c.op());
    // Synchronous: it times each algorithm, so the scratch buffers may go when it returns.
    c.check(Algos::search(handle, plan, o, count, &got, results.data(), ws.defined() ? ws.raw_data() : nullptr,
                          max_workspace),
            "algorithm search");
    r = pick(results, got, k, max_workspace);
  }
  // Without autotuning, or when no timed algorithm qualifies (the search may skip some, say for
  // want of workspace): the heuristics' first that does.
  if (r == nullptr) {
    max_workspace = kMaxWorkspaceBytes;
    r = pick(heuristic, heuristic_count, k, max_workspace);
  }
  if (r == nullptr)
    FT_FAIL(c.op(), ": cuDNN has no ", k.deterministic ? "deterministic " : "", "algorithm",
            exact_f32(k) ? " with exact f32 products" : "", " within ", max_workspace, " bytes of workspace",
            k.deterministic ? " (deterministic_algorithms() is on)" : "", "; ", describe(c.p, c.dt));
  // cuDNN selects kernels by algorithm and math type together; exact f32 keeps CUDNN_FMA_MATH.
  if (!exact_f32(k)) c.check(cudnn().cudnnSetConvolutionMathType(plan.conv, r->mathType), "math type");
  plan.algo = static_cast<int>(r->algo);
  c.check(Algos::workspace(handle, plan, &plan.workspace), "workspace size");
}

const Plan& plan_for(const Key& k, const Call& c, const Operands& o, cudaStream_t stream) {
  static std::mutex mu;
  static std::map<Key, Plan> plans;
  std::lock_guard<std::mutex> lock(mu);
  auto it = plans.find(k);
  if (it != plans.end()) return it->second;
  Plan plan;
  try {
    make_descriptors(plan, k, c);
    CudnnHandle& d = cudnn_handle(k.device, c.op());
    std::lock_guard<std::mutex> device_lock(d.mu);
    switch (k.pass) {
      case Pass::forward: choose<ForwardAlgos>(plan, k, c, o, d.handle, stream); break;
      case Pass::backward_data: choose<BackwardDataAlgos>(plan, k, c, o, d.handle, stream); break;
      case Pass::backward_weight: choose<BackwardWeightAlgos>(plan, k, c, o, d.handle, stream); break;
    }
  } catch (...) {
    plan.destroy();
    throw;
  }
  return plans.emplace(k, plan).first->second;
}

void check_int_range(const Call& c) {
  const ConvParams& p = c.p;
  const int64_t scalars[] = {p.kH,         p.kW,          p.stride[0],   p.stride[1], p.padding[0],
                             p.padding[1], p.dilation[0], p.dilation[1], p.groups};
  for (int64_t v : scalars)
    FT_CHECK(v <= INT_MAX, c.op(), ": cuDNN takes 32-bit sizes, strides and padding; ", describe(p, c.dt));
  FT_CHECK(p.O * (p.C / p.groups) * p.kH * p.kW <= INT_MAX, c.op(),
           ": the weight has more elements than cuDNN's 32-bit indexing allows; ", describe(p, c.dt));
}

// Images per cuDNN call: all of them unless the activations pass 32-bit indexing.
int64_t images_per_call(const Call& c) {
  const ConvParams& p = c.p;
  const int64_t per_image = std::max(p.C * p.H * p.W, p.O * p.OH * p.OW);
  FT_CHECK(per_image <= INT_MAX, c.op(), ": one image has ", per_image,
           " elements, more than cuDNN's 32-bit indexing allows; ", describe(p, c.dt));
  return std::max<int64_t>(1, std::min<int64_t>(p.N, INT_MAX / std::max<int64_t>(per_image, 1)));
}

// Runs the pass over the batch, one cuDNN call per slice of images. x, w, y: dense in the layout
// cuDNN is told, 16-byte aligned; the pass's output among them is overwritten.
void run(const Call& c, const Tensor& x, const Tensor& w, const Tensor& y) {
  const ConvParams& p = c.p;
  check_int_range(c);
  const Stream s = current_stream(x.device());
  const int device = s.device.index;
  const cudaStream_t stream = static_cast<cudaStream_t>(s.handle);
  check(cudaSetDevice(device), c.op());
  const int64_t per_call = images_per_call(c);
  const int64_t es = static_cast<int64_t>(dtype_size(c.dt));
  char* const px = static_cast<char*>(x.raw_data());
  char* const py = static_cast<char*>(y.raw_data());
  const bool f64 = c.dt == DType::F64;
  const double one64 = 1, zero64 = 0;
  const float one32 = 1, zero32 = 0;
  const void* alpha = f64 ? static_cast<const void*>(&one64) : &one32;
  for (int64_t n0 = 0; n0 < p.N; n0 += per_call) {
    const int64_t n = std::min(per_call, p.N - n0);
    const Operands o{px + n0 * p.C * p.H * p.W * es, w.raw_data(), py + n0 * p.O * p.OH * p.OW * es};
    const Plan& plan = plan_for(key_for(c, n, device), c, o, stream);
    const Tensor ws = plan.workspace > 0 ? empty({static_cast<int64_t>(plan.workspace)},
                                                 TensorOptions(DType::U8, Device::cuda(device)))
                                         : Tensor();
    void* const wsp = ws.defined() ? ws.raw_data() : nullptr;
    // Slices after the first add to the weight gradient of those before.
    const bool accumulate = c.pass == Pass::backward_weight && n0 > 0;
    const void* beta = f64 ? (accumulate ? &one64 : &zero64) : static_cast<const void*>(accumulate ? &one32 : &zero32);
    CudnnHandle& d = cudnn_handle(device, c.op());
    std::lock_guard<std::mutex> lock(d.mu);
    c.check(cudnn().cudnnSetStream(d.handle, stream), "set stream");
    switch (c.pass) {
      case Pass::forward:
        c.check(cudnn().cudnnConvolutionForward(d.handle, alpha, plan.x, o.x, plan.w, o.w, plan.conv,
                                                static_cast<cudnnConvolutionFwdAlgo_t>(plan.algo), wsp, plan.workspace,
                                                beta, plan.y, o.y),
                "convolution");
        break;
      case Pass::backward_data:
        c.check(cudnn().cudnnConvolutionBackwardData(d.handle, alpha, plan.w, o.w, plan.y, o.y, plan.conv,
                                                     static_cast<cudnnConvolutionBwdDataAlgo_t>(plan.algo), wsp,
                                                     plan.workspace, beta, plan.x, o.x),
                "convolution");
        break;
      case Pass::backward_weight:
        c.check(cudnn().cudnnConvolutionBackwardFilter(d.handle, alpha, plan.x, o.x, plan.y, o.y, plan.conv,
                                                       static_cast<cudnnConvolutionBwdFilterAlgo_t>(plan.algo), wsp,
                                                       plan.workspace, beta, plan.w, o.w),
                "convolution");
        break;
    }
  }
}

// --- layouts -------------------------------------------------------------------------------------

bool aligned(const Tensor& t) { return reinterpret_cast<uintptr_t>(t.raw_data()) % kAlignment == 0; }

bool dense_in(const Tensor& t, bool nhwc) { return nhwc ? t.is_channels_last() : t.is_contiguous(); }

Tensor empty_dense(const Tensor& like, bool nhwc) {
  const Shape& s = like.shape();
  if (!nhwc) return empty(s, like.options());
  return empty_strided(s, {s[1] * s[2] * s[3], 1, s[3] * s[1], s[1]}, like.options());
}

// An input as cuDNN is told it is laid out: itself, or a dense aligned copy.
Tensor operand(const Tensor& t, bool nhwc) {
  if (dense_in(t, nhwc) && aligned(t)) return t;
  Tensor c = empty_dense(t, nhwc);
  cuda::copy(c, t);
  return c;
}

// Where cuDNN writes an output: `dst` itself when laid out as cuDNN is told, else a scratch
// tensor that finish() copies into dst.
Tensor result(const Tensor& dst, bool nhwc) {
  return dense_in(dst, nhwc) && aligned(dst) ? dst : empty_dense(dst, nhwc);
}
void finish(const Tensor& dst, const Tensor& buf) {
  if (!buf.same(dst)) cuda::copy(dst, buf);
}

// gb[o] = sum of gy[:, o, :, :], overwritten (the reduction kernel writes each output once).
void bias_gradient(const Tensor& gy, const Tensor& gb) { cuda::sum(gy, {true, false, true, true}, 1.0, gb); }

}  // namespace

void conv2d_forward(const ConvParams& p, const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y) {
  if (y.numel() == 0) return;
  const Call c{Pass::forward, p, x.dtype()};
  if (x.numel() == 0 || w.numel() == 0) {
    cuda::fill(y, 0);  // no input channels or pixels: every window sums nothing
  } else {
    const bool nhwc = c.nhwc();
    const Tensor yb = result(y, nhwc);
    run(c, operand(x, nhwc), operand(w, nhwc), yb);
    finish(y, yb);
  }
  if (b.defined()) cuda::add_inplace(y, b.view({p.O, 1, 1}).expand(y.shape()), 1.0);
}

void conv2d_backward_data(const ConvParams& p, const Tensor& gy, const Tensor& w, const Tensor& gx) {
  if (gx.numel() == 0) return;
  const Call c{Pass::backward_data, p, gy.dtype()};
  if (gy.numel() == 0 || w.numel() == 0) {
    cuda::fill(gx, 0);
    return;
  }
  const bool nhwc = c.nhwc();
  const Tensor gxb = result(gx, nhwc);
  run(c, gxb, operand(w, nhwc), operand(gy, nhwc));
  finish(gx, gxb);
}

void conv2d_backward_weight(const ConvParams& p, const Tensor& gy, const Tensor& x, const Tensor& gw,
                            const Tensor& gb) {
  const Call c{Pass::backward_weight, p, gy.dtype()};
  if (gw.numel() > 0) {
    if (gy.numel() == 0 || x.numel() == 0) {
      cuda::fill(gw, 0);
    } else {
      const bool nhwc = c.nhwc();
      const Tensor gwb = result(gw, nhwc);
      run(c, operand(x, nhwc), gwb, operand(gy, nhwc));
      finish(gw, gwb);
    }
  }
  if (gb.defined()) {
    if (gy.numel() == 0)
      cuda::fill(gb, 0);
    else
      bias_gradient(gy, gb);
  }
}

}  // namespace ft::cuda
