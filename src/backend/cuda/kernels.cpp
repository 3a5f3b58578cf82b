// Fills the CUDA kernel table: one line per entry the backend provides (the function of the same
// name in ft::cuda, declared in kernels.h from the lists). What is not listed stays empty and
// raises "no cuda kernel for <name>" where an op asks for it.
#include "backend/cuda/kernels.h"

// clang-format off
#define FT_CUDA_PROVIDED(X)                                                                          \
  /* elementwise (elementwise.cu, copy.cu, random_fill.cu, dropout.cu) */                             \
  X(copy) X(fill) X(unary) X(unary_backward) X(binary) X(where) X(clamp) X(clamp_backward)            \
  X(add_inplace) X(random_fill) X(dropout_forward) X(dropout_backward)                                \
  X(silu_mul) X(silu_mul_backward)                                                                    \
  /* reductions and indexing (reduce.cu, indexing.cu) */                                              \
  X(sum) X(var) X(max_dim) X(max_all) X(max_dim_backward)                                             \
  X(cat) X(check_index_range) X(index_select) X(index_add) X(gather) X(scatter_add)                   \
  /* matrix products (matmul.cpp: cuBLASLt), with the MLP's GELU epilogues */                          \
  X(matmul) X(linear_weight_grad) X(linear_gelu) X(matmul_gelu_backward)                              \
  /* convolutions (conv.cpp: cuDNN) */                                                                \
  X(conv2d_forward) X(conv2d_backward_data) X(conv2d_backward_weight)                                 \
  /* BatchNorm (batch_norm.cu) and pooling (pool.cu) */                                               \
  X(batch_norm_stats) X(batch_norm_update) X(batch_norm_apply) X(batch_norm_backward)                \
  X(batch_norm_add_relu)                                                                              \
  X(max_pool2d_forward) X(max_pool2d_backward) X(avg_pool2d_forward) X(avg_pool2d_backward)           \
  X(adaptive_avg_pool2d_forward) X(adaptive_avg_pool2d_backward)                                      \
  /* norms, softmax, cross-entropy (norm.cu, softmax.cu, loss.cu); attention (attention*.cu) */       \
  X(row_norm_forward) X(row_norm_backward) X(softmax_forward) X(softmax_backward)                     \
  X(cross_entropy_forward) X(cross_entropy_backward) X(attention_forward) X(attention_backward)       \
  X(attention_document_bounds)                                                                        \
  /* rotary position embedding (rotary.cu) */                                                         \
  X(rotary_embedding)                                                                                 \
  /* FP8: quantizing and the scales' update (fp8.cu), products (fp8_matmul.cpp: cuBLASLt) */          \
  X(fp8_quantize) X(fp8_update_scales) X(fp8_matmul)                                                  \
  /* optimizers, clipping, loss scaling (optim.cu) */                                                 \
  X(sgd_step) X(adam_step) X(lamb_step) X(lars_step) X(clip_grad_norm) X(clip_grad_value)             \
  X(unscale_grads) X(update_loss_scale)
// clang-format on

namespace ft::cuda {

const backend::Kernels& cuda_kernels() {
  static const backend::Kernels table = [] {
    backend::Kernels k(DeviceType::CUDA);
#define FT_CUDA_ASSIGN(name) k.name = &cuda::name;
    FT_CUDA_PROVIDED(FT_CUDA_ASSIGN)
#undef FT_CUDA_ASSIGN
    return k;
  }();
  return table;
}

}  // namespace ft::cuda
