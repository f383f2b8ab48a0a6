// SPDX-License-Identifier: Apache-2.0
// CPU reference of the KDA decode / verify step and the RecoverSSM commit: stages
// against hand-computed values, cache and padding invariants, verify vs sequential
// steps, commit vs verify, layout equivalences, float32 vs float64 tolerances.
#include "fusedstep_reference/kda_decode.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/seed.h"
#include "float_bits.h"

namespace fusedstep::reference {
namespace {

constexpr int kD = 128;
constexpr Precision kF32 = Precision::kFloat32;
constexpr Precision kF64 = Precision::kFloat64;

using fusedstep::testing::fresh_seed;

uint16_t bf16(double v) { return bits::bf16_rne(static_cast<float>(v)); }
double from_bf16(uint16_t b) { return bits::bf16_to_f32(b); }

// Index of the first element whose bits differ (NaN == NaN), or -1.
int64_t first_difference(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(double)) != 0) return static_cast<int64_t>(i);
  return -1;
}

#define EXPECT_SAME_BITS(a, b, what)                                                     \
  do {                                                                                   \
    const int64_t fs_at_ = first_difference((a), (b));                                   \
    EXPECT_EQ(fs_at_, -1) << what << ": first difference at " << fs_at_ << ": "          \
                          << (fs_at_ >= 0 && size_t(fs_at_) < (a).size() ? (a)[fs_at_] : 0.0) \
                          << " vs "                                                      \
                          << (fs_at_ >= 0 && size_t(fs_at_) < (b).size() ? (b)[fs_at_] : 0.0); \
  } while (0)

struct CaseOptions {
  int batch = 2, heads = 2, tokens = 1;
  bool conv_tap_major = false;        // [slot, tap, channel] instead of [slot, channel, tap]
  bool conv_state_fp32 = false;
  bool conv_weight_tap_major = false;  // [4, 3 dim] (channel stride 1) instead of [3 dim, 4]
  bool conv_weight_bf16 = false;
  bool conv_bias = true;
  bool given_raw_gate = false;
  KdaGateMode gate_mode = KdaGateMode::kOneChain;
  bool records = false, deferred_rows = false, token_counts = false;
  bool packed = false;                // no padding in row / slot strides
};

// Host inputs of one problem. The logical values depend only on (seed, batch, heads,
// tokens), never on the layout options, so two layouts of one seed hold the same data.
struct KdaCase {
  CaseOptions o;
  int64_t dim = 0, channels = 0, rows = 0, taps = 0;
  int64_t state_slots = 0, conv_state_slots = 0, record_slots = 0;
  int64_t x_stride = 0, f_a_stride = 0, raw_gate_stride = 0, raw_beta_stride = 0, output_gate_stride = 0;
  int64_t conv_slot_stride = 0, conv_channel_stride = 0, conv_tap_stride = 0;
  int64_t weight_channel_stride = 0, weight_tap_stride = 0;
  int64_t state_slot_stride = 0, slots_stride = 0;
  std::vector<uint16_t> x, f_a, raw_gate, raw_beta, output_gate, f_b, conv_weight_b, conv_state_b;
  std::vector<float> conv_weight_f, conv_bias, a_log, dt_bias, norm_weight, conv_state_f, state;
  std::vector<int32_t> slots, accepted, token_counts, record_rows;

  int64_t conv_index(int64_t slot, int64_t channel, int64_t tap) const {
    return slot * conv_slot_stride + channel * conv_channel_stride + tap * conv_tap_stride;
  }
  double conv_input(int64_t slot, int64_t channel, int64_t tap) const {
    const int64_t i = conv_index(slot, channel, tap);
    return o.conv_state_fp32 ? conv_state_f[i] : from_bf16(conv_state_b[i]);
  }
  int32_t slot(int b, int t) const { return o.tokens == 1 ? slots[b] : slots[b * slots_stride + t]; }
  const float* state_head(int64_t slot, int h) const {
    return state.data() + slot * state_slot_stride + int64_t(h) * kD * kD;
  }

  KdaProblem problem() const {
    KdaProblem p;
    p.batch = o.batch;
    p.heads = o.heads;
    p.tokens = o.tokens;
    p.x = x.data();
    p.x_stride = x_stride;
    if (o.given_raw_gate) {
      p.raw_gate = raw_gate.data();
      p.raw_gate_stride = raw_gate_stride;
    } else {
      p.f_a = f_a.data();
      p.f_a_stride = f_a_stride;
      p.f_b_weight = f_b.data();
    }
    p.raw_beta = raw_beta.data();
    p.raw_beta_stride = raw_beta_stride;
    p.output_gate = output_gate.data();
    p.output_gate_stride = output_gate_stride;
    p.conv_weight = o.conv_weight_bf16 ? static_cast<const void*>(conv_weight_b.data()) : conv_weight_f.data();
    p.conv_weight_bf16 = o.conv_weight_bf16;
    p.conv_weight_channel_stride = weight_channel_stride;
    p.conv_weight_tap_stride = weight_tap_stride;
    p.conv_bias = o.conv_bias ? conv_bias.data() : nullptr;
    p.a_log = a_log.data();
    p.dt_bias = dt_bias.data();
    p.norm_weight = norm_weight.data();
    p.conv_state = o.conv_state_fp32 ? static_cast<const void*>(conv_state_f.data()) : conv_state_b.data();
    p.conv_state_bf16 = !o.conv_state_fp32;
    p.conv_state_slot_stride = conv_slot_stride;
    p.conv_state_channel_stride = conv_channel_stride;
    p.conv_state_tap_stride = conv_tap_stride;
    p.conv_state_slots = conv_state_slots;
    p.state = state.data();
    p.state_slot_stride = state_slot_stride;
    p.state_slots = state_slots;
    p.slots = slots.data();
    p.slots_stride = slots_stride;
    p.accepted = o.tokens > 1 ? accepted.data() : nullptr;
    p.token_counts = o.token_counts ? token_counts.data() : nullptr;
    p.records = o.records;
    p.record_rows = o.deferred_rows ? record_rows.data() : nullptr;
    p.record_slots = record_slots;
    p.gate_mode = o.gate_mode;
    return p;
  }
};

KdaCase make_case(const CaseOptions& o, uint64_t seed) {
  KdaCase c;
  c.o = o;
  const int q = o.tokens;
  c.dim = int64_t(o.heads) * kD;
  c.channels = 3 * c.dim;
  c.rows = int64_t(o.batch) * q;
  c.taps = q + 2;
  c.state_slots = c.rows + 3;
  c.conv_state_slots = c.state_slots;
  c.record_slots = o.batch + 2;
  const int64_t pad = o.packed ? 0 : 8;
  c.x_stride = c.channels + pad;
  c.f_a_stride = kD + pad;
  c.raw_gate_stride = c.dim + pad;
  c.raw_beta_stride = o.heads + (o.packed ? 0 : 3);
  c.output_gate_stride = c.dim + pad;
  c.state_slot_stride = int64_t(o.heads) * kD * kD + (o.packed ? 0 : 4);
  c.slots_stride = q == 1 ? 1 : q + (o.packed ? 0 : 1);
  if (o.conv_tap_major) {
    c.conv_channel_stride = 1;
    c.conv_tap_stride = c.channels + pad;
    c.conv_slot_stride = c.taps * c.conv_tap_stride + (o.packed ? 0 : 5);
  } else {
    c.conv_tap_stride = 1;
    c.conv_channel_stride = c.taps + (o.packed ? 0 : 1);
    c.conv_slot_stride = c.channels * c.conv_channel_stride + (o.packed ? 0 : 5);
  }
  if (o.conv_weight_tap_major) {
    c.weight_channel_stride = 1;
    c.weight_tap_stride = c.channels + pad;
  } else {
    c.weight_channel_stride = 4;
    c.weight_tap_stride = 1;
  }

  std::mt19937_64 rng(seed);
  std::mt19937_64 gap_rng(seed ^ 0x9e3779b97f4a7c15ull);
  std::normal_distribution<double> normal(0.0, 1.0);
  auto uniform = [&](double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng); };
  auto gap_bf16 = [&] { return bf16(std::normal_distribution<double>(0.0, 1.0)(gap_rng)); };

  // Row tensors (BF16): every stride gap holds random values too.
  auto rows_bf16 = [&](int64_t width, int64_t stride, double sigma) {
    std::vector<uint16_t> v(c.rows * stride);
    for (auto& e : v) e = gap_bf16();
    for (int64_t r = 0; r < c.rows; ++r)
      for (int64_t i = 0; i < width; ++i) v[r * stride + i] = bf16(sigma * normal(rng));
    return v;
  };
  c.x = rows_bf16(c.channels, c.x_stride, 1.0);
  c.f_a = rows_bf16(kD, c.f_a_stride, 1.0);
  c.raw_gate = rows_bf16(c.dim, c.raw_gate_stride, 1.0);
  c.raw_beta = rows_bf16(o.heads, c.raw_beta_stride, 1.0);
  c.output_gate = rows_bf16(c.dim, c.output_gate_stride, 1.0);

  // Conv weights: BF16-representable values, so FP32 and BF16 weights are the same numbers.
  std::vector<double> weights(c.channels * 4);
  for (auto& w : weights) w = from_bf16(bf16(uniform(-0.6, 0.6)));
  const int64_t weight_elems = (c.channels - 1) * c.weight_channel_stride + 3 * c.weight_tap_stride + 1;
  c.conv_weight_f.assign(weight_elems, 0.0f);
  c.conv_weight_b.assign(weight_elems, 0);
  for (int64_t ch = 0; ch < c.channels; ++ch)
    for (int i = 0; i < 4; ++i) {
      const int64_t index = ch * c.weight_channel_stride + i * c.weight_tap_stride;
      c.conv_weight_f[index] = static_cast<float>(weights[ch * 4 + i]);
      c.conv_weight_b[index] = bf16(weights[ch * 4 + i]);
    }
  c.conv_bias.resize(c.channels);
  for (auto& b : c.conv_bias) b = static_cast<float>(uniform(-0.2, 0.2));
  c.f_b.resize(c.dim * kD);
  for (auto& w : c.f_b) w = bf16(normal(rng) / std::sqrt(double(kD)));
  c.a_log.resize(o.heads);
  for (auto& a : c.a_log) a = static_cast<float>(uniform(-1.5, 0.5));
  c.dt_bias.resize(c.dim);
  for (auto& d : c.dt_bias) d = static_cast<float>(uniform(-1.0, 1.0));
  c.norm_weight.resize(kD);
  for (auto& w : c.norm_weight) w = static_cast<float>(uniform(0.5, 1.5));

  // Conv state: BF16 values in either dtype.
  const int64_t conv_elems = c.conv_state_slots * c.conv_slot_stride;
  c.conv_state_b.resize(conv_elems);
  for (auto& e : c.conv_state_b) e = gap_bf16();
  for (int64_t s = 0; s < c.conv_state_slots; ++s)
    for (int64_t ch = 0; ch < c.channels; ++ch)
      for (int64_t t = 0; t < c.taps; ++t) c.conv_state_b[c.conv_index(s, ch, t)] = bf16(normal(rng));
  c.conv_state_f.resize(conv_elems);
  for (int64_t i = 0; i < conv_elems; ++i) c.conv_state_f[i] = bits::bf16_to_f32(c.conv_state_b[i]);

  c.state.resize(c.state_slots * c.state_slot_stride);
  for (auto& s : c.state) s = static_cast<float>(std::uniform_real_distribution<double>(-0.5, 0.5)(gap_rng));
  for (int64_t s = 0; s < c.state_slots; ++s)
    for (int64_t i = 0; i < int64_t(o.heads) * kD * kD; ++i)
      c.state[s * c.state_slot_stride + i] = static_cast<float>(uniform(-0.5, 0.5));

  // Distinct slots 1 .. state_slots - 1; table gaps hold slot 0.
  std::vector<int32_t> perm(c.state_slots - 1);
  std::iota(perm.begin(), perm.end(), 1);
  std::shuffle(perm.begin(), perm.end(), rng);
  c.slots.assign(o.batch * c.slots_stride, 0);
  for (int b = 0; b < o.batch; ++b)
    for (int t = 0; t < q; ++t) c.slots[b * c.slots_stride + t] = perm[b * q + t];
  c.accepted.resize(o.batch);
  c.token_counts.resize(o.batch);
  for (int b = 0; b < o.batch; ++b) {
    c.accepted[b] = std::uniform_int_distribution<int>(1, q)(rng);
    c.token_counts[b] = std::uniform_int_distribution<int>(1, q)(rng);
  }
  c.record_rows.resize(c.record_slots);
  std::iota(c.record_rows.begin(), c.record_rows.end(), 0);
  std::shuffle(c.record_rows.begin(), c.record_rows.end(), rng);
  c.record_rows.resize(o.batch);
  return c;
}

// Request b's single-token steps (q = 1, float32), chained through the caches: the
// conv window starts at taps A-1 .. A+1 of b's conv slot, the state at slot slots[b, A-1].
struct SequentialSteps {
  std::vector<std::vector<double>> output, raw_g, conv_out;  // per step: one row
  std::vector<std::vector<double>> state;                    // per step: heads * 128 * 128
  std::vector<double> conv_window;                           // final [channel][3 taps]
};

SequentialSteps run_sequential(const KdaCase& c, int b, int accepted, int steps) {
  const int q = c.o.tokens;
  const int64_t head_block = int64_t(c.o.heads) * kD * kD;
  std::vector<float> conv(2 * c.channels * 3, 0.0f), state(2 * head_block, 0.0f);
  for (int64_t ch = 0; ch < c.channels; ++ch)
    for (int j = 0; j < 3; ++j) conv[(c.channels + ch) * 3 + j] = static_cast<float>(c.conv_input(c.slot(b, 0), ch, accepted - 1 + j));
  std::copy_n(c.state.data() + c.slot(b, accepted - 1) * c.state_slot_stride, head_block, state.begin() + head_block);
  const int32_t one = 1;
  SequentialSteps out;
  for (int t = 0; t < steps; ++t) {
    const int64_t row = int64_t(b) * q + t;
    KdaProblem p = c.problem();
    p.batch = 1;
    p.tokens = 1;
    p.x += row * c.x_stride;
    if (p.f_a) p.f_a += row * c.f_a_stride;
    if (p.raw_gate) p.raw_gate += row * c.raw_gate_stride;
    p.raw_beta += row * c.raw_beta_stride;
    p.output_gate += row * c.output_gate_stride;
    p.conv_state = conv.data();
    p.conv_state_bf16 = false;
    p.conv_state_slot_stride = c.channels * 3;
    p.conv_state_channel_stride = 3;
    p.conv_state_tap_stride = 1;
    p.conv_state_slots = 2;
    p.state = state.data();
    p.state_slot_stride = head_block;
    p.state_slots = 2;
    p.slots = &one;
    p.slots_stride = 1;
    p.accepted = nullptr;
    p.token_counts = nullptr;
    p.records = false;
    p.record_rows = nullptr;
    const KdaResult r = kda_decode(p, kF32);
    out.output.push_back(r.output);
    out.raw_g.push_back(r.raw_g);
    out.conv_out.push_back(r.conv_out);
    std::transform(r.state.begin(), r.state.end(), state.begin(), [](double v) { return static_cast<float>(v); });
    std::transform(r.conv_state.begin(), r.conv_state.end(), conv.begin(), [](double v) { return static_cast<float>(v); });
    out.state.emplace_back(r.state.begin() + head_block, r.state.end());
  }
  out.conv_window.assign(conv.begin() + c.channels * 3, conv.end());
  return out;
}

std::vector<double> slice(const std::vector<double>& v, int64_t begin, int64_t count) {
  return std::vector<double>(v.begin() + begin, v.begin() + begin + count);
}

std::vector<double> state_slot(const KdaCase& c, const std::vector<double>& buffer, int64_t slot) {
  return slice(buffer, slot * c.state_slot_stride, int64_t(c.o.heads) * kD * kD);
}

std::vector<double> input_state_slot(const KdaCase& c, int64_t slot) {
  const float* s = c.state.data() + slot * c.state_slot_stride;
  return std::vector<double>(s, s + int64_t(c.o.heads) * kD * kD);
}

// Logical [slot][channel][tap] view of a conv buffer in the case's layout.
std::vector<double> conv_logical(const KdaCase& c, const std::vector<double>& buffer) {
  std::vector<double> v;
  v.reserve(c.conv_state_slots * c.channels * c.taps);
  for (int64_t s = 0; s < c.conv_state_slots; ++s)
    for (int64_t ch = 0; ch < c.channels; ++ch)
      for (int64_t t = 0; t < c.taps; ++t) v.push_back(buffer[c.conv_index(s, ch, t)]);
  return v;
}

std::vector<double> conv_buffer_input(const KdaCase& c) {
  std::vector<double> v(c.conv_state_b.size());
  for (size_t i = 0; i < v.size(); ++i) v[i] = c.o.conv_state_fp32 ? c.conv_state_f[i] : from_bf16(c.conv_state_b[i]);
  return v;
}

double silu64(double a) { return a / (1.0 + std::exp(-a)); }
double sigmoid64(double a) { return 1.0 / (1.0 + std::exp(-a)); }

// ---------------------------------------------------------------------------------
// Stages

// SiLU, sigmoid, decay, the q/k L2 norm and the dot tree equal hand-computed values.
TEST(KdaReferenceStages, MatchHandComputedValues) {
  for (Precision p : {kF64, kF32}) {
    const double tol = p == kF64 ? 1e-15 : 3e-7;  // float32: a few FP32 ulps
    auto near = [&](double got, double want) { EXPECT_NEAR(got, want, tol * std::max(1.0, std::fabs(want))); };
    EXPECT_EQ(kda_silu(0.0, p), 0.0);
    near(kda_silu(1.0, p), 0.7310585786300049);     // 1 / (1 + e^-1)
    near(kda_silu(-2.0, p), -0.2384058440442351);   // -2 / (1 + e^2)
    near(kda_silu(20.0, p), 19.999999958776925);    // 20 / (1 + e^-20)
    EXPECT_EQ(kda_sigmoid(0.0, p), 0.5);
    near(kda_sigmoid(2.0, p), 0.8807970779778823);
    near(kda_sigmoid(-3.0, p), 0.04742587317756678);
    // a_log = 0, raw_g + dt_bias = 0: y = 0, sigmoid = 1/2, decay = exp(-5 / 2).
    near(kda_decay(0.0, 0.25, -0.25, -5.0, p), 0.0820849986238988);
    // a_log = ln 2, raw_g + dt_bias = 1.5: y = 3, decay = exp(-5 sigmoid(3)) = exp(-4.762870634112167).
    near(kda_decay(0.6931471805599453, 1.0, 0.5, -5.0, p), 0.008541055925847904);

    // (3, 4, 0, ...): |x| = sqrt(25 + 1e-6) (eps as FP32 1e-6).
    std::vector<double> x(kD, 0.0), out(kD, -1.0);
    x[0] = 3.0;
    x[77] = 4.0;
    kda_l2_normalize(x.data(), 0.5, out.data(), p);
    const double norm = std::sqrt(25.0 + double(1e-6f));
    near(out[0], 0.5 * 3.0 / norm);
    near(out[77], 0.5 * 4.0 / norm);
    for (int i = 0; i < kD; ++i) {
      if (i != 0 && i != 77) {
        EXPECT_EQ(out[i], 0.0) << i;
      }
    }

    // sum_i i * (1 + i % 3) over 128 keys, exact in FP32.
    std::vector<double> s(kD), u(kD);
    double want = 0.0;
    for (int i = 0; i < kD; ++i) {
      s[i] = i;
      u[i] = 1 + i % 3;
      want += s[i] * u[i];
    }
    EXPECT_EQ(kda_dot128(s.data(), u.data(), p), want);
  }
}

// The conv taps, bias, SiLU and BF16 rounding of q|k|v follow the window rule for each accepted count.
TEST(KdaReferenceStages, ConvMatchesHandComputedWindow) {
  const uint64_t seed = fresh_seed();
  CaseOptions o;
  o.batch = 3;
  o.heads = 1;
  o.tokens = 3;
  KdaCase c = make_case(o, seed);
  // Simple weights: taps 1/8, 2/8, 3/8, 4/8 on every channel.
  for (int64_t ch = 0; ch < c.channels; ++ch)
    for (int i = 0; i < 4; ++i) c.conv_weight_f[ch * c.weight_channel_stride + i * c.weight_tap_stride] = (i + 1) / 8.0f;
  c.accepted = {1, 2, 3};
  for (Precision p : {kF64, kF32}) {
    const KdaResult r = kda_decode(c.problem(), p);
    for (int b = 0; b < o.batch; ++b) {
      const int a = c.accepted[b];
      for (int t = 0; t < o.tokens; ++t)
        for (int64_t ch = 0; ch < c.channels; ++ch) {
          double w[6];
          for (int j = 0; j < 3; ++j) w[j] = c.conv_input(c.slot(b, 0), ch, a - 1 + j);
          for (int j = 0; j < 3; ++j) w[3 + j] = from_bf16(c.x[(b * o.tokens + j) * c.x_stride + ch]);
          const double acc = c.conv_bias[ch] + (w[t] + 2 * w[t + 1] + 3 * w[t + 2] + 4 * w[t + 3]) / 8.0;
          const double want = silu64(acc);
          const double got = r.conv_out[(b * o.tokens + t) * c.channels + ch];
          if (p == kF64) {
            ASSERT_NEAR(got, want, 1e-14 * std::max(1.0, std::fabs(want))) << b << " " << t << " " << ch;
          } else {
            ASSERT_EQ(got, from_bf16(bf16(got))) << "float32 q|k|v must be BF16 values";
            // BF16 rounding (2^-8 relative) plus the FP32 accumulation's rounding, which is
            // relative to the terms, not to a sum that cancels to near zero (silu' <= 1.1).
            const double terms = std::fabs(c.conv_bias[ch]) + (std::fabs(w[t]) + 2 * std::fabs(w[t + 1]) +
                                                               3 * std::fabs(w[t + 2]) + 4 * std::fabs(w[t + 3])) / 8.0;
            ASSERT_LE(std::fabs(got - want), std::ldexp(std::fabs(want), -8) + std::ldexp(terms, -20))
                << b << " " << t << " " << ch;
          }
        }
    }
  }
}

// One recurrence step on a hand-checkable state: k_n ~ e_0, q_n ~ e_1 * scale, equal decays, beta = 1/2.
TEST(KdaReferenceStages, RecurrenceStepOnHandCheckableState) {
  const uint64_t seed = fresh_seed();
  CaseOptions o;
  o.batch = 1;
  o.heads = 1;
  o.tokens = 1;
  o.conv_bias = false;
  o.given_raw_gate = true;
  KdaCase c = make_case(o, seed);
  // Conv passes x through (tap 3 = 1), x: q = 8 e_1, k = 8 e_0, v = 8 + v / 16.
  for (int64_t ch = 0; ch < c.channels; ++ch)
    for (int i = 0; i < 4; ++i) c.conv_weight_f[ch * c.weight_channel_stride + i * c.weight_tap_stride] = i == 3 ? 1.0f : 0.0f;
  for (int64_t ch = 0; ch < c.channels; ++ch) c.x[ch] = 0;
  c.x[1] = bf16(8.0);
  c.x[kD + 0] = bf16(8.0);
  for (int v = 0; v < kD; ++v) c.x[2 * kD + v] = bf16(8.0 + v / 16.0);
  c.a_log[0] = 0.0f;  // y = raw_g + dt_bias = 0: decay = exp(-2.5) on every key
  for (int k = 0; k < kD; ++k) {
    c.raw_gate[k] = bf16(0.5);
    c.dt_bias[k] = -0.5f;
  }
  c.raw_beta[0] = bf16(0.0);  // beta = 1/2
  const int64_t s = c.slot(0, 0);
  for (int v = 0; v < kD; ++v)
    for (int k = 0; k < kD; ++k) c.state[s * c.state_slot_stride + v * kD + k] = k == 0 ? 1.0f : (k == 1 ? 2.0f : 0.0f);

  const double d = std::exp(-2.5);
  const double kn0 = silu64(8.0) / std::sqrt(silu64(8.0) * silu64(8.0) + double(1e-6f));
  const double qn1 = kn0 * double(c.problem().q_scale);
  for (Precision p : {kF64, kF32}) {
    const KdaResult r = kda_decode(c.problem(), p);
    const double tol = p == kF64 ? 1e-13 : 2e-2;  // float32: BF16 q|k|v and o
    for (int v = 0; v < kD; ++v) {
      const double value = silu64(8.0 + v / 16.0);
      const double v_new = (value - d * kn0) * 0.5;
      const double* got = &r.state[s * c.state_slot_stride + v * kD];
      EXPECT_NEAR(got[0], d + kn0 * v_new, tol * (d + kn0 * v_new)) << v;
      EXPECT_NEAR(got[1], 2 * d, tol * 2 * d) << v;
      for (int k = 2; k < kD; ++k) ASSERT_EQ(got[k], 0.0) << v << " " << k;
      // o = 2 d qn1 on every value row: the norm gives o / sqrt(o^2 + eps).
      const double o_v = 2 * d * qn1;
      const double gate = sigmoid64(from_bf16(c.output_gate[v]));
      const double want = o_v / std::sqrt(o_v * o_v + double(1e-5f)) * c.norm_weight[v] * gate;
      EXPECT_NEAR(r.output[v], want, (p == kF64 ? 1e-13 : 1e-2) * std::fabs(want)) << v;
    }
  }
}

// A naive float64 evaluation of the step (plain sums, no trees) agrees with the reference's float64 mode.
TEST(KdaReferenceStages, Float64MatchesNaiveEvaluation) {
  const uint64_t seed = fresh_seed();
  CaseOptions o;
  o.batch = 2;
  o.heads = 2;
  o.tokens = 1;
  const KdaCase c = make_case(o, seed);
  const KdaProblem p = c.problem();
  const KdaResult r = kda_decode(p, kF64);
  for (int b = 0; b < o.batch; ++b) {
    const int64_t s = c.slot(b, 0);
    for (int h = 0; h < o.heads; ++h) {
      const double* qkv = &r.conv_out[b * c.channels];
      std::vector<double> qn(kD), kn(kD), decay(kD);
      double sq = 0, sk = 0;
      for (int i = 0; i < kD; ++i) {
        sq += qkv[h * kD + i] * qkv[h * kD + i];
        sk += qkv[c.dim + h * kD + i] * qkv[c.dim + h * kD + i];
      }
      for (int i = 0; i < kD; ++i) {
        qn[i] = qkv[h * kD + i] / std::sqrt(sq + double(1e-6f)) * double(p.q_scale);
        kn[i] = qkv[c.dim + h * kD + i] / std::sqrt(sk + double(1e-6f));
        // raw_g from the f_a projection in exact arithmetic
        double g = 0;
        for (int j = 0; j < kD; ++j) g += from_bf16(c.f_b[(h * kD + i) * kD + j]) * from_bf16(c.f_a[b * c.f_a_stride + j]);
        EXPECT_NEAR(r.raw_g[b * c.dim + h * kD + i], g, 1e-12);
        decay[i] = std::exp(double(p.lower_bound) * sigmoid64(std::exp(double(c.a_log[h])) * (g + c.dt_bias[h * kD + i])));
      }
      const double beta = sigmoid64(from_bf16(c.raw_beta[b * c.raw_beta_stride + h]));
      const float* s0 = c.state_head(s, h);
      std::vector<double> o_row(kD);
      double ss = 0;
      for (int v = 0; v < kD; ++v) {
        std::vector<double> row(kD);
        double dk = 0;
        for (int k = 0; k < kD; ++k) {
          row[k] = s0[v * kD + k] * decay[k];
          dk += row[k] * kn[k];
        }
        const double v_new = (qkv[2 * c.dim + h * kD + v] - dk) * beta;
        double dq = 0;
        for (int k = 0; k < kD; ++k) {
          row[k] += kn[k] * v_new;
          dq += row[k] * qn[k];
          const double got = r.state[s * c.state_slot_stride + (h * kD + v) * kD + k];
          ASSERT_NEAR(got, row[k], 1e-12 * std::max(1.0, std::fabs(row[k]))) << b << " " << h << " " << v << " " << k;
        }
        o_row[v] = dq;
        ss += dq * dq;
      }
      for (int v = 0; v < kD; ++v) {
        const double gate = sigmoid64(from_bf16(c.output_gate[b * c.output_gate_stride + h * kD + v]));
        const double want = o_row[v] / std::sqrt(ss / kD + double(p.norm_eps)) * c.norm_weight[v] * gate;
        EXPECT_NEAR(r.output[b * c.dim + h * kD + v], want, 1e-11 * std::max(1.0, std::fabs(want)));
      }
    }
  }
}

// Gate modes: every float32 raw_g is a BF16 value, and differs from the BF16 rounding of
// the exact projection by at most the two roundings (one BF16 ulp of the larger) plus the
// float32 accumulation error of 128 exact products (at most 128 * 2^-24 * sum |f_b f_a|:
// under cancellation that is many ulps of a small result). The caller's raw_gate is used
// as given.
TEST(KdaReferenceStages, GateModesRoundTheExactProjection) {
  const uint64_t seed = fresh_seed();
  CaseOptions o;
  o.batch = 3;
  o.heads = 2;
  o.tokens = 1;
  KdaCase c = make_case(o, seed);
  const KdaResult exact = kda_decode(c.problem(), kF64);
  for (KdaGateMode mode : {KdaGateMode::kOneChain, KdaGateMode::kFourChains, KdaGateMode::kFmaTree}) {
    c.o.gate_mode = mode;
    const KdaResult r = kda_decode(c.problem(), kF32);
    for (size_t i = 0; i < r.raw_g.size(); ++i) {
      const double g = r.raw_g[i];
      ASSERT_EQ(g, from_bf16(bf16(g)));
      const int64_t row = static_cast<int64_t>(i) / c.dim, k = static_cast<int64_t>(i) % c.dim;
      double abs_sum = 0.0;
      for (int j = 0; j < kD; ++j) {
        abs_sum += std::fabs(from_bf16(c.f_b[k * kD + j]) * from_bf16(c.f_a[row * c.f_a_stride + j]));
      }
      const double larger = std::max(std::fabs(g), std::fabs(exact.raw_g[i]));
      const double ulp = larger > 0 ? std::ldexp(1.0, std::ilogb(larger) - 7) : 0.0;
      const double bound = ulp + 128.0 * std::ldexp(1.0, -24) * abs_sum;
      ASSERT_LE(std::fabs(g - exact.raw_g[i]), bound) << "mode " << int(mode) << " element " << i;
    }
  }
  // Given raw gates: raw_g is the input, in both precisions.
  c.o.given_raw_gate = true;
  for (Precision p : {kF64, kF32}) {
    const KdaResult r = kda_decode(c.problem(), p);
    for (int64_t row = 0; row < c.rows; ++row)
      for (int64_t k = 0; k < c.dim; ++k)
        ASSERT_EQ(r.raw_g[row * c.dim + k], from_bf16(c.raw_gate[row * c.raw_gate_stride + k]));
  }
}

// ---------------------------------------------------------------------------------
// Invariants

// A padding request (bad slot, accepted count, token count or record row) writes zero rows and leaves every cache byte and record untouched.
TEST(KdaReferenceInvariants, PaddingRequestsTouchNothing) {
  const uint64_t seed = fresh_seed();
  struct Setup { int q; bool records; int variant; };
  for (const Setup& setup : {Setup{1, false, 0}, Setup{3, false, 0}, Setup{3, false, 1}, Setup{3, true, 0}, Setup{3, true, 1}}) {
    const int q = setup.q;
    SCOPED_TRACE("q " + std::to_string(q) + " records " + std::to_string(setup.records) + " variant " + std::to_string(setup.variant));
    CaseOptions o;
    o.batch = 8;
    o.heads = 1;
    o.tokens = q;
    o.records = setup.records;
    o.deferred_rows = setup.records;
    o.token_counts = q > 1;
    KdaCase c = make_case(o, seed + 10 * q + 2 * setup.records + setup.variant);
    // Distinct slots 1 .. rows; slots rows + 1, rows + 2 are valid state slots but conv padding.
    c.conv_state_slots = c.rows + 1;
    auto slot_ref = [&](int b, int t) -> int32_t& { return c.slots[q == 1 ? b : b * c.slots_stride + t]; };
    for (int b = 0; b < o.batch; ++b) {
      c.accepted[b] = 1;
      c.token_counts[b] = q;
      for (int t = 0; t < q; ++t) slot_ref(b, t) = 1 + b * q + t;
    }
    const int32_t bad_state = int32_t(c.state_slots), conv_only_bad = int32_t(c.conv_state_slots);
    if (setup.variant == 0) {
      slot_ref(1, 0) = 0;
      slot_ref(2, 0) = -1;
      slot_ref(3, 0) = bad_state;
      slot_ref(4, 0) = conv_only_bad;  // the state slot exists, the conv slot does not
      if (q == 1) {
        slot_ref(6, 0) = bad_state + 7;
        slot_ref(7, 0) = -5;
      } else {
        c.accepted[6] = 0;
        c.accepted[7] = q + 1;
      }
    } else {
      c.accepted[1] = 2, slot_ref(1, 1) = 0;          // read slot 0, conv slot fine
      c.accepted[2] = 3, slot_ref(2, 2) = bad_state;  // read slot out of range
      c.token_counts[3] = 0;
      c.token_counts[4] = q + 1;
      if (setup.records) {
        c.record_rows[6] = int32_t(c.record_slots);
        c.record_rows[7] = -1;
      } else {
        c.accepted[6] = 2, slot_ref(6, 1) = -3;
        c.accepted[7] = 2, slot_ref(7, 0) = -2;       // conv slot bad, read slot fine
      }
    }
    const std::vector<int> valid = {0, 5};
    const std::vector<int> padding = {1, 2, 3, 4, 6, 7};
    const std::vector<double> conv_in = conv_buffer_input(c);
    for (Precision p : {kF64, kF32}) {
      const KdaResult r = kda_decode(c.problem(), p);
      for (int b : padding)
        for (int t = 0; t < q; ++t) {
          const int64_t row = int64_t(b) * q + t;
          for (int64_t k = 0; k < c.dim; ++k) {
            ASSERT_EQ(r.output[row * c.dim + k], 0.0) << "padding request " << b;
            ASSERT_EQ(r.raw_g[row * c.dim + k], 0.0) << "padding request " << b;
          }
        }
      // Every slot that no valid request names (the padding requests' slots among them) is byte-identical.
      for (int64_t s = 0; s < c.state_slots; ++s) {
        bool named_by_valid = false;
        for (int b : valid)
          for (int t = 0; t < q; ++t) named_by_valid |= c.slot(b, t) == s;
        if (named_by_valid) continue;
        EXPECT_SAME_BITS(state_slot(c, r.state, s), input_state_slot(c, s), "state slot " << s);
        if (s < c.conv_state_slots)
          EXPECT_SAME_BITS(slice(r.conv_state, s * c.conv_slot_stride, c.conv_slot_stride),
                           slice(conv_in, s * c.conv_slot_stride, c.conv_slot_stride), "conv slot " << s);
      }
      if (setup.records) {
        EXPECT_SAME_BITS(r.state, std::vector<double>(c.state.begin(), c.state.end()), "record mode writes no state");
        for (int64_t row = 0; row < c.record_slots; ++row) {
          const bool written = row == c.record_rows[0] || row == c.record_rows[5];
          for (int64_t i = 0; i < int64_t(o.heads) * q * kD; ++i)
            ASSERT_EQ(std::isnan(r.record_correction[row * o.heads * q * kD + i]), !written) << "record row " << row;
        }
      }
      for (int b : valid) {
        double sum = 0;
        for (int64_t k = 0; k < c.dim; ++k) sum += std::fabs(r.output[int64_t(b) * q * c.dim + k]);
        EXPECT_GT(sum, 0.0) << "valid request " << b << " ran";
      }
    }
  }
}

// A verify (q = 2..8, any accepted count A and token count n) equals n chained single-token steps from slot slots[b, A-1], bitwise in float32.
TEST(KdaReferenceInvariants, VerifyEqualsSequentialSingleSteps) {
  const uint64_t seed = fresh_seed();
  for (int q = 2; q <= 8; ++q) {
    CaseOptions o;
    o.batch = 2;
    o.heads = 2;
    o.tokens = q;
    o.token_counts = true;
    o.gate_mode = KdaGateMode(q % 3);
    o.conv_tap_major = q % 2 == 0;
    KdaCase c = make_case(o, seed + q);
    c.accepted[0] = 1;  // A = 1, every token accepted
    c.token_counts[0] = q;
    const KdaResult r = kda_decode(c.problem(), kF32);
    for (int b = 0; b < o.batch; ++b) {
      const int a = c.accepted[b], n = c.token_counts[b];
      SCOPED_TRACE("q " + std::to_string(q) + " A " + std::to_string(a) + " n " + std::to_string(n));
      const SequentialSteps seq = run_sequential(c, b, a, n);
      for (int t = 0; t < n; ++t) {
        const int64_t row = int64_t(b) * q + t;
        EXPECT_SAME_BITS(slice(r.output, row * c.dim, c.dim), seq.output[t], "output row t=" << t);
        EXPECT_SAME_BITS(slice(r.raw_g, row * c.dim, c.dim), seq.raw_g[t], "raw_g t=" << t);
        EXPECT_SAME_BITS(slice(r.conv_out, row * c.channels, c.channels), seq.conv_out[t], "conv_out t=" << t);
        EXPECT_SAME_BITS(state_slot(c, r.state, c.slot(b, t)), seq.state[t], "state after token " << t);
      }
      // The verify's taps n-1 .. n+1 are the last single step's window.
      for (int64_t ch = 0; ch < c.channels; ++ch)
        for (int j = 0; j < 3; ++j)
          ASSERT_EQ(r.conv_state[c.conv_index(c.slot(b, 0), ch, n - 1 + j)], seq.conv_window[ch * 3 + j]) << ch << " " << j;
    }
  }
}

// q = 1 equals a verify with one token (token_counts = 1, A = 1) on the same inputs, in both precisions.
TEST(KdaReferenceInvariants, SingleStepEqualsVerifyWithOneToken) {
  const uint64_t seed = fresh_seed();
  CaseOptions o;
  o.batch = 3;
  o.heads = 2;
  o.tokens = 4;
  o.token_counts = true;
  KdaCase c = make_case(o, seed);
  for (int b = 0; b < o.batch; ++b) c.accepted[b] = 1, c.token_counts[b] = 1;
  // The q = 1 problem: rows b * 4, slots[b, 0], the conv slot's first three taps.
  KdaProblem single = c.problem();
  single.tokens = 1;
  single.x_stride = 4 * c.x_stride;
  single.f_a_stride = 4 * c.f_a_stride;
  single.raw_beta_stride = 4 * c.raw_beta_stride;
  single.output_gate_stride = 4 * c.output_gate_stride;
  std::vector<int32_t> slots1(o.batch);
  for (int b = 0; b < o.batch; ++b) slots1[b] = c.slot(b, 0);
  single.slots = slots1.data();
  single.accepted = nullptr;
  single.token_counts = nullptr;
  for (Precision p : {kF64, kF32}) {
    const KdaResult verify = kda_decode(c.problem(), p);
    const KdaResult step = kda_decode(single, p);
    for (int b = 0; b < o.batch; ++b) {
      EXPECT_SAME_BITS(slice(verify.output, int64_t(b) * 4 * c.dim, c.dim), slice(step.output, b * c.dim, c.dim), "output " << b);
      for (int t = 1; t < 4; ++t)
        for (int64_t k = 0; k < c.dim; ++k) ASSERT_EQ(verify.output[(int64_t(b) * 4 + t) * c.dim + k], 0.0) << "row t >= n";
    }
    EXPECT_SAME_BITS(verify.state, step.state, "state buffer");
    EXPECT_SAME_BITS(verify.conv_state, step.conv_state, "conv buffer (taps 3-5 untouched by both)");
  }
}

// Taps 0..n+1 of the conv slot become [c_A, c_{A+1}, x_0..x_{n-1}], later taps stay; rows t >= n are zero and write no state.
TEST(KdaReferenceInvariants, ConvWindowRewriteFollowsTokenCounts) {
  const uint64_t seed = fresh_seed();
  CaseOptions o;
  o.batch = 4;
  o.heads = 1;
  o.tokens = 4;
  o.token_counts = true;
  for (bool tap_major : {false, true}) {
    o.conv_tap_major = tap_major;
    KdaCase c = make_case(o, seed + tap_major);
    c.accepted = {1, 2, 3, 4};
    c.token_counts = {2, 4, 1, 3};
    const std::vector<double> conv_in = conv_buffer_input(c);
    for (Precision p : {kF64, kF32}) {
      const KdaResult r = kda_decode(c.problem(), p);
      for (int b = 0; b < o.batch; ++b) {
        const int a = c.accepted[b], n = c.token_counts[b];
        const int64_t s = c.slot(b, 0);
        for (int64_t ch = 0; ch < c.channels; ++ch) {
          for (int j = 0; j < c.taps; ++j) {
            double want;
            if (j < 2) want = c.conv_input(s, ch, a + j);
            else if (j < n + 2) want = from_bf16(c.x[(int64_t(b) * o.tokens + j - 2) * c.x_stride + ch]);
            else want = conv_in[c.conv_index(s, ch, j)];
            ASSERT_EQ(r.conv_state[c.conv_index(s, ch, j)], want) << "b " << b << " channel " << ch << " tap " << j;
          }
        }
        for (int t = 0; t < o.tokens; ++t) {
          const int64_t row = int64_t(b) * o.tokens + t;
          double sum = 0;
          for (int64_t k = 0; k < c.dim; ++k) sum += std::fabs(r.output[row * c.dim + k]);
          const int32_t ws = c.slot(b, t);
          if (t < n) {
            EXPECT_GT(sum, 0.0);
            EXPECT_NE(first_difference(state_slot(c, r.state, ws), input_state_slot(c, ws)), -1) << "token " << t << " written";
          } else {
            EXPECT_EQ(sum, 0.0) << "row t >= n";
            EXPECT_SAME_BITS(state_slot(c, r.state, ws), input_state_slot(c, ws), "slot of padding row " << t);
          }
        }
      }
    }
  }
}

// Records: deferred rows (record_rows) hold exactly the direct rows; k is the post-conv k, raw_g the gate; no state slot is written; output and conv state match the non-record verify.
TEST(KdaReferenceInvariants, RecordsDirectAndDeferred) {
  const uint64_t seed = fresh_seed();
  CaseOptions o;
  o.batch = 3;
  o.heads = 2;
  o.tokens = 3;
  o.token_counts = true;
  KdaCase c = make_case(o, seed);
  c.token_counts = {3, 1, 2};
  for (Precision p : {kF64, kF32}) {
    c.o.records = false;
    const KdaResult plain = kda_decode(c.problem(), p);
    c.o.records = true;
    c.o.deferred_rows = false;
    const KdaResult direct = kda_decode(c.problem(), p);
    c.o.deferred_rows = true;
    const KdaResult deferred = kda_decode(c.problem(), p);
    const std::vector<double> state_in(c.state.begin(), c.state.end());
    for (const KdaResult* r : {&direct, &deferred}) {
      EXPECT_SAME_BITS(r->state, state_in, "record mode writes no state");
      EXPECT_SAME_BITS(r->output, plain.output, "output");
      EXPECT_SAME_BITS(r->conv_state, plain.conv_state, "conv state");
    }
    const int64_t per_token = kD, heads = o.heads, q = o.tokens;
    std::vector<bool> used(c.record_slots, false);
    for (int b = 0; b < o.batch; ++b) {
      const int64_t row_deferred = c.record_rows[b];
      used[row_deferred] = true;
      for (int h = 0; h < o.heads; ++h)
        for (int t = 0; t < q; ++t) {
          const int64_t dc = ((int64_t(b) * heads + h) * q + t) * per_token;
          const int64_t fc = ((row_deferred * heads + h) * q + t) * per_token;
          const bool ran = t < c.token_counts[b];
          for (int i = 0; i < kD; ++i) {
            ASSERT_EQ(std::isnan(direct.record_correction[dc + i]), !ran);
            ASSERT_EQ(std::isnan(deferred.record_correction[fc + i]), !ran);
            ASSERT_EQ(std::isnan(deferred.record_key_gate[2 * fc + i]), !ran);
            ASSERT_EQ(std::isnan(deferred.record_key_gate[2 * fc + kD + i]), !ran);
          }
          if (!ran) continue;
          EXPECT_SAME_BITS(slice(deferred.record_correction, fc, kD), slice(direct.record_correction, dc, kD), "correction");
          EXPECT_SAME_BITS(slice(deferred.record_key_gate, 2 * fc, 2 * kD), slice(direct.record_key_gate, 2 * dc, 2 * kD), "key_gate");
          const int64_t row = int64_t(b) * q + t;
          EXPECT_SAME_BITS(slice(direct.record_key_gate, 2 * dc, kD), slice(plain.conv_out, row * c.channels + c.dim + h * kD, kD), "k");
          EXPECT_SAME_BITS(slice(direct.record_key_gate, 2 * dc + kD, kD), slice(plain.raw_g, row * c.dim + h * kD, kD), "raw_g");
        }
    }
    for (int64_t row = 0; row < c.record_slots; ++row) {
      if (used[row]) continue;
      for (int64_t i = 0; i < heads * q * kD; ++i) ASSERT_TRUE(std::isnan(deferred.record_correction[row * heads * q * kD + i]));
    }
  }
}

// Commit(n) of a record-mode verify equals the non-record verify's state after token n-1 bitwise (both precisions) and n single steps (float32).
TEST(KdaReferenceInvariants, CommitReplaysVerifyStateBitwise) {
  const uint64_t seed = fresh_seed();
  for (int q : {2, 4, 8}) {
    CaseOptions o;
    o.batch = 3;
    o.heads = 2;
    o.tokens = q;
    o.deferred_rows = q == 4;
    o.gate_mode = q == 8 ? KdaGateMode::kFourChains : KdaGateMode::kOneChain;
    KdaCase c = make_case(o, seed + q);
    c.accepted = {1, 1, 1};
    for (Precision p : {kF64, kF32}) {
      c.o.records = false;
      const KdaResult plain = kda_decode(c.problem(), p);
      c.o.records = true;
      const KdaResult verify = kda_decode(c.problem(), p);
      for (int n = 0; n <= q + 1; ++n) {
        std::vector<int32_t> commit_accepted(o.batch, n);
        commit_accepted[1] = std::max(0, n - 1);
        const std::vector<double> committed = kda_commit(c.problem(), verify, p, commit_accepted.data());
        for (int b = 0; b < o.batch; ++b) {
          const int folded = std::clamp(commit_accepted[b], 0, q);
          const int64_t checkpoint = c.slot(b, 0);
          const std::vector<double> want =
              folded == 0 ? input_state_slot(c, checkpoint) : state_slot(c, plain.state, c.slot(b, folded - 1));
          EXPECT_SAME_BITS(state_slot(c, committed, checkpoint), want, "q " << q << " b " << b << " n " << folded);
          if (p == kF32 && b == 0 && folded > 0 && n == folded) {
            const SequentialSteps seq = run_sequential(c, b, 1, folded);
            EXPECT_SAME_BITS(state_slot(c, committed, checkpoint), seq.state.back(), "vs single steps, n " << folded);
          }
        }
        // Nothing but the checkpoints changes.
        for (int64_t s = 0; s < c.state_slots; ++s)
          if (s != c.slot(0, 0) && s != c.slot(1, 0) && s != c.slot(2, 0))
            EXPECT_SAME_BITS(state_slot(c, committed, s), input_state_slot(c, s), "slot " << s);
      }
    }
  }
}

// The general commit with A > 1: the checkpoint is the verify's read slot slots[b, A-1]; out-of-range slots and record rows are skipped.
TEST(KdaReferenceInvariants, CommitFromLaterCheckpointAndSkips) {
  const uint64_t seed = fresh_seed();
  CaseOptions o;
  o.batch = 4;
  o.heads = 1;
  o.tokens = 4;
  o.deferred_rows = true;
  KdaCase c = make_case(o, seed);
  c.accepted = {2, 4, 3, 1};
  c.o.records = false;
  const KdaResult plain = kda_decode(c.problem(), kF32);
  c.o.records = true;
  const KdaResult verify = kda_decode(c.problem(), kF32);
  KdaCommitProblem commit;
  commit.batch = o.batch;
  commit.heads = o.heads;
  commit.tokens = o.tokens;
  commit.state = c.state.data();
  commit.state_slot_stride = c.state_slot_stride;
  commit.state_slots = c.state_slots;
  std::vector<int32_t> checkpoints(o.batch), n = {3, 2, 4, 1};
  for (int b = 0; b < o.batch; ++b) checkpoints[b] = c.slot(b, c.accepted[b] - 1);
  std::vector<int32_t> rows = c.record_rows;
  checkpoints[3] = 0;                  // skipped: slot 0
  rows[2] = int32_t(c.record_slots);   // skipped: record row out of range
  commit.slots = checkpoints.data();
  commit.accepted = n.data();
  commit.record_correction = verify.record_correction.data();
  commit.record_key_gate = verify.record_key_gate.data();
  commit.record_rows = rows.data();
  commit.record_slots = c.record_slots;
  commit.a_log = c.a_log.data();
  commit.dt_bias = c.dt_bias.data();
  commit.lower_bound = c.problem().lower_bound;
  const std::vector<double> committed = kda_commit(commit, kF32);
  for (int b = 0; b < 2; ++b)
    EXPECT_SAME_BITS(state_slot(c, committed, checkpoints[b]), state_slot(c, plain.state, c.slot(b, n[b] - 1)), "b " << b);
  const int32_t skipped = c.slot(2, c.accepted[2] - 1);
  EXPECT_SAME_BITS(state_slot(c, committed, skipped), input_state_slot(c, skipped), "skipped record row");
  EXPECT_SAME_BITS(state_slot(c, committed, c.slot(3, 0)), input_state_slot(c, c.slot(3, 0)), "skipped slot");
}

// Conv-state layout and dtype, conv-weight layout and dtype, row strides and a given raw gate (equal to the computed one) do not change any result bit.
TEST(KdaReferenceInvariants, LayoutsAndDtypesGiveIdenticalResults) {
  const uint64_t seed = fresh_seed();
  for (int q : {1, 3}) {
    CaseOptions base;
    base.batch = 3;
    base.heads = 2;
    base.tokens = q;
    base.token_counts = q > 1;
    std::vector<CaseOptions> variants;
    auto add = [&](auto change) { CaseOptions v = base; change(v); variants.push_back(v); };
    add([](CaseOptions& v) { v.conv_tap_major = true; });
    add([](CaseOptions& v) { v.conv_state_fp32 = true; });
    add([](CaseOptions& v) { v.conv_weight_tap_major = true; });
    add([](CaseOptions& v) { v.conv_weight_bf16 = true; });
    add([](CaseOptions& v) { v.packed = true; });
    add([](CaseOptions& v) { v.conv_tap_major = true, v.conv_state_fp32 = true, v.conv_weight_tap_major = true, v.conv_weight_bf16 = true; });
    for (Precision p : {kF64, kF32}) {
      const KdaCase ref_case = make_case(base, seed + q);
      const KdaResult ref = kda_decode(ref_case.problem(), p);
      for (const CaseOptions& v : variants) {
        const KdaCase vc = make_case(v, seed + q);
        const KdaResult r = kda_decode(vc.problem(), p);
        const std::string what = "q " + std::to_string(q) + " tap_major " + std::to_string(v.conv_tap_major) + " fp32 state " +
                                 std::to_string(v.conv_state_fp32) + " tap-major weight " + std::to_string(v.conv_weight_tap_major) +
                                 " bf16 weight " + std::to_string(v.conv_weight_bf16) + " packed " + std::to_string(v.packed);
        EXPECT_SAME_BITS(r.output, ref.output, what << " output");
        EXPECT_SAME_BITS(r.raw_g, ref.raw_g, what << " raw_g");
        EXPECT_SAME_BITS(conv_logical(vc, r.conv_state), conv_logical(ref_case, ref.conv_state), what << " conv state");
        for (int64_t s = 0; s < ref_case.state_slots; ++s)
          EXPECT_SAME_BITS(state_slot(vc, r.state, s), state_slot(ref_case, ref.state, s), what << " state slot " << s);
      }
      // A given raw gate equal to the projection's BF16 output (float32) gives the same bits.
      if (p == kF32) {
        KdaCase given = make_case(base, seed + q);
        given.o.given_raw_gate = true;
        for (int64_t row = 0; row < given.rows; ++row)
          for (int64_t k = 0; k < given.dim; ++k) given.raw_gate[row * given.raw_gate_stride + k] = bf16(ref.raw_g[row * given.dim + k]);
        // Padding rows (t >= n) have raw_g 0 in the result; they are not run either way.
        const KdaResult r = kda_decode(given.problem(), p);
        EXPECT_SAME_BITS(r.output, ref.output, "given raw gate output");
        EXPECT_SAME_BITS(r.state, ref.state, "given raw gate state");
      }
    }
  }
}

// The reference never writes its inputs.
TEST(KdaReferenceInvariants, InputsAreNeverModified) {
  const uint64_t seed = fresh_seed();
  CaseOptions o;
  o.batch = 2;
  o.heads = 1;
  o.tokens = 3;
  o.records = true;
  o.deferred_rows = true;
  o.token_counts = true;
  const KdaCase c = make_case(o, seed);
  const KdaCase before = c;
  for (Precision p : {kF64, kF32}) {
    const KdaResult r = kda_decode(c.problem(), p);
    (void)kda_commit(c.problem(), r, p);
  }
  EXPECT_EQ(c.x, before.x);
  EXPECT_EQ(c.f_a, before.f_a);
  EXPECT_EQ(c.raw_beta, before.raw_beta);
  EXPECT_EQ(c.output_gate, before.output_gate);
  EXPECT_EQ(c.conv_state_b, before.conv_state_b);
  EXPECT_EQ(0, std::memcmp(c.state.data(), before.state.data(), c.state.size() * sizeof(float)));
  EXPECT_EQ(c.slots, before.slots);
  EXPECT_EQ(c.accepted, before.accepted);
  EXPECT_EQ(c.token_counts, before.token_counts);
  EXPECT_EQ(c.record_rows, before.record_rows);
}

}  // namespace
}  // namespace fusedstep::reference

namespace fusedstep::reference {
namespace {

struct ToleranceStats {
  double output = 0;      // max |out32 - out64| / max(rms(out64 over the (row, head)), 0.5)
  double state = 0;       // max |S32 - S64| / max |S64| over the (slot, head)
  double correction = 0;  // max |c32 - c64| / max |c64| over the (record row, head, token)
  double conv = 0;        // max |qkv32 - qkv64| / (2^-8 |qkv64| + 2^-20): BF16 half ulp + FP32 conv rounding
};

// Worst of max|a - b| / max|b| over `count` blocks of `size` (NaN = unwritten, skipped).
double block_error(const std::vector<double>& a, const std::vector<double>& b, int64_t count, int64_t stride, int64_t size) {
  double worst = 0;
  for (int64_t i = 0; i < count; ++i) {
    double peak = 0, err = 0;
    for (int64_t j = 0; j < size; ++j) {
      const double x = a[i * stride + j], y = b[i * stride + j];
      if (std::isnan(x) || std::isnan(y)) continue;
      peak = std::max(peak, std::fabs(y));
      err = std::max(err, std::fabs(x - y));
    }
    if (peak > 0) worst = std::max(worst, err / peak);
  }
  return worst;
}

ToleranceStats measure(const KdaCase& c, const KdaResult& r32, const KdaResult& r64) {
  ToleranceStats st;
  const int64_t heads = c.o.heads;
  for (int64_t row = 0; row < c.rows; ++row)
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t base = row * c.dim + h * kD;
      double ss = 0;
      for (int v = 0; v < kD; ++v) ss += r64.output[base + v] * r64.output[base + v];
      const double scale = std::max(std::sqrt(ss / kD), 0.5);
      for (int v = 0; v < kD; ++v)
        st.output = std::max(st.output, std::fabs(r32.output[base + v] - r64.output[base + v]) / scale);
    }
  for (int64_t s = 0; s < c.state_slots; ++s)
    st.state = std::max(st.state, block_error(slice(r32.state, s * c.state_slot_stride, heads * kD * kD),
                                              slice(r64.state, s * c.state_slot_stride, heads * kD * kD), heads, kD * kD, kD * kD));
  if (!r32.record_correction.empty())
    st.correction = block_error(r32.record_correction, r64.record_correction, c.record_slots * heads * c.o.tokens, kD, kD);
  for (size_t i = 0; i < r64.conv_out.size(); ++i)
    st.conv = std::max(st.conv, std::fabs(r32.conv_out[i] - r64.conv_out[i]) /
                                    (std::ldexp(std::fabs(r64.conv_out[i]), -8) + std::ldexp(1.0, -20)));
  return st;
}

// float32 mode (the GPU's BF16 rounding points) stays within docs/numerics.md's tolerances of float64: heads 3 and 12, batch 1-5, q 1-4.
TEST(KdaReferenceTolerance, Float32WithinToleranceOfFloat64) {
  const uint64_t seed = fresh_seed();
  ToleranceStats worst;
  int index = 0;
  for (int heads : {3, 12})
    for (int q = 1; q <= 4; ++q) {
      CaseOptions o;
      o.heads = heads;
      o.tokens = q;
      o.batch = heads == 3 ? 5 : 1 + (q % 3);
      o.records = q > 1 && q % 2 == 0;
      o.gate_mode = KdaGateMode(index % 3);
      const KdaCase c = make_case(o, seed + index++);
      const ToleranceStats st = measure(c, kda_decode(c.problem(), kF32), kda_decode(c.problem(), kF64));
      worst.output = std::max(worst.output, st.output);
      worst.state = std::max(worst.state, st.state);
      worst.correction = std::max(worst.correction, st.correction);
      worst.conv = std::max(worst.conv, st.conv);
    }
  std::printf("[ tol      ] worst: output %.3e state %.3e correction %.3e conv %.3e\n", worst.output, worst.state,
              worst.correction, worst.conv);
  EXPECT_LE(worst.output, 0.1);
  EXPECT_LE(worst.state, 1.5e-2);
  EXPECT_LE(worst.correction, 1e-2);
  EXPECT_LE(worst.conv, 1.01);  // a BF16 half ulp can be 2^-8 |v| exactly; FP32 adds ~2^-22 relative
}

}  // namespace
}  // namespace fusedstep::reference
