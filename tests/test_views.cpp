// View ops and dtype conversions against PyTorch, and their gradients.
#include <gtest/gtest.h>

#include "fasttrain/fasttrain.h"
#include "support/gradcheck.h"
#include "support/parity.h"

using namespace ft;

namespace {

Tensor apply_view(const std::string& name, const Tensor& x) {
  if (name == "reshape") return x.reshape({6, -1});
  if (name == "transpose") return x.transpose(0, 2);
  if (name == "permute") return x.permute({2, 0, 1});
  if (name == "slice_step") return x.slice(1, 1, 3).slice(2, 0, 4, 2);
  if (name == "narrow") return x.narrow(2, 1, 3);
  if (name == "select") return x.select(1, -1);
  if (name == "expand") return x.slice(1, 0, 1).expand({5, 2, 3, 4});
  if (name == "unsqueeze_squeeze") return x.unsqueeze(1).squeeze(1).unsqueeze(-1);
  if (name == "flatten") return x.flatten(1);
  if (name == "contiguous") return x.contiguous();
  FT_FAIL("unknown view ", name);
}

const char* kViews[] = {"reshape", "transpose", "permute",           "slice_step", "narrow",
                        "select",  "expand",    "unsqueeze_squeeze", "flatten",    "contiguous"};

}  // namespace

TEST(ViewParity, ValuesAndGradients) {
  for (const char* dt : {"f32", "f64", "bf16"}) {
    for (const char* v : kViews) {
      for (const char* suffix : {"", "_transposed"}) {
        std::string name = std::string("view_") + v + "_" + dt + suffix;
        SCOPED_TRACE(name);
        FT_PARITY_CASE(c, name);
        Tensor x = c.input("x", true);
        Tensor y = apply_view(v, x);
        c.expect_output(y);
        c.backward({y});
        c.expect_grad("x", x);
      }
    }
  }
}

TEST(ViewGradcheck, EveryViewOp) {
  Generator g(5);
  for (const char* v : kViews) {
    SCOPED_TRACE(v);
    std::string name = v;
    Tensor x = randn({4, 3, 2}, DType::F64, &g).permute({2, 1, 0}).detach().requires_grad_();  // [2,3,4], strided
    EXPECT_GRADCHECK([name](const std::vector<Tensor>& in) { return apply_view(name, in[0]); }, {x});
  }
}

TEST(ConversionParity, RoundingMatchesPyTorchExactly) {
  for (const char* target : {"bf16", "f16"}) {
    std::string name = std::string("cast_f32_to_") + target;
    SCOPED_TRACE(name);
    FT_PARITY_CASE(c, name);
    Tensor y = c.input("x").to(dtype_from_name(target)).to(DType::F32);
    c.expect_output(y);
  }
  FT_PARITY_CASE(c, "cast_f32_to_i32");
  c.expect_output(c.input("x").to(DType::I32));
}
