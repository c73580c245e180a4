#include "nn/winograd.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

namespace latent::layers {

namespace {

// Channels handled together in the transforms: one 64-byte cache line of float32.
constexpr int64_t kChannelBlock = 16;
// Transformed input and products of one band of tile rows stay about this size, so they live in the
// last-level cache instead of costing 4x the activation in memory.
constexpr int64_t kBandBytes = 16 << 20;
// Below this width (of input and output) oneDNN's direct convolution is as fast or faster: the products are too
// thin to repay the transforms (the crossover measured per width is in docs/performance.md).
constexpr int64_t kMinChannels = 64;

struct Geometry {
  int64_t ci, co, tp, t, h, w, nh, nw;
  int64_t nl = 0;  // of the tp input frames, the first nl come from `left`, the rest from x
};

// Input frame tp of channel c of one batch element: from the carried frames or from the chunk.
inline const float* frame_plane(const float* x, const float* left, const Geometry& g, int64_t c, int64_t tp) {
  const int64_t hw = g.h * g.w;
  if (tp < g.nl) return left + (c * g.nl + tp) * hw;
  return x + (c * (g.tp - g.nl) + tp - g.nl) * hw;
}

// The transforms only add and subtract; what costs is moving data between the channel-major activations and
// the channel-minor matrices of the products. Both are built from loops over a block of 16 contiguous channels,
// compiled twice (AVX2 and baseline) and picked at load time, since the library itself targets baseline x86-64.
#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
#define LATENT_MULTIVERSION __attribute__((target_clones("avx2", "default")))
#else
#define LATENT_MULTIVERSION
#endif

inline void store_channels(float* dst, const float* src, int64_t n) {
  if (n == kChannelBlock)
    std::memcpy(dst, src, kChannelBlock * sizeof(float));
  else
    std::memcpy(dst, src, n * sizeof(float));
}

inline void load_channels(float* dst, const float* src, int64_t n) {
  if (n == kChannelBlock) {
    std::memcpy(dst, src, kChannelBlock * sizeof(float));
  } else {
    std::memcpy(dst, src, n * sizeof(float));
    std::fill(dst + n, dst + kChannelBlock, 0.f);
  }
}

// V[ab][tp][tile][ci] for the tile rows [i0, i0 + nb) of one batch element: left [Ci][nl][H][W] then
// x [Ci][Tp - nl][H][W]. Tile (i, j) covers input rows 2i-1 .. 2i+2 and columns 2j-1 .. 2j+2; what lies outside
// the image is the zero padding.
LATENT_MULTIVERSION
void transform_input_rows(const float* x, const float* left, const Geometry& g, int64_t i0, int64_t nb, float* v,
                          int64_t task_begin, int64_t task_end) {
  constexpr int64_t B = kChannelBlock;
  const int64_t wp = 2 * g.nw + 2;  // one padded row: input columns -1 .. 2*nw
  const int64_t tiles = nb * g.nw;
  const int64_t ab_stride = g.tp * tiles * g.ci;
  std::vector<float> q(4 * wp * B, 0.f);  // q[a][column][channel]: (B^T d) rows, channels innermost
  std::vector<float> zero_row(g.w, 0.f);
  for (int64_t task = task_begin; task < task_end; ++task) {
    const int64_t tp = task / nb, il = task % nb, i = i0 + il;
    for (int64_t c0 = 0; c0 < g.ci; c0 += B) {
      const int64_t cn = std::min(B, g.ci - c0);
      for (int64_t cl = 0; cl < cn; ++cl) {
        const float* plane = frame_plane(x, left, g, c0 + cl, tp);
        const float* r[4];
        for (int k = 0; k < 4; ++k) {
          const int64_t y = 2 * i - 1 + k;
          r[k] = (y >= 0 && y < g.h) ? plane + y * g.w : zero_row.data();
        }
        float* q0 = q.data() + B + cl;  // column 0 is the left padding
        float* q1 = q0 + wp * B;
        float* q2 = q1 + wp * B;
        float* q3 = q2 + wp * B;
        for (int64_t c = 0; c < g.w; ++c) {
          q0[c * B] = r[0][c] - r[2][c];
          q1[c * B] = r[1][c] + r[2][c];
          q2[c * B] = r[2][c] - r[1][c];
          q3[c * B] = r[1][c] - r[3][c];
        }
      }
      for (int64_t j = 0; j < g.nw; ++j) {
        float* dst = v + ((tp * tiles) + il * g.nw + j) * g.ci + c0;
        for (int a = 0; a < 4; ++a) {
          const float* s0 = q.data() + (a * wp + 2 * j) * B;
          const float* s1 = s0 + B;
          const float* s2 = s1 + B;
          const float* s3 = s2 + B;
          // A whole block of q is always there (unused channels are stale but never stored), so the arithmetic
          // runs over a fixed 16 lanes and vectorises; only the stores are cut to the real channels.
          float o[4][B];
          for (int64_t cl = 0; cl < B; ++cl) {
            o[0][cl] = s0[cl] - s2[cl];
            o[1][cl] = s1[cl] + s2[cl];
            o[2][cl] = s2[cl] - s1[cl];
            o[3][cl] = s1[cl] - s3[cl];
          }
          for (int b = 0; b < 4; ++b) store_channels(dst + (a * 4 + b) * ab_stride, o[b], cn);
        }
      }
    }
  }
}

void transform_input(const float* x, const float* left, const Geometry& g, int64_t i0, int64_t nb, float* v) {
  at::parallel_for(0, g.tp * nb, 1,
                   [&](int64_t begin, int64_t end) { transform_input_rows(x, left, g, i0, nb, v, begin, end); });
}

// y [Co][T][H][W] of one batch element from M[ab][t][tile][co] of the tile rows [i0, i0 + nb): A^T M A + bias.
LATENT_MULTIVERSION
void transform_output_rows(const float* m, const float* bias, const Geometry& g, int64_t i0, int64_t nb, float* y,
                           int64_t task_begin, int64_t task_end) {
  constexpr int64_t B = kChannelBlock;
  const int64_t tiles = nb * g.nw;
  const int64_t ab_stride = g.t * tiles * g.co;
  const int64_t wb = 2 * g.nw;
  std::vector<float> rows(B * 2 * wb);  // rows[channel][0 or 1][column]: two output rows per channel
  for (int64_t task = task_begin; task < task_end; ++task) {
    const int64_t t = task / nb, il = task % nb, i = i0 + il;
    const bool second_row = 2 * i + 1 < g.h;
    for (int64_t c0 = 0; c0 < g.co; c0 += B) {
      const int64_t cn = std::min(B, g.co - c0);
      for (int64_t j = 0; j < g.nw; ++j) {
        const float* e = m + ((t * tiles) + il * g.nw + j) * g.co + c0;
        // Gathered into fixed 16-lane blocks (zeros past the last channel) so the arithmetic vectorises.
        float in[16][B];
        for (int ab = 0; ab < 16; ++ab) load_channels(in[ab], e + ab * ab_stride, cn);
        float s0[4][B], s1[4][B], out[4][B];
        for (int b = 0; b < 4; ++b)
          for (int64_t cl = 0; cl < B; ++cl) {
            s0[b][cl] = in[b][cl] + in[4 + b][cl] + in[8 + b][cl];
            s1[b][cl] = in[4 + b][cl] - in[8 + b][cl] - in[12 + b][cl];
          }
        for (int64_t cl = 0; cl < B; ++cl) {
          out[0][cl] = s0[0][cl] + s0[1][cl] + s0[2][cl];
          out[1][cl] = s0[1][cl] - s0[2][cl] - s0[3][cl];
          out[2][cl] = s1[0][cl] + s1[1][cl] + s1[2][cl];
          out[3][cl] = s1[1][cl] - s1[2][cl] - s1[3][cl];
        }
        for (int64_t cl = 0; cl < cn; ++cl) {
          float* r = rows.data() + cl * 2 * wb + 2 * j;
          r[0] = out[0][cl];
          r[1] = out[1][cl];
          r[wb] = out[2][cl];
          r[wb + 1] = out[3][cl];
        }
      }
      for (int64_t cl = 0; cl < cn; ++cl) {
        const float add = bias ? bias[c0 + cl] : 0.f;
        const float* r = rows.data() + cl * 2 * wb;
        float* dst = y + (((c0 + cl) * g.t + t) * g.h + 2 * i) * g.w;
        for (int64_t c = 0; c < g.w; ++c) dst[c] = r[c] + add;
        if (second_row)
          for (int64_t c = 0; c < g.w; ++c) dst[g.w + c] = r[wb + c] + add;
      }
    }
  }
}

void transform_output(const float* m, const float* bias, const Geometry& g, int64_t i0, int64_t nb, float* y) {
  at::parallel_for(0, g.t * nb, 1,
                   [&](int64_t begin, int64_t end) { transform_output_rows(m, bias, g, i0, nb, y, begin, end); });
}

// Per-thread buffers for the transformed band, kept between calls: fresh 16 MB allocations are fresh pages
// from the kernel, and zeroing them cost as much as the transforms. Raw memory wrapped per call, not a kept
// Tensor: one made under InferenceMode could not be written outside it, and the other way round.
torch::Tensor scratch(int which, int64_t numel) {
  struct Buffer {
    std::unique_ptr<float, decltype(&std::free)> data{nullptr, &std::free};
    int64_t capacity = 0;
  };
  thread_local Buffer buffers[2];
  Buffer& b = buffers[which];
  if (b.capacity < numel) {
    const size_t bytes = (size_t(numel) * sizeof(float) + 63) / 64 * 64;
    b.data.reset(static_cast<float*>(std::aligned_alloc(64, bytes)));
    if (!b.data) throw std::bad_alloc();
    b.capacity = numel;
  }
  return torch::from_blob(b.data.get(), {numel}, torch::kFloat);
}

}  // namespace

ConvAlgorithm parse_conv_algorithm(std::string_view s) {
  if (s.empty() || s == "auto") return ConvAlgorithm::automatic;
  if (s == "winograd") return ConvAlgorithm::winograd;
  if (s == "direct") return ConvAlgorithm::direct;
  throw std::invalid_argument("LATENT_CPU_CONV must be auto, winograd or direct, not '" + std::string(s) + "'");
}

ConvAlgorithm cpu_conv_algorithm() {
  static const ConvAlgorithm algorithm = [] {
    const char* v = std::getenv("LATENT_CPU_CONV");
    return parse_conv_algorithm(v ? v : "");
  }();
  return algorithm;
}

bool winograd_preferred(const Tensor& w) {
  if (!w.defined() || !w.device().is_cpu() || w.scalar_type() != torch::kFloat) return false;
  if ((w.dim() != 5 && w.dim() != 4) || w.size(-1) != 3 || w.size(-2) != 3) return false;
  switch (cpu_conv_algorithm()) {
    case ConvAlgorithm::direct: return false;
    case ConvAlgorithm::winograd: return true;
    case ConvAlgorithm::automatic: return w.size(0) >= kMinChannels && w.size(1) >= kMinChannels;
  }
  return false;
}

Tensor winograd_weights(const Tensor& w_in) {
  TORCH_CHECK((w_in.dim() == 5 || w_in.dim() == 4) && w_in.size(-1) == 3 && w_in.size(-2) == 3 &&
                  w_in.scalar_type() == torch::kFloat && w_in.device().is_cpu(),
              "winograd_weights: a float32 CPU [Co, Ci, kT, 3, 3] kernel is needed, got ", w_in.sizes());
  const Tensor w = w_in.dim() == 4 ? w_in.unsqueeze(2) : w_in;
  const int64_t co_n = w.size(0), ci_n = w.size(1), kt = w.size(2);
  Tensor wc = w.contiguous();
  Tensor u = torch::empty({kt, 16, ci_n, co_n}, w.options());
  const float* src = wc.data_ptr<float>();
  float* dst = u.data_ptr<float>();
  // U = G g G^T with G = [[1, 0, 0], [1/2, 1/2, 1/2], [1/2, -1/2, 1/2], [0, 0, 1]].
  at::parallel_for(0, kt * ci_n, 1, [&](int64_t begin, int64_t end) {
    for (int64_t kc = begin; kc < end; ++kc) {
      const int64_t k = kc / ci_n, ci = kc % ci_n;
      for (int64_t co = 0; co < co_n; ++co) {
        const float* g = src + ((co * ci_n + ci) * kt + k) * 9;
        float r[4][3];
        for (int c = 0; c < 3; ++c) {
          r[0][c] = g[c];
          r[1][c] = 0.5f * (g[c] + g[3 + c] + g[6 + c]);
          r[2][c] = 0.5f * (g[c] - g[3 + c] + g[6 + c]);
          r[3][c] = g[6 + c];
        }
        for (int a = 0; a < 4; ++a) {
          const float row[4] = {r[a][0], 0.5f * (r[a][0] + r[a][1] + r[a][2]), 0.5f * (r[a][0] - r[a][1] + r[a][2]),
                                r[a][2]};
          for (int b = 0; b < 4; ++b) dst[((k * 16 + a * 4 + b) * ci_n + ci) * co_n + co] = row[b];
        }
      }
    }
  });
  return u;
}

Tensor winograd_conv3d(const Tensor& x_in, const Tensor& u, const Tensor& b, const Tensor& left_in) {
  TORCH_CHECK(x_in.device().is_cpu() && x_in.scalar_type() == torch::kFloat,
              "winograd_conv3d: float32 CPU input needed, got ", x_in.scalar_type(), " on ", x_in.device());
  TORCH_CHECK(x_in.dim() == 5 && u.dim() == 4 && u.size(1) == 16 && x_in.size(1) == u.size(2),
              "winograd_conv3d: input ", x_in.sizes(), " does not match transformed weights ", u.sizes());
  const bool has_left = left_in.defined();
  if (has_left) {
    TORCH_CHECK(left_in.device().is_cpu() && left_in.scalar_type() == torch::kFloat && left_in.dim() == 5 &&
                    left_in.size(0) == x_in.size(0) && left_in.size(1) == x_in.size(1) &&
                    left_in.size(3) == x_in.size(3) && left_in.size(4) == x_in.size(4),
                "winograd_conv3d: carried frames ", left_in.sizes(), " do not fit the input ", x_in.sizes());
  }
  const int64_t nl = has_left ? left_in.size(2) : 0;
  const int64_t kt = u.size(0);
  TORCH_CHECK(nl + x_in.size(2) >= kt, "winograd_conv3d: ", nl + x_in.size(2), " frames for a kernel of ", kt);
  Tensor x = x_in.contiguous();
  Tensor left = has_left ? left_in.contiguous() : Tensor();
  Geometry g;
  g.ci = x.size(1);
  g.co = u.size(3);
  g.nl = nl;
  g.tp = nl + x.size(2);
  g.t = g.tp - kt + 1;
  g.h = x.size(3);
  g.w = x.size(4);
  g.nh = (g.h + 1) / 2;
  g.nw = (g.w + 1) / 2;
  const int64_t batch = x.size(0);
  Tensor y = torch::empty({batch, g.co, g.t, g.h, g.w}, x.options());
  if (y.numel() == 0) return y;
  Tensor bias = b.defined() ? b.contiguous() : Tensor();

  const int64_t row_bytes = 16 * g.nw * (g.tp * g.ci + g.t * g.co) * int64_t(sizeof(float));
  const int64_t band = std::clamp<int64_t>(kBandBytes / std::max<int64_t>(row_bytes, 1), 1, g.nh);
  Tensor vbuf = scratch(0, 16 * g.tp * band * g.nw * g.ci);
  Tensor mbuf = scratch(1, 16 * g.t * band * g.nw * g.co);
  for (int64_t n = 0; n < batch; ++n) {
    const float* xs = x.data_ptr<float>() + n * g.ci * (g.tp - g.nl) * g.h * g.w;
    const float* ls = has_left ? left.data_ptr<float>() + n * g.ci * g.nl * g.h * g.w : nullptr;
    float* ys = y.data_ptr<float>() + n * g.co * g.t * g.h * g.w;
    for (int64_t i0 = 0; i0 < g.nh; i0 += band) {
      const int64_t nb = std::min(band, g.nh - i0), tiles = nb * g.nw;
      Tensor v = vbuf.narrow(0, 0, 16 * g.tp * tiles * g.ci).view({16, g.tp, tiles, g.ci});
      Tensor m = mbuf.narrow(0, 0, 16 * g.t * tiles * g.co).view({16, g.t * tiles, g.co});
      transform_input(xs, ls, g, i0, nb, v.data_ptr<float>());
      // Output frame t takes input frames t .. t+kT-1: one batched product per time tap, accumulated.
      for (int64_t k = 0; k < kt; ++k) {
        Tensor a = v.narrow(1, k, g.t).reshape({16, g.t * tiles, g.ci});
        if (k == 0)
          at::bmm_out(m, a, u[k]);
        else
          m.baddbmm_(a, u[k]);
      }
      transform_output(m.data_ptr<float>(), bias.defined() ? bias.data_ptr<float>() : nullptr, g, i0, nb, ys);
    }
  }
  return y;
}

}  // namespace latent::layers
