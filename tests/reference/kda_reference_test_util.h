// SPDX-License-Identifier: Apache-2.0
// Helpers of the CPU reference's KDA suites (kda_stages_test.cc, kda_verify_test.cc,
// kda_commit_test.cc): one problem's host inputs in any layout (KdaCase, make_case),
// a request's chained single-token steps, slices of state and conv buffers, the
// bitwise comparison EXPECT_SAME_BITS and the per-block relative error block_error.
// Internal linkage: each test file gets its own copies; inline, so that a file may use
// only some of them.
#pragma once

#include "fusedstep_reference/kda_decode.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "common/seed.h"
#include "float_bits.h"

namespace fusedstep::reference {
namespace {

constexpr int kD = 128;
constexpr Precision kF32 = Precision::kFloat32;
constexpr Precision kF64 = Precision::kFloat64;

using fusedstep::testing::fresh_seed;

inline uint16_t bf16(double v) { return bits::bf16_rne(static_cast<float>(v)); }
inline double from_bf16(uint16_t b) { return bits::bf16_to_f32(b); }

// Index of the first element whose bits differ (NaN == NaN), or -1.
inline int64_t first_difference(const std::vector<double>& a, const std::vector<double>& b) {
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
  // The recurrent state's values rounded to BF16 (the FP32 buffer `state` and the BF16
  // buffer `state_b` then hold the same numbers); state_bf16 passes the BF16 buffer.
  // Both are set after the seed's values are drawn, so they change no other value.
  bool bf16_state_values = false;
  bool state_bf16 = false;            // implies bf16_state_values
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
  std::vector<uint16_t> state_b;      // bf16_state_values / state_bf16 only: the bits of `state`
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
    if (o.state_bf16 && state_b.size() != state.size()) ADD_FAILURE() << "state_bf16 on a case made without BF16 state values";
    p.state = o.state_bf16 ? static_cast<const void*>(state_b.data()) : state.data();
    p.state_bf16 = o.state_bf16;
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

inline KdaCase make_case(const CaseOptions& o, uint64_t seed) {
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
  if (o.bf16_state_values || o.state_bf16) {
    c.state_b.resize(c.state.size());
    for (size_t i = 0; i < c.state.size(); ++i) {
      c.state_b[i] = bits::bf16_rne(c.state[i]);
      c.state[i] = bits::bf16_to_f32(c.state_b[i]);
    }
  }

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
// The chain's state is FP32, or with bf16_state a BF16 buffer that every step rounds
// its state into (the case's state values must then be BF16).
struct SequentialSteps {
  std::vector<std::vector<double>> output, raw_g, conv_out;  // per step: one row
  std::vector<std::vector<double>> state;                    // per step: heads * 128 * 128
  std::vector<double> conv_window;                           // final [channel][3 taps]
};

inline SequentialSteps run_sequential(const KdaCase& c, int b, int accepted, int steps, bool bf16_state = false) {
  const int q = c.o.tokens;
  const int64_t head_block = int64_t(c.o.heads) * kD * kD;
  std::vector<float> conv(2 * c.channels * 3, 0.0f), state(2 * head_block, 0.0f);
  for (int64_t ch = 0; ch < c.channels; ++ch)
    for (int j = 0; j < 3; ++j) conv[(c.channels + ch) * 3 + j] = static_cast<float>(c.conv_input(c.slot(b, 0), ch, accepted - 1 + j));
  std::copy_n(c.state.data() + c.slot(b, accepted - 1) * c.state_slot_stride, head_block, state.begin() + head_block);
  std::vector<uint16_t> state_bits(state.size());
  auto to_bits = [&] { std::transform(state.begin(), state.end(), state_bits.begin(), bits::bf16_rne); };
  to_bits();
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
    p.state = bf16_state ? static_cast<const void*>(state_bits.data()) : state.data();
    p.state_bf16 = bf16_state;
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
    to_bits();  // exact when bf16_state (the step stored BF16 values)
    std::transform(r.conv_state.begin(), r.conv_state.end(), conv.begin(), [](double v) { return static_cast<float>(v); });
    out.state.emplace_back(r.state.begin() + head_block, r.state.end());
  }
  out.conv_window.assign(conv.begin() + c.channels * 3, conv.end());
  return out;
}

// Worst of max|a - b| / max|b| over `count` blocks of `size` (NaN = unwritten, skipped).
inline double block_error(const std::vector<double>& a, const std::vector<double>& b, int64_t count, int64_t stride,
                          int64_t size) {
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

inline std::vector<double> slice(const std::vector<double>& v, int64_t begin, int64_t count) {
  return std::vector<double>(v.begin() + begin, v.begin() + begin + count);
}

inline std::vector<double> state_slot(const KdaCase& c, const std::vector<double>& buffer, int64_t slot) {
  return slice(buffer, slot * c.state_slot_stride, int64_t(c.o.heads) * kD * kD);
}

inline std::vector<double> input_state_slot(const KdaCase& c, int64_t slot) {
  const float* s = c.state.data() + slot * c.state_slot_stride;
  return std::vector<double>(s, s + int64_t(c.o.heads) * kD * kD);
}

}  // namespace
}  // namespace fusedstep::reference
