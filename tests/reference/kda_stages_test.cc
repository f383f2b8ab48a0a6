// SPDX-License-Identifier: Apache-2.0
// The CPU reference's KDA stage arithmetic: SiLU, sigmoid, decay, the q/k L2 norm, the
// dot tree, the conv window, one recurrence step and the gate modes against
// hand-computed values and a naive float64 evaluation; float32 mode within
// docs/numerics.md's tolerances of float64.
#include "fusedstep_reference/kda_decode.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "reference/kda_reference_test_util.h"

namespace fusedstep::reference {
namespace {

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
// float32 vs float64

struct ToleranceStats {
  double output = 0;      // max |out32 - out64| / max(rms(out64 over the (row, head)), 0.5)
  double state = 0;       // max |S32 - S64| / max |S64| over the (slot, head)
  double correction = 0;  // max |c32 - c64| / max |c64| over the (record row, head, token)
  double conv = 0;        // max |qkv32 - qkv64| / (2^-8 |qkv64| + 2^-20): BF16 half ulp + FP32 conv rounding
};

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
