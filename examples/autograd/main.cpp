// Fits a line y = a*x + b to points by gradient descent: tensors, autograd and a no-grad update.
#include <cstdio>

#include "fasttrain/fasttrain.h"

int main() {
  ft::manual_seed(0);
  ft::Tensor x = ft::randn({64, 1});
  ft::Tensor y = 3.0 * x + 0.5;  // the line to recover
  ft::Tensor a = ft::zeros({1}), b = ft::zeros({1});
  a.requires_grad_();
  b.requires_grad_();
  for (int step = 0; step <= 100; ++step) {
    ft::Tensor loss = ft::mean(ft::square(a * x + b - y));
    loss.backward();  // a.grad() = d loss / d a, b.grad() = d loss / d b
    if (step % 25 == 0)
      std::printf("step %3d  loss %9.6f  dloss/da %+8.4f  dloss/db %+8.4f\n", step, loss.item<float>(),
                  a.grad().item<float>(), b.grad().item<float>());
    ft::autograd::NoGradGuard no_grad;  // the update is not recorded
    ft::add_(a, a.grad(), -0.1);
    ft::add_(b, b.grad(), -0.1);
    ft::zero_grad({a, b});
  }
  std::printf("fitted y = %.3f * x + %.3f\n", a.item<float>(), b.item<float>());
}
