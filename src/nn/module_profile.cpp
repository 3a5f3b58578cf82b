// Modules under the profiler: UnaryModule::operator() opens a ModuleScope (a span, and the path
// the memory history attributes allocations to) while profiling, and name_modules registers the
// dotted paths of a model's modules so that scope can name them.
#include "core/profiler_context.h"
#include "fasttrain/nn.h"

namespace ft::nn {

Tensor UnaryModule::profiled_forward(const Tensor& x) {
  return call_as_this([&] { return forward(x); });
}

Tensor UnaryModule::call_as_this(const std::function<Tensor()>& f) {
  if (!profiler::active()) return f();
  std::optional<std::string> path = profiler::detail::module_path(this);
  profiler::detail::ModuleScope scope(path ? std::move(*path) : type_name());
  return f();
}

}  // namespace ft::nn

namespace ft::profiler {

void name_modules(nn::Module& root) {
  // The root is "(model)", so its own work is told apart from work outside any module ("").
  for (const auto& [name, module] : root.named_modules())
    detail::set_module_path(module.get(), name.empty() ? "(model)" : name);
}

void forget_module_names() { detail::clear_module_paths(); }

}  // namespace ft::profiler
