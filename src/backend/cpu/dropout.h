// CPU kernels for dropout. The keep mask comes straight from Philox-4x32-10: element i (row-major
// over the dense input) uses counter base + i/4, word i%4, and is kept iff
// uniform_from_word(word) < keep, the rule bernoulli_mask uses, so the mask is the same on any
// number of threads and on a GPU kernel that follows the same rule. Eight counter blocks are
// computed together in AVX2 registers (vpmuludq for the 32x32->64-bit Philox multiplies; a scalar
// fallback without AVX2); the keep test is an integer compare on the top 24 bits of each word,
// and the output is x * (mask * scale), branch-free.
#pragma once
#include <cstdint>

#include "backend/cpu/kernel_decls.h"
#include "fasttrain/random.h"
#include "fasttrain/tensor.h"

namespace ft::cpu {

// dropout_forward: x, y dense and of one floating dtype; mask dense u8. y = kept ? x * scale : 0; mask = kept.
// dropout_backward: dx = dy * mask * scale (all dense).

}  // namespace ft::cpu
