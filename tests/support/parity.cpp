#include "support/parity.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "fasttrain/autograd.h"
#include "fasttrain/npy.h"

#ifndef FT_PARITY_DIR
#error "FT_PARITY_DIR must be defined by the build"
#endif

namespace ft::test {

namespace fs = std::filesystem;

Tolerance default_tolerance(DType t) {
  switch (t) {
    case DType::F64: return {1e-10, 1e-8};
    case DType::F32: return {1e-5, 1e-4};
    case DType::BF16: return {1e-2, 2e-2};
    case DType::F16: return {1e-3, 2e-3};
    default: return {0, 0};
  }
}

std::string compare(const Tensor& actual, const Tensor& expected, Tolerance tol) {
  std::ostringstream os;
  if (actual.shape() != expected.shape()) {
    os << "shape " << actual.shape().str() << " != expected " << expected.shape().str();
    return os.str();
  }
  std::vector<double> a = actual.to_vector(), e = expected.to_vector();
  int64_t bad = 0, worst_i = -1;
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    double diff = std::fabs(a[i] - e[i]);
    bool ok = diff <= tol.atol + tol.rtol * std::fabs(e[i]) || (std::isnan(a[i]) && std::isnan(e[i])) ||
              (std::isinf(a[i]) && a[i] == e[i]);
    if (!ok) {
      ++bad;
      double excess = std::isnan(diff) ? INFINITY : diff - tol.rtol * std::fabs(e[i]);
      if (excess >= worst) {
        worst = excess;
        worst_i = static_cast<int64_t>(i);
      }
    }
  }
  if (bad == 0) return "";
  os << bad << " of " << a.size() << " elements differ (atol " << tol.atol << ", rtol " << tol.rtol
     << "); worst at flat index " << worst_i << ": got " << a[worst_i] << ", expected " << e[worst_i];
  return os.str();
}

namespace {

std::string parity_root() {
  const char* env = std::getenv("FT_PARITY_DIR");
  return env ? env : FT_PARITY_DIR;
}

// Empty when the references exist, else why they do not.
std::string missing_references(const std::string& root) {
  if (fs::exists(root + "/COMPLETE")) return "";
  return "parity references not generated (" + root +
         "): install python3-torch (apt-get install python3-torch) and rerun ctest";
}

}  // namespace

const ParityManifest& parity_manifest() {
  static const ParityManifest manifest = [] {
    ParityManifest m;
    const std::string root = parity_root();
    m.skip_reason = missing_references(root);
    if (!m.skip_reason.empty()) return m;
    std::ifstream f(root + "/manifest.json");
    FT_CHECK(f.good(), "parity: ", root, "/manifest.json is missing although the references are complete");
    m.cases = nlohmann::json::parse(f).at("cases");
    m.available = true;
    return m;
  }();
  return manifest;
}

std::vector<nlohmann::json> ParityManifest::op_cases(const std::string& family) const {
  std::vector<nlohmann::json> out;
  for (const auto& c : cases)
    if (c.at("family") == family && !c.at("op").is_null()) out.push_back(c);
  return out;
}

ParityCase::ParityCase(const std::string& name) {
  const std::string root = parity_root();
  dir_ = root + "/" + name;
  skip_reason_ = missing_references(root);
  if (!skip_reason_.empty()) return;
  if (!fs::exists(dir_ + "/meta.json")) {
    ADD_FAILURE() << "parity case '" << name << "' is missing from " << root << " (not defined in tests/parity/*.py?)";
    skip_reason_ = "missing case";
    return;
  }
  std::ifstream f(dir_ + "/meta.json");
  meta_ = nlohmann::json::parse(f);
  available_ = true;
}

DType ParityCase::dtype() const { return dtype_from_name(meta_.at("dtype").get<std::string>()); }

Tolerance ParityCase::tolerance() const {
  Tolerance t = default_tolerance(dtype());
  if (meta_.contains("atol")) t.atol = meta_["atol"].get<double>();
  if (meta_.contains("rtol")) t.rtol = meta_["rtol"].get<double>();
  return t;
}

Tensor ParityCase::load(const std::string& file, DType as) const {
  Tensor t = load_npy(dir_ + "/" + file + ".npy");
  return t.dtype() == as ? t : t.to(as);
}

bool ParityCase::has(const std::string& name) const { return meta_["inputs"].contains(name); }

Tensor ParityCase::input(const std::string& name, bool requires_grad) const {
  FT_CHECK(has(name), "parity case ", dir_, " has no input '", name, "'");
  const auto& spec = meta_["inputs"][name];
  DType dt = dtype_from_name(spec.at("dtype").get<std::string>());
  Tensor stored = load("in_" + name, dt);
  std::string layout = spec.value("layout", "contiguous");
  Tensor t;
  if (layout == "contiguous") {
    t = stored;
  } else if (layout == "transposed") {
    // stored holds the array with its dimensions reversed; reverse back as a view
    Dims order;
    for (int i = stored.dim() - 1; i >= 0; --i) order.push_back(i);
    t = stored.permute(order);
  } else if (layout == "strided") {
    // stored holds the array with every last-dim element doubled; take every other element
    t = stored.slice(-1, 0, stored.size(-1), 2);
  } else if (layout == "broadcast") {
    // stored holds one slice along dim 0; expand it to the full shape
    std::vector<int64_t> shape = spec.at("shape").get<std::vector<int64_t>>();
    t = stored.expand(Shape(shape));
  } else if (layout == "channels_last") {
    // stored holds NHWC data; view as NCHW with channels-last strides
    t = stored.permute({0, 3, 1, 2});
  } else {
    FT_FAIL("parity: unknown layout '", layout, "'");
  }
  if (requires_grad) t = t.detach().requires_grad_(true);
  return t;
}

void ParityCase::expect_output(const Tensor& actual, int index) const {
  expect_close(actual, "out" + std::to_string(index), "output " + std::to_string(index));
}

void ParityCase::expect_close(const Tensor& actual, const std::string& ref_name, const std::string& what) const {
  Tensor expected = load(ref_name, DType::F64);
  Tolerance tol = is_floating(actual.dtype()) ? tolerance() : Tolerance{0, 0};
  std::string msg = compare(actual, expected, tol);
  EXPECT_TRUE(msg.empty()) << dir_ << ": " << what << ": " << msg;
}

void ParityCase::backward(const std::vector<Tensor>& outputs) const {
  std::vector<Tensor> roots, grads;
  for (size_t i = 0; i < outputs.size(); ++i) {
    std::string name = "gout" + std::to_string(i);
    if (!fs::exists(dir_ + "/" + name + ".npy")) continue;
    roots.push_back(outputs[i]);
    grads.push_back(load(name, outputs[i].dtype()));
  }
  autograd::backward(roots, grads);
}

void ParityCase::expect_grad(const std::string& input_name, const Tensor& input) const {
  ASSERT_TRUE(input.grad().defined()) << dir_ << ": no gradient reached input '" << input_name << "'";
  expect_close(input.grad(), "grad_" + input_name, "gradient of " + input_name);
}

}  // namespace ft::test
