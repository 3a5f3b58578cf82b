// The small benchmark models of shared/BENCH.md, built exactly as peer/torch_bench.py builds them
// (same layers in the same torch.nn.Sequential nesting, so state-dict names match: "0.0.weight").
#include "fasttrain/models.h"
#include "fasttrain/nn.h"

namespace ft::nn {

std::shared_ptr<Sequential> mlp(const std::vector<int64_t>& sizes, Generator* gen) {
  FT_CHECK(sizes.size() >= 2, "mlp: expected at least 2 sizes (input and output), found ", sizes.size());
  auto net = std::make_shared<Sequential>();
  for (size_t i = 0; i + 1 < sizes.size(); ++i) {
    net->push_back(std::make_shared<Linear>(sizes[i], sizes[i + 1], true, gen));
    if (i + 2 < sizes.size()) net->push_back(std::make_shared<ReLU>());
  }
  return net;
}

std::shared_ptr<Sequential> cnn_mini(int64_t in_channels, int64_t classes, Generator* gen) {
  FT_CHECK(in_channels > 0 && classes > 0, "cnn_mini: in_channels and classes must be positive, found ", in_channels,
           " and ", classes);
  auto conv_bn_relu = [gen](int64_t i, int64_t o, int64_t s) {
    return std::make_shared<Sequential>(
        std::vector<ModulePtr>{std::make_shared<Conv2d>(i, o, 3, s, 1, false, 1, 1, gen),
                               std::make_shared<BatchNorm2d>(o), std::make_shared<ReLU>()});
  };
  auto net = std::make_shared<Sequential>();
  struct Stage {
    int64_t out, stride;
  };
  int64_t c = in_channels;
  for (Stage s : {Stage{32, 1}, {32, 1}, {64, 2}, {64, 1}, {128, 2}, {128, 1}}) {
    net->push_back(conv_bn_relu(c, s.out, s.stride));
    c = s.out;
  }
  net->push_back(std::make_shared<AdaptiveAvgPool2d>(1));
  net->push_back(std::make_shared<Flatten>());
  net->push_back(std::make_shared<Linear>(c, classes, true, gen));
  return net;
}

}  // namespace ft::nn
