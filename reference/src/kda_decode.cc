// SPDX-License-Identifier: Apache-2.0
// CPU reference of the KDA decode / verify step and the RecoverSSM commit.
//
// One templated body serves both precisions: T = float follows docs/numerics.md
// ("KDA decode") operation by operation (std::fma exactly where the contract fuses,
// the contract's reduction trees, BF16 rounding of q|k|v, raw_g and o), with correctly
// rounded exp/sqrt/division standing in for ex2/sqrt/rcp.approx and div.full;
// T = double keeps the same formula structure with no BF16 rounding (the truth).
// A BF16 recurrent state is the one storage format both precisions round to: it is
// read exactly and every stored state is rounded to BF16 once (store_bf16), from float
// in float32 mode and directly from double in float64 mode.
// Built with -ffp-contract=off, so nothing else is fused.
#include "fusedstep_reference/kda_decode.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <type_traits>

#include "float_bits.h"

namespace fusedstep::reference {
namespace {

constexpr int kHeadDim = 128;  // keys = values = 128
constexpr int kRank = 128;     // f_a width
constexpr int kTaps = 4;       // conv width

// v rounded to BF16 in one rounding, round to nearest even, with BF16's exponent range:
// 8 significant bits, subnormals in steps of 2^-133, magnitudes from (2 - 2^-8) 2^127
// up to +-Inf. Scaling by powers of two is exact, so the only rounding is nearbyint's
// (the default round-to-nearest-even mode). NaN as cvt.rn.bf16.f32 gives it.
double bf16_of_double(double v) {
  if (std::isnan(v)) return bits::round_bf16(static_cast<float>(v));
  if (std::isinf(v) || v == 0.0) return v;
  int e = 0;
  (void)std::frexp(v, &e);  // |v| = m 2^e, m in [0.5, 1)
  const int quantum = std::max(e - 8, -133);
  const double r = std::ldexp(std::nearbyint(std::ldexp(v, -quantum)), quantum);
  return std::fabs(r) >= 0x1p128 ? std::copysign(std::numeric_limits<double>::infinity(), v) : r;
}

// The precision-dependent primitives.
template <class T>
struct Arith;

template <>
struct Arith<float> {
  static float bf16(float v) { return bits::round_bf16(v); }
  static float store_bf16(float v) { return bits::round_bf16(v); }  // a stored BF16 state
  // ex2(x * log2e): the RN multiply as on the GPU, then 2^y in double rounded to float.
  static float exp(float x) {
    const float scaled = x * 1.4426950408889634f;
    return static_cast<float>(std::exp2(static_cast<double>(scaled)));
  }
  static float sqrt(float x) { return std::sqrt(x); }
  static float fma(float a, float b, float c) { return std::fma(a, b, c); }
};

template <>
struct Arith<double> {
  static double bf16(double v) { return v; }
  static double store_bf16(double v) { return bf16_of_double(v); }  // a stored BF16 state: direct RNE
  static double exp(double x) { return std::exp(x); }
  static double sqrt(double x) { return std::sqrt(x); }
  static double fma(double a, double b, double c) { return std::fma(a, b, c); }
};

template <class T>
T div(T a, T b) { return a / b; }
template <class T>
T recip(T x) { return T(1) / x; }
template <class T>
T sigmoid(T x) { return div<T>(T(1), T(1) + Arith<T>::exp(-x)); }
template <class T>
T silu(T acc) { return div<T>(acc, T(1) + Arith<T>::exp(-acc)); }

template <class T>
T decay_of(T a_log, T raw_g, T dt_bias, T lower_bound) {
  const T y = Arith<T>::exp(a_log) * (raw_g + dt_bias);
  return Arith<T>::exp(lower_bound * sigmoid<T>(y));
}

// Butterfly v[i] += v[i ^ d] for d = n/2 .. 1 over n values; every element ends equal
// (x + y = y + x), element 0 is returned.
template <class T, size_t N>
T butterfly(std::array<T, N> v) {
  for (size_t d = N / 2; d >= 1; d /= 2) {
    std::array<T, N> next;
    for (size_t i = 0; i < N; ++i) next[i] = v[i] + v[i ^ d];
    v = next;
  }
  return v[0];
}

// q/k norm: element i on lane i % 32 of warp i / 32; per-warp butterfly over x_i * x_i;
// sq = ((W0 + W2) + (W1 + W3)) + 1e-6; out = (x * recip(sqrt(sq))) * scale.
template <class T>
void l2_normalize(const T* x, T scale, T* out) {
  std::array<T, 4> warp{};
  for (int w = 0; w < 4; ++w) {
    std::array<T, 32> lanes;
    for (int l = 0; l < 32; ++l) lanes[l] = x[32 * w + l] * x[32 * w + l];
    warp[w] = butterfly(lanes);
  }
  const T sq = ((warp[0] + warp[2]) + (warp[1] + warp[3])) + static_cast<T>(1e-6f);
  const T inv = recip<T>(Arith<T>::sqrt(sq));
  for (int i = 0; i < kHeadDim; ++i) out[i] = (x[i] * inv) * scale;
}

// dot(S, u): groups of four keys as an fma chain, then the pairwise tree ^16 .. ^1.
template <class T>
T dot128(const T* s, const T* u) {
  std::array<T, 32> groups;
  for (int i = 0; i < 32; ++i) {
    const T* sg = s + 4 * i;
    const T* ug = u + 4 * i;
    groups[i] = Arith<T>::fma(sg[3], ug[3],
                              Arith<T>::fma(sg[2], ug[2], Arith<T>::fma(sg[1], ug[1], sg[0] * ug[0])));
  }
  return butterfly(groups);
}

// Gated RMSNorm tree: s(a, g) pairs rows 32g + {a, a+16} and {a+8, a+24}; butterfly
// over a; sumsq = (G0 + G2) + (G1 + G3).
template <class T>
T gated_norm_sumsq(const T* o) {
  std::array<T, 4> group{};
  for (int g = 0; g < 4; ++g) {
    std::array<T, 8> lanes;
    for (int a = 0; a < 8; ++a) {
      const T* og = o + 32 * g;
      lanes[a] = (og[a] * og[a] + og[16 + a] * og[16 + a]) + (og[8 + a] * og[8 + a] + og[24 + a] * og[24 + a]);
    }
    group[g] = butterfly(lanes);
  }
  return (group[0] + group[2]) + (group[1] + group[3]);
}

// Column of chunk c's k-index kidx in the m16n8k16 fragments: 2q + {0,1} -> 4q + {0,1},
// 2q + 8 + {0,1} -> 4q + {2,3}.
int fragment_column(int chunk, int kidx) {
  const int quad = (kidx % 8) / 2;
  return 16 * chunk + 4 * quad + (kidx >= 8 ? 2 : 0) + kidx % 2;
}

template <class T>
T gate_projection(const uint16_t* f_b_row, const uint16_t* f_a_row, KdaGateMode mode) {
  auto product = [&](int col) {
    return static_cast<T>(bits::bf16_to_f32(f_b_row[col])) * static_cast<T>(bits::bf16_to_f32(f_a_row[col]));
  };
  if constexpr (std::is_same_v<T, double>) {
    double sum = 0.0;  // every BF16 product is exact; the truth needs no order
    for (int col = 0; col < kRank; ++col) sum += product(col);
    return sum;
  } else {
    auto chain = [&](int first_chunk, int chunks) {  // sequential FP32 sum, k-index order
      float acc = 0.0f;
      for (int c = first_chunk; c < first_chunk + chunks; ++c)
        for (int kidx = 0; kidx < 16; ++kidx) acc = acc + product(fragment_column(c, kidx));
      return acc;
    };
    switch (mode) {
      case KdaGateMode::kOneChain:
        return chain(0, 8);
      case KdaGateMode::kFourChains:
        return 0.0f + (((chain(0, 2) + chain(2, 2)) + chain(4, 2)) + chain(6, 2));
      case KdaGateMode::kFmaTree: {
        std::array<float, 16> partial{};
        for (int i = 0; i < 16; ++i) {
          float p = 0.0f;
          for (int j = 0; j < 8; ++j) {
            const int col = 8 * i + j;
            p = std::fma(bits::bf16_to_f32(f_b_row[col]), bits::bf16_to_f32(f_a_row[col]), p);
          }
          partial[i] = p;
        }
        for (int d = 8; d >= 1; d /= 2)
          for (int i = 0; i < d; ++i) partial[i] = partial[i] + partial[i + d];
        return partial[0];
      }
    }
    return 0.0f;
  }
}

double bf16_value(const uint16_t* p, int64_t i) { return bits::bf16_to_f32(p[i]); }

// Element i of a state buffer, FP32 or BF16, exactly.
double state_value(const void* state, bool bf16, int64_t i) {
  return bf16 ? bf16_value(static_cast<const uint16_t*>(state), i) : static_cast<const float*>(state)[i];
}

// The whole state buffer as the result holds it before any write: every element exact.
std::vector<double> state_buffer(const void* state, bool bf16, int64_t elements) {
  std::vector<double> out(elements);
  for (int64_t i = 0; i < elements; ++i) out[i] = state_value(state, bf16, i);
  return out;
}

// The value a store of s writes: s itself into an FP32 state, bf16(s) into a BF16 one.
template <class T>
double stored_state(T s, bool bf16) {
  return static_cast<double>(bf16 ? Arith<T>::store_bf16(s) : s);
}

// Where request b reads and writes, or padding.
struct RequestPlan {
  bool padding = true;
  int accepted = 1;        // A
  int count = 1;           // n: tokens run (rows t >= n are padding rows)
  int64_t read_slot = 0;   // state slot the recurrence starts from
  int64_t conv_slot = 0;
  int64_t record_row = 0;
};

RequestPlan plan_request(const KdaProblem& p, int b) {
  RequestPlan r;
  const int q = p.tokens;
  if (q == 1) {
    const int64_t slot = p.slots[b];
    r.read_slot = r.conv_slot = slot;
    if (slot <= 0 || slot >= p.state_slots || slot >= p.conv_state_slots) return r;
  } else {
    const int32_t* row = p.slots + static_cast<int64_t>(b) * p.slots_stride;
    r.accepted = p.accepted[b];
    r.count = p.token_counts ? p.token_counts[b] : q;
    if (r.accepted < 1 || r.accepted > q || r.count < 1 || r.count > q) return r;
    r.read_slot = row[r.accepted - 1];
    r.conv_slot = row[0];
    if (r.read_slot <= 0 || r.read_slot >= p.state_slots) return r;
    if (r.conv_slot <= 0 || r.conv_slot >= p.conv_state_slots) return r;
  }
  if (p.records) {
    r.record_row = p.record_rows ? p.record_rows[b] : b;
    if (r.record_row < 0 || r.record_row >= p.record_slots) return r;
  }
  r.padding = false;
  return r;
}

template <class T>
KdaResult run(const KdaProblem& p) {
  const int q = p.tokens;
  const int heads = p.heads;
  const int64_t dim = static_cast<int64_t>(heads) * kHeadDim;
  const int64_t channels = 3 * dim;
  const int64_t rows = static_cast<int64_t>(p.batch) * q;
  const double nan = std::numeric_limits<double>::quiet_NaN();

  KdaResult out;
  out.output.assign(rows * dim, 0.0);
  out.raw_g.assign(rows * dim, 0.0);
  out.conv_out.assign(rows * channels, 0.0);
  out.state = state_buffer(p.state, p.state_bf16, p.state_slots * p.state_slot_stride);
  const int64_t conv_elems = p.conv_state_slots * p.conv_state_slot_stride;
  out.conv_state.resize(conv_elems);
  auto conv_in = [&](int64_t index) -> double {
    return p.conv_state_bf16 ? bf16_value(static_cast<const uint16_t*>(p.conv_state), index)
                             : static_cast<const float*>(p.conv_state)[index];
  };
  for (int64_t i = 0; i < conv_elems; ++i) out.conv_state[i] = conv_in(i);
  if (p.records) {
    out.record_correction.assign(p.record_slots * heads * q * kHeadDim, nan);
    out.record_key_gate.assign(p.record_slots * heads * q * 2 * kHeadDim, nan);
  }
  auto weight = [&](int64_t c, int tap) -> T {
    const int64_t index = c * p.conv_weight_channel_stride + tap * p.conv_weight_tap_stride;
    return static_cast<T>(p.conv_weight_bf16 ? bf16_value(static_cast<const uint16_t*>(p.conv_weight), index)
                                             : static_cast<const float*>(p.conv_weight)[index]);
  };

  std::vector<T> qkv(static_cast<size_t>(q) * channels);  // post-conv, per token
  std::vector<T> raw_g(static_cast<size_t>(q) * dim);
  std::vector<T> state(kHeadDim * kHeadDim);
  std::vector<T> w(q + 3);  // conv window of the request, per channel

  for (int b = 0; b < p.batch; ++b) {
    const RequestPlan r = plan_request(p, b);
    if (r.padding) continue;
    const int n = r.count;
    const int64_t conv_base = r.conv_slot * p.conv_state_slot_stride;
    auto x_of = [&](int t, int64_t c) { return bf16_value(p.x, (static_cast<int64_t>(b) * q + t) * p.x_stride + c); };

    // Conv: window w = [c_{A-1}, c_A, c_{A+1}, x_0 .. x_{q-1}]; token t uses w[t .. t+3].
    for (int64_t c = 0; c < channels; ++c) {
      for (int j = 0; j < 3; ++j)
        w[j] = static_cast<T>(conv_in(conv_base + c * p.conv_state_channel_stride +
                                      (r.accepted - 1 + j) * p.conv_state_tap_stride));
      for (int t = 0; t < n; ++t) w[3 + t] = static_cast<T>(x_of(t, c));
      for (int t = 0; t < n; ++t) {
        T acc = p.conv_bias ? static_cast<T>(p.conv_bias[c]) : T(0);
        for (int i = 0; i < kTaps; ++i) acc = Arith<T>::fma(w[t + i], weight(c, i), acc);
        qkv[t * channels + c] = Arith<T>::bf16(silu<T>(acc));
      }
      // Taps 0 .. n+1 become [c_A, c_{A+1}, x_0 .. x_{n-1}]; later taps stay.
      for (int j = 0; j < n + 2; ++j)
        out.conv_state[conv_base + c * p.conv_state_channel_stride + j * p.conv_state_tap_stride] =
            static_cast<double>(w[1 + j]);
    }

    for (int t = 0; t < n; ++t) {
      const int64_t row = static_cast<int64_t>(b) * q + t;
      for (int64_t k = 0; k < dim; ++k) {
        T g;
        if (p.raw_gate) {
          g = static_cast<T>(bf16_value(p.raw_gate, row * p.raw_gate_stride + k));
        } else {
          g = Arith<T>::bf16(gate_projection<T>(p.f_b_weight + k * kRank, p.f_a + row * p.f_a_stride, p.gate_mode));
        }
        raw_g[t * dim + k] = g;
        out.raw_g[row * dim + k] = static_cast<double>(g);
      }
      for (int64_t c = 0; c < channels; ++c) out.conv_out[row * channels + c] = static_cast<double>(qkv[t * channels + c]);
    }

    for (int h = 0; h < heads; ++h) {
      const int64_t src = r.read_slot * p.state_slot_stride + static_cast<int64_t>(h) * kHeadDim * kHeadDim;
      for (int i = 0; i < kHeadDim * kHeadDim; ++i) state[i] = static_cast<T>(state_value(p.state, p.state_bf16, src + i));
      const T a_log = static_cast<T>(p.a_log[h]);
      for (int t = 0; t < n; ++t) {
        const int64_t row = static_cast<int64_t>(b) * q + t;
        const T* qh = &qkv[t * channels + h * kHeadDim];
        const T* kh = qh + dim;
        const T* vh = qh + 2 * dim;
        std::array<T, kHeadDim> q_n, k_n, decay, o;
        l2_normalize<T>(qh, static_cast<T>(p.q_scale), q_n.data());
        l2_normalize<T>(kh, T(1), k_n.data());  // (k * r) * 1 == k * r exactly
        for (int k = 0; k < kHeadDim; ++k)
          decay[k] = decay_of<T>(a_log, raw_g[t * dim + h * kHeadDim + k], static_cast<T>(p.dt_bias[h * kHeadDim + k]),
                                 static_cast<T>(p.lower_bound));
        const T beta = sigmoid<T>(static_cast<T>(bf16_value(p.raw_beta, row * p.raw_beta_stride + h)));
        const int64_t record_base = (r.record_row * heads + h) * q + t;
        for (int v = 0; v < kHeadDim; ++v) {
          T* s = &state[v * kHeadDim];
          for (int k = 0; k < kHeadDim; ++k) s[k] = s[k] * decay[k];
          const T dk = dot128<T>(s, k_n.data());
          const T v_new = (vh[v] - dk) * beta;
          for (int k = 0; k < kHeadDim; ++k) s[k] = Arith<T>::fma(k_n[k], v_new, s[k]);
          o[v] = Arith<T>::bf16(dot128<T>(s, q_n.data()));
          if (p.records) out.record_correction[record_base * kHeadDim + v] = static_cast<double>(v_new);
        }
        if (p.records) {
          double* kg = &out.record_key_gate[record_base * 2 * kHeadDim];
          for (int k = 0; k < kHeadDim; ++k) {
            kg[k] = static_cast<double>(kh[k]);
            kg[kHeadDim + k] = static_cast<double>(raw_g[t * dim + h * kHeadDim + k]);
          }
        } else {
          const int64_t write_slot = q == 1 ? r.read_slot : p.slots[static_cast<int64_t>(b) * p.slots_stride + t];
          if (write_slot > 0 && write_slot < p.state_slots) {
            double* dst = &out.state[write_slot * p.state_slot_stride + static_cast<int64_t>(h) * kHeadDim * kHeadDim];
            // The stored copy is rounded (BF16 state); `state` carries on unrounded.
            for (int i = 0; i < kHeadDim * kHeadDim; ++i) dst[i] = stored_state<T>(state[i], p.state_bf16);
          }
        }
        // Gated RMSNorm of the BF16 o.
        const T rstd = recip<T>(Arith<T>::sqrt(gated_norm_sumsq<T>(o.data()) * static_cast<T>(1.0 / 128.0) +
                                               static_cast<T>(p.norm_eps)));
        for (int v = 0; v < kHeadDim; ++v) {
          const T gate = sigmoid<T>(static_cast<T>(bf16_value(p.output_gate, row * p.output_gate_stride + h * kHeadDim + v)));
          out.output[row * dim + h * kHeadDim + v] =
              static_cast<double>(Arith<T>::bf16(((o[v] * rstd) * static_cast<T>(p.norm_weight[v])) * gate));
        }
      }
    }
  }
  return out;
}

template <class T>
std::vector<double> commit(const KdaCommitProblem& c) {
  const int q = c.tokens;
  std::vector<double> out = state_buffer(c.state, c.state_bf16, c.state_slots * c.state_slot_stride);
  std::vector<T> state(kHeadDim * kHeadDim);
  for (int b = 0; b < c.batch; ++b) {
    const int64_t slot = c.slots[static_cast<int64_t>(b) * c.slots_stride];
    if (slot <= 0 || slot >= c.state_slots) continue;
    const int64_t record_row = c.record_rows ? c.record_rows[b] : b;
    if (record_row < 0 || record_row >= c.record_slots) continue;
    const int n = std::clamp(c.accepted[b], 0, q);
    for (int h = 0; h < c.heads; ++h) {
      const int64_t head_base = slot * c.state_slot_stride + static_cast<int64_t>(h) * kHeadDim * kHeadDim;
      for (int i = 0; i < kHeadDim * kHeadDim; ++i) state[i] = static_cast<T>(state_value(c.state, c.state_bf16, head_base + i));
      for (int t = 0; t < n; ++t) {
        const int64_t record_base = (record_row * c.heads + h) * q + t;
        const double* kg = c.record_key_gate + record_base * 2 * kHeadDim;
        const double* correction = c.record_correction + record_base * kHeadDim;
        std::array<T, kHeadDim> k, k_n, decay;
        for (int i = 0; i < kHeadDim; ++i) k[i] = static_cast<T>(kg[i]);
        l2_normalize<T>(k.data(), T(1), k_n.data());
        for (int i = 0; i < kHeadDim; ++i)
          decay[i] = decay_of<T>(static_cast<T>(c.a_log[h]), static_cast<T>(kg[kHeadDim + i]),
                                 static_cast<T>(c.dt_bias[h * kHeadDim + i]), static_cast<T>(c.lower_bound));
        for (int v = 0; v < kHeadDim; ++v) {
          T* s = &state[v * kHeadDim];
          const T v_new = static_cast<T>(correction[v]);
          for (int i = 0; i < kHeadDim; ++i) s[i] = Arith<T>::fma(k_n[i], v_new, s[i] * decay[i]);
        }
      }
      for (int i = 0; i < kHeadDim * kHeadDim; ++i) out[head_base + i] = stored_state<T>(state[i], c.state_bf16);
    }
  }
  return out;
}

template <class T>
std::array<T, kHeadDim> to_array(const double* x) {
  std::array<T, kHeadDim> a;
  for (int i = 0; i < kHeadDim; ++i) a[i] = static_cast<T>(x[i]);
  return a;
}

}  // namespace

KdaResult kda_decode(const KdaProblem& problem, Precision precision) {
  return precision == Precision::kFloat32 ? run<float>(problem) : run<double>(problem);
}

std::vector<double> kda_commit(const KdaCommitProblem& commit_problem, Precision precision) {
  return precision == Precision::kFloat32 ? commit<float>(commit_problem) : commit<double>(commit_problem);
}

std::vector<double> kda_commit(const KdaProblem& problem, const KdaResult& verify, Precision precision,
                               const int32_t* commit_accepted) {
  KdaCommitProblem c;
  c.batch = problem.batch;
  c.heads = problem.heads;
  c.tokens = problem.tokens;
  c.state = problem.state;
  c.state_bf16 = problem.state_bf16;
  c.state_slot_stride = problem.state_slot_stride;
  c.state_slots = problem.state_slots;
  c.slots = problem.slots;
  c.slots_stride = problem.tokens == 1 ? 1 : problem.slots_stride;
  c.accepted = commit_accepted ? commit_accepted : problem.accepted;
  c.record_correction = verify.record_correction.data();
  c.record_key_gate = verify.record_key_gate.data();
  c.record_rows = problem.record_rows;
  c.record_slots = problem.record_slots;
  c.a_log = problem.a_log;
  c.dt_bias = problem.dt_bias;
  c.lower_bound = problem.lower_bound;
  return kda_commit(c, precision);
}

double kda_silu(double acc, Precision precision) {
  return precision == Precision::kFloat32 ? silu<float>(static_cast<float>(acc)) : silu<double>(acc);
}

double kda_sigmoid(double x, Precision precision) {
  return precision == Precision::kFloat32 ? sigmoid<float>(static_cast<float>(x)) : sigmoid<double>(x);
}

double kda_decay(double a_log, double raw_g, double dt_bias, double lower_bound, Precision precision) {
  if (precision == Precision::kFloat32)
    return decay_of<float>(static_cast<float>(a_log), static_cast<float>(raw_g), static_cast<float>(dt_bias),
                           static_cast<float>(lower_bound));
  return decay_of<double>(a_log, raw_g, dt_bias, lower_bound);
}

void kda_l2_normalize(const double* x, double scale, double* out, Precision precision) {
  if (precision == Precision::kFloat32) {
    const auto in = to_array<float>(x);
    std::array<float, kHeadDim> result;
    l2_normalize<float>(in.data(), static_cast<float>(scale), result.data());
    for (int i = 0; i < kHeadDim; ++i) out[i] = result[i];
  } else {
    l2_normalize<double>(x, scale, out);
  }
}

double kda_dot128(const double* s, const double* u, Precision precision) {
  if (precision == Precision::kFloat32) {
    const auto sf = to_array<float>(s);
    const auto uf = to_array<float>(u);
    return dot128<float>(sf.data(), uf.data());
  }
  return dot128<double>(s, u);
}

double kda_state_bf16(double v, Precision precision) {
  return precision == Precision::kFloat32 ? Arith<float>::store_bf16(static_cast<float>(v)) : Arith<double>::store_bf16(v);
}

}  // namespace fusedstep::reference
