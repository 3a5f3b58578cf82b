// ResNets as one torch.nn.Sequential, in the layout of shared/peer/torch_bench.py's resnet50:
// stem, residual blocks, global average pool, flatten, linear. A block is
//   relu(body(x) + short(x)),  short = 1x1 conv (stride s) + BatchNorm when the stride or the
//   channel count changes, identity (no parameters) otherwise,
// with bias-free convolutions before every BatchNorm and PyTorch's default layer initialisation.
// Bottleneck bodies put the stride on the 3x3 conv (ResNet v1.5, as torchvision). CIFAR ResNets
// (He et al. 2016, section 4.2) use the same projection shortcut (option B) where shapes change,
// which adds 2,752 parameters to the zero-padding option A's counts (resnet20: 272,474).
#include <map>

#include "fasttrain/models.h"
#include "fasttrain/nn.h"

namespace ft::nn {
namespace {

class ResidualBlock : public CheckpointableBlock {
 public:
  ResidualBlock(std::string type, std::shared_ptr<Sequential> body, std::shared_ptr<Sequential> shortcut)
      : type_(std::move(type)) {
    body_ = register_module("body", std::move(body));
    if (shortcut) short_ = register_module("short", std::move(shortcut));
  }
  Tensor block_forward(const Tensor& x) override {
    // The body's last BatchNorm, the add and the ReLU run as one op (batch_norm_add_relu).
    return body_->forward_add_relu(x, short_ ? (*short_)(x) : x);
  }
  std::string type_name() const override { return type_; }

 private:
  std::string type_;
  std::shared_ptr<Sequential> body_, short_;
};

struct Builder {
  Generator* gen;
  ModulePtr conv(int64_t i, int64_t o, int64_t k, int64_t s) const {
    return std::make_shared<Conv2d>(i, o, k, s, k / 2, false, 1, 1, gen);
  }
  static ModulePtr bn(int64_t c) { return std::make_shared<BatchNorm2d>(c); }
  static ModulePtr relu() { return std::make_shared<ReLU>(); }
  std::shared_ptr<Sequential> shortcut(int64_t i, int64_t o, int64_t s) const {
    if (s == 1 && i == o) return nullptr;
    return std::make_shared<Sequential>(std::vector<ModulePtr>{conv(i, o, 1, s), bn(o)});
  }
  ModulePtr basic(int64_t i, int64_t o, int64_t s) const {
    auto body =
        std::make_shared<Sequential>(std::vector<ModulePtr>{conv(i, o, 3, s), bn(o), relu(), conv(o, o, 3, 1), bn(o)});
    return std::make_shared<ResidualBlock>("BasicBlock", body, shortcut(i, o, s));
  }
  ModulePtr bottleneck(int64_t i, int64_t mid, int64_t o, int64_t s) const {
    auto body = std::make_shared<Sequential>(std::vector<ModulePtr>{
        conv(i, mid, 1, 1), bn(mid), relu(), conv(mid, mid, 3, s), bn(mid), relu(), conv(mid, o, 1, 1), bn(o)});
    return std::make_shared<ResidualBlock>("Bottleneck", body, shortcut(i, o, s));
  }
};

struct ResNetSpec {
  bool cifar;
  bool bottleneck;
  std::vector<int64_t> blocks;  // per stage
};

const std::map<std::string, ResNetSpec>& specs() {
  static const std::map<std::string, ResNetSpec> s{
      {"resnet18", {false, false, {2, 2, 2, 2}}},  {"resnet34", {false, false, {3, 4, 6, 3}}},
      {"resnet50", {false, true, {3, 4, 6, 3}}},   {"resnet101", {false, true, {3, 4, 23, 3}}},
      {"resnet152", {false, true, {3, 8, 36, 3}}}, {"resnet20", {true, false, {3, 3, 3}}},
      {"resnet32", {true, false, {5, 5, 5}}},      {"resnet44", {true, false, {7, 7, 7}}},
      {"resnet56", {true, false, {9, 9, 9}}},      {"resnet110", {true, false, {18, 18, 18}}}};
  return s;
}

}  // namespace

std::shared_ptr<UnaryModule> resnet(const std::string& name, int64_t classes, Generator* gen) {
  auto it = specs().find(name);
  if (it == specs().end()) {
    std::string known;
    for (auto& [n, _] : specs()) known += (known.empty() ? "" : ", ") + n;
    FT_FAIL("resnet: unknown model \"", name, "\"; known: ", known);
  }
  FT_CHECK(classes > 0, "resnet: classes must be positive, found ", classes);
  const ResNetSpec& spec = it->second;
  Builder b{gen};
  auto net = std::make_shared<Sequential>();
  int64_t c;
  if (spec.cifar) {  // 3x3 stem, stages of 16/32/64 channels
    c = 16;
    net->push_back(b.conv(3, c, 3, 1));
    net->push_back(b.bn(c));
    net->push_back(b.relu());
  } else {  // 7x7/2 stem and 3x3/2 max pool, stages of 64/128/256/512 (x4 in bottlenecks)
    c = 64;
    net->push_back(b.conv(3, c, 7, 2));
    net->push_back(b.bn(c));
    net->push_back(b.relu());
    net->push_back(std::make_shared<MaxPool2d>(3, 2, 1));
  }
  int64_t width = c;
  for (size_t stage = 0; stage < spec.blocks.size(); ++stage, width *= 2) {
    for (int64_t k = 0; k < spec.blocks[stage]; ++k) {
      const int64_t stride = (stage > 0 && k == 0) ? 2 : 1;
      if (spec.bottleneck) {
        net->push_back(b.bottleneck(c, width, width * 4, stride));
        c = width * 4;
      } else {
        net->push_back(b.basic(c, width, stride));
        c = width;
      }
    }
  }
  net->push_back(std::make_shared<AdaptiveAvgPool2d>(1));
  net->push_back(std::make_shared<Flatten>());
  net->push_back(std::make_shared<Linear>(c, classes, true, gen));
  return net;
}

}  // namespace ft::nn
