#include "fasttrain/autograd.h"

namespace ft::autograd {
namespace {
thread_local bool tls_grad_enabled = true;
thread_local bool tls_inference = false;
}  // namespace

bool grad_enabled() { return tls_grad_enabled; }
void set_grad_enabled(bool on) { tls_grad_enabled = on; }
bool inference_mode_enabled() { return tls_inference; }

InferenceMode::InferenceMode() : prev_grad_(tls_grad_enabled), prev_inference_(tls_inference) {
  tls_grad_enabled = false;
  tls_inference = true;
}
InferenceMode::~InferenceMode() {
  tls_grad_enabled = prev_grad_;
  tls_inference = prev_inference_;
}

}  // namespace ft::autograd
