// Elementwise ops: type promotion, broadcasting, and gradients. The per-element math is in
// backend/elementwise_math.h, whose op lists also generate the unary functions and the
// comparisons at the end of this file; the loops are in backend/cpu/elementwise.cpp.
#include "fasttrain/ops/elementwise.h"

#include "backend/kernels.h"
#include "fasttrain/ops/reduce.h"
#include "ops/common.h"
#include "ops/conv_layout.h"
#include "ops/unary.h"

namespace ft {

using autograd::record_function;
using backend::kernels;
using math::BinaryOp;
using math::UnaryOp;

namespace {

// The output of an elementwise op keeps the memory format of its first input of the output's
// shape (PyTorch's TensorIterator rule): a ReLU or residual add of channels-last activations stays
// channels-last, so the next convolution reads NHWC in place instead of reordering NCHW.
Tensor empty_like_inputs(const Shape& shape, TensorOptions opts, std::initializer_list<const Tensor*> inputs) {
  for (const Tensor* t : inputs)
    if (t->shape() == shape) return ops::empty_in_format(shape, opts, ops::prefers_channels_last(*t));
  return empty(shape, opts);
}

// Broadcasts and promotes, then runs the kernel. No autograd.
Tensor binary_forward(BinaryOp op, const Tensor& a, const Tensor& b) {
  const char* name = math::binary_info(op).name;
  ops::common_device({&a, &b}, name);
  Shape shape = broadcast_shapes(a.shape(), b.shape(), name);
  DType dt = promote_types(a.dtype(), b.dtype());
  Tensor ac = a.dtype() == dt ? a : a.to(dt);
  Tensor bc = b.dtype() == dt ? b : b.to(dt);
  Tensor out =
      empty_like_inputs(shape, TensorOptions(math::is_comparison(op) ? DType::Bool : dt, a.device()), {&a, &b});
  kernels(out).binary(op, ac, bc, out);
  return out;
}

}  // namespace

// Every unary op: the dtype check its domain asks for, the kernel, and a fused backward kernel
// (grad * f'(x) in one pass) reading what the op's list line says it saves.
Tensor ops::unary(UnaryOp op, const Tensor& x) {
  const math::UnaryInfo& info = math::unary_info(op);
  if (info.domain != math::UnaryDomain::Numeric) ops::check_floating(x, info.name, "input");
  Tensor y = empty_like_inputs(x.shape(), x.options(), {&x});
  kernels(y).unary(op, x, y);
  if (autograd::any_requires_grad({&x})) {
    // An op whose derivative is written in y keeps y alone: x may be freed after the forward.
    autograd::SavedTensor saved(info.saves == math::UnarySaves::Output ? y : x);
    const char* node = info.node;
    record_function(node, {&x}, {&y}, [op, saved, node](std::vector<Tensor>& g) {
      Tensor s = saved.get(node);
      Tensor gx = empty_like_inputs(s.shape(), s.options(), {&s});
      kernels(gx).unary_backward(op, g[0], s, s, gx);
      return std::vector<Tensor>{gx};
    });
  }
  return y;
}

Tensor sum_to_shape(const Tensor& grad, const Shape& shape) {
  if (grad.shape() == shape) return grad;
  const int lead = grad.dim() - shape.size();
  FT_CHECK(lead >= 0, "sum_to_shape: gradient shape ", grad.shape().str(), " has fewer dimensions than ", shape.str());
  Dims dims;
  for (int i = 0; i < grad.dim(); ++i) {
    if (i < lead) {
      dims.push_back(i);
    } else if (shape[i - lead] == 1 && grad.size(i) != 1) {
      dims.push_back(i);
    }
  }
  Tensor r = dims.empty() ? grad : sum(grad, dims, true);
  return r.reshape(shape);
}

// --- binary arithmetic ---

Tensor add(const Tensor& a, const Tensor& b, Scalar alpha) {
  Tensor bb = alpha.to_double() == 1.0 ? b : mul(b, alpha);
  Tensor out = binary_forward(BinaryOp::Add, a, bb);
  if (autograd::any_requires_grad({&a, &bb})) {
    Shape sa = a.shape(), sb = bb.shape();
    record_function("AddBackward", {&a, &bb}, {&out}, [sa, sb](std::vector<Tensor>& g) {
      return std::vector<Tensor>{sum_to_shape(g[0], sa), sum_to_shape(g[0], sb)};
    });
  }
  return out;
}

Tensor sub(const Tensor& a, const Tensor& b, Scalar alpha) {
  Tensor bb = alpha.to_double() == 1.0 ? b : mul(b, alpha);
  Tensor out = binary_forward(BinaryOp::Sub, a, bb);
  if (autograd::any_requires_grad({&a, &bb})) {
    Shape sa = a.shape(), sb = bb.shape();
    record_function("SubBackward", {&a, &bb}, {&out}, [sa, sb](std::vector<Tensor>& g) {
      return std::vector<Tensor>{sum_to_shape(g[0], sa), sum_to_shape(neg(g[0]), sb)};
    });
  }
  return out;
}

Tensor mul(const Tensor& a, const Tensor& b) {
  Tensor out = binary_forward(BinaryOp::Mul, a, b);
  if (autograd::any_requires_grad({&a, &b})) {
    bool need_a = a.requires_grad(), need_b = b.requires_grad();
    autograd::SavedTensor sa(need_b ? a : Tensor()), sb(need_a ? b : Tensor());
    Shape sha = a.shape(), shb = b.shape();
    record_function("MulBackward", {&a, &b}, {&out}, [=](std::vector<Tensor>& g) {
      Tensor ga = need_a ? sum_to_shape(mul(g[0], sb.get("MulBackward")), sha) : Tensor();
      Tensor gb = need_b ? sum_to_shape(mul(g[0], sa.get("MulBackward")), shb) : Tensor();
      return std::vector<Tensor>{ga, gb};
    });
  }
  return out;
}

Tensor div(const Tensor& a, const Tensor& b) {
  // Integer division follows PyTorch's true division: promote to float.
  if (!is_floating(a.dtype()) && !is_floating(b.dtype())) return div(a.to(DType::F32), b.to(DType::F32));
  Tensor out = binary_forward(BinaryOp::Div, a, b);
  if (autograd::any_requires_grad({&a, &b})) {
    bool need_b = b.requires_grad();
    autograd::SavedTensor sb(b), sout(need_b ? out : Tensor());
    Shape sha = a.shape(), shb = b.shape();
    record_function("DivBackward", {&a, &b}, {&out}, [=](std::vector<Tensor>& g) {
      Tensor bv = sb.get("DivBackward");
      Tensor ga = sum_to_shape(div(g[0], bv), sha);
      Tensor gb = need_b ? sum_to_shape(neg(div(mul(g[0], sout.get("DivBackward")), bv)), shb) : Tensor();
      return std::vector<Tensor>{ga, gb};
    });
  }
  return out;
}

Tensor add(const Tensor& a, Scalar b) { return add(a, ops::scalar_like(b, a)); }
Tensor sub(const Tensor& a, Scalar b) { return sub(a, ops::scalar_like(b, a)); }
Tensor mul(const Tensor& a, Scalar b) { return mul(a, ops::scalar_like(b, a)); }
Tensor div(const Tensor& a, Scalar b) { return div(a, ops::scalar_like(b, a)); }
Tensor rsub(const Tensor& a, Scalar b) { return sub(ops::scalar_like(b, a), a); }

// Gradient of max/min flows to the selected input; ties split evenly (PyTorch's rule).
static Tensor extremum(BinaryOp op, const Tensor& a, const Tensor& b) {
  Tensor out = binary_forward(op, a, b);
  if (autograd::any_requires_grad({&a, &b})) {
    autograd::SavedTensor sa(a), sb(b);
    Shape sha = a.shape(), shb = b.shape();
    bool is_max = op == BinaryOp::Max;
    record_function(is_max ? "MaximumBackward" : "MinimumBackward", {&a, &b}, {&out}, [=](std::vector<Tensor>& g) {
      const char* node = is_max ? "MaximumBackward" : "MinimumBackward";
      Tensor av = sa.get(node), bv = sb.get(node);
      Tensor a_wins = (is_max ? gt(av, bv) : lt(av, bv)).to(g[0].dtype());
      Tensor tie = eq(av, bv).to(g[0].dtype());
      Tensor wa = add(a_wins, mul(tie, 0.5));
      Tensor wb = rsub(wa, 1.0);
      return std::vector<Tensor>{sum_to_shape(mul(g[0], wa), sha), sum_to_shape(mul(g[0], wb), shb)};
    });
  }
  return out;
}
Tensor maximum(const Tensor& a, const Tensor& b) { return extremum(BinaryOp::Max, a, b); }
Tensor minimum(const Tensor& a, const Tensor& b) { return extremum(BinaryOp::Min, a, b); }

Tensor pow(const Tensor& a, const Tensor& b) {
  Tensor out = binary_forward(BinaryOp::Pow, a, b);
  if (autograd::any_requires_grad({&a, &b})) {
    bool need_b = b.requires_grad();
    autograd::SavedTensor sa(a), sb(b), sout(out);
    Shape sha = a.shape(), shb = b.shape();
    record_function("PowBackward", {&a, &b}, {&out}, [=](std::vector<Tensor>& g) {
      Tensor av = sa.get("PowBackward"), bv = sb.get("PowBackward"), ov = sout.get("PowBackward");
      // d/da a^b = b a^(b-1); d/db a^b = a^b log a (taken as 0 where a == 0, as PyTorch does)
      Tensor ga = sum_to_shape(mul(g[0], mul(bv, pow(av, sub(bv, 1.0)))), sha);
      Tensor gb;
      if (need_b) {
        Tensor safe_log = where(eq(av, 0.0), zeros_like(av), log(where(eq(av, 0.0), ones_like(av), av)));
        gb = sum_to_shape(mul(g[0], mul(ov, safe_log)), shb);
      }
      return std::vector<Tensor>{ga, gb};
    });
  }
  return out;
}

Tensor pow(const Tensor& a, Scalar exponent) {
  double e = exponent.to_double();
  if (e == 2.0) return square(a);
  Tensor out = binary_forward(BinaryOp::Pow, a, ops::scalar_like(exponent, a));
  if (autograd::any_requires_grad({&a})) {
    autograd::SavedTensor sa(a);
    record_function("PowScalarBackward", {&a}, {&out}, [=](std::vector<Tensor>& g) {
      Tensor av = sa.get("PowScalarBackward");
      Tensor d = e == 0.0 ? zeros_like(av) : mul(pow(av, e - 1.0), e);
      return std::vector<Tensor>{mul(g[0], d)};
    });
  }
  return out;
}

// --- unary (the rest are generated at the end of the file) ---

Tensor gelu(const Tensor& x, GeluApprox approximate) {
  return ops::unary(approximate == GeluApprox::Tanh ? UnaryOp::GeluTanh : UnaryOp::Gelu, x);
}

Tensor clamp(const Tensor& x, std::optional<double> lo, std::optional<double> hi) {
  FT_CHECK(lo || hi, "clamp: at least one of min and max must be given");
  FT_CHECK(!(lo && hi) || *lo <= *hi, "clamp: min ", *lo, " is greater than max ", *hi);
  Tensor out = empty_like_inputs(x.shape(), x.options(), {&x});
  kernels(out).clamp(x, lo, hi, out);
  if (autograd::any_requires_grad({&x})) {
    autograd::SavedTensor sx(x);
    record_function("ClampBackward", {&x}, {&out}, [=](std::vector<Tensor>& g) {
      Tensor xv = sx.get("ClampBackward");
      Tensor gx = empty_like_inputs(xv.shape(), xv.options(), {&xv});
      kernels(gx).clamp_backward(g[0], xv, lo, hi, gx);
      return std::vector<Tensor>{gx};
    });
  }
  return out;
}

// --- gated activation ---

// SwiGLU's gate, silu(gate) * up, as one pass each way (kernel_list.h's silu_mul): the composition
// reads gate twice and writes and re-reads silu(gate), and its backward runs four passes. Rows
// keep their stride (as_rows), so gate and up may be the two halves of one [.., 2F] product.
// A backend without the fusion runs the composition, whose autograd gives the same gradients.
Tensor silu_mul(const Tensor& gate, const Tensor& up) {
  constexpr const char* kOp = "silu_mul";
  FT_CHECK(gate.defined() && up.defined(), kOp, ": gate and up must be defined tensors");
  ops::check_floating(gate, kOp, "gate");
  ops::check_floating(up, kOp, "up");
  FT_CHECK(gate.dtype() == up.dtype(), kOp, ": gate and up must have one dtype, found gate ", dtype_name(gate.dtype()),
           ", up ", dtype_name(up.dtype()));
  FT_CHECK(gate.shape() == up.shape(), kOp, ": gate and up must have one shape, found gate ", gate.shape().str(),
           ", up ", up.shape().str());
  ops::common_device({&gate, &up}, kOp);
  const backend::Kernels& k = kernels(gate);
  if (!k.silu_mul.has_value() || !k.silu_mul_backward.has_value()) return mul(silu(gate), up);
  Tensor out = empty(gate.shape(), gate.options());
  k.silu_mul(ops::as_rows(gate), ops::as_rows(up), ops::as_rows(out));
  if (autograd::any_requires_grad({&gate, &up})) {
    autograd::SavedTensor sg(gate), su(up);
    record_function("SiluMulBackward", {&gate, &up}, {&out}, [sg, su](std::vector<Tensor>& g) {
      Tensor gv = sg.get("SiluMulBackward"), uv = su.get("SiluMulBackward");
      Tensor dgate = empty(gv.shape(), gv.options()), dup = empty(uv.shape(), uv.options());
      Tensor go = g[0].dtype() == gv.dtype() ? g[0] : g[0].to(gv.dtype());
      kernels(dgate).silu_mul_backward(ops::as_rows(go), ops::as_rows(gv), ops::as_rows(uv), ops::as_rows(dgate),
                                       ops::as_rows(dup));
      return std::vector<Tensor>{dgate, dup};
    });
  }
  return out;
}

// --- selection ---

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  ops::common_device({&cond, &a, &b}, "where");
  Shape shape = broadcast_shapes(broadcast_shapes(cond.shape(), a.shape(), "where"), b.shape(), "where");
  DType dt = promote_types(a.dtype(), b.dtype());
  Tensor c = cond.dtype() == DType::Bool ? cond : ne(cond, ops::scalar_like(0, cond));
  Tensor ac = a.dtype() == dt ? a : a.to(dt);
  Tensor bc = b.dtype() == dt ? b : b.to(dt);
  Tensor out = empty(shape, TensorOptions(dt, a.device()));
  kernels(out).where(c, ac, bc, out);
  if (autograd::any_requires_grad({&a, &b})) {
    autograd::SavedTensor sc(c);
    Shape sha = a.shape(), shb = b.shape();
    record_function("WhereBackward", {&a, &b}, {&out}, [=](std::vector<Tensor>& g) {
      Tensor cv = sc.get("WhereBackward");
      Tensor z = zeros({}, g[0].options());
      return std::vector<Tensor>{sum_to_shape(where(cv, g[0], z), sha), sum_to_shape(where(cv, z, g[0]), shb)};
    });
  }
  return out;
}

Tensor masked_fill(const Tensor& x, const Tensor& mask, Scalar value) {
  FT_CHECK(mask.dtype() == DType::Bool, "masked_fill: mask must be a bool tensor, found ", dtype_name(mask.dtype()));
  FT_CHECK(broadcast_shapes(x.shape(), mask.shape(), "masked_fill") == x.shape(), "masked_fill: mask of shape ",
           mask.shape().str(), " does not broadcast to the input's shape ", x.shape().str());
  Tensor v = full({}, value, x.options());
  Tensor out;
  {
    autograd::NoGradGuard ng;
    out = where(mask, v, x);
  }
  if (autograd::any_requires_grad({&x})) {
    autograd::SavedTensor sm(mask);
    Shape shx = x.shape();
    record_function("MaskedFillBackward", {&x}, {&out}, [=](std::vector<Tensor>& g) {
      Tensor z = zeros({}, g[0].options());
      return std::vector<Tensor>{sum_to_shape(where(sm.get("MaskedFillBackward"), z, g[0]), shx)};
    });
  }
  return out;
}

// --- comparisons (tensor-tensor forms are generated at the end of the file) ---

Tensor eq(const Tensor& a, Scalar b) { return eq(a, ops::scalar_like(b, a)); }
Tensor gt(const Tensor& a, Scalar b) { return gt(a, ops::scalar_like(b, a)); }
Tensor lt(const Tensor& a, Scalar b) { return lt(a, ops::scalar_like(b, a)); }
Tensor logical_not(const Tensor& x) { return eq(x.dtype() == DType::Bool ? x : ne(x, ops::scalar_like(0, x)), false); }

// --- in place ---

Tensor& add_(Tensor& a, const Tensor& b, Scalar alpha) {
  FT_CHECK(!(autograd::grad_enabled() && a.requires_grad()), "add_: in-place write to a tensor that requires grad ",
           "while grad mode is on; use add(), or write under NoGradGuard");
  FT_CHECK(broadcast_shapes(a.shape(), b.shape(), "add_") == a.shape(), "add_: shape ", b.shape().str(),
           " does not broadcast to ", a.shape().str());
  ops::common_device({&a, &b}, "add_");
  Tensor bc = b.dtype() == a.dtype() ? b : b.to(a.dtype());
  kernels(a).add_inplace(a, bc, alpha.to_double());
  a.bump_version();
  return a;
}

Tensor& mul_(Tensor& a, Scalar b) {
  FT_CHECK(!(autograd::grad_enabled() && a.requires_grad()), "mul_: in-place write to a tensor that requires grad ",
           "while grad mode is on");
  kernels(a).binary(BinaryOp::Mul, a, ops::scalar_like(b, a).to(a.dtype()), a);
  a.bump_version();
  return a;
}

}  // namespace ft

// One function per Public unary op and per comparison of the lists in elementwise_math.h.
// Defined by qualified name outside the namespace: that needs a declaration in the public
// header, so a list line without one fails to compile here.
#define FT_UNARY_FUNCTION_Public(Op, name) \
  ft::Tensor ft::name(const Tensor& x) { return ops::unary(math::UnaryOp::Op, x); }
#define FT_UNARY_FUNCTION_Internal(Op, name)
#define FT_UNARY_FUNCTION(Op, name, domain, saves, api, ...) FT_UNARY_FUNCTION_##api(Op, name)
FT_UNARY_OPS(FT_UNARY_FUNCTION)
#undef FT_UNARY_FUNCTION
#undef FT_UNARY_FUNCTION_Internal
#undef FT_UNARY_FUNCTION_Public

#define FT_BINARY_FUNCTION_Comparison(Op, name) \
  ft::Tensor ft::name(const Tensor& a, const Tensor& b) { return binary_forward(math::BinaryOp::Op, a, b); }
#define FT_BINARY_FUNCTION_Arithmetic(Op, name)
#define FT_BINARY_FUNCTION(Op, name, kind, formula) FT_BINARY_FUNCTION_##kind(Op, name)
FT_BINARY_OPS(FT_BINARY_FUNCTION)
#undef FT_BINARY_FUNCTION
#undef FT_BINARY_FUNCTION_Arithmetic
#undef FT_BINARY_FUNCTION_Comparison
