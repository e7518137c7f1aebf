// demo-data: a synthetic robot dataset whose frames look like camera frames.
//
// Note [Synthetic frames]: decode cost and JPEG size depend on image content, so flat colours would
// make every loader benchmark lie. Each (episode, camera) gets a static scene rendered once — a
// plaster wall and a wooden table (value noise + ring/grain texture) under a lighting gradient —
// and every frame draws the moving parts on top: a 3-link robot arm with a gripper, boxes and
// balls with shading and shadows, all placed from the episode's state trajectory. A last pass adds
// per-pixel sensor noise. The wrist camera follows the end effector (zoomed, background shifts).
// 640x480 q90 frames come out around 40-90 KB, like real ones.
#include <fcntl.h>
#include <sys/stat.h>
#include <turbojpeg.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <thread>

#include "common/file_util.h"
#include "common/thread_pool.h"
#include "loongforge/logging.h"
#include "loongforge/metrics.h"
#include "loongforge/pack.h"
#include "loongforge/progress.h"

namespace loongforge::data {
namespace fs = std::filesystem;
namespace {

constexpr double kPi = 3.14159265358979323846;
constexpr double kStepSeconds = 0.1;  // 10 Hz control
constexpr int kMaxDemoThreads = 1024;
// Marks an episodes/ folder as written by demo-data, so that overwrite may replace it. A dotfile:
// pack ignores it.
constexpr char kDemoMarker[] = ".loongforge-demo-data";
constexpr char kDemoMarkerText[] =
    "written by loongforge demo-data; demo-data --overwrite may replace this folder\n";

uint64_t SplitMix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A small deterministic generator (xoshiro-like quality is not needed here).
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(SplitMix(seed)) {}
  uint64_t Next() { return s_ = SplitMix(s_); }
  double Uniform() { return static_cast<double>(Next() >> 11) * (1.0 / 9007199254740992.0); }
  double Uniform(double a, double b) { return a + (b - a) * Uniform(); }
  double Normal() {  // Box-Muller
    double u1 = std::max(Uniform(), 1e-12), u2 = Uniform();
    return std::sqrt(-2 * std::log(u1)) * std::cos(2 * kPi * u2);
  }
  int Int(int lo, int hi) {
    return lo + static_cast<int>(Next() % static_cast<uint64_t>(hi - lo + 1));
  }

 private:
  uint64_t s_;
};

uint64_t Mix(uint64_t a, uint64_t b) { return SplitMix(a * 0x100000001b3ull ^ SplitMix(b)); }

// ---- value noise ------------------------------------------------------------------------------

float Hash01(int x, int y, uint32_t seed) {
  uint32_t h = static_cast<uint32_t>(x) * 374761393u + static_cast<uint32_t>(y) * 668265263u +
               seed * 2246822519u;
  h = (h ^ (h >> 13)) * 1274126177u;
  h ^= h >> 16;
  return static_cast<float>(h & 0xffffff) * (1.0f / 16777215.0f);
}

float ValueNoise(float x, float y, uint32_t seed) {
  int xi = static_cast<int>(std::floor(x)), yi = static_cast<int>(std::floor(y));
  float fx = x - static_cast<float>(xi), fy = y - static_cast<float>(yi);
  fx = fx * fx * (3 - 2 * fx);
  fy = fy * fy * (3 - 2 * fy);
  float a = Hash01(xi, yi, seed), b = Hash01(xi + 1, yi, seed);
  float c = Hash01(xi, yi + 1, seed), d = Hash01(xi + 1, yi + 1, seed);
  return (a + (b - a) * fx) + ((c + (d - c) * fx) - (a + (b - a) * fx)) * fy;
}

float Fbm(float x, float y, uint32_t seed, int octaves) {
  float sum = 0, amp = 0.5f, norm = 0;
  for (int o = 0; o < octaves; ++o) {
    sum += amp * ValueNoise(x, y, seed + 101u * static_cast<uint32_t>(o));
    norm += amp;
    x *= 2.03f;
    y *= 2.03f;
    amp *= 0.5f;
  }
  return sum / norm;
}

uint8_t Clamp8(float v) { return static_cast<uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v + 0.5f)); }

// Gaussian sensor noise, sigma ~3 levels, read at a random offset per row (cheap per frame).
const std::vector<int8_t>& NoiseTable() {
  static const std::vector<int8_t> table = [] {
    std::vector<int8_t> t(size_t{1} << 20);
    Rng rng(12345);
    for (auto& v : t)
      v = static_cast<int8_t>(std::lround(std::clamp(rng.Normal() * 3.0, -12.0, 12.0)));
    return t;
  }();
  return table;
}

struct Rgb {
  float r, g, b;
};

// ---- episode trajectory -----------------------------------------------------------------------

struct Trajectory {
  int dims = 0;
  // state[d](t) = sum_k amp[d][k] * sin(2 pi freq[d][k] t + phase[d][k]) + offset[d]
  std::vector<std::array<double, 3>> amp, freq, phase;
  std::vector<double> offset;
  double Eval(int d, double t_s) const {
    double v = offset[d];
    for (int k = 0; k < 3; ++k) v += amp[d][k] * std::sin(2 * kPi * freq[d][k] * t_s + phase[d][k]);
    return v;
  }
};

Trajectory MakeTrajectory(int dims, Rng* rng) {
  Trajectory tr;
  tr.dims = dims;
  tr.amp.resize(dims);
  tr.freq.resize(dims);
  tr.phase.resize(dims);
  tr.offset.resize(dims);
  for (int d = 0; d < dims; ++d) {
    tr.offset[d] = rng->Uniform(-0.3, 0.3);
    for (int k = 0; k < 3; ++k) {
      tr.amp[d][k] = rng->Uniform(0.1, 0.6) / (k + 1);
      tr.freq[d][k] = rng->Uniform(0.03, 0.25) * (k + 1);
      tr.phase[d][k] = rng->Uniform(0, 2 * kPi);
    }
  }
  return tr;
}

const char* const kInstructions[] = {
    "pick up the red block and place it in the bowl",
    "push the blue box to the left edge of the table",
    "stack the green cube on top of the red cube",
    "open the drawer and put the ball inside",
    "move the yellow ball next to the blue box",
    "pick up the sponge and wipe the table",
    "grasp the handle and pull the cup towards you",
    "place the red block on the blue box",
    "roll the ball to the right side of the table",
    "put all the blocks into the tray",
};

// ---- scene ------------------------------------------------------------------------------------

struct View {
  float zoom = 1, rot = 0;         // applied around the focus point
  float focus_x = 0, focus_y = 0;  // world point shown at the image centre (wrist) or 0 = identity
  bool follow = false;             // wrist camera: focus follows the end effector
  bool mirror = false;
};

struct SceneStatic {
  int w = 0, h = 0, margin = 0;
  std::vector<uint8_t> background;  // (w + 2 margin) x (h + 2 margin) x 3
  std::vector<uint16_t> light;      // w x h, 256 = 1.0
  View view;
  Rgb box_color[2], ball_color[2], arm_color;
};

SceneStatic MakeScene(int w, int h, uint64_t seed, int camera) {
  SceneStatic s;
  s.w = w;
  s.h = h;
  s.margin = camera == 1 ? w / 6 : 4;
  Rng rng(Mix(seed, 7000 + static_cast<uint64_t>(camera)));
  const int bw = w + 2 * s.margin, bh = h + 2 * s.margin;
  s.background.resize(static_cast<size_t>(bw) * bh * 3);
  uint32_t nseed = static_cast<uint32_t>(rng.Next());
  float horizon = static_cast<float>(bh) * static_cast<float>(rng.Uniform(0.28, 0.42));
  Rgb wall{static_cast<float>(rng.Uniform(170, 215)), static_cast<float>(rng.Uniform(165, 205)),
           static_cast<float>(rng.Uniform(150, 195))};
  Rgb wood_light{static_cast<float>(rng.Uniform(175, 200)),
                 static_cast<float>(rng.Uniform(120, 140)),
                 static_cast<float>(rng.Uniform(75, 95))};
  Rgb wood_dark{wood_light.r * 0.62f, wood_light.g * 0.58f, wood_light.b * 0.55f};
  float ring_freq = static_cast<float>(rng.Uniform(6, 10));
  float ring_cx = static_cast<float>(rng.Uniform(-0.5, 1.5)),
        ring_cy = static_cast<float>(rng.Uniform(-2, -0.5));
  const float inv = 1.0f / static_cast<float>(h);
  for (int y = 0; y < bh; ++y) {
    uint8_t* row = &s.background[static_cast<size_t>(y) * bw * 3];
    for (int x = 0; x < bw; ++x) {
      float u = static_cast<float>(x) * inv, v = static_cast<float>(y) * inv;
      Rgb c;
      if (static_cast<float>(y) < horizon) {
        // Plaster wall: low-frequency blotches plus fine grain.
        float n = Fbm(u * 3, v * 3, nseed, 4) - 0.5f;
        float fine = ValueNoise(u * 90, v * 90, nseed + 7) - 0.5f;
        float k = 1 + 0.18f * n + 0.06f * fine;
        c = {wall.r * k, wall.g * k, wall.b * k};
        // A skirting board just above the table edge.
        if (static_cast<float>(y) > horizon - 0.025f * h) c = {c.r * 0.7f, c.g * 0.7f, c.b * 0.72f};
      } else {
        // Wooden table seen in perspective: rings plus grain along u.
        float depth = (static_cast<float>(y) - horizon) * inv + 0.15f;
        float tu = (u - 0.5f * bw * inv) / depth, tv = 1.0f / depth;
        float warp = Fbm(tu * 1.5f, tv * 0.8f, nseed + 3, 3);
        float r =
            std::sqrt((tu - ring_cx) * (tu - ring_cx) * 0.04f + (tv - ring_cy) * (tv - ring_cy)) *
                ring_freq +
            3.0f * warp;
        float ring = r - std::floor(r);
        ring = ring < 0.5f ? ring * 2 : 2 - ring * 2;
        ring = ring * ring * (3 - 2 * ring);
        float grain = ValueNoise(tu * 6, tv * 120, nseed + 11) - 0.5f;
        float k = 1 + 0.12f * grain;
        c = {(wood_light.r + (wood_dark.r - wood_light.r) * ring) * k,
             (wood_light.g + (wood_dark.g - wood_light.g) * ring) * k,
             (wood_light.b + (wood_dark.b - wood_light.b) * ring) * k};
        // Table edge shadow just below the horizon.
        float dy = (static_cast<float>(y) - horizon) * inv;
        if (dy < 0.02f)
          c = {c.r * (0.6f + 20 * dy), c.g * (0.6f + 20 * dy), c.b * (0.6f + 20 * dy)};
      }
      row[3 * x] = Clamp8(c.r);
      row[3 * x + 1] = Clamp8(c.g);
      row[3 * x + 2] = Clamp8(c.b);
    }
  }
  // Lighting: a soft spot from a lamp plus a linear falloff across the frame.
  s.light.resize(static_cast<size_t>(w) * h);
  float lx = static_cast<float>(rng.Uniform(0.2, 0.8)) * w,
        ly = static_cast<float>(rng.Uniform(0.0, 0.4)) * h;
  float gx = static_cast<float>(rng.Uniform(-0.25, 0.25)),
        gy = static_cast<float>(rng.Uniform(-0.25, 0.1));
  float spot = static_cast<float>(w) * 0.6f;
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      float dx = (static_cast<float>(x) - lx) / spot, dy = (static_cast<float>(y) - ly) / spot;
      float f = 0.72f + 0.45f * std::exp(-(dx * dx + dy * dy)) +
                gx * (static_cast<float>(x) / w - 0.5f) + gy * (static_cast<float>(y) / h - 0.5f);
      s.light[static_cast<size_t>(y) * w + x] =
          static_cast<uint16_t>(std::clamp(f, 0.3f, 1.4f) * 256);
    }
  switch (camera) {
    case 0:
      break;
    case 1:
      s.view.follow = true;
      s.view.zoom = 1.8f;
      break;
    case 2:
      s.view.mirror = true;
      s.view.rot = 0.08f;
      s.view.zoom = 0.9f;
      break;
    default:
      s.view.rot = static_cast<float>(rng.Uniform(-0.2, 0.2));
      s.view.zoom = static_cast<float>(rng.Uniform(0.8, 1.3));
      s.view.mirror = rng.Uniform() < 0.5;
  }
  // Object colours come from the episode seed only, so every camera sees the same objects.
  Rng orng(Mix(seed, 99));
  auto color = [&orng] {
    const Rgb palette[] = {
        {200, 40, 35}, {40, 70, 190}, {45, 160, 60}, {225, 190, 40}, {230, 120, 30}};
    Rgb c = palette[orng.Int(0, 4)];
    return Rgb{c.r * static_cast<float>(orng.Uniform(0.85, 1.1)),
               c.g * static_cast<float>(orng.Uniform(0.85, 1.1)),
               c.b * static_cast<float>(orng.Uniform(0.85, 1.1))};
  };
  for (auto& c : s.box_color) c = color();
  for (auto& c : s.ball_color) c = color();
  s.arm_color = {static_cast<float>(orng.Uniform(150, 200)),
                 static_cast<float>(orng.Uniform(150, 200)),
                 static_cast<float>(orng.Uniform(160, 210))};
  return s;
}

// World coordinates are pixels of the front view of a w x h frame.
struct Frame {
  uint8_t* px;
  int w, h;
  float cx, cy, zoom, cos_r, sin_r, mirror;  // world -> image transform around (cx, cy)
  void ToImage(float x, float y, float* ix, float* iy) const {
    float dx = (x - cx) * mirror, dy = y - cy;
    *ix = 0.5f * w + zoom * (cos_r * dx - sin_r * dy);
    *iy = 0.5f * h + zoom * (sin_r * dx + cos_r * dy);
  }
};

// Calls fn(x, y, px) for every pixel in the clamped bounding box.
template <typename Fn>
void ForBox(const Frame& f, float x0, float y0, float x1, float y1, Fn fn) {
  int ax = std::max(0, static_cast<int>(std::floor(x0))),
      ay = std::max(0, static_cast<int>(std::floor(y0)));
  int bx = std::min(f.w - 1, static_cast<int>(std::ceil(x1))),
      by = std::min(f.h - 1, static_cast<int>(std::ceil(y1)));
  for (int y = ay; y <= by; ++y) {
    uint8_t* row = f.px + static_cast<size_t>(y) * f.w * 3;
    for (int x = ax; x <= bx; ++x)
      fn(static_cast<float>(x) + 0.5f, static_cast<float>(y) + 0.5f, row + 3 * x);
  }
}

void Blend(uint8_t* p, Rgb c, float a) {
  p[0] = Clamp8(p[0] + (c.r - p[0]) * a);
  p[1] = Clamp8(p[1] + (c.g - p[1]) * a);
  p[2] = Clamp8(p[2] + (c.b - p[2]) * a);
}

// A cylinder-shaded capsule from (x0,y0) to (x1,y1), radius r (image pixels).
void Capsule(const Frame& f, float x0, float y0, float x1, float y1, float r, Rgb c) {
  float vx = x1 - x0, vy = y1 - y0, len2 = std::max(vx * vx + vy * vy, 1e-6f);
  ForBox(f, std::min(x0, x1) - r, std::min(y0, y1) - r, std::max(x0, x1) + r, std::max(y0, y1) + r,
         [&](float x, float y, uint8_t* p) {
           float t = std::clamp(((x - x0) * vx + (y - y0) * vy) / len2, 0.0f, 1.0f);
           float dx = x - (x0 + t * vx), dy = y - (y0 + t * vy);
           float d = std::sqrt(dx * dx + dy * dy) / r;
           if (d >= 1) return;
           // Light from the upper left: brighter on that side of the axis.
           float side = (dx * -0.6f + dy * -0.8f) / r;
           float k = 0.55f + 0.45f * std::sqrt(1 - d * d) + 0.25f * side;
           float a = std::min(1.0f, (1 - d) * r);  // anti-aliased rim
           Blend(p, {c.r * k, c.g * k, c.b * k}, a);
         });
}

void Ball(const Frame& f, float x0, float y0, float r, Rgb c) {
  ForBox(f, x0 - r, y0 - r, x0 + r, y0 + r, [&](float x, float y, uint8_t* p) {
    float dx = (x - x0) / r, dy = (y - y0) / r, d2 = dx * dx + dy * dy;
    if (d2 >= 1) return;
    float nz = std::sqrt(1 - d2);
    float diffuse = std::max(0.0f, -0.45f * dx - 0.55f * dy + 0.7f * nz);
    float spec = std::pow(std::max(0.0f, -0.35f * dx - 0.45f * dy + 0.82f * nz), 24.0f);
    float k = 0.3f + 0.8f * diffuse;
    Rgb s{c.r * k + 230 * spec, c.g * k + 230 * spec, c.b * k + 230 * spec};
    Blend(p, s, std::min(1.0f, (1 - std::sqrt(d2)) * r));
  });
}

// A soft elliptical shadow.
void Shadow(const Frame& f, float x0, float y0, float rx, float ry, float strength) {
  ForBox(f, x0 - rx, y0 - ry, x0 + rx, y0 + ry, [&](float x, float y, uint8_t* p) {
    float dx = (x - x0) / rx, dy = (y - y0) / ry, d2 = dx * dx + dy * dy;
    if (d2 >= 1) return;
    float k = 1 - strength * (1 - d2);
    p[0] = static_cast<uint8_t>(p[0] * k);
    p[1] = static_cast<uint8_t>(p[1] * k);
    p[2] = static_cast<uint8_t>(p[2] * k);
  });
}

// A box seen from above and in front: a rotated top face and a darker front face.
void Box(const Frame& f, float x0, float y0, float half, float angle, Rgb c) {
  float ca = std::cos(angle), sa = std::sin(angle), depth = half * 0.7f;
  float ext = half * 1.5f + depth;
  ForBox(f, x0 - ext, y0 - ext, x0 + ext, y0 + ext, [&](float x, float y, uint8_t* p) {
    float dx = x - x0, dy = y - y0;
    float u = ca * dx + sa * dy, v = (-sa * dx + ca * dy) * 1.6f;  // top face foreshortened
    if (std::fabs(u) < half && std::fabs(v) < half) {
      float k = 1.0f + 0.15f * (-u / half) * 0.5f;
      Blend(p, {c.r * k, c.g * k, c.b * k}, 1);
    } else if (std::fabs(u) < half && v >= half && v < half + depth * 1.6f) {
      Blend(p, {c.r * 0.62f, c.g * 0.62f, c.b * 0.62f}, 1);
    }
  });
}

struct EpisodePlan {
  int index = 0;
  std::string name;
  int steps = 0;
  std::string instruction;
  uint64_t seed = 0;
};

// Scene state from the noise-free trajectory at time t (seconds).
struct Pose {
  float joints[3];
  float grip;
  float ball[2][2];
  float box[2][3];
};

Pose PoseAt(const Trajectory& tr, double t_s, int w, int h) {
  auto s = [&](int i) { return static_cast<float>(tr.Eval(i % tr.dims, t_s)); };
  Pose p;
  p.joints[0] = static_cast<float>(-kPi / 2) + 0.55f * s(0);
  p.joints[1] = 0.9f * s(1) + 0.3f;
  p.joints[2] = 0.9f * s(2) - 0.2f;
  p.grip = 0.5f + 0.5f * std::tanh(2 * s(3));
  for (int b = 0; b < 2; ++b) {
    p.ball[b][0] = w * (0.5f + 0.32f * std::sin(1.3f * s(4 + 2 * b) + b * 2.1f));
    p.ball[b][1] = h * (0.72f + 0.12f * std::sin(1.1f * s(5 + 2 * b) + b));
    p.box[b][0] = w * (0.3f + 0.4f * b + 0.12f * std::sin(s(8 + b)));
    p.box[b][1] = h * (0.8f + 0.06f * std::cos(s(10 + b)));
    p.box[b][2] = 0.8f * s(12 + b);
  }
  return p;
}

void RenderFrame(const SceneStatic& sc, const Pose& pose, uint64_t frame_seed,
                 std::vector<uint8_t>* out) {
  const int w = sc.w, h = sc.h;
  out->resize(static_cast<size_t>(w) * h * 3);
  // Arm geometry in world coordinates.
  float base_x = 0.5f * w, base_y = 1.04f * h;
  float len[3] = {0.36f * h, 0.3f * h, 0.16f * h};
  float rad[3] = {0.045f * h, 0.036f * h, 0.026f * h};
  float jx[4] = {base_x}, jy[4] = {base_y}, ang = 0;
  for (int i = 0; i < 3; ++i) {
    ang += pose.joints[i];
    jx[i + 1] = jx[i] + len[i] * std::cos(ang);
    jy[i + 1] = jy[i] + len[i] * std::sin(ang);
  }
  Frame f{out->data(),
          w,
          h,
          0.5f * w,
          0.5f * h,
          sc.view.zoom,
          std::cos(sc.view.rot),
          std::sin(sc.view.rot),
          sc.view.mirror ? -1.0f : 1.0f};
  int off_x = sc.margin, off_y = sc.margin;
  if (sc.view.follow) {
    f.cx = jx[3];
    f.cy = jy[3] - 0.1f * h;
    // The background shifts with the wrist, within the margin rendered around the frame.
    off_x = std::clamp(static_cast<int>(sc.margin + (jx[3] - 0.5f * w) * 0.4f), 0, 2 * sc.margin);
    off_y = std::clamp(static_cast<int>(sc.margin + (jy[3] - 0.5f * h) * 0.4f), 0, 2 * sc.margin);
  }
  const int bw = w + 2 * sc.margin;
  for (int y = 0; y < h; ++y)
    std::memcpy(out->data() + static_cast<size_t>(y) * w * 3,
                sc.background.data() + (static_cast<size_t>(y + off_y) * bw + off_x) * 3,
                static_cast<size_t>(w) * 3);
  const float z = f.zoom;
  float ix, iy, ix2, iy2;
  // Shadows, then boxes and balls, then the arm (nearest to the camera) on top.
  for (int b = 0; b < 2; ++b) {
    f.ToImage(pose.ball[b][0], pose.ball[b][1] + 0.04f * h, &ix, &iy);
    Shadow(f, ix + 6 * z, iy, 0.05f * h * z, 0.02f * h * z, 0.45f);
    f.ToImage(pose.box[b][0], pose.box[b][1] + 0.05f * h, &ix, &iy);
    Shadow(f, ix + 8 * z, iy, 0.09f * h * z, 0.03f * h * z, 0.4f);
  }
  for (int b = 0; b < 2; ++b) {
    f.ToImage(pose.box[b][0], pose.box[b][1], &ix, &iy);
    Box(f, ix, iy, 0.06f * h * z, pose.box[b][2] + sc.view.rot, sc.box_color[b]);
  }
  for (int b = 0; b < 2; ++b) {
    f.ToImage(pose.ball[b][0], pose.ball[b][1], &ix, &iy);
    Ball(f, ix, iy, 0.04f * h * z, sc.ball_color[b]);
  }
  for (int i = 0; i < 3; ++i) {
    f.ToImage(jx[i], jy[i], &ix, &iy);
    f.ToImage(jx[i + 1], jy[i + 1], &ix2, &iy2);
    Capsule(f, ix, iy, ix2, iy2, rad[i] * z, sc.arm_color);
    Ball(f, ix, iy, rad[i] * 1.1f * z, {70, 70, 80});
  }
  // Gripper fingers at the end effector, opening with pose.grip.
  float dir = ang, open = (0.015f + 0.035f * pose.grip) * h;
  for (int side = -1; side <= 1; side += 2) {
    float bx = jx[3] + side * open * -std::sin(dir), by = jy[3] + side * open * std::cos(dir);
    float tx = bx + 0.07f * h * std::cos(dir), ty = by + 0.07f * h * std::sin(dir);
    f.ToImage(bx, by, &ix, &iy);
    f.ToImage(tx, ty, &ix2, &iy2);
    Capsule(f, ix, iy, ix2, iy2, 0.012f * h * z, {60, 60, 66});
  }
  // Lighting and sensor noise in one pass.
  const auto& noise = NoiseTable();
  Rng rng(frame_seed);
  for (int y = 0; y < h; ++y) {
    uint8_t* row = out->data() + static_cast<size_t>(y) * w * 3;
    const uint16_t* lrow = sc.light.data() + static_cast<size_t>(y) * w;
    const int8_t* nrow = noise.data() + rng.Next() % (noise.size() - static_cast<size_t>(w) * 3);
    for (int x = 0; x < w; ++x) {
      int l = lrow[x];
      for (int c = 0; c < 3; ++c) {
        int v = ((row[3 * x + c] * l) >> 8) + nrow[3 * x + c];
        row[3 * x + c] = static_cast<uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
      }
    }
  }
}

std::string FormatFloat(float v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.9g", static_cast<double>(v));
  return buf;
}

struct TjCompressor {
  tjhandle h = tjInitCompress();
  ~TjCompressor() {
    if (h) tjDestroy(h);
  }
};

// Writes a new file in the staging directory (Note [Outputs are created, never followed]: the
// directory is this run's own, and O_EXCL | O_NOFOLLOW still refuses anything found there).
Status WriteFile(const fs::path& path, const void* data, size_t n) {
  LF_ASSIGN_OR_RETURN(int fd, loongforge::internal::OpenNewFile(path.string()));
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) {
      Status s = ErrnoToStatus(errno, "write " + path.string());
      ::close(fd);
      return s;
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  if (::close(fd) != 0) return ErrnoToStatus(errno, "close " + path.string());
  return Status::Ok();
}

// Renders, encodes and writes one episode. `frames_done` feeds the progress bar.
Status WriteEpisode(const DemoDataOptions& o, const std::vector<std::string>& cams,
                    const EpisodePlan& ep, const fs::path& dir, ProgressBar* bar,
                    std::atomic<int64_t>* jpeg_bytes, const std::atomic<bool>* cancel) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return ErrnoToStatus(ec.value(), "create " + dir.string());
  Rng rng(Mix(ep.seed, 1));
  Trajectory state_tr = MakeTrajectory(o.state_dim, &rng);
  Trajectory extra_tr =
      MakeTrajectory(std::max(1, o.action_dim), &rng);  // for action dims > state dims
  // steps.jsonl
  std::string jsonl;
  for (int t = 0; t < ep.steps; ++t) {
    double ts = t * kStepSeconds;
    jsonl += "{\"step\": " + std::to_string(t) + ", \"state\": [";
    for (int d = 0; d < o.state_dim; ++d) {
      float v = static_cast<float>(state_tr.Eval(d, ts) + 0.005 * rng.Normal());
      jsonl += (d ? ", " : "") + FormatFloat(v);
    }
    jsonl += "], \"action\": [";
    for (int d = 0; d < o.action_dim; ++d) {
      double a;
      if (d < o.state_dim) {  // velocity towards the next state: next-state delta / dt
        a = (state_tr.Eval(d, ts + kStepSeconds) - state_tr.Eval(d, ts)) / kStepSeconds;
      } else {
        a = extra_tr.Eval(d, ts);
      }
      jsonl += (d ? ", " : "") + FormatFloat(static_cast<float>(a + 0.01 * rng.Normal()));
    }
    jsonl += "], \"instruction\": \"" + ep.instruction + "\"}\n";
  }
  LF_RETURN_IF_ERROR(WriteFile(dir / "steps.jsonl", jsonl.data(), jsonl.size()));
  // Frames.
  TjCompressor tj;
  if (!tj.h) return InternalError(std::string("tjInitCompress: ") + tjGetErrorStr());
  unsigned long cap = tjBufSize(o.width, o.height, TJSAMP_420);
  std::unique_ptr<unsigned char, void (*)(unsigned char*)> jbuf(tjAlloc(static_cast<int>(cap)),
                                                                tjFree);
  std::vector<uint8_t> rgb;
  for (size_t c = 0; c < cams.size(); ++c) {
    fs::path cdir = dir / ("cam_" + cams[c]);
    fs::create_directories(cdir, ec);
    if (ec) return ErrnoToStatus(ec.value(), "create " + cdir.string());
    SceneStatic scene = MakeScene(o.width, o.height, ep.seed, static_cast<int>(c));
    for (int t = 0; t < ep.steps; ++t) {
      if (cancel->load()) return CancelledError("cancelled");
      Pose pose = PoseAt(state_tr, t * kStepSeconds, o.width, o.height);
      RenderFrame(scene, pose, Mix(ep.seed, 1000003ull * (c + 1) + static_cast<uint64_t>(t)), &rgb);
      unsigned char* dst = jbuf.get();
      unsigned long size = cap;
      if (tjCompress2(tj.h, rgb.data(), o.width, 0, o.height, TJPF_RGB, &dst, &size, TJSAMP_420,
                      o.quality, TJFLAG_NOREALLOC) != 0)
        return InternalError("encode frame " + std::to_string(t) + ": " + tjGetErrorStr2(tj.h));
      LF_RETURN_IF_ERROR(WriteFile(cdir / (std::to_string(t) + ".jpg"), dst, size));
      jpeg_bytes->fetch_add(static_cast<int64_t>(size));
      bar->Add(1);
    }
  }
  return Status::Ok();
}

// Ok if demo-data may write `final_dir`: it does not exist, or overwrite is set and it is an
// episodes folder demo-data wrote (it has the marker file). AlreadyExists naming it otherwise.
Status CheckDemoOutput(const fs::path& final_dir, bool overwrite) {
  struct stat st;
  if (::lstat(final_dir.c_str(), &st) != 0) {
    if (errno == ENOENT) return Status::Ok();
    return ErrnoToStatus(errno, "stat " + final_dir.string());
  }
  if (!overwrite)
    return AlreadyExistsError(final_dir.string() +
                              " already exists (use --overwrite / overwrite=True to replace "
                              "demo data)");
  const fs::path marker = final_dir / kDemoMarker;
  struct stat ms;
  if (!S_ISDIR(st.st_mode) || ::lstat(marker.c_str(), &ms) != 0 || !S_ISREG(ms.st_mode))
    return AlreadyExistsError(final_dir.string() + " exists and was not written by demo-data (no " +
                              kDemoMarker +
                              " in it); overwrite replaces only demo data, never recorded "
                              "episodes: choose another --out or move it yourself");
  return Status::Ok();
}

// Renames `staging` to `final_dir`; with overwrite, swaps out the old demo data (checked again)
// and removes it.
Status PublishDemo(const fs::path& staging, const fs::path& final_dir, bool overwrite) {
  LF_RETURN_IF_ERROR(CheckDemoOutput(final_dir, overwrite));
  std::error_code ec;
  int rc = ::renameat2(AT_FDCWD, staging.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_NOREPLACE);
  if (rc != 0 && (errno == EINVAL || errno == ENOSYS)) {
    // A filesystem without renameat2 flags: check, then rename (or move the old demo data aside).
    struct stat st;
    if (::lstat(final_dir.c_str(), &st) == 0) {
      if (!overwrite) return AlreadyExistsError(final_dir.string() + " appeared meanwhile");
      std::string aside = final_dir.string() + ".old.XXXXXX";
      if (!::mkdtemp(aside.data())) return ErrnoToStatus(errno, "create " + aside);
      if (::rename(final_dir.c_str(), aside.c_str()) != 0)
        return ErrnoToStatus(errno, "rename " + final_dir.string() + " to " + aside);
      fs::remove_all(aside, ec);
    }
    rc = ::rename(staging.c_str(), final_dir.c_str());
  }
  if (rc == 0) return loongforge::internal::SyncDir(final_dir.parent_path().string());
  if (errno == EEXIST && overwrite) {
    // The old folder is demo data (checked above): exchange, then remove it from its new name.
    if (::renameat2(AT_FDCWD, staging.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) != 0)
      return ErrnoToStatus(errno, "exchange " + staging.string() + " and " + final_dir.string());
    fs::remove_all(staging, ec);
    if (ec) LF_LOG(WARNING) << "the replaced demo data " << staging << " was not removed";
    return loongforge::internal::SyncDir(final_dir.parent_path().string());
  }
  if (errno == EEXIST)
    return AlreadyExistsError(final_dir.string() + " appeared while demo data was written");
  return ErrnoToStatus(errno, "rename " + staging.string() + " to " + final_dir.string());
}

}  // namespace

std::vector<std::string> DefaultCameraNames(int k) {
  static const char* const kNames[] = {"front", "wrist", "side", "top"};
  std::vector<std::string> names;
  for (int i = 0; i < k; ++i) names.push_back(i < 4 ? kNames[i] : "cam" + std::to_string(i));
  return names;
}

std::vector<uint8_t> RenderDemoFrame(int width, int height, uint64_t seed, int episode, int camera,
                                     double t) {
  uint64_t ep_seed = Mix(seed, static_cast<uint64_t>(episode));
  Rng rng(Mix(ep_seed, 1));
  Trajectory tr = MakeTrajectory(14, &rng);
  SceneStatic scene = MakeScene(width, height, ep_seed, camera);
  std::vector<uint8_t> rgb;
  RenderFrame(scene, PoseAt(tr, t * 6.0, width, height),
              Mix(ep_seed, static_cast<uint64_t>(t * 1e6)), &rgb);
  return rgb;
}

StatusOr<DemoDataResult> GenerateDemoData(const DemoDataOptions& o) {
  if (o.out_dir.empty()) return InvalidArgumentError("demo-data: --out is required");
  if (o.episodes < 1) return InvalidArgumentError("demo-data: episodes must be >= 1");
  if (o.cameras < 1) return InvalidArgumentError("demo-data: cameras must be >= 1");
  if (o.width < 16 || o.height < 16 || o.width > 8192 || o.height > 8192)
    return InvalidArgumentError("demo-data: image size must be within 16..8192 per side");
  if (o.steps_min < 1 || o.steps_max < o.steps_min)
    return InvalidArgumentError("demo-data: need 1 <= steps-min <= steps-max");
  if (o.state_dim < 1 || o.action_dim < 1)
    return InvalidArgumentError("demo-data: dims must be >= 1");
  if (o.quality < 1 || o.quality > 100)
    return InvalidArgumentError("demo-data: quality must be in 1..100");
  if (o.threads < 0 || o.threads > kMaxDemoThreads)
    return InvalidArgumentError("demo-data: threads must be in 0.." +
                                std::to_string(kMaxDemoThreads) + " (0 = all cores), got " +
                                std::to_string(o.threads));
  std::vector<std::string> cams =
      o.camera_names.empty() ? DefaultCameraNames(o.cameras) : o.camera_names;
  if (static_cast<int>(cams.size()) != o.cameras)
    return InvalidArgumentError("demo-data: " + std::to_string(cams.size()) + " camera names for " +
                                std::to_string(o.cameras) + " cameras");
  for (const auto& c : cams) {
    bool ok = !c.empty() && std::all_of(c.begin(), c.end(), [](unsigned char ch) {
      return std::isalnum(ch) || ch == '_' || ch == '-';
    });
    if (!ok)
      return InvalidArgumentError("demo-data: camera name '" + c + "' must be [A-Za-z0-9_-]+");
    // Two cameras of one name would write into one folder: half the frames claimed.
    if (std::count(cams.begin(), cams.end(), c) > 1)
      return InvalidArgumentError("demo-data: camera name '" + c + "' is given twice");
  }
  const double start = NowSeconds();
  const fs::path root(o.out_dir), final_dir = root / "episodes",
                                  staging_prefix = root / "episodes.partial.";
  std::error_code ec;
  LF_RETURN_IF_ERROR(CheckDemoOutput(final_dir, o.overwrite));
  fs::create_directories(root, ec);
  if (ec) return ErrnoToStatus(ec.value(), "create " + root.string());
  std::string templ = staging_prefix.string() + "XXXXXX";
  if (!::mkdtemp(templ.data()))
    return ErrnoToStatus(errno, "create a staging directory in " + root.string());
  const fs::path staging(templ);
  ::chmod(staging.c_str(), 0755);  // mkdtemp makes it 0700
  // Removes the staging directory on every early return below (it is this run's own).
  struct StagingGuard {
    fs::path dir;
    ~StagingGuard() {
      std::error_code e;
      if (!dir.empty()) fs::remove_all(dir, e);
    }
  } guard{staging};

  std::vector<EpisodePlan> plan(o.episodes);
  int64_t total_steps = 0;
  for (int e = 0; e < o.episodes; ++e) {
    EpisodePlan& p = plan[e];
    p.index = e;
    char name[32];
    std::snprintf(name, sizeof(name), "%06d", e);
    p.name = name;
    p.seed = Mix(o.seed, static_cast<uint64_t>(e));
    Rng rng(p.seed);
    p.steps = rng.Int(o.steps_min, o.steps_max);
    p.instruction = kInstructions[rng.Next() % (sizeof(kInstructions) / sizeof(kInstructions[0]))];
    total_steps += p.steps;
  }
  int threads = o.threads > 0 ? o.threads
                              : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  threads = std::min(threads, o.episodes);
  std::atomic<int64_t> jpeg_bytes{0};
  std::atomic<bool> cancel{false};
  std::vector<Status> results(o.episodes);
  {
    ProgressBar bar("demo-data", total_steps * o.cameras, o.progress);
    ThreadPool pool(threads, "demo-data");
    for (int e = 0; e < o.episodes; ++e) {
      Status s = pool.Submit([&, e] {
        results[e] =
            WriteEpisode(o, cams, plan[e], staging / plan[e].name, &bar, &jpeg_bytes, &cancel);
        if (!results[e].ok()) cancel.store(true);
      });
      if (!s.ok()) {
        results[e] = s;
        break;
      }
    }
    pool.Shutdown();
  }
  for (const Status& s : results)
    if (!s.ok() && s.code() != StatusCode::kCancelled) return s;
  LF_RETURN_IF_ERROR(
      WriteFile(staging / kDemoMarker, kDemoMarkerText, std::strlen(kDemoMarkerText)));
  // One filesystem sync for all the frames, then publish by rename.
  int fd = ::open(staging.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    ::syncfs(fd);
    ::close(fd);
  }
  LF_RETURN_IF_ERROR(PublishDemo(staging, final_dir, o.overwrite));
  guard.dir.clear();
  DemoDataResult r;
  r.episodes = o.episodes;
  r.steps = total_steps;
  r.frames = total_steps * o.cameras;
  r.jpeg_bytes = jpeg_bytes.load();
  r.seconds = NowSeconds() - start;
  return r;
}

}  // namespace loongforge::data
