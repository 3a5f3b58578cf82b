// Generators and the random fills: each fill reserves its counter blocks from the generator and
// runs the random_fill entry of the tensor's device, whose values backend/random_math.h defines
// (Philox-4x32-10 and the distributions), so a seed gives the same tensor on every device.
#include "fasttrain/random.h"

#include "backend/kernels.h"
#include "backend/random_math.h"
#include "fasttrain/autograd.h"
#include "fasttrain/cuda_graph.h"

namespace ft {

void Generator::manual_seed(uint64_t seed) {
  std::lock_guard<std::mutex> lock(mu_);
  state_ = {seed, 0};
}
GeneratorState Generator::state() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_;
}
void Generator::set_state(GeneratorState s) {
  std::lock_guard<std::mutex> lock(mu_);
  state_ = s;
}
uint64_t Generator::seed() const { return state().seed; }
uint64_t Generator::reserve(uint64_t blocks) {
  // Outside a capture every draw comes through here. Inside one, device draws go through draw()
  // instead; what is left is a draw for the CPU, which runs once, at the capture, and never in a
  // replay.
  refuse_in_graph_capture("random numbers drawn for the CPU",
                          "the generator's counter is a host value a replay would repeat");
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t base = state_.offset;
  state_.offset += blocks;
  return base;
}

PhiloxDraw Generator::draw(uint64_t blocks, Device device) {
  if (CudaGraph* graph = capturing_graph(); graph != nullptr && device.is_cuda()) {
    const auto [base, device_base] = graph->random_counters(*this, blocks);
    return PhiloxDraw{seed(), base, device_base};
  }
  return PhiloxDraw{seed(), reserve(blocks), nullptr};
}

Generator& default_generator() {
  static Generator gen(0);
  return gen;
}
void manual_seed(uint64_t seed) { default_generator().manual_seed(seed); }

Philox4 philox4x32(uint64_t key, uint64_t ctr_lo, uint64_t ctr_hi) {
  const random_math::PhiloxBlock w = random_math::philox4x32(key, ctr_lo, ctr_hi);
  return Philox4{{w.v[0], w.v[1], w.v[2], w.v[3]}};
}

namespace {

using random_math::RandomDistribution;
using random_math::RandomFill;

// Fills a contiguous tensor: element i comes from counter block base + i/4 of the generator.
void fill_counter_based(const Tensor& t, Generator* gen, RandomFill fill) {
  FT_CHECK(t.is_contiguous(), "random fill: expected a contiguous tensor");
  const backend::Kernels& kernels = backend::kernels(t);
  // Before reserving counters: a device that cannot fill leaves the generator as it was.
  if (!kernels.random_fill.has_value()) backend::missing_kernel(t.device().type, kernels.random_fill.name());
  Generator& g = gen ? *gen : default_generator();
  const PhiloxDraw d = g.draw((t.numel() + 3) / 4, t.device());
  fill.key = d.key;
  fill.base = d.base;
  fill.device_base = d.device_base;
  kernels.random_fill(t, fill);
}

RandomFill with(RandomDistribution d) {
  RandomFill f;
  f.distribution = d;
  return f;
}

Tensor finish(Tensor t, const TensorOptions& opts) {
  if (opts.requires_grad) t.requires_grad_(true);
  return t;
}

}  // namespace

Tensor rand(const Shape& shape, TensorOptions opts, Generator* gen) {
  Tensor t = empty(shape, opts.with_requires_grad(false));
  fill_counter_based(t, gen, with(RandomDistribution::Uniform01));
  return finish(t, opts);
}

Tensor randn(const Shape& shape, TensorOptions opts, Generator* gen) {
  Tensor t = empty(shape, opts.with_requires_grad(false));
  fill_counter_based(t, gen, with(RandomDistribution::StandardNormal));
  return finish(t, opts);
}

Tensor randint(int64_t low, int64_t high, const Shape& shape, TensorOptions opts, Generator* gen) {
  FT_CHECK(high > low, "randint: expected low < high, found low ", low, ", high ", high);
  uint64_t range = static_cast<uint64_t>(high - low);
  FT_CHECK(range <= (1ull << 32), "randint: range ", range, " exceeds 2^32");
  Tensor t = empty(shape, opts.with_requires_grad(false));
  RandomFill f = with(RandomDistribution::RandInt);
  f.int_low = low;
  f.int_range = range;
  fill_counter_based(t, gen, f);
  return t;
}

Tensor rand_like(const Tensor& t, Generator* gen) { return rand(t.shape(), t.options(), gen); }
Tensor randn_like(const Tensor& t, Generator* gen) { return randn(t.shape(), t.options(), gen); }

static void fill_into(Tensor& t, const Tensor& values) {
  autograd::NoGradGuard ng;
  t.copy_(values);
}

Tensor& uniform_(Tensor& t, double low, double high, Generator* gen) {
  // Drawn in f64 and converted by the copy, so every dtype and layout gets the same values.
  Tensor v = empty(t.shape(), TensorOptions(DType::F64, t.device()));
  RandomFill f = with(RandomDistribution::Uniform);
  f.low = low;
  f.high = high;
  fill_counter_based(v, gen, f);
  fill_into(t, v);
  return t;
}

Tensor& normal_(Tensor& t, double mean, double std, Generator* gen) {
  Tensor v = empty(t.shape(), TensorOptions(DType::F64, t.device()));
  RandomFill f = with(RandomDistribution::Normal);
  f.mean = mean;
  f.std = std;
  fill_counter_based(v, gen, f);
  fill_into(t, v);
  return t;
}

Tensor bernoulli_mask(const Shape& shape, double keep_prob, TensorOptions opts, Generator* gen) {
  Tensor t = empty(shape, opts.with_requires_grad(false));
  RandomFill f = with(RandomDistribution::Bernoulli);
  f.p = keep_prob;
  fill_counter_based(t, gen, f);
  return t;
}

}  // namespace ft
