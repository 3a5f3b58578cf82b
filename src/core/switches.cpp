// The list of the process switches (switches.h), for `fasttrain switches` and its tests.
#include "core/switches.h"

namespace ft {

std::vector<SwitchInfo> process_switches() {
  using namespace switches;
  std::vector<SwitchInfo> list = {cpu_isa.info(),
                                  f32_gemm.info(),
                                  half_gemm.info(),
                                  conv_algo.info(),
                                  conv_weight_grad.info(),
                                  fused_add_norm.info(),
                                  cuda_bgradb.info(),
                                  cuda_norm_backward.info(),
                                  cuda_gelu_epilogue.info(),
                                  cuda_attention_fma.info(),
                                  cuda_attention.info(),
                                  cuda_expandable_segments.info(),
                                  dist_staging.info()};
  // Not a choice but a specification of faults to inject, read before main(); listed so that every
  // variable the library reads for itself is in one list.
  const char* fault = std::getenv("FASTTRAIN_FAULT");
  list.push_back({"FASTTRAIN_FAULT",
                  FT_FAULT_INJECTION ? "faults to inject, for the fault tests (core/fault_injection.h)"
                                     : "faults to inject: not built in (FASTTRAIN_FAULT_INJECTION=OFF)",
                  "<action>@<point>[:<n>], comma-separated", fault != nullptr ? fault : ""});
  return list;
}

}  // namespace ft
