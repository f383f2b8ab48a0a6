// SPDX-License-Identifier: Apache-2.0
// Contract: the mHC CPU reference follows docs/numerics.md "mHC shifted boundary" stage by stage (float32 mode) and its float32 mode agrees with its float64 truth within the bounds stated there.
#include "fusedstep_reference/mhc_boundary.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "common/seed.h"
#include "float_bits.h"
#include "mhc_boundary/layout.h"

namespace {

using fusedstep::WeightRounding;
using fusedstep::reference::MhcBoundaryProblem;
using fusedstep::reference::MhcBoundaryResult;
using fusedstep::reference::Precision;
namespace ref = fusedstep::reference;
namespace bits = fusedstep::bits;

constexpr WeightRounding kModes[] = {WeightRounding::kTf32Rna, WeightRounding::kTf32Rne,
                                     WeightRounding::kFp32};

using fusedstep::testing::fresh_seed;

uint16_t bf(float v) { return bits::bf16_rne(v); }
float from_bf(uint16_t b) { return bits::bf16_to_f32(b); }

// Owns the inputs of a problem.
struct Inputs {
  int64_t tokens = 0, hidden = 0;
  std::vector<uint16_t> x, residual, norm_weight;
  std::vector<float> post, comb, pre_lag, fn, scale, base;
  MhcBoundaryProblem problem(WeightRounding rounding) const {
    MhcBoundaryProblem p;
    p.tokens = tokens;
    p.hidden = hidden;
    p.x = x.data();
    p.residual = residual.data();
    p.post = post.data();
    p.comb = comb.data();
    p.pre_lag = pre_lag.data();
    p.fn = fn.data();
    p.scale = scale.data();
    p.base = base.data();
    p.norm_weight = norm_weight.data();
    p.rounding = rounding;
    return p;
  }
};

// All zeros except scale = 1 and norm_weight = 1; comb is the identity, so that
// residual_out = residual unless a test says otherwise.
Inputs plain_inputs(int64_t tokens, int64_t hidden) {
  Inputs in;
  in.tokens = tokens;
  in.hidden = hidden;
  in.x.assign(size_t(tokens * hidden), 0);
  in.residual.assign(size_t(tokens * 4 * hidden), 0);
  in.norm_weight.assign(size_t(hidden), bf(1.0f));
  in.post.assign(size_t(tokens * 4), 0.0f);
  in.comb.assign(size_t(tokens * 16), 0.0f);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int j = 0; j < 4; ++j) in.comb[size_t(t * 16 + 5 * j)] = 1.0f;
  }
  in.pre_lag.assign(size_t(tokens * 4), 0.0f);
  in.fn.assign(size_t(24 * 4 * hidden), 0.0f);
  in.scale.assign(3, 1.0f);
  in.base.assign(24, 0.0f);
  return in;
}

// Realistic magnitudes: activations and streams ~ N(0, 1) in BF16, post in (0, 2),
// comb and pre positive, fn ~ N(0, 0.02^2), scale ~ 1, base ~ N(0, 0.5^2).
Inputs random_inputs(std::mt19937_64& rng, int64_t tokens, int64_t hidden) {
  Inputs in = plain_inputs(tokens, hidden);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  const float stream_scale = 0.5f + 2.0f * unit(rng);
  for (auto& v : in.x) v = bf(normal(rng));
  for (auto& v : in.residual) v = bf(stream_scale * normal(rng));
  for (auto& v : in.norm_weight) v = bf(1.0f + 0.2f * normal(rng));
  for (auto& v : in.post) v = 2.0f * unit(rng);
  for (auto& v : in.comb) v = unit(rng) * 0.5f;
  for (auto& v : in.pre_lag) v = 0.05f + unit(rng);
  for (auto& v : in.fn) v = 0.02f * normal(rng);
  for (auto& v : in.scale) v = 0.25f + 1.5f * unit(rng);
  for (auto& v : in.base) v = 0.5f * normal(rng);
  return in;
}

// ---------------------------------------------------------------- stage 1: residual update

// The residual update is mul then an FMA chain over j = 0..3, per the contract.
TEST(MhcReferenceStages, ResidualUpdateHandComputed) {
  const float comb_js[4] = {0.25f, 0.5f, 1.0f, 2.0f};
  const float r[4] = {4.0f, 2.0f, -1.0f, 0.5f};
  EXPECT_EQ(ref::residual_update_f32(0.5f, 3.0f, comb_js, r), 3.5f);  // 1.5 + 1 + 1 - 1 + 1
  const double comb_d[4] = {0.25, 0.5, 1.0, 2.0}, r_d[4] = {4.0, 2.0, -1.0, 0.5};
  EXPECT_EQ(ref::residual_update_f64(0.5, 3.0, comb_d, r_d), 3.5);
  // fused: -1 + (1 + 2^-12)^2 = 2^-11 + 2^-24 exactly (a separate multiply would lose 2^-24).
  const float c1[4] = {1.0f + 0x1p-12f, 0.0f, 0.0f, 0.0f};
  const float r1[4] = {1.0f + 0x1p-12f, 0.0f, 0.0f, 0.0f};
  EXPECT_EQ(ref::residual_update_f32(-1.0f, 1.0f, c1, r1), 0x1p-11f + 0x1p-24f);
}

// mul.ftz / fma.ftz: subnormal inputs and results of the residual update flush to
// signed zero in float32 mode; float64 keeps them.
TEST(MhcReferenceStages, ResidualUpdateFlushesSubnormals) {
  const float zero4[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  const double zero4d[4] = {0.0, 0.0, 0.0, 0.0};
  // Subnormal product.
  EXPECT_EQ(ref::residual_update_f32(0x1p-70f, 0x1p-70f, zero4, zero4), 0.0f);
  // -0 from the flushed product survives FMAs that add -0 (comb = -0): the sign is kept.
  const float negative_zeros[4] = {-0.0f, -0.0f, -0.0f, -0.0f};
  const float negative = ref::residual_update_f32(-0x1p-70f, 0x1p-70f, negative_zeros, zero4);
  EXPECT_EQ(negative, 0.0f);
  EXPECT_TRUE(std::signbit(negative)) << "the flush keeps the sign";
  EXPECT_EQ(ref::residual_update_f64(0x1p-70, 0x1p-70, zero4d, zero4d), 0x1p-140);
  // Subnormal input: 2^-130 * 2^100 would be a normal 2^-30 without the flush.
  EXPECT_EQ(ref::residual_update_f32(0x1p-130f, 0x1p100f, zero4, zero4), 0.0f);
  EXPECT_EQ(ref::residual_update_f64(0x1p-130, 0x1p100, zero4d, zero4d), 0x1p-30);
  // A subnormal partial is gone before the next FMA: 2^-125 instead of 2^-125 + 3 * 2^-128.
  const float c[4] = {1.0f, 0.0f, 0.0f, 0.0f}, r[4] = {0x1p-125f, 0.0f, 0.0f, 0.0f};
  EXPECT_EQ(ref::residual_update_f32(3.0f * 0x1p-64f, 0x1p-64f, c, r), 0x1p-125f);
  // An FMA result that is subnormal flushes; the smallest normal stays.
  const float c2[4] = {0x1p-64f, 0.0f, 0.0f, 0.0f}, r2[4] = {0x1p-63f, 0.0f, 0.0f, 0.0f};
  EXPECT_EQ(ref::residual_update_f32(0.0f, 0.0f, c2, r2), 0.0f);
  const float r3[4] = {0x1p-62f, 0.0f, 0.0f, 0.0f};
  EXPECT_EQ(ref::residual_update_f32(0.0f, 0.0f, c2, r3), 0x1p-126f);

  // The same through the whole boundary: one element whose terms are all subnormal.
  Inputs in = plain_inputs(1, 512);
  for (auto& c_ : in.comb) c_ = 0.0f;
  in.post[0] = 0x1p-70f;
  in.x[7] = bf(0x1p-70f);
  in.x[8] = bf(1.0f);
  for (WeightRounding mode : kModes) {
    const MhcBoundaryResult f32 = ref::mhc_boundary(in.problem(mode), Precision::kFloat32);
    const MhcBoundaryResult f64 = ref::mhc_boundary(in.problem(mode), Precision::kFloat64);
    EXPECT_EQ(f32.residual_out[7], 0.0);
    EXPECT_EQ(f64.residual_out[7], 0x1p-140);
    EXPECT_EQ(f32.residual_out[8], 0x1p-70) << "a normal product passes";
  }
}

// ---------------------------------------------------------------- stage 2: lagged collapse

// The collapse is an IEEE FMA chain from +0.
TEST(MhcReferenceStages, LaggedCollapseHandComputed) {
  const float pre[4] = {0.5f, 0.25f, 0.125f, 1.0f};
  const float cur[4] = {2.0f, 4.0f, 8.0f, -1.0f};
  EXPECT_EQ(ref::lagged_collapse_f32(pre, cur), 2.0f);
  // From +0: four -0 terms give +0, not -0.
  const float ones[4] = {1.0f, 1.0f, 1.0f, 1.0f};
  const float negative_zeros[4] = {-0.0f, -0.0f, -0.0f, -0.0f};
  EXPECT_FALSE(std::signbit(ref::lagged_collapse_f32(ones, negative_zeros)));
  // No FTZ here: a subnormal collapse survives (the BF16 rounding keeps 2^-130 too).
  const float tiny[4] = {0x1p-130f, 0.0f, 0.0f, 0.0f};
  EXPECT_EQ(ref::lagged_collapse_f32(ones, tiny), 0x1p-130f);
  // Fused: -1 + (1 + 2^-12)^2 keeps 2^-24 (in the other order the first FMA rounds).
  const float p2[4] = {1.0f, 1.0f + 0x1p-12f, 0.0f, 0.0f};
  const float c2[4] = {-1.0f, 1.0f + 0x1p-12f, 0.0f, 0.0f};
  EXPECT_EQ(ref::lagged_collapse_f32(p2, c2), 0x1p-11f + 0x1p-24f);
}

// ------------------------------------------------- stages 3-4: sums of squares, layer input

// The sums of squares walk chunks as an even and an odd FMA lane over (pair, stream):
// with 4096 on stream 0 at hidden 6 and 1 on every other even element of the first
// chunk, the contract's order gives 2^24 + 12 (a stream-major order would give
// 2^24 + 4, the exact sum is 2^24 + 15).
TEST(MhcReferenceStages, SumOfSquaresFollowsTheChunkOrder) {
  Inputs in = plain_inputs(1, 512);
  const int64_t H = in.hidden;
  for (int j = 0; j < 4; ++j) {
    for (int h : {0, 2, 4, 6}) in.residual[size_t(j * H + h)] = bf(1.0f);
  }
  in.residual[6] = bf(4096.0f);
  in.pre_lag[0] = 1.0f;  // li = stream 0: 1, 1, 1, 4096 on the even lane -> 3 + 2^24 ties to 2^24 + 4
  for (WeightRounding mode : kModes) {
    const MhcBoundaryResult f32 = ref::mhc_boundary(in.problem(mode), Precision::kFloat32);
    const MhcBoundaryResult f64 = ref::mhc_boundary(in.problem(mode), Precision::kFloat64);
    EXPECT_EQ(f32.ssq[0], 0x1p24 + 12.0);
    EXPECT_EQ(f64.ssq[0], 0x1p24 + 15.0);
    EXPECT_EQ(f32.ssq_li[0], 0x1p24 + 4.0);
    EXPECT_EQ(f64.ssq_li[0], 0x1p24 + 3.0);
  }
}

// layer_input = bf16((li * rsqrt(ssq_li / H + norm_eps)) * norm_weight): with li = 2
// everywhere and norm_eps = 0, rstd = 1/2 and the output is the norm weight.
TEST(MhcReferenceStages, LayerInputHandComputed) {
  std::mt19937_64 rng(fresh_seed());
  std::normal_distribution<float> normal(1.0f, 0.3f);
  Inputs in = plain_inputs(2, 1024);
  const int64_t H = in.hidden;
  for (int64_t t = 0; t < 2; ++t) {
    for (int64_t h = 0; h < H; ++h) in.residual[size_t(t * 4 * H + 2 * H + h)] = bf(2.0f);
    in.pre_lag[size_t(t * 4 + 2)] = 1.0f;
  }
  for (auto& w : in.norm_weight) w = bf(normal(rng));
  for (WeightRounding mode : kModes) {
    MhcBoundaryProblem p = in.problem(mode);
    p.norm_eps = 0.0f;
    for (Precision precision : {Precision::kFloat32, Precision::kFloat64}) {
      const MhcBoundaryResult out = ref::mhc_boundary(p, precision);
      for (int64_t t = 0; t < 2; ++t) {
        EXPECT_EQ(out.ssq_li[size_t(t)], 4.0 * double(H));
        for (int64_t h = 0; h < H; ++h) {
          ASSERT_EQ(out.li[size_t(t * H + h)], 2.0);
          ASSERT_EQ(out.layer_input[size_t(t * H + h)], double(from_bf(in.norm_weight[size_t(h)])))
              << "t " << t << " h " << h;
        }
      }
    }
  }
}

// ------------------------------------------------------------ stages 5 and 8: projection

// With small-integer weights and streams every product and partial sum is exact, so
// the float32 walk over slices, warps and k steps must equal the float64 dot product:
// each of the 4 * hidden columns is visited exactly once.
TEST(MhcReferenceStages, ProjectionVisitsEveryColumnOnce) {
  std::mt19937_64 rng(fresh_seed());
  std::uniform_int_distribution<int> small(-8, 8);
  for (int64_t hidden : {512, 1024, 2048}) {
    Inputs in = plain_inputs(2, hidden);
    for (auto& v : in.residual) v = bf(float(small(rng)));
    for (auto& v : in.fn) v = float(small(rng));
    for (WeightRounding mode : kModes) {
      const MhcBoundaryResult f32 = ref::mhc_boundary(in.problem(mode), Precision::kFloat32);
      const MhcBoundaryResult f64 = ref::mhc_boundary(in.problem(mode), Precision::kFloat64);
      ASSERT_EQ(f32.residual_out, f64.residual_out);
      for (size_t i = 0; i < f32.mix.size(); ++i) {
        ASSERT_EQ(f32.mix[i], f64.mix[i]) << "hidden " << hidden << " mix " << i;
      }
      ASSERT_EQ(f32.ssq, f64.ssq);
    }
  }
}

// The rounding rule is part of the semantics: a TF32 tie (1 + 2^-11) multiplies as
// 1 + 2^-10 (RNA), 1 (RNE) or itself (FP32), in both modes; kFp32 in float64 mode is
// the plain double dot product of the unrounded weight.
TEST(MhcReferenceStages, WeightRoundingModesDiffer) {
  Inputs in = plain_inputs(1, 512);
  const int64_t K = 4 * in.hidden;
  const int64_t column = 2 * in.hidden + 77;  // stream 2, hidden 77
  in.residual[size_t(column)] = bf(3.0f);
  in.fn[size_t(5 * K + column)] = 1.0f + 0x1p-11f;
  const double want[3] = {3.0 * (1.0 + 0x1p-10), 3.0, 3.0 * (1.0 + 0x1p-11)};
  for (int m = 0; m < 3; ++m) {
    for (Precision precision : {Precision::kFloat32, Precision::kFloat64}) {
      const MhcBoundaryResult out = ref::mhc_boundary(in.problem(kModes[m]), precision);
      EXPECT_EQ(out.mix[5], want[m]) << "mode " << m;
      for (int n = 0; n < 24; ++n) {
        if (n != 5) {
          EXPECT_EQ(out.mix[size_t(n)], 0.0);
        }
      }
    }
  }
  std::mt19937_64 rng(fresh_seed());
  Inputs r = random_inputs(rng, 2, 512);
  const MhcBoundaryResult fp32 = ref::mhc_boundary(r.problem(WeightRounding::kFp32), Precision::kFloat64);
  const MhcBoundaryResult rna = ref::mhc_boundary(r.problem(WeightRounding::kTf32Rna), Precision::kFloat64);
  for (int64_t t = 0; t < 2; ++t) {
    for (int n = 0; n < 24; ++n) {
      double dot = 0.0;
      for (int64_t k = 0; k < K; ++k) dot += double(r.fn[size_t(n * K + k)]) * fp32.residual_out[size_t(t * K + k)];
      EXPECT_EQ(fp32.mix[size_t(t * 24 + n)], dot);
      EXPECT_NE(rna.mix[size_t(t * 24 + n)], dot) << "TF32 rounding of random weights shows";
    }
  }
}

// ------------------------------------------------------- stages 6-7: coefficients, Sinkhorn

// Sigmoid and exp per the contract: sigmoid(0) = 1/2 exactly, the 2^126 clamp gives
// 2^-126 for very negative inputs, large inputs give 1; exp and sigmoid near the truth.
TEST(MhcReferenceStages, SigmoidAndExpValues) {
  EXPECT_EQ(ref::sigmoid_f32(0.0f), 0.5f);
  EXPECT_EQ(ref::sigmoid_f64(0.0), 0.5);
  EXPECT_EQ(ref::sigmoid_f32(-100.0f), 0x1p-126f);
  EXPECT_EQ(ref::sigmoid_f32(-1e30f), 0x1p-126f);
  EXPECT_EQ(ref::sigmoid_f32(-INFINITY), 0x1p-126f);
  EXPECT_EQ(ref::sigmoid_f32(100.0f), 1.0f);
  EXPECT_EQ(ref::exp_f32(0.0f), 1.0f);
  EXPECT_EQ(ref::exp_f32(-INFINITY), 0.0f);
  EXPECT_EQ(ref::rsqrt_f32(4.0f), 0.5f);
  for (float x = -20.0f; x <= 20.0f; x += 0.37f) {
    // The RN multiply by log2(e) (itself rounded to float) before ex2 costs up to
    // |x| * 2^-23 relative; the rest is within 2 ulp.
    const double truth = std::exp(double(x));
    const double exp_bound = truth * (std::fabs(x) + 2.0) * 0x1p-23;
    EXPECT_LE(std::fabs(double(ref::exp_f32(x)) - truth), exp_bound) << x;
    const double s = 1.0 / (1.0 + std::exp(-double(x)));
    const double sigmoid_bound = s * ((1.0 - s) * std::fabs(x) * 0x1p-23 + 0x1p-22);
    EXPECT_LE(std::fabs(double(ref::sigmoid_f32(x)) - s), sigmoid_bound) << x;
    EXPECT_NEAR(ref::sigmoid_f64(double(x)), s, 1e-15);
  }
}

// Coefficients from hand-picked mixes: a = fma(mix * rstd, scale, base) with rstd =
// rsqrt(ssq / 4H + rms_eps); zero logits give pre = 1/2 + eps, post = post_mult / 2 and
// a uniform comb that every pass keeps uniform.
TEST(MhcReferenceStages, CoefficientsHandComputed) {
  Inputs in = plain_inputs(1, 512);
  in.scale = {3.0f, 0.5f, 1.0f};
  in.base.assign(24, 0.0f);
  in.base[0] = -3.0f;  // a[0] = 2 * 1/2 * 3 - 3 = 0
  in.base[4] = 1.0f;   // a[4] = 4 * 1/2 * 1/2 + 1 = 2
  MhcBoundaryProblem p = in.problem(WeightRounding::kTf32Rna);
  p.rms_eps = 0.0f;
  p.post_mult = 2.0f;
  const float ssq = 4.0f * 512.0f * 4.0f;  // ssq / 4H = 4, rstd = 1/2
  for (int iters : {1, 2, 20}) {
    p.sinkhorn_iters = iters;
    float mix[24] = {};
    mix[0] = 2.0f;
    mix[4] = -4.0f;  // a[4] = -4 * 1/2 * 1/2 + 1 = 0
    float pre[4], post[4], comb[16];
    ref::coefficients_f32(mix, ssq, p, pre, post, comb);
    double mixd[24] = {}, pred[4], postd[4], combd[16];
    mixd[0] = 2.0;
    mixd[4] = -4.0;
    ref::coefficients_f64(mixd, double(ssq), p, pred, postd, combd);
    for (int j = 0; j < 4; ++j) {
      EXPECT_EQ(pre[j], 0.5f + p.hc_pre_eps);
      EXPECT_EQ(pred[j], 0.5 + double(p.hc_pre_eps));
      EXPECT_EQ(post[j], 1.0f);
      EXPECT_EQ(postd[j], 1.0);
    }
    // Uniform: v0 = 1/4 + eps, each pass v <- v / (4v + eps).
    const double eps = double(p.sinkhorn_eps);
    double v = 0.25 + eps;
    for (int pass = 0; pass < 2 * iters - 1; ++pass) v = v / (4.0 * v + eps);
    for (int i = 0; i < 16; ++i) {
      EXPECT_NEAR(combd[i], v, 1e-15) << "iters " << iters;
      EXPECT_NEAR(double(comb[i]), v, 4.0 * std::ldexp(v, -24)) << "iters " << iters;
    }
  }
}

// Softmax + eps and one column pass on a known matrix: rows [ln 3, 0, 0, 0] -> (1/2,
// 1/6, 1/6, 1/6), the other rows uniform; c = (p + eps) / (column sum + eps).
TEST(MhcReferenceStages, SinkhornOneIterationKnownAnswer) {
  for (double eps : {0.0, 1e-3, 1e-6}) {
    double logits[16] = {};
    logits[4] = std::log(3.0);
    double p[16];
    for (int i = 0; i < 16; ++i) p[i] = (i / 4 == 1 ? (i == 4 ? 0.5 : 1.0 / 6.0) : 0.25) + eps;
    double want[16];
    for (int k = 0; k < 4; ++k) {
      const double sum = p[k] + p[4 + k] + p[8 + k] + p[12 + k] + eps;
      for (int i = 0; i < 4; ++i) want[4 * i + k] = p[4 * i + k] / sum;
    }
    double got[16];
    ref::sinkhorn_f64(logits, 1, eps, got);
    float logits_f[16], got_f[16];
    for (int i = 0; i < 16; ++i) logits_f[i] = float(logits[i]);
    ref::sinkhorn_f32(logits_f, 1, float(eps), got_f);
    for (int i = 0; i < 16; ++i) {
      EXPECT_NEAR(got[i], want[i], 1e-15) << "eps " << eps << " entry " << i;
      EXPECT_NEAR(double(got_f[i]), want[i], std::ldexp(want[i], -20)) << "eps " << eps << " entry " << i;
    }
  }
  // eps = 0 and uniform logits: every float32 step is exact.
  const float zeros[16] = {};
  float out[16];
  ref::sinkhorn_f32(zeros, 1, 0.0f, out);
  for (float v : out) EXPECT_EQ(v, 0.25f);
}

// Sinkhorn invariant: after 20 iterations on random logits the matrix is doubly
// stochastic. Columns sum to 1 within 4e-6 (the last pass normalizes columns: eps plus
// rounding); rows within 1e-5 for logits in [-1, 1] and 1e-2 for logits in [-2, 2]
// (10x the worst of 200k random matrices each: 1e-6 and 1e-3; docs/numerics.md). Both
// modes, and float32 within 1e-6 of float64 on every entry.
TEST(MhcReferenceStages, SinkhornIsDoublyStochastic) {
  std::mt19937_64 rng(fresh_seed());
  for (const auto& [spread, row_bound] : {std::pair{1.0, 1e-5}, std::pair{2.0, 1e-2}}) {
    std::uniform_real_distribution<double> logit(-spread, spread);
    double worst_row = 0.0, worst_col = 0.0, worst_f32 = 0.0;
    for (int trial = 0; trial < 3000; ++trial) {
      float af[16];
      double a[16];
      for (int i = 0; i < 16; ++i) a[i] = af[i] = float(logit(rng));
      double c[16];
      float cf[16];
      ref::sinkhorn_f64(a, 20, double(1e-6f), c);
      ref::sinkhorn_f32(af, 20, 1e-6f, cf);
      for (int i = 0; i < 4; ++i) {
        double row = 0.0, col = 0.0, rowf = 0.0, colf = 0.0;
        for (int k = 0; k < 4; ++k) {
          row += c[4 * i + k];
          col += c[4 * k + i];
          rowf += cf[4 * i + k];
          colf += cf[4 * k + i];
        }
        worst_row = std::max({worst_row, std::fabs(row - 1.0), std::fabs(rowf - 1.0)});
        worst_col = std::max({worst_col, std::fabs(col - 1.0), std::fabs(colf - 1.0)});
      }
      for (int i = 0; i < 16; ++i) worst_f32 = std::max(worst_f32, std::fabs(double(cf[i]) - c[i]));
    }
    std::printf("[ info     ] logits in [-%g, %g]: max |row sum - 1| = %.3g, max |column sum - 1| = %.3g, "
                "max |float32 - float64| = %.3g\n", spread, spread, worst_row, worst_col, worst_f32);
    EXPECT_LE(worst_row, row_bound);
    EXPECT_LE(worst_col, 4e-6);
    EXPECT_LE(worst_f32, 1e-6);
  }
}

// ---------------------------------------------------------------------- whole boundary

// Edge cases: tokens = 0 returns empty outputs; invalid sizes throw; one Sinkhorn
// iteration still ends on a column pass.
TEST(MhcReferenceBoundary, EdgeCases) {
  MhcBoundaryProblem empty;
  empty.hidden = 4096;
  for (Precision precision : {Precision::kFloat32, Precision::kFloat64}) {
    const MhcBoundaryResult out = ref::mhc_boundary(empty, precision);
    EXPECT_TRUE(out.residual_out.empty() && out.layer_input.empty() && out.pre.empty() &&
                out.post.empty() && out.comb.empty() && out.mix.empty() && out.li.empty());
  }
  std::mt19937_64 rng(fresh_seed());
  Inputs in = random_inputs(rng, 2, 512);
  MhcBoundaryProblem p = in.problem(WeightRounding::kTf32Rna);
  p.sinkhorn_iters = 0;
  EXPECT_THROW(ref::mhc_boundary(p, Precision::kFloat64), std::invalid_argument);
  p.sinkhorn_iters = 1;
  p.hidden = 500;
  EXPECT_THROW(ref::mhc_boundary(p, Precision::kFloat32), std::invalid_argument);
  p.hidden = 512;
  p.fn = nullptr;
  EXPECT_THROW(ref::mhc_boundary(p, Precision::kFloat64), std::invalid_argument);
  p.fn = in.fn.data();
  // One iteration: column sums are S / (S + eps) for the softmax column sum S, exactly
  // 1 (up to rounding) with eps = 0.
  for (float eps : {0.0f, 1e-6f}) {
    p.sinkhorn_eps = eps;
    const MhcBoundaryResult f32 = ref::mhc_boundary(p, Precision::kFloat32);
    const MhcBoundaryResult f64 = ref::mhc_boundary(p, Precision::kFloat64);
    for (int64_t t = 0; t < 2; ++t) {
      for (int k = 0; k < 4; ++k) {
        double col = 0.0, colf = 0.0;
        for (int i = 0; i < 4; ++i) {
          col += f64.comb[size_t(t * 16 + 4 * i + k)];
          colf += f32.comb[size_t(t * 16 + 4 * i + k)];
        }
        if (eps == 0.0f) {
          EXPECT_NEAR(col, 1.0, 1e-15);
          EXPECT_NEAR(colf, 1.0, 1e-6);
        } else {
          EXPECT_TRUE(col < 1.0 && col > 1.0 - 1e-3) << col;
          EXPECT_TRUE(colf < 1.0 + 1e-6 && colf > 1.0 - 1e-3) << colf;
        }
      }
    }
  }
}

// Worst |float32 - float64| / bound of one output over the test, printed for the docs.
struct WorstRatio {
  const char* name;
  double ratio = 0.0;
  void check(double got, double want, double bound, const char* where_fmt, int64_t a, int64_t b) {
    const double err = std::fabs(got - want);
    ratio = std::max(ratio, err / bound);
    ASSERT_LE(err, bound) << name << " " << std::string(where_fmt) << " " << a << " " << b
                          << ": float32 " << got << " float64 " << want;
  }
};

constexpr double kU = 0x1p-24;   // FP32 unit roundoff
constexpr double kUb = 0x1p-8;   // BF16 unit roundoff
constexpr double kFtzSlack = 0x1p-120;  // flushed subnormal terms

// float32 mode vs float64 truth on random realistic problems, per output, against the
// bounds of docs/numerics.md ("Tolerances": first-order rounding analysis; the
// projection and the statistics of 4 * hidden rounded values use Hoeffding's bound at
// 8 root-sum-squares, failure probability < 1e-13). Stage checks compare each float32
// stage with exact arithmetic on that stage's own float32 inputs (deterministic bounds).
TEST(MhcReferenceBoundary, Float32AgreesWithFloat64) {
  std::mt19937_64 rng(fresh_seed());
  WorstRatio residual{"residual_out"}, li_w{"li"}, layer{"layer_input"}, mix_w{"mix"}, ssq_w{"ssq"},
      pre_w{"pre"}, post_w{"post"}, comb_w{"comb"};
  WorstRatio li_s{"li stage"}, layer_s{"layer_input stage"}, mix_s{"mix stage"}, ssq_s{"ssq stage"},
      ssq_li_s{"ssq_li stage"}, pre_s{"pre stage"}, post_s{"post stage"}, comb_s{"comb stage"};
  double worst_layer_norm = 0.0;
  for (int64_t hidden : {512, 1024}) {
    for (WeightRounding mode : kModes) {
      for (int repeat = 0; repeat < 2; ++repeat) {
        const int64_t T = 1 + int64_t(rng() % 4);
        const Inputs in = random_inputs(rng, T, hidden);
        MhcBoundaryProblem p = in.problem(mode);
        p.sinkhorn_iters = 1 + int(rng() % 20);
        const MhcBoundaryResult f = ref::mhc_boundary(p, Precision::kFloat32);
        const MhcBoundaryResult d = ref::mhc_boundary(p, Precision::kFloat64);
        const int64_t H = hidden, K = 4 * H, S = H / 16;
        std::vector<double> w(size_t(24 * K));
        for (size_t i = 0; i < w.size(); ++i) w[i] = bits::round_weight(in.fn[i], mode);
        for (int64_t t = 0; t < T; ++t) {
          const float* post = in.post.data() + t * 4;
          const float* comb = in.comb.data() + t * 16;
          const float* pre_lag = in.pre_lag.data() + t * 4;
          const double* rf = f.residual_out.data() + t * K;
          const double* rd = d.residual_out.data() + t * K;
          // residual_out: 5 FP32 roundings of partials bounded by M, then BF16.
          std::vector<double> tres(static_cast<size_t>(K));
          for (int64_t h = 0; h < H; ++h) {
            const double x = from_bf(in.x[size_t(t * H + h)]);
            for (int s = 0; s < 4; ++s) {
              double M = std::fabs(post[s] * x);
              for (int j = 0; j < 4; ++j) {
                M += std::fabs(double(comb[4 * j + s]) * from_bf(in.residual[size_t(t * K + j * H + h)]));
              }
              const int64_t k = s * H + h;
              tres[size_t(k)] = kUb * std::fabs(rd[k]) + 6.0 * kU * M + kFtzSlack;
              residual.check(rf[k], rd[k], tres[size_t(k)], "t, k", t, k);
            }
          }
          // li: propagated residual bounds, 4 FMA roundings, BF16.
          std::vector<double> tli(static_cast<size_t>(H));
          double ssq_li_exact = 0.0;
          for (int64_t h = 0; h < H; ++h) {
            double A = 0.0, B = 0.0, on_f32 = 0.0, abs_f32 = 0.0;
            for (int j = 0; j < 4; ++j) {
              A += pre_lag[j] * tres[size_t(j * H + h)];
              B += pre_lag[j] * (std::fabs(rd[j * H + h]) + tres[size_t(j * H + h)]);
              on_f32 += pre_lag[j] * rf[j * H + h];
              abs_f32 += std::fabs(pre_lag[j] * rf[j * H + h]);
            }
            const double lid = d.li[size_t(t * H + h)], lif = f.li[size_t(t * H + h)];
            tli[size_t(h)] = kUb * std::fabs(lid) + 1.004 * A + 4.1 * kU * B + kFtzSlack;
            li_w.check(lif, lid, tli[size_t(h)], "t, h", t, h);
            li_s.check(lif, on_f32, kUb * std::fabs(on_f32) + 4.1 * kU * abs_f32 + kFtzSlack, "t, h", t, h);
            ssq_li_exact += lif * lif;
          }
          // Sums of squares: stage = recursive-summation bound over the contract's
          // depth; end to end = Hoeffding on sum e_k (2 r_k) plus sum e_k^2.
          double rf2 = 0.0, cross = 0.0, bias = 0.0, li_cross = 0.0, li_bias = 0.0;
          for (int64_t k = 0; k < K; ++k) {
            rf2 += rf[k] * rf[k];
            cross += std::pow(2.0 * tres[size_t(k)] * std::fabs(rd[k]), 2);
            bias += tres[size_t(k)] * tres[size_t(k)];
          }
          for (int64_t h = 0; h < H; ++h) {
            li_cross += std::pow(2.0 * tli[size_t(h)] * std::fabs(d.li[size_t(t * H + h)]), 2);
            li_bias += tli[size_t(h)] * tli[size_t(h)];
          }
          const double depth = 33.0 + double(S / 8), li_depth = 21.0 + double(S / 8);
          ssq_s.check(f.ssq[size_t(t)], rf2, 1.001 * depth * kU * rf2, "t", t, 0);
          ssq_li_s.check(f.ssq_li[size_t(t)], ssq_li_exact, 1.001 * li_depth * kU * ssq_li_exact, "t", t, 0);
          const double tssq = 8.0 * std::sqrt(cross) + bias + 1.01 * depth * kU * (rf2 + bias);
          ssq_w.check(f.ssq[size_t(t)], d.ssq[size_t(t)], tssq, "t", t, 0);
          const double tssq_li =
              8.0 * std::sqrt(li_cross) + li_bias + 1.01 * li_depth * kU * (ssq_li_exact + li_bias);
          // layer_input: li and rstd errors, two RN multiplies, BF16.
          const double arg_li = d.ssq_li[size_t(t)] / double(H) + double(p.norm_eps);
          const double q_li = (tssq_li / double(H) + 2.01 * kU * (arg_li + tssq_li / double(H))) / arg_li;
          const double rstd_li = 1.0 / std::sqrt(arg_li), dr_li = q_li / (2.0 * (1.0 - q_li)) + 1.01 * kU;
          const double rstd_li_f = 1.0 / std::sqrt(f.ssq_li[size_t(t)] / double(H) + double(p.norm_eps));
          double err2 = 0.0, norm2 = 0.0;
          for (int64_t h = 0; h < H; ++h) {
            const double nw = from_bf(in.norm_weight[size_t(h)]);
            const double lid = d.li[size_t(t * H + h)], LId = d.layer_input[size_t(t * H + h)];
            const double LIf = f.layer_input[size_t(t * H + h)];
            const double E1 = tli[size_t(h)] * rstd_li * (1.0 + dr_li) + std::fabs(lid) * rstd_li * dr_li;
            const double bound = kUb * std::fabs(LId) + 1.005 * std::fabs(nw) * E1 + 2.1 * kU * std::fabs(LId);
            layer.check(LIf, LId, bound + kFtzSlack, "t, h", t, h);
            const double y = f.li[size_t(t * H + h)] * rstd_li_f * nw;
            layer_s.check(LIf, y, (kUb + 4.3 * kU) * std::fabs(y) + kFtzSlack, "t, h", t, h);
            err2 += (LIf - LId) * (LIf - LId);
            norm2 += LId * LId;
          }
          worst_layer_norm = std::max(worst_layer_norm, std::sqrt(err2 / norm2));
          // mix: exact products; chain + parts + warps + slices roundings (stage); end to
          // end Hoeffding on sum w_k e_k.
          const double chain = 16.0 * double(fusedstep::mhc::steps_per_warp(H)) + 26.0;
          double tmix[24];
          for (int n = 0; n < 24; ++n) {
            double on_f32 = 0.0, abs_f32 = 0.0, rss = 0.0, abs_d = 0.0;
            for (int64_t k = 0; k < K; ++k) {
              const double wk = w[size_t(n * K + k)];
              on_f32 += wk * rf[k];
              abs_f32 += std::fabs(wk * rf[k]);
              abs_d += std::fabs(wk) * (std::fabs(rd[k]) + tres[size_t(k)]);
              rss += std::pow(wk * tres[size_t(k)], 2);
            }
            const double mf = f.mix[size_t(t * 24 + n)], md = d.mix[size_t(t * 24 + n)];
            mix_s.check(mf, on_f32, 1.001 * chain * kU * abs_f32 + 1e-30, "t, n", t, n);
            tmix[n] = 8.0 * std::sqrt(rss) + 1.001 * chain * kU * abs_d + 1e-30;
            mix_w.check(mf, md, tmix[n], "t, n", t, n);
          }
          // Coefficients: a's bound from mix and rstd; sigmoid is 1/4-Lipschitz; the
          // 20-pass Sinkhorn moves entries by at most 2x the logits' max change
          // (observed 0.64); float32 formula errors on top.
          const double arg = d.ssq[size_t(t)] / double(K) + double(p.rms_eps);
          const double q = (tssq / double(K) + 2.01 * kU * (arg + tssq / double(K))) / arg;
          const double rstd = 1.0 / std::sqrt(arg), dr = q / (2.0 * (1.0 - q)) + 1.01 * kU;
          double ta[24], a_abs[24], ta_comb = 0.0;
          for (int n = 0; n < 24; ++n) {
            const double scale = std::fabs(in.scale[size_t(n < 4 ? 0 : (n < 8 ? 1 : 2))]);
            const double md = std::fabs(d.mix[size_t(t * 24 + n)]);
            const double e2 = (tmix[n] * rstd * (1.0 + dr) + md * rstd * dr) * (1.0 + 2.0 * kU) + kU * md * rstd;
            a_abs[n] = std::fabs(d.mix[size_t(t * 24 + n)] * rstd * double(in.scale[size_t(n < 4 ? 0 : (n < 8 ? 1 : 2))]) +
                                 double(in.base[size_t(n)]));
            ta[n] = scale * e2 + 1.01 * kU * (a_abs[n] + scale * e2);
            if (n >= 8) ta_comb = std::max(ta_comb, ta[n]);
          }
          double pre_f64[4], post_f64[4], comb_f64[16], mix_f[24];
          for (int n = 0; n < 24; ++n) mix_f[n] = f.mix[size_t(t * 24 + n)];
          ref::coefficients_f64(mix_f, f.ssq[size_t(t)], p, pre_f64, post_f64, comb_f64);
          for (int j = 0; j < 4; ++j) {
            const double tpre = ta[j] / 4.0 + (a_abs[j] + ta[j]) * 0x1p-25 + 0x1p-21;
            const double tpost =
                double(p.post_mult) * (ta[4 + j] / 4.0 + (a_abs[4 + j] + ta[4 + j]) * 0x1p-25 + 0x1p-21);
            pre_w.check(f.pre[size_t(t * 4 + j)], d.pre[size_t(t * 4 + j)], tpre, "t, j", t, j);
            post_w.check(f.post[size_t(t * 4 + j)], d.post[size_t(t * 4 + j)], tpost, "t, j", t, j);
            pre_s.check(f.pre[size_t(t * 4 + j)], pre_f64[j], 0x1p-18, "t, j", t, j);
            post_s.check(f.post[size_t(t * 4 + j)], post_f64[j], 0x1p-18 * double(p.post_mult), "t, j", t, j);
          }
          for (int i = 0; i < 16; ++i) {
            comb_w.check(f.comb[size_t(t * 16 + i)], d.comb[size_t(t * 16 + i)], 2.0 * ta_comb + 1e-6, "t, i", t, i);
            comb_s.check(f.comb[size_t(t * 16 + i)], comb_f64[i], 2e-6, "t, i", t, i);
          }
        }
      }
    }
  }
  for (const WorstRatio* r : {&residual, &li_w, &layer, &ssq_w, &mix_w, &pre_w, &post_w, &comb_w, &li_s,
                              &layer_s, &ssq_s, &ssq_li_s, &mix_s, &pre_s, &post_s, &comb_s}) {
    std::printf("[ info     ] %-18s worst |float32 - float64| / bound = %.3g\n", r->name, r->ratio);
  }
  std::printf("[ info     ] layer_input normwise relative error <= %.3g\n", worst_layer_norm);
  EXPECT_LE(worst_layer_norm, 0x1p-7);
}

}  // namespace
