# Sourced by the comparison scripts. OpenBLAS misdetects some AVX-512 VMs and falls back to its
# SSE3 kernels; fasttrain repairs that at start-up (src/backend/cpu/blas_setup.cpp). PyTorch uses
# the same OpenBLAS, so give it the same kernels for a fair comparison.
if [ -z "${OPENBLAS_CORETYPE:-}" ] && grep -q avx512f /proc/cpuinfo; then
  if grep -q avx512_bf16 /proc/cpuinfo; then export OPENBLAS_CORETYPE=Cooperlake; else export OPENBLAS_CORETYPE=SkylakeX; fi
fi
