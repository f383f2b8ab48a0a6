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

uint64_t test_seed() {
  if (const char* env = std::getenv("FUSEDSTEP_SEED")) return std::stoull(env);
  std::random_device rd;
  const uint64_t seed = (uint64_t(rd()) << 32) ^ rd();
  std::printf("[ seed     ] %llu\n", static_cast<unsigned long long>(seed));
  return seed;
}

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
  std::mt19937_64 rng(test_seed());
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
  std::mt19937_64 rng(test_seed());
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
  std::mt19937_64 rng(test_seed());
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
  std::mt19937_64 rng(test_seed());
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
  std::mt19937_64 rng(test_seed());
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
  const MhcBoundaryResult f32 = ref::mhc_boundary(p, Precision::kFloat32);
  const MhcBoundaryResult f64 = ref::mhc_boundary(p, Precision::kFloat64);
  for (int64_t t = 0; t < 2; ++t) {
    for (int k = 0; k < 4; ++k) {
      double col = 0.0, colf = 0.0;
      for (int i = 0; i < 4; ++i) {
        col += f64.comb[size_t(t * 16 + 4 * i + k)];
        colf += f32.comb[size_t(t * 16 + 4 * i + k)];
      }
      EXPECT_NEAR(col, 1.0, 4e-6);
      EXPECT_NEAR(colf, 1.0, 4e-6);
    }
  }
}

}  // namespace
