// Compiled by the public_headers_standalone test with nothing but include/ on the include path and
// no -D flags: a program using the library must not need any dependency's headers (JSON, TOML,
// CLI, BLAS) or the library's compile definitions.
#include "fasttrain/fasttrain.h"

// A use of the umbrella's types and ops, so the check also covers what only a caller instantiates.
[[maybe_unused]] static ft::Tensor standalone_use(const ft::Tensor& x) { return ft::relu(ft::matmul(x, x)); }
