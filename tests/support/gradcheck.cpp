#include "support/gradcheck.h"

#include <cmath>
#include <sstream>

#include "fasttrain/autograd.h"
#include "fasttrain/ops.h"
#include "fasttrain/random.h"
#include "support/parity.h"

namespace ft::test {

std::string gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& fn, const std::vector<Tensor>& inputs,
                      GradcheckOptions opts) {
  for (const Tensor& t : inputs)
    if (t.defined() && t.requires_grad() && t.dtype() != DType::F64)
      return "gradcheck: inputs that require grad must be f64, found " + std::string(dtype_name(t.dtype()));
  Tensor out = fn(inputs);
  Generator gen(1234);
  Tensor v = randn(out.shape(), DType::F64, &gen);

  std::vector<Tensor> wrt;
  for (const Tensor& t : inputs)
    if (t.defined() && t.requires_grad()) wrt.push_back(t);
  if (wrt.empty()) return "gradcheck: no input requires grad";
  std::vector<Tensor> analytical = autograd::grad({out}, wrt, {v});

  auto objective = [&]() {
    autograd::NoGradGuard ng;
    Tensor o = fn(inputs);
    return sum(mul(o.to(DType::F64), v)).item<double>();
  };

  std::ostringstream report;
  double worst = 0;
  for (size_t w = 0; w < wrt.size(); ++w) {
    Tensor x = wrt[w];
    Tensor a = analytical[w].defined() ? analytical[w].to(DType::F64).contiguous() : zeros(x.shape(), DType::F64);
    std::vector<double> av = a.to_vector();
    // Perturb through a flat view of the (possibly strided) input's own memory.
    for (int64_t i = 0; i < x.numel(); ++i) {
      // logical index -> storage element
      int64_t rem = i, elem = x.offset();
      for (int d = x.dim() - 1; d >= 0; --d) {
        elem += (rem % x.size(d)) * x.stride(d);
        rem /= x.size(d);
      }
      double* p = static_cast<double*>(x.storage()->ptr()) + elem;
      double orig = *p;
      *p = orig + opts.eps;
      double fp = objective();
      *p = orig - opts.eps;
      double fm = objective();
      *p = orig;
      double numerical = (fp - fm) / (2 * opts.eps);
      double err = std::fabs(numerical - av[i]);
      double allowed = opts.atol + opts.rtol * std::fabs(numerical);
      if (!(err <= allowed) && err - allowed > worst) {
        worst = err - allowed;
        report.str("");
        report << "gradcheck: input " << w << " (shape " << x.shape().str() << "), element " << i << ": analytical "
               << av[i] << ", numerical " << numerical << ", |diff| " << err << " > allowed " << allowed;
      }
    }
  }
  return report.str();
}

std::string compare_with_reference(const std::function<Tensor(const std::vector<Tensor>&)>& fn,
                                   const std::function<Tensor(const std::vector<Tensor>&)>& reference,
                                   const std::vector<Tensor>& inputs, double atol, double rtol) {
  const Tolerance tol{atol, rtol};
  Tensor y = fn(inputs), y_ref = reference(inputs);
  std::string msg = compare(y, y_ref, tol);
  if (!msg.empty()) return "output: " + msg;
  std::vector<Tensor> wrt;
  std::vector<size_t> index;
  for (size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i].defined() && inputs[i].requires_grad()) {
      wrt.push_back(inputs[i]);
      index.push_back(i);
    }
  if (wrt.empty()) return "";
  Generator gen(4321);
  Tensor gout = randn(y.shape(), y.dtype(), &gen);
  std::vector<Tensor> g = autograd::grad({y}, wrt, {gout});
  std::vector<Tensor> g_ref = autograd::grad({y_ref}, wrt, {gout});
  for (size_t w = 0; w < wrt.size(); ++w) {
    // an input the function does not reach gets no gradient: compare as zeros
    Tensor a = g[w].defined() ? g[w] : zeros(wrt[w].shape(), wrt[w].dtype());
    Tensor e = g_ref[w].defined() ? g_ref[w] : zeros(wrt[w].shape(), wrt[w].dtype());
    msg = compare(a, e, tol);
    if (!msg.empty()) return "gradient of input " + std::to_string(index[w]) + ": " + msg;
  }
  return "";
}

}  // namespace ft::test
