// FP8 linear layers (fasttrain/fp8.h): the ops around the kernel-table entries fp8_quantize,
// fp8_update_scales and fp8_matmul, the layers' scaling state and the FP8 region.
#include "fasttrain/fp8.h"

#include <iterator>
#include <map>

#include "backend/kernels.h"
#include "core/name_table.h"
#include "fasttrain/autocast.h"
#include "fasttrain/nn.h"
#include "fasttrain/ops.h"
#include "ops/common.h"

namespace ft {

using backend::kernels;

namespace {

constexpr NamedValue<Fp8AmaxAlgo> kAmaxAlgoNames[] = {{Fp8AmaxAlgo::Max, "max"},
                                                      {Fp8AmaxAlgo::MostRecent, "most_recent"}};
static_assert(std::size(kAmaxAlgoNames) == kFp8AmaxAlgoCount &&
                  ft::detail::rows_start_in_enum_order(kAmaxAlgoNames, kFp8AmaxAlgoCount),
              "one row per Fp8AmaxAlgo, in enum order");

thread_local const Fp8Recipe* t_recipe = nullptr;

// "f32 [3]", or "none".
std::string describe(const Tensor& t) {
  return t.defined() ? detail::concat(dtype_name(t.dtype()), " ", t.shape().str()) : std::string("none");
}

void check_scalar_f32(const Tensor& t, const Tensor& x, const char* op, const char* what) {
  FT_CHECK(t.defined() && t.dtype() == DType::F32 && t.numel() == 1, op, ": ", what,
           " must be an f32 tensor of one element, found ", describe(t));
  FT_CHECK(t.device() == x.device(), op, ": ", what, " is on ", t.device().str(), ", the data on ", x.device().str());
}

void check_codes(const Tensor& t, const char* op, const char* what) {
  FT_CHECK(t.defined() && t.dtype() == DType::U8 && t.dim() == 2 && t.is_contiguous(), op, ": ", what,
           " must be dense 2-d u8 codes, found ", describe(t));
}

// The dtypes an FP8 product writes (cuBLASLt's FP8 outputs this engine uses).
void check_product_dtype(DType t, const char* op, const char* what) {
  FT_CHECK(t == DType::F32 || t == DType::BF16, op, ": ", what, " must be f32 or bf16 for FP8 products, found ",
           dtype_name(t));
}

// Transposed codes [C, R] widened with zero codes to a multiple of 16 columns: the summed
// dimension of the weight gradient's product is R (the rows, tokens), and cuBLASLt's FP8 GEMMs
// need it a multiple of 16; zeros add nothing to the sums. Both backends take the same path.
Tensor summed_dim_padded(const Tensor& codes_t) {
  const int64_t R = codes_t.size(1), padded = (R + 15) / 16 * 16;
  if (padded == R) return codes_t;
  Tensor out = zeros({codes_t.size(0), padded}, codes_t.options());
  out.narrow(1, 0, R).copy_(codes_t);
  return out;
}

}  // namespace

std::span<const NamedValue<Fp8AmaxAlgo>> option_names(Fp8AmaxAlgo) { return kAmaxAlgoNames; }

const char* fp8_format_name(Fp8Format f) { return f == Fp8Format::E4M3 ? "e4m3" : "e5m2"; }

void check_fp8_recipe(const Fp8Recipe& r) {
  FT_CHECK(r.amax_history_len >= 1 && r.amax_history_len <= kFp8MaxAmaxHistory,
           "fp8 recipe: amax_history_len must be 1..", kFp8MaxAmaxHistory, ", found ", r.amax_history_len);
  FT_CHECK(r.margin >= 0 && r.margin <= kFp8MaxMargin, "fp8 recipe: margin must be 0..", kFp8MaxMargin, ", found ",
           r.margin);
}

bool fp8_linear_shape_ok(int64_t in_features, int64_t out_features) {
  return in_features > 0 && out_features > 0 && in_features % 16 == 0 && out_features % 16 == 0;
}

Fp8LinearState::Fp8LinearState(const Fp8Recipe& recipe, Device device) {
  check_fp8_recipe(recipe);
  const TensorOptions f32(DType::F32, device);
  amax = zeros({kFp8Roles}, f32);
  amax_history = zeros({kFp8Roles, recipe.amax_history_len}, f32);
  scale = ones({kFp8Roles}, f32);
  scale_inv = ones({kFp8Roles}, f32);
}

void Fp8LinearState::update_scales(const Fp8Recipe& recipe) {
  FT_CHECK(amax_history.size(1) == recipe.amax_history_len, "fp8: a layer's amax history holds ", amax_history.size(1),
           " steps, the recipe asks for ", recipe.amax_history_len);
  backend::Fp8ScaleParams p;
  p.margin = recipe.margin;
  p.algo = recipe.amax_algo;
  kernels(amax).fp8_update_scales(amax, amax_history, scale, scale_inv, p);
}

std::vector<std::pair<std::string, Tensor>> Fp8LinearState::tensors() const {
  return {{"amax", amax}, {"amax_history", amax_history}, {"scale", scale}, {"scale_inv", scale_inv}};
}

Fp8Codes fp8_quantize(const Tensor& x, Fp8Format format, const Tensor& scale, const Tensor& amax,
                      bool with_transposed) {
  constexpr const char* kOp = "fp8_quantize";
  FT_CHECK(x.defined() && x.dim() == 2, kOp, ": x must be 2-d [R, C], found ",
           x.defined() ? x.shape().str() : std::string("none"));
  ops::check_floating(x, kOp, "x");
  check_scalar_f32(scale, x, kOp, "scale");
  check_scalar_f32(amax, x, kOp, "amax");
  const Tensor rows = x.size(1) <= 1 || x.stride(1) == 1 ? x.detach() : x.detach().contiguous();
  const TensorOptions u8(DType::U8, x.device());
  Fp8Codes out{empty({x.size(0), x.size(1)}, u8), with_transposed ? empty({x.size(1), x.size(0)}, u8) : Tensor()};
  kernels(x).fp8_quantize(rows, format, scale, amax, out.codes, out.transposed);
  return out;
}

Tensor fp8_matmul(const Tensor& a, Fp8Format fa, const Tensor& a_scale_inv, const Tensor& b, Fp8Format fb,
                  const Tensor& b_scale_inv, const Tensor& bias, DType out_dtype, bool fast_accumulate) {
  constexpr const char* kOp = "fp8_matmul";
  check_codes(a, kOp, "a");
  check_codes(b, kOp, "b");
  FT_CHECK(a.size(1) == b.size(1), kOp, ": a [M, K] and b [N, K] must share K, found ", a.shape().str(), " and ",
           b.shape().str());
  FT_CHECK(!(fa == Fp8Format::E5M2 && fb == Fp8Format::E5M2), kOp,
           ": at most one operand may be e5m2 (cuBLASLt has no e5m2 x e5m2 product)");
  ops::common_device({&a, &b, &a_scale_inv, &b_scale_inv, &bias}, kOp);
  check_scalar_f32(a_scale_inv, a, kOp, "a_scale_inv");
  check_scalar_f32(b_scale_inv, a, kOp, "b_scale_inv");
  check_product_dtype(out_dtype, kOp, "the output");
  if (bias.defined())
    FT_CHECK(bias.dim() == 1 && bias.size(0) == b.size(0) && bias.dtype() == out_dtype && bias.is_contiguous(), kOp,
             ": bias must be dense [", b.size(0), "] of the output's dtype ", dtype_name(out_dtype), ", found ",
             dtype_name(bias.dtype()), " ", bias.shape().str());
  Tensor out = empty({a.size(0), b.size(0)}, TensorOptions(out_dtype, a.device()));
  kernels(a).fp8_matmul(a, fa, a_scale_inv, b, fb, b_scale_inv, bias, fast_accumulate, out);
  return out;
}

Tensor fp8_linear(const Tensor& x, const Tensor& weight, const Tensor& bias, Fp8LinearState& state) {
  constexpr const char* kOp = "fp8_linear";
  FT_CHECK(x.defined() && weight.defined(), kOp, ": input and weight must be defined");
  FT_CHECK(x.dim() >= 1 && weight.dim() == 2, kOp, ": expected input [..., in] and weight [out, in], found ",
           x.shape().str(), " and ", weight.shape().str());
  const int64_t in = weight.size(1), out_f = weight.size(0);
  FT_CHECK(x.size(-1) == in, kOp, ": input has ", x.size(-1), " features (last dim of ", x.shape().str(), "), weight ",
           weight.shape().str(), " expects ", in);
  FT_CHECK(fp8_linear_shape_ok(in, out_f), kOp, ": FP8 products need in and out features that are multiples of 16, ",
           "found weight ", weight.shape().str());
  if (bias.defined())
    FT_CHECK(bias.dim() == 1 && bias.size(0) == out_f, kOp, ": bias has shape ", bias.shape().str(), ", expected [",
             out_f, "]");
  ops::common_device({&x, &weight, &bias, &state.scale}, kOp);
  check_product_dtype(x.dtype(), kOp, "the input");
  check_product_dtype(weight.dtype(), kOp, "the weight");
  const DType out_dtype = autocast::enabled() ? autocast::lowp_dtype() : x.dtype();
  check_product_dtype(out_dtype, kOp, "autocast's dtype");

  Shape lead = x.shape();
  lead.resize(x.dim() - 1);
  Shape y_shape = lead;
  y_shape.push_back(out_f);
  const bool need_x = x.requires_grad() && autograd::grad_enabled();
  const bool need_w = weight.requires_grad() && autograd::grad_enabled();
  const bool need_b = bias.defined() && bias.requires_grad() && autograd::grad_enabled();

  const Tensor x_sinv = state.scale_inv_of(Fp8Role::Input), w_sinv = state.scale_inv_of(Fp8Role::Weight);
  const Tensor g_scale = state.scale_of(Fp8Role::GradOutput), g_amax = state.amax_of(Fp8Role::GradOutput);
  const Tensor g_sinv = state.scale_inv_of(Fp8Role::GradOutput);
  const Fp8Codes xq = fp8_quantize(ops::as_rows(x), Fp8Format::E4M3, state.scale_of(Fp8Role::Input),
                                   state.amax_of(Fp8Role::Input), need_w);
  const Fp8Codes wq = fp8_quantize(weight.detach(), Fp8Format::E4M3, state.scale_of(Fp8Role::Weight),
                                   state.amax_of(Fp8Role::Weight), need_x);
  const Tensor b = bias.defined() ? bias.detach().to(out_dtype).contiguous() : Tensor();
  // Forward with cuBLASLt's fast accumulation (Transformer Engine's choice for the forward GEMM;
  // the gradients' products accumulate exactly in f32).
  Tensor y = fp8_matmul(xq.codes, Fp8Format::E4M3, x_sinv, wq.codes, Fp8Format::E4M3, w_sinv, b, out_dtype,
                        /*fast_accumulate=*/true)
                 .view(y_shape);
  if (need_x || need_w || need_b) {
    const Shape x_shape = x.shape();
    const DType x_dtype = x.dtype(), w_dtype = weight.dtype(), b_dtype = bias.defined() ? bias.dtype() : DType::F32;
    const Tensor xq_t = need_w ? summed_dim_padded(xq.transposed) : Tensor(), wq_t = wq.transposed;
    autograd::record_function("Fp8LinearBackward", {&x, &weight, &bias}, {&y}, [=](std::vector<Tensor>& g) {
      const Tensor gy = ops::as_rows(g[0]);  // [R, out]
      Tensor gx, gw, gb;
      if (need_x || need_w) {
        const Fp8Codes gq = fp8_quantize(gy, Fp8Format::E5M2, g_scale, g_amax, need_w);
        if (need_x)  // dx = dy W: [R, out] x ([in, out] codes)^T
          gx = fp8_matmul(gq.codes, Fp8Format::E5M2, g_sinv, wq_t, Fp8Format::E4M3, w_sinv, Tensor(), x_dtype)
                   .view(x_shape);
        if (need_w)  // dW = dy^T x: [out, R] x ([in, R] codes)^T
          gw = fp8_matmul(summed_dim_padded(gq.transposed), Fp8Format::E5M2, g_sinv, xq_t, Fp8Format::E4M3, x_sinv,
                          Tensor(), w_dtype);
      }
      if (need_b) gb = sum(gy.to(b_dtype), {0});  // from the unquantized gradient
      return std::vector<Tensor>{gx, gw, gb};
    });
  }
  return y;
}

Fp8Autocast::Fp8Autocast(const Fp8Recipe& recipe, bool enabled) : previous_(t_recipe), recipe_(recipe) {
  if (enabled) check_fp8_recipe(recipe_);
  t_recipe = enabled ? &recipe_ : nullptr;
}

Fp8Autocast::~Fp8Autocast() { t_recipe = previous_; }

const Fp8Recipe* fp8_autocast_recipe() { return t_recipe; }

std::vector<std::pair<std::string, Fp8LinearState*>> fp8_states(nn::Module& model) {
  std::vector<std::pair<std::string, Fp8LinearState*>> out;
  for (auto& [name, m] : model.named_modules())
    if (auto* linear = dynamic_cast<nn::Linear*>(m.get()); linear != nullptr && linear->fp8_state)
      out.emplace_back(name, linear->fp8_state.get());
  return out;
}

void fp8_update_scales(nn::Module& model, const Fp8Recipe& recipe) {
  for (auto& [name, state] : fp8_states(model)) state->update_scales(recipe);
}

std::vector<std::pair<std::string, Tensor>> fp8_state_tensors(nn::Module& model) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& [name, state] : fp8_states(model))
    for (auto& [key, t] : state->tensors()) out.emplace_back(name.empty() ? key : name + "." + key, t);
  return out;
}

void load_fp8_state_tensors(nn::Module& model, const Fp8Recipe& recipe,
                            const std::vector<std::pair<std::string, Tensor>>& tensors, const std::string& source) {
  std::map<std::string, Tensor> by_key(tensors.begin(), tensors.end());
  // Every layer named in the file, made first (nothing changes if a key is wrong).
  std::map<std::string, nn::Linear*> layers;
  for (auto& [name, m] : model.named_modules())
    if (auto* linear = dynamic_cast<nn::Linear*>(m.get()); linear != nullptr && linear->runs_fp8())
      layers[name] = linear;
  std::map<std::string, std::shared_ptr<Fp8LinearState>> states;
  for (const auto& [key, t] : by_key) {
    const size_t dot = key.rfind('.');
    const std::string layer = dot == std::string::npos ? "" : key.substr(0, dot);
    auto it = layers.find(layer);
    FT_CHECK(it != layers.end(), source, ": ", key, " names no FP8 linear layer of the model");
    auto& st = states[layer];
    if (!st) st = std::make_shared<Fp8LinearState>(recipe, it->second->weight.device());
  }
  for (auto& [layer, st] : states) {
    for (auto& [what, dst] : st->tensors()) {
      const std::string key = layer.empty() ? what : layer + "." + what;
      auto t = by_key.find(key);
      FT_CHECK(t != by_key.end(), source, ": ", key, " is missing");
      FT_CHECK(t->second.shape() == dst.shape() && t->second.dtype() == DType::F32, source, ": ", key, " is ",
               dtype_name(t->second.dtype()), " ", t->second.shape().str(), ", expected f32 ", dst.shape().str(),
               what == std::string("amax_history") ? " (the fp8 amax history length differs)" : "");
      Tensor d = dst;
      d.copy_(t->second.to(dst.device()));
    }
  }
  for (auto& [layer, st] : states) layers[layer]->fp8_state = st;
}

}  // namespace ft
