// Module::save / Module::load: the state dict as a safetensors file (loadable by PyTorch's
// safetensors.torch.load_file and back). Kept apart from module.cpp so programs that never save
// do not link the file I/O.
#include "fasttrain/nn.h"

namespace ft::nn {

void Module::save(const std::string& safetensors_path) const {
  save_safetensors(safetensors_path, state_dict(), {{"format", "pt"}});
}

void Module::load(const std::string& safetensors_path, bool strict) {
  SafetensorsFile f = load_safetensors(safetensors_path);
  try {
    load_state_dict(f.tensors, strict);
  } catch (const Error& e) {
    FT_FAIL(safetensors_path, ": ", e.what());
  }
}

}  // namespace ft::nn
