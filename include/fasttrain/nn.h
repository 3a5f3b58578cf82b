// Modules: named parameters, buffers and submodules with PyTorch's naming ("blocks.0.attn.weight"),
// train/eval, state dicts, device/dtype moves, channels-last, initialisers, and the layers.
// Implemented in src/nn/. The models built from them (BENCH.md's, GPT and its weight files) are
// in models.h.
#pragma once
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fasttrain/fp8.h"
#include "fasttrain/ops.h"
#include "fasttrain/profiler.h"
#include "fasttrain/random.h"
#include "fasttrain/safetensors.h"
#include "fasttrain/tensor.h"

namespace ft::nn {

class KvCache;  // kv_cache.h

class Module {
 public:
  virtual ~Module() = default;
  virtual std::string type_name() const = 0;  // "Linear", "GPT", ...

  // --- registration (used by constructors) ---
  // Registers a parameter (a leaf; requires_grad unless frozen) and returns the stored handle.
  Tensor& register_parameter(const std::string& name, Tensor t, bool requires_grad = true);
  // Registers a buffer (saved in state_dict, moved by to(), no gradient), e.g. running_mean.
  Tensor& register_buffer(const std::string& name, Tensor t);
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m) {
    add_child(name, m);
    return m;
  }

  // --- introspection, in registration order, names joined with "." ---
  // Parameters shared between modules (tied weights) are listed once, under the first name.
  std::vector<std::pair<std::string, Tensor>> named_parameters() const;
  std::vector<Tensor> parameters() const;
  std::vector<std::pair<std::string, Tensor>> named_buffers() const;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_children() const;
  // Includes self as "" (a non-owning handle: a module may live on the stack); shared submodules once.
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_modules();
  int64_t num_parameters() const;  // unique parameters' elements

  // --- modes ---
  virtual void train(bool on = true);  // recursive
  void eval() { train(false); }
  bool is_training() const { return training_; }

  // --- state ---
  // Parameters and buffers by name (tied weights appear under every name, as in PyTorch).
  TensorMap state_dict() const;
  // Copies values in place (under NoGrad, converting dtype). strict: the key sets must match.
  // Validates everything before changing anything: a missing/unexpected key or a shape mismatch
  // throws ft::Error naming the key, expected and found, and leaves the module unchanged.
  // A model that recognises another program's layout of its weights (GPT: Hugging Face's) says so
  // instead of listing every mismatch, and names the function that converts that layout.
  void load_state_dict(const TensorMap& state, bool strict = true);
  void save(const std::string& safetensors_path) const;  // state_dict to a .safetensors file
  void load(const std::string& safetensors_path, bool strict = true);

  // --- moves (floating parameters and buffers only for dtype) ---
  void to(Device device);
  void to(DType dtype);
  // Converts 4-d parameters (conv weights) to channels-last memory order.
  void to_channels_last();
  void zero_grad(bool set_to_none = true);

 protected:
  Module() = default;
  // Asked by load_state_dict when `state` does not fit this module: a non-empty answer says which
  // foreign layout `state` is in and how to load it, and replaces the list of mismatches (which
  // would only repeat the layout difference once per tensor).
  virtual std::string explain_foreign_state(const TensorMap& state) const;
  bool training_ = true;

 private:
  void add_child(const std::string& name, std::shared_ptr<Module> m);
  std::vector<std::pair<std::string, Tensor>> params_;
  std::vector<std::pair<std::string, Tensor>> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
};

// A module with one tensor in and one tensor out (layers, Sequential, the models).
// Call it as m(x): while profiling, the call is a span named by the module's path and its
// allocations are attributed to it (profiler.h); otherwise it is forward(x) after one relaxed load.
class UnaryModule : public Module {
 public:
  virtual Tensor forward(const Tensor& x) = 0;
  Tensor operator()(const Tensor& x) {
    if (profiler::active()) [[unlikely]]
      return profiled_forward(x);
    return forward(x);
  }

 protected:
  // f() as a call of this module: inside its profiler span while profiling.
  Tensor call_as_this(const std::function<Tensor()>& f);

 private:
  Tensor profiled_forward(const Tensor& x);
};
using ModulePtr = std::shared_ptr<UnaryModule>;

// A repeated block of a model (GPT's transformer blocks, the ResNets' residual blocks) whose
// forward can run under activation checkpointing (autograd::checkpoint): its activations are
// recomputed in backward instead of kept. Off by default; names and state_dict are unaffected.
//
// Blocks are also the unit that ZeRO stage 3 (FSDP) gathers: BlockHooks run around every forward.
class CheckpointableBlock;
class BlockHooks {
 public:
  virtual ~BlockHooks() = default;
  // Before the block computes (its parameters must hold their values once this returns).
  virtual void before_forward(CheckpointableBlock& block) = 0;
  // With the block's output; the returned tensor replaces it (it may carry an autograd node
  // whose backward runs before the block's own, to gather the parameters again).
  virtual Tensor after_forward(CheckpointableBlock& block, const Tensor& output) = 0;
};

class CheckpointableBlock : public UnaryModule {
 public:
  Tensor forward(const Tensor& x) final;
  // forward(x) with a second input that is data, not differentiated: the decoders hand their
  // blocks the document ids of packed windows this way (DocumentMask). block_forward reads it as
  // side_input() (undefined under forward(x)). It is captured with the call, so the recomputation
  // of activation checkpointing, which runs later inside backward, sees this call's tensor and
  // not whatever a later forward left behind. Called as this module (profiler spans, hooks).
  Tensor forward(const Tensor& x, const Tensor& side);
  void set_activation_checkpointing(bool on) { checkpointing_ = on; }
  bool activation_checkpointing() const { return checkpointing_; }
  // At most one set of hooks (not owned; null removes them). The recomputation of activation
  // checkpointing runs inside the block's backward and calls no hooks.
  void set_hooks(BlockHooks* hooks) { hooks_ = hooks; }
  BlockHooks* hooks() const { return hooks_; }

 protected:
  virtual Tensor block_forward(const Tensor& x) = 0;
  const Tensor& side_input() const { return side_; }
  // f(), a variant of block_forward for inference (a decoder block's cached step), called as the
  // block is: its hooks around it (ZeRO-3 gathers the parameters) and under its profiler span.
  // Never checkpointed: without a graph there is nothing to recompute. side_input() is undefined.
  Tensor forward_variant(const std::function<Tensor()>& f);

 private:
  Tensor run(const Tensor& x, const Tensor& side);
  bool checkpointing_ = false;
  BlockHooks* hooks_ = nullptr;
  Tensor side_;  // the side input of the block_forward running now
};

// Turns activation checkpointing on or off for every CheckpointableBlock in `model` (itself
// included) and returns how many there are; throws if there are none (a model with no
// checkpointable blocks would silently keep all its activations).
int64_t set_activation_checkpointing(Module& model, bool on);

// --- initialisers (in place, under NoGrad, from the given or default generator) ---
namespace init {
void normal_(Tensor& t, double mean = 0.0, double std = 1.0, Generator* gen = nullptr);
void uniform_(Tensor& t, double low = 0.0, double high = 1.0, Generator* gen = nullptr);
void zeros_(Tensor& t);
void ones_(Tensor& t);
enum class Nonlinearity { Linear, ReLU, LeakyReLU, Tanh };
// PyTorch's fan computation (fan_in = size(1) * receptive field) and gains.
void kaiming_uniform_(Tensor& t, double a = 0.0, bool fan_in_mode = true, Nonlinearity nl = Nonlinearity::LeakyReLU,
                      Generator* gen = nullptr);
void kaiming_normal_(Tensor& t, double a = 0.0, bool fan_in_mode = true, Nonlinearity nl = Nonlinearity::ReLU,
                     Generator* gen = nullptr);
void xavier_uniform_(Tensor& t, double gain = 1.0, Generator* gen = nullptr);
void xavier_normal_(Tensor& t, double gain = 1.0, Generator* gen = nullptr);
}  // namespace init

// --- layers (parameter names and default initialisation as in torch.nn) ---
class Linear : public UnaryModule {  // weight [out, in], bias [out]
 public:
  Linear(int64_t in, int64_t out, bool bias = true, Generator* gen = nullptr);
  // Wraps existing tensors as this layer's parameters, without initialising them: weight tying
  // (GPT's head shares the token embedding) registers the same tensor in two modules.
  explicit Linear(Tensor weight, Tensor bias = Tensor());
  // Inside an Fp8Autocast region (fp8.h) a layer with `fp8` on and sizes fp8_linear_shape_ok
  // runs fp8_linear with its own `fp8_state`, made on its first such call; otherwise linear().
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "Linear"; }
  // Whether this layer runs in FP8 under --precision fp8-mixed. Models turn it off for layers
  // that stay in bf16 there, as Transformer Engine recipes do: the output head (its logits feed
  // the loss; a vocabulary is rarely a multiple of 16).
  bool runs_fp8() const { return fp8 && fp8_linear_shape_ok(weight.size(1), weight.size(0)); }
  Tensor weight, bias;
  bool fp8 = true;
  std::shared_ptr<Fp8LinearState> fp8_state;
};
class Conv2d : public UnaryModule {  // weight [out, in/groups, k, k]
 public:
  Conv2d(int64_t in, int64_t out, int64_t kernel, int64_t stride = 1, int64_t padding = 0, bool bias = true,
         int64_t groups = 1, int64_t dilation = 1, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "Conv2d"; }
  Tensor weight, bias;
  int64_t stride, padding, groups, dilation;
};
class BatchNorm2d : public UnaryModule {  // weight, bias, running_mean, running_var, num_batches_tracked
 public:
  explicit BatchNorm2d(int64_t channels, double eps = 1e-5, double momentum = 0.1);
  Tensor forward(const Tensor& x) override;
  // relu(forward(x)) as one fused op (batch_norm_relu), called as this module (its profiler span).
  // Sequential runs a BatchNorm2d followed by a ReLU module this way.
  Tensor call_with_relu(const Tensor& x);
  // relu(forward(x) + residual) as one fused op (batch_norm_add_relu), called as this module: the
  // output of a ResNet block (Sequential::forward_add_relu).
  Tensor call_with_add_relu(const Tensor& x, const Tensor& residual);
  std::string type_name() const override { return "BatchNorm2d"; }
  Tensor weight, bias, running_mean, running_var, num_batches_tracked;
  double eps, momentum;
};
class LayerNorm : public UnaryModule {
 public:
  explicit LayerNorm(int64_t dim, double eps = 1e-5, bool affine = true);
  Tensor forward(const Tensor& x) override;
  // add_layer_norm(x, residual) with this module's parameters, as a call of this module: a
  // pre-norm block's residual add fused into the norm after it ({x + residual, its norm}).
  ResidualNorm call_with_add(const Tensor& x, const Tensor& residual);
  std::string type_name() const override { return "LayerNorm"; }
  Tensor weight, bias;
  int64_t dim;
  double eps;
};
class RMSNorm : public UnaryModule {
 public:
  explicit RMSNorm(int64_t dim, double eps = 1e-6);
  Tensor forward(const Tensor& x) override;
  // add_rms_norm(x, residual) as a call of this module ({x + residual, its norm}), as LayerNorm's.
  ResidualNorm call_with_add(const Tensor& x, const Tensor& residual);
  std::string type_name() const override { return "RMSNorm"; }
  Tensor weight;
  int64_t dim;
  double eps;
};
class Embedding : public UnaryModule {  // weight [num, dim] ~ N(0, 1)
 public:
  Embedding(int64_t num, int64_t dim, Generator* gen = nullptr);
  Tensor forward(const Tensor& ids) override;
  std::string type_name() const override { return "Embedding"; }
  Tensor weight;
};
class Dropout : public UnaryModule {
 public:
  explicit Dropout(double p = 0.5) : p(p) {}
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "Dropout"; }
  double p;
};
class ReLU : public UnaryModule {
 public:
  Tensor forward(const Tensor& x) override { return relu(x); }
  std::string type_name() const override { return "ReLU"; }
};
class GELU : public UnaryModule {
 public:
  explicit GELU(GeluApprox approx = GeluApprox::None) : approx(approx) {}
  Tensor forward(const Tensor& x) override { return gelu(x, approx); }
  std::string type_name() const override { return "GELU"; }
  GeluApprox approx;
};
class SiLU : public UnaryModule {
 public:
  Tensor forward(const Tensor& x) override { return silu(x); }
  std::string type_name() const override { return "SiLU"; }
};
class MaxPool2d : public UnaryModule {
 public:
  MaxPool2d(int64_t kernel, int64_t stride = 0, int64_t padding = 0)
      : kernel(kernel), stride(stride), padding(padding) {}
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "MaxPool2d"; }
  int64_t kernel, stride, padding;
};
class AvgPool2d : public UnaryModule {
 public:
  AvgPool2d(int64_t kernel, int64_t stride = 0, int64_t padding = 0)
      : kernel(kernel), stride(stride), padding(padding) {}
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "AvgPool2d"; }
  int64_t kernel, stride, padding;
};
class AdaptiveAvgPool2d : public UnaryModule {
 public:
  explicit AdaptiveAvgPool2d(int64_t out) : out(out) {}
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "AdaptiveAvgPool2d"; }
  int64_t out;
};
class Flatten : public UnaryModule {  // flattens all dims after the first
 public:
  Tensor forward(const Tensor& x) override { return x.flatten(1); }
  std::string type_name() const override { return "Flatten"; }
};
// Children named "0", "1", ... as in torch.nn.Sequential.
class Sequential : public UnaryModule {
 public:
  Sequential() = default;
  explicit Sequential(std::vector<ModulePtr> layers);
  void push_back(ModulePtr m);
  Tensor forward(const Tensor& x) override;
  // relu(forward(x) + residual), called as this module: a ResNet block's body and its output.
  // When the last layer is a BatchNorm2d, it, the add and the ReLU run as one fused op.
  Tensor forward_add_relu(const Tensor& x, const Tensor& residual);
  std::string type_name() const override { return "Sequential"; }
  size_t size() const { return layers_.size(); }
  const ModulePtr& operator[](size_t i) const { return layers_[i]; }

 private:
  Tensor run_layers(const Tensor& x, size_t end);  // layers [0, end) in order
  std::vector<ModulePtr> layers_;
};
// Children named "0", "1", ...; no forward of its own.
class ModuleList : public Module {
 public:
  void push_back(std::shared_ptr<Module> m);
  size_t size() const { return items_.size(); }
  std::shared_ptr<Module> operator[](size_t i) const { return items_[i]; }
  template <class M>
  std::shared_ptr<M> at(size_t i) const {
    return std::dynamic_pointer_cast<M>(items_[i]);
  }
  std::string type_name() const override { return "ModuleList"; }

 private:
  std::vector<std::shared_ptr<Module>> items_;
};
// Multi-head causal self-attention with a fused qkv projection (GPT-2 layout): x [B, T, C] ->
// [B, T, C]; submodules c_attn (C -> 3C) and c_proj (C -> C); attention through the fused
// scaled_dot_product_attention (causal).
class CausalSelfAttention : public UnaryModule {
 public:
  CausalSelfAttention(int64_t dim, int64_t heads, double dropout = 0.0, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;
  // With doc_ids [B, T] defined, attention under DocumentMask{doc_ids} (causal within each
  // packed document); undefined, forward(x).
  Tensor forward(const Tensor& x, const Tensor& doc_ids);
  // x [B, T, C] at positions cache.length() .. +T-1 (kv_cache.h: cached_attention), keys and
  // values stored in the cache's `layer`; no dropout.
  Tensor forward_cached(const Tensor& x, KvCache& cache, int64_t layer);
  std::string type_name() const override { return "CausalSelfAttention"; }
  std::shared_ptr<Linear> c_attn, c_proj;
  int64_t heads;
  double dropout;

 private:
  Tensor attend(const Tensor& x, const Tensor& doc_ids, KvCache* cache, int64_t layer);
};

}  // namespace ft::nn
