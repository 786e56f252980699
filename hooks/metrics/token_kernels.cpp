// The per-token kernels of token_stats on the CPU (docs/algorithms.md §1, §2), built and loaded
// by native.py: `rows` (the three row sums H, H2, top-1 and log p come from) and `position` (the
// same plus ICT JS for the rollout groups at one position). Plain C++ with GCC/Clang vector
// extensions: 8 float lanes, lowered to AVX2 + FMA where the build flags allow, to SSE or NEON
// elsewhere. No torch headers: it builds in about a second.
//
// `position`, per group of k rows (the rollouts of one prompt at one position), for each row j:
//   pass 1  m_j = max z (NaN propagates, so the caller's finite check sees it),
//   pass 2  s = (z − m_j)/temp (≥ −87), e = exp(s); Σe, Σe·s, Σe² and e kept in a buffer of
//           k × V floats per call (the k rows of one group: a few MB, which stay in L2/L3);
// then one pass over V for the whole group from the kept e:
//   ½P̄ = Σ_j ½w_j e_j (w_j = its weight in P̄ / Σe_j, 0 when inactive), Σ ½P̄ log P̄ once, and
//   per row Σ −M_j log M_j with M_j = ½(p_j + P̄).
// Out, per row: m, Σe, Σe·s, Σe² and Σ ½P̄ log P̄ − M_j log M_j = JS_j + ½H(p_j), what fused.py's
// compiled `position` returns.
//
// Keeping e (instead of a second exp per element, as the compiled kernel does) is what brings
// JS within 2x of the log-prob floor: measured 1.57x vs 2.27x at [6, 256, 151936], float32.
// Sums are accumulated in blocks of 512 elements, then across blocks (error ~ (64 + V/512)·ε,
// not V/8·ε). exp: Cephes' degree-7 polynomial with a power-of-two scale (rel. error < 1e-7);
// log: a degree-8 one after splitting off the exponent (rel. error < 4e-7), as in fused.py.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

typedef float vf __attribute__((vector_size(32)));
typedef int32_t vi __attribute__((vector_size(32)));
typedef uint16_t vh __attribute__((vector_size(16)));
constexpr int kLanes = 8;
constexpr int kBlock = 64;  // vectors per partial sum: 512 elements
constexpr float kExpMin = -87.0f;  // exp(−87) ≈ 1.6e-38, still a normal float

inline vf splat(float x) { return vf{x, x, x, x, x, x, x, x}; }

inline vf load(const float* p) {
  vf v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline vf load(const uint16_t* p) {  // bfloat16: the high half of a float32
  vh h;
  std::memcpy(&h, p, sizeof h);
  return reinterpret_cast<vf>(__builtin_convertvector(h, vi) << 16);
}

template <typename T>
inline vf load_tail(const T* p, int64_t n, float pad) {  // n < kLanes elements, the rest `pad`
  float buf[kLanes];
  for (int i = 0; i < kLanes; i++) buf[i] = pad;
  if constexpr (sizeof(T) == 4) {
    std::memcpy(buf, p, n * sizeof(float));
  } else {
    for (int64_t i = 0; i < n; i++) {
      uint32_t bits = uint32_t(p[i]) << 16;
      std::memcpy(&buf[i], &bits, 4);
    }
  }
  return load(buf);
}

inline float hsum(vf v) {
  float s = 0.0f;
  for (int i = 0; i < kLanes; i++) s += v[i];
  return s;
}

inline vf vexp(vf s) {  // s in [−87, 0]
  const vf magic = splat(12582912.0f);  // 1.5·2^23: adding it rounds to an integer
  vf n = (s * splat(1.44269504088896341f) + magic) - magic;
  vf r = s - n * splat(0.693359375f) + n * splat(2.12194440e-4f);
  vf p = r * splat(1.9875691500e-4f) + splat(1.3981999507e-3f);
  p = p * r + splat(8.3334519073e-3f);
  p = p * r + splat(4.1665795894e-2f);
  p = p * r + splat(1.6666665459e-1f);
  p = p * r + splat(5.0000001201e-1f);
  p = p * r * r + r + splat(1.0f);
  vi scale = (__builtin_convertvector(n, vi) + 127) << 23;
  return p * reinterpret_cast<vf>(scale);
}

inline vf vlog(vf x) {  // x a normal positive float; 0 gives a finite value (only ever times 0)
  vi bits = reinterpret_cast<vi>(x);
  vi n = (bits - 0x3F2AAAAB) >> 23;  // the mantissa lands in [2/3, 4/3)
  vf r = reinterpret_cast<vf>(bits - (n << 23)) - splat(1.0f);
  vf p = r * splat(-0.15630834f) + splat(0.17128032f);
  p = p * r + splat(-0.16382664f);
  p = p * r + splat(0.19796002f);
  p = p * r + splat(-0.25008026f);
  p = p * r + splat(0.33337551f);
  vf nf = __builtin_convertvector(n, vf);
  return (r * r * (r * p - splat(0.5f)) + nf * splat(-2.12194440e-4f)) + r + nf * splat(0.693359375f);
}

inline vf shifted(vf z, vf scale, vf shift) {  // (z − m)/temp, at least −87 (NaN becomes −87)
  vf s = z * scale + shift;
  return s > splat(kExpMin) ? s : splat(kExpMin);
}

// Pass 1 over one row: the max, NaN if any element is NaN (torch.amax's answer).
template <typename T>
float row_max(const T* z, int64_t V) {
  vf m = splat(-INFINITY);
  vi nan = vi{};
  int64_t v = 0;
  for (; v + kLanes <= V; v += kLanes) {
    vf x = load(z + v);
    m = x > m ? x : m;
    nan |= x != x;
  }
  if (v < V) {
    vf x = load_tail(z + v, V - v, -INFINITY);
    m = x > m ? x : m;
    nan |= x != x;
  }
  float out = -INFINITY;
  for (int i = 0; i < kLanes; i++) {
    if (nan[i]) return NAN;
    out = m[i] > out ? m[i] : out;
  }
  return out;
}

// Pass 2 over one row: Σe, Σe·s, Σe² and, when `e` is given, e itself (V floats there).
template <typename T, bool Keep>
void row_sums(const T* z, int64_t V, float m, float inv_temp, float* e, float out[3]) {
  const vf scale = splat(inv_temp), shift = splat(-m * inv_temp);
  vf t1{}, tz{}, t2{};
  int64_t v = 0;
  while (v + kLanes <= V) {
    vf a1{}, az{}, a2{};
    for (int b = 0; b < kBlock && v + kLanes <= V; b++, v += kLanes) {
      vf s = shifted(load(z + v), scale, shift);
      vf x = vexp(s);
      a1 += x;
      az += x * s;
      a2 += x * x;
      if constexpr (Keep) std::memcpy(e + v, &x, sizeof x);
    }
    t1 += a1;
    tz += az;
    t2 += a2;
  }
  if (v < V) {
    vf s = shifted(load_tail(z + v, V - v, 0.0f), scale, shift);
    vf x = vexp(s);
    float buf[kLanes];
    std::memcpy(buf, &x, sizeof x);
    for (int i = int(V - v); i < kLanes; i++) buf[i] = 0.0f;
    x = load(buf);
    t1 += x;
    tz += x * s;
    t2 += x * x;
    if constexpr (Keep) std::memcpy(e + v, buf, (V - v) * sizeof(float));
  }
  out[0] = hsum(t1);
  out[1] = hsum(tz);
  out[2] = hsum(t2);
}

// The group's JS terms from its kept e [k, V]: per row Σ −M_j log M_j + Σ ½P̄ (log ½P̄ + log 2).
// half_inv[j] = ½/Σe_j, half_w[j] = ½·w_j/Σe_j. Each vector of e is loaded twice (for ½P̄, then
// for its row's term): from L1, and any k fits.
void js_terms(const float* e, int64_t k, int64_t V, const float* half_inv, const float* half_w, float* out) {
  const vf ln2 = splat(0.6931471805599453f);
  std::vector<vf> total(k), part(k);
  vf shared_total{};
  // one vector of every row: row j at at + j·stride
  auto step = [&](const float* at, int64_t stride, vf& shared) {
    vf half_mean{};
    for (int64_t j = 0; j < k; j++) half_mean += load(at + j * stride) * splat(half_w[j]);
    shared += half_mean * (vlog(half_mean) + ln2);
    for (int64_t j = 0; j < k; j++) {
      vf mix = load(at + j * stride) * splat(half_inv[j]) + half_mean;
      part[j] -= mix * vlog(mix);
    }
  };
  auto block = [&](const float* at, int64_t stride, int64_t vectors) {
    vf shared{};
    for (int64_t j = 0; j < k; j++) part[j] = vf{};
    for (int64_t b = 0; b < vectors; b++) step(at + b * kLanes, stride, shared);
    shared_total += shared;
    for (int64_t j = 0; j < k; j++) total[j] += part[j];
  };
  const int64_t full = V / kLanes * kLanes;
  for (int64_t v = 0; v < full; v += kBlock * kLanes) block(e + v, V, std::min<int64_t>(kBlock, (full - v) / kLanes));
  if (full < V) {  // the tail, padded with zeros, whose terms are 0 · (a finite log) = 0
    std::vector<float> pad(k * kLanes, 0.0f);
    for (int64_t j = 0; j < k; j++) std::memcpy(&pad[j * kLanes], e + j * V + full, (V - full) * sizeof(float));
    block(pad.data(), kLanes, 1);
  }
  const float shared = hsum(shared_total);
  for (int64_t j = 0; j < k; j++) out[j] = hsum(total[j]) + shared;
}

template <typename T>
void positions(const T* z, int64_t c, int64_t groups, int64_t k, int64_t V, int64_t stride_c,
               int64_t stride_row, float inv_temp, const float* w, float* out, int64_t plane) {
  // the group's e, for its JS pass; freed on return (malloc reuses it for the next call)
  std::vector<float> kept(k * V), half_inv(k), half_w(k), js(k);
  const int64_t rows = groups * k;
  for (int64_t p = 0; p < c; p++) {
    for (int64_t g = 0; g < groups; g++) {
      const int64_t first = p * rows + g * k;  // index of the group's first row in [c, rows]
      for (int64_t j = 0; j < k; j++) {
        const T* row = z + p * stride_c + (g * k + j) * stride_row;
        const float m = row_max(row, V);
        float sums[3];
        row_sums<T, true>(row, V, m, inv_temp, kept.data() + j * V, sums);
        out[first + j] = m;
        out[plane + first + j] = sums[0];
        out[2 * plane + first + j] = sums[1];
        out[3 * plane + first + j] = sums[2];
        half_inv[j] = 0.5f / sums[0];  // Σe ≥ 1 for a finite max; ≥ V·1.6e-38 for garbage rows
        half_w[j] = w[first + j] * half_inv[j];
      }
      js_terms(kept.data(), k, V, half_inv.data(), half_w.data(), js.data());
      for (int64_t j = 0; j < k; j++) out[4 * plane + first + j] = js[j];
    }
  }
}

// Rows without JS: m, Σe, Σe·s, Σe² per row (nothing of size V written).
template <typename T>
void rows(const T* z, int64_t n, int64_t V, int64_t stride_row, float inv_temp, float* out, int64_t plane) {
  for (int64_t r = 0; r < n; r++) {
    const T* row = z + r * stride_row;
    const float m = row_max(row, V);
    float sums[3];
    row_sums<T, false>(row, V, m, inv_temp, nullptr, sums);
    out[r] = m;
    out[plane + r] = sums[0];
    out[2 * plane + r] = sums[1];
    out[3 * plane + r] = sums[2];
  }
}

// positions() for an extern "C" entry: 0, or 1 when its buffers could not be allocated.
template <typename T>
int guarded_positions(const T* z, int64_t c, int64_t groups, int64_t k, int64_t V, int64_t stride_c,
                      int64_t stride_row, float inv_temp, const float* w, float* out, int64_t plane) {
  try {
    positions(z, c, groups, k, V, stride_c, stride_row, inv_temp, w, out, plane);
  } catch (...) {
    return 1;
  }
  return 0;
}

}  // namespace

// Each entry returns 0, or 1 when its buffers could not be allocated (no exception crosses into
// the caller: ctypes cannot take one).
extern "C" {

// z: c positions × (groups·k) rows × V logits (row r of position p at p·stride_c + r·stride_row,
// elements contiguous within a row); w: [c, groups·k] each row's weight in its group's mean
// (1/active count, 0 when inactive); out: 5 planes of `plane` floats, row (p, r) at p·groups·k + r.
int forksight_position_f32(const float* z, int64_t c, int64_t groups, int64_t k, int64_t V, int64_t stride_c,
                           int64_t stride_row, float inv_temp, const float* w, float* out, int64_t plane) {
  return guarded_positions(z, c, groups, k, V, stride_c, stride_row, inv_temp, w, out, plane);
}

int forksight_position_bf16(const uint16_t* z, int64_t c, int64_t groups, int64_t k, int64_t V,
                            int64_t stride_c, int64_t stride_row, float inv_temp, const float* w, float* out,
                            int64_t plane) {
  return guarded_positions(z, c, groups, k, V, stride_c, stride_row, inv_temp, w, out, plane);
}

// z: n rows of V logits (row r at r·stride_row); out: 4 planes (m, Σe, Σe·s, Σe²) of `plane` floats.
int forksight_rows_f32(const float* z, int64_t n, int64_t V, int64_t stride_row, float inv_temp, float* out,
                       int64_t plane) {
  rows(z, n, V, stride_row, inv_temp, out, plane);  // allocates nothing
  return 0;
}

int forksight_rows_bf16(const uint16_t* z, int64_t n, int64_t V, int64_t stride_row, float inv_temp, float* out,
                        int64_t plane) {
  rows(z, n, V, stride_row, inv_temp, out, plane);
  return 0;
}

}  // extern "C"
