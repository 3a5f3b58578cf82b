// rotary_embedding and its tables: validation, the tables' math (inverse frequencies, Llama 3's
// scaling, cos and sin in f64) and autograd. The kernels (backend/cpu/rotary.cpp,
// backend/cuda/rotary.cu) turn each pair (i, i + D/2) of x at position t by the table's angle:
//   out[i] = x[i] c - x[i + D/2] s,  out[i + D/2] = x[i + D/2] c + x[i] s   (c, s at [t, i]).
// A rotation's transpose is its inverse, so the backward is the same kernel turning the
// gradient by minus the angle; nothing is saved but the tables.
#include "fasttrain/ops/rotary.h"

#include <cmath>
#include <numbers>

#include "backend/kernels.h"
#include "ops/common.h"

namespace ft {

using backend::kernels;

namespace {

constexpr const char* kOp = "rotary_embedding";

void check_inputs(const Tensor& x, const Tensor& cos, const Tensor& sin) {
  FT_CHECK(x.defined() && cos.defined() && sin.defined(), kOp, ": x, cos and sin must be defined tensors");
  FT_CHECK(x.dim() == 4, kOp, ": x must have 4 dimensions [B, T, H, D], found ", x.dim(), " (shape ", x.shape().str(),
           ")");
  ops::check_floating(x, kOp, "x");
  const int64_t T = x.size(1), D = x.size(3);
  FT_CHECK(D % 2 == 0, kOp, ": the head dim D of x [B, T, H, D] must be even (pairs i and i + D/2), found ", D);
  const Shape want{T, D / 2};
  const Tensor* tables[] = {&cos, &sin};
  const char* names[] = {"cos", "sin"};
  for (int i = 0; i < 2; ++i) {
    const Tensor& t = *tables[i];
    FT_CHECK(t.shape() == want, kOp, ": ", names[i], " must be [T, D/2] = ", want.str(), " for x ", x.shape().str(),
             ", found ", t.shape().str());
    const bool ok = t.dtype() == DType::F32 || (t.dtype() == DType::F64 && x.dtype() == DType::F64);
    FT_CHECK(ok, kOp, ": ", names[i], " must be f32 (or f64 for f64 x), found ", dtype_name(t.dtype()), " for x ",
             dtype_name(x.dtype()));
  }
  FT_CHECK(cos.dtype() == sin.dtype(), kOp, ": cos and sin must have one dtype, found cos ", dtype_name(cos.dtype()),
           ", sin ", dtype_name(sin.dtype()));
  ops::common_device({&x, &cos, &sin}, kOp);
}

// x as the kernel reads it: any strides but a dense last dim.
Tensor dense_last_dim(const Tensor& x) { return x.size(3) <= 1 || x.stride(3) == 1 ? x : x.contiguous(); }

}  // namespace

std::vector<double> rope_inverse_frequencies(int64_t head_dim, double theta, const RopeScaling& s) {
  FT_CHECK(head_dim > 0 && head_dim % 2 == 0, "rope_tables: head_dim must be even and positive, found ", head_dim);
  FT_CHECK(theta > 0, "rope_tables: theta (rope_theta) must be positive, found ", theta);
  std::vector<double> inv(static_cast<size_t>(head_dim / 2));
  for (size_t i = 0; i < inv.size(); ++i)
    inv[i] = 1.0 / std::pow(theta, static_cast<double>(2 * i) / static_cast<double>(head_dim));
  if (s.type == RopeScaling::Type::None) return inv;
  FT_CHECK(s.factor > 0 && s.low_freq_factor > 0 && s.high_freq_factor > s.low_freq_factor &&
               s.original_max_position_embeddings > 0,
           "rope_tables: llama3 scaling needs factor > 0, 0 < low_freq_factor < high_freq_factor and "
           "original_max_position_embeddings > 0, found factor ",
           s.factor, ", low_freq_factor ", s.low_freq_factor, ", high_freq_factor ", s.high_freq_factor,
           ", original_max_position_embeddings ", s.original_max_position_embeddings);
  const double L = static_cast<double>(s.original_max_position_embeddings);
  const double low_wavelen = L / s.low_freq_factor, high_wavelen = L / s.high_freq_factor;
  for (double& f : inv) {
    const double wavelen = 2 * std::numbers::pi / f;
    if (wavelen > low_wavelen) {
      f /= s.factor;  // long wavelengths: interpolated positions
    } else if (wavelen >= high_wavelen) {
      const double a = (L / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      f = (1 - a) * f / s.factor + a * f;
    }  // short wavelengths are kept
  }
  return inv;
}

RopeTables rope_tables(int64_t positions, int64_t head_dim, double theta, const RopeScaling& scaling,
                       TensorOptions options) {
  FT_CHECK(positions >= 0, "rope_tables: positions must be >= 0, found ", positions);
  FT_CHECK(options.dtype == DType::F32 || options.dtype == DType::F64, "rope_tables: the tables are f32 or f64, found ",
           dtype_name(options.dtype));
  const std::vector<double> inv = rope_inverse_frequencies(head_dim, theta, scaling);
  const int64_t half = head_dim / 2;
  std::vector<double> c(static_cast<size_t>(positions * half)), s(c.size());
  for (int64_t t = 0; t < positions; ++t)
    for (int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(t) * inv[static_cast<size_t>(i)];
      c[t * half + i] = std::cos(angle);
      s[t * half + i] = std::sin(angle);
    }
  const TensorOptions host(options.dtype);
  return {from_vector(c, {positions, half}, host).to(options.device),
          from_vector(s, {positions, half}, host).to(options.device)};
}

Tensor rotary_embedding(const Tensor& x, const Tensor& cos, const Tensor& sin) {
  check_inputs(x, cos, sin);
  const Tensor c = cos.detach().contiguous(), s = sin.detach().contiguous();
  Tensor out = empty(x.shape(), x.options());
  kernels(x).rotary_embedding(dense_last_dim(x.detach()), c, s, false, out);
  if (autograd::any_requires_grad({&x})) {
    autograd::SavedTensor sc(c), ss(s);
    const DType dt = x.dtype();
    autograd::record_function("RotaryEmbeddingBackward", {&x}, {&out}, [sc, ss, dt](std::vector<Tensor>& g) {
      const char* node = "RotaryEmbeddingBackward";
      Tensor go = dense_last_dim(g[0].dtype() == dt ? g[0] : g[0].to(dt));
      Tensor dx = empty(go.shape(), go.options());
      kernels(dx).rotary_embedding(go, sc.get(node), ss.get(node), true, dx);
      return std::vector<Tensor>{dx};
    });
  }
  return out;
}

}  // namespace ft
