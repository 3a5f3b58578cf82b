// FP8 training (`--precision fp8-mixed`): linear layers multiply in 8-bit floating point with
// per-tensor scales, everything else as bf16-mixed. The recipe is NVIDIA Transformer Engine's
// delayed scaling in its HYBRID form:
//
//   forward   y  = (q(x) q(W)^T) / (s_x s_W) + b        q(.) = E4M3(. * s), saturating
//   backward  dx = (q(dy) q(W)) / (s_dy s_W)            q(dy) in E5M2 (range for gradients)
//             dW = (q(dy)^T q(x)) / (s_dy s_x),  db = column sums of dy (unquantized)
//
// Each tensor role (input, weight, output gradient) of each layer has a scale s from the largest
// magnitudes (amax) of its last `amax_history_len` steps: s = max_finite / amax / 2^margin
// (448 for E4M3, 57344 for E5M2). A step quantizes with the scale its predecessors set and
// records its own amax, so quantizing needs no extra pass over a tensor; the scales move at the
// end of the step (fp8_update_scales), on the device, without a host read (CUDA graphs can
// replay it). Products accumulate in f32 and the dequantizing factor is applied once to the
// result; master weights and the optimizer stay in f32.
//
// On a GPU the products are cuBLASLt's FP8 GEMMs (Hopper and later). On the CPU they are
// emulated: the 8-bit codes are decoded (exactly) to f32 and multiplied in f32, the same values
// a GPU multiplies, summed in another order; for checking a recipe, not for speed.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "fasttrain/names.h"
#include "fasttrain/tensor.h"

namespace ft {

namespace nn {
class Module;
}

enum class Fp8Format : uint8_t { E4M3, E5M2 };
const char* fp8_format_name(Fp8Format f);  // "e4m3", "e5m2"

// Transformer Engine's amax_compute_algo: the history's maximum, or its newest entry only.
enum class Fp8AmaxAlgo : uint8_t { Max, MostRecent };
inline constexpr size_t kFp8AmaxAlgoCount = 2;
std::span<const NamedValue<Fp8AmaxAlgo>> option_names(Fp8AmaxAlgo);  // "max", "most_recent"

struct Fp8Recipe {
  int margin = 0;               // scales are divided by 2^margin (headroom for growth)
  int amax_history_len = 1024;  // Transformer Engine's default
  Fp8AmaxAlgo amax_algo = Fp8AmaxAlgo::Max;
};
// The recipe's limits: the CUDA update kernel holds a history row in shared memory (4096 f32 =
// 16 KiB), and a margin past 64 would scale every value into the subnormals.
inline constexpr int kFp8MaxAmaxHistory = 4096;
inline constexpr int kFp8MaxMargin = 64;
// Throws ft::Error naming the field when the recipe cannot be used (history 1..kFp8MaxAmaxHistory,
// margin 0..kFp8MaxMargin).
void check_fp8_recipe(const Fp8Recipe& r);

// The tensor roles of an FP8 linear layer, the rows of its state.
enum class Fp8Role : uint8_t { Input, Weight, GradOutput };
inline constexpr int kFp8Roles = 3;
inline constexpr std::array<Fp8Format, kFp8Roles> kFp8RoleFormats = {Fp8Format::E4M3, Fp8Format::E4M3, Fp8Format::E5M2};

// One linear layer's scaling state, on its weight's device (all f32):
//   amax          [3]     this step's largest magnitude per role so far (max over micro-batches
//                         and activation-checkpoint recomputations, which see the same values)
//   amax_history  [3, L]  the last L steps' amaxes, newest first
//   scale         [3]     what each role is quantized with now (1 before the first update)
//   scale_inv     [3]     1 / scale, what the products dequantize with
struct Fp8LinearState {
  Fp8LinearState(const Fp8Recipe& recipe, Device device);
  Tensor amax, amax_history, scale, scale_inv;
  Tensor amax_of(Fp8Role r) const { return amax.narrow(0, static_cast<int64_t>(r), 1); }
  Tensor scale_of(Fp8Role r) const { return scale.narrow(0, static_cast<int64_t>(r), 1); }
  Tensor scale_inv_of(Fp8Role r) const { return scale_inv.narrow(0, static_cast<int64_t>(r), 1); }
  // End of a step: amax enters the history (the oldest entry leaves), amax restarts at 0, and
  // each role's scale becomes fp8_next_scale of the history's amax (Max or MostRecent).
  void update_scales(const Fp8Recipe& recipe);
  // The state's tensors by name ("amax", "amax_history", "scale", "scale_inv").
  std::vector<std::pair<std::string, Tensor>> tensors() const;
};

// Quantizes x (floating, 2-d [R, C] with a dense last dim) to 8-bit codes of `format`:
// codes U8 [R, C] = saturate(x * scale), and with `with_transposed` the same codes as U8 [C, R]
// (cuBLASLt's FP8 products want the summed dimension dense in both operands). amax (f32 [1], on
// x's device) becomes max(amax, max |x|). scale is f32 [1] on x's device.
struct Fp8Codes {
  Tensor codes, transposed;
};
Fp8Codes fp8_quantize(const Tensor& x, Fp8Format format, const Tensor& scale, const Tensor& amax,
                      bool with_transposed = false);
// out [M, N] = (a [M, K] b [N, K]^T) * a_scale_inv * b_scale_inv (+ bias [N]) in `out_dtype`
// (f32 or bf16), from codes a and b (U8, dense, K a multiple of 16 on a GPU).
Tensor fp8_matmul(const Tensor& a, Fp8Format fa, const Tensor& a_scale_inv, const Tensor& b, Fp8Format fb,
                  const Tensor& b_scale_inv, const Tensor& bias, DType out_dtype, bool fast_accumulate = false);

// y = x W^T + b through FP8 products with `state`'s scales (the formulas at the top), recording
// the step's amaxes into it. x [..., in], W [out, in], b [out] or undefined; y has x's leading
// shape and autocast's dtype when autocast is on (else x's); dx has x's dtype, dW and db W's.
Tensor fp8_linear(const Tensor& x, const Tensor& weight, const Tensor& bias, Fp8LinearState& state);

// Whether a linear layer of these sizes can run in FP8: both multiples of 16 (cuBLASLt's FP8
// GEMMs need it of the summed dimension, which each size is in one of the three products).
bool fp8_linear_shape_ok(int64_t in_features, int64_t out_features);

// The FP8 region: while one is alive on this thread, nn::Linear layers that allow it (fp8 on,
// sizes as above) run fp8_linear with their own state (made on first use). The train step opens
// one around the forward under fp8-mixed, inside autocast's bf16 region; one made with
// enabled = false turns FP8 off inside it.
class Fp8Autocast {
 public:
  explicit Fp8Autocast(const Fp8Recipe& recipe, bool enabled = true);
  ~Fp8Autocast();
  Fp8Autocast(const Fp8Autocast&) = delete;
  Fp8Autocast& operator=(const Fp8Autocast&) = delete;

 private:
  const Fp8Recipe* previous_;
  Fp8Recipe recipe_;
};
// The recipe of the innermost live Fp8Autocast on this thread; null outside one.
const Fp8Recipe* fp8_autocast_recipe();

// Every FP8 state in `model` (linear layers that have run under Fp8Autocast), by module name.
std::vector<std::pair<std::string, Fp8LinearState*>> fp8_states(nn::Module& model);
// End of an optimizer step: update_scales of each of them.
void fp8_update_scales(nn::Module& model, const Fp8Recipe& recipe);
// Checkpoints (the Trainer's fp8_scales.safetensors): every FP8 state of `model` as
// "<module>.<tensor>" (e.g. "blocks.0.mlp.c_fc.amax_history"), live views.
std::vector<std::pair<std::string, Tensor>> fp8_state_tensors(nn::Module& model);
// Loads them back into `model`, making the states of layers that have not run yet (a fresh model
// before its first step). Throws ft::Error naming `source` and the key when a key names no FP8
// linear layer of the model, a tensor is missing, or a shape differs (another amax history).
void load_fp8_state_tensors(nn::Module& model, const Fp8Recipe& recipe,
                            const std::vector<std::pair<std::string, Tensor>>& tensors, const std::string& source);

}  // namespace ft
