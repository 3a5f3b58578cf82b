// Procedural shapes images (data.h): each image is drawn from its own Philox counters, so image i
// is the same whatever the thread count, and the whole set is built in parallel.
#include <cmath>

#include "fasttrain/data.h"
#include "fasttrain/parallel.h"
#include "fasttrain/random.h"

namespace ft::data {

namespace {

// Philox counters reserved per image for its shape parameters; the pixel noise uses a separate
// key so parameter draws and noise never share words.
constexpr uint64_t kParamBlocks = 4;
constexpr uint64_t kNoiseKeySalt = 0xD1B54A32D192ED03ull;

// Whether point (u, v), in the shape's own frame scaled so the shape's radius is 1, is inside.
bool inside(int64_t cls, double u, double v) {
  const double r2 = u * u + v * v, au = std::fabs(u), av = std::fabs(v);
  switch (cls) {
    case 0: return r2 <= 1.0;               // disk
    case 1: return au <= 0.8 && av <= 0.8;  // square
    case 2: {                               // triangle, apex up
      // Equilateral triangle inscribed in the unit circle: three half-planes.
      const double s = 0.8660254037844386;  // sqrt(3)/2
      return v >= -0.5 && (s * u - 0.5 * v) <= 0.5 && (-s * u - 0.5 * v) <= 0.5;
    }
    case 3: return (au <= 0.28 && av <= 1.0) || (av <= 0.28 && au <= 1.0);  // cross
    case 4: return r2 <= 1.0 && r2 >= 0.36;                                 // ring
    default: {                                                              // frame (hollow square)
      const double m = std::max(au, av);
      return m <= 0.85 && m >= 0.5;
    }
  }
}

}  // namespace

const std::vector<std::string>& shape_class_names() {
  static const std::vector<std::string> names = {"disk", "square", "triangle", "cross", "ring", "frame"};
  return names;
}

ImageSet make_shapes(int64_t n, uint64_t seed, const ShapesOptions& o) {
  const int64_t max_classes = static_cast<int64_t>(shape_class_names().size());
  FT_CHECK(n >= 1, "make_shapes: expected at least one image, found ", n);
  FT_CHECK(o.classes >= 2 && o.classes <= max_classes, "make_shapes: expected 2 to ", max_classes, " classes, found ",
           o.classes);
  FT_CHECK(o.image_size >= 8 && o.image_size <= 512, "make_shapes: expected an image size in [8, 512], found ",
           o.image_size);
  FT_CHECK(o.noise >= 0 && o.noise <= 1, "make_shapes: expected noise in [0, 1], found ", o.noise);
  const int64_t S = o.image_size, plane = S * S;
  ImageSet set{empty({n, 3, S, S}), empty({n}, DType::I64)};
  float* img = set.images.data<float>();
  int64_t* lab = set.labels.data<int64_t>();
  parallel_for(0, n, 16, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      float w[4 * kParamBlocks];
      for (uint64_t k = 0; k < kParamBlocks; ++k) {
        Philox4 p = philox4x32(seed, static_cast<uint64_t>(i) * kParamBlocks + k);
        for (int j = 0; j < 4; ++j) w[4 * k + j] = uniform_from_word(p.v[j]);
      }
      const int64_t cls = std::min<int64_t>(static_cast<int64_t>(w[0] * o.classes), o.classes - 1);
      const double radius = S * (0.2 + 0.2 * w[1]);
      const double cx = radius + w[2] * (S - 2 * radius), cy = radius + w[3] * (S - 2 * radius);
      const double angle = w[4] * 2 * M_PI, ca = std::cos(angle), sa = std::sin(angle);
      // Foreground and background colours from opposite halves of [0, 1] per channel (which
      // half is foreground is random), so the shape always stands out.
      const bool light_shape = w[5] < 0.5f;
      float fg[3], bg[3];
      for (int c = 0; c < 3; ++c) {
        float hi = 0.6f + 0.4f * w[6 + c], lo = 0.4f * w[9 + c];
        fg[c] = light_shape ? hi : lo;
        bg[c] = light_shape ? lo : hi;
      }
      lab[i] = cls;
      float* out = img + i * 3 * plane;
      const uint64_t noise_key = seed ^ kNoiseKeySalt;
      for (int64_t y = 0; y < S; ++y)
        for (int64_t x = 0; x < S; ++x) {
          const double dx = (x + 0.5 - cx) / radius, dy = (y + 0.5 - cy) / radius;
          const bool in = inside(cls, ca * dx + sa * dy, -sa * dx + ca * dy);
          // Box-Muller: words 0-1 give channels 0 and 1, words 2-3 channel 2. 1 - u lies in
          // (0, 1], so the logarithm is finite and never positive.
          Philox4 p = philox4x32(noise_key, static_cast<uint64_t>(i * plane + y * S + x));
          const double r0 = std::sqrt(-2.0 * std::log(1.0 - uniform_from_word(p.v[0])));
          const double t0 = 2 * M_PI * uniform_from_word(p.v[1]);
          const double r1 = std::sqrt(-2.0 * std::log(1.0 - uniform_from_word(p.v[2])));
          const double g[3] = {r0 * std::cos(t0), r0 * std::sin(t0),
                               r1 * std::cos(2 * M_PI * uniform_from_word(p.v[3]))};
          for (int c = 0; c < 3; ++c) {
            const double value = (in ? fg[c] : bg[c]) + o.noise * g[c];
            out[c * plane + y * S + x] = static_cast<float>(2.0 * value - 1.0);
          }
        }
    }
  });
  return set;
}

}  // namespace ft::data
