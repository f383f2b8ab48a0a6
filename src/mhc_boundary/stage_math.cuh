// mHC boundary: per-element and per-token formulas of docs/numerics.md, shared by the
// fused kernel and the composed reference path (same code, same bits).
#pragma once

#include "common/device_math.cuh"
#include "mhc_boundary/layout.h"

namespace fusedstep::mhc {

// residual_out[s] before rounding: mul.ftz(post[s], x), then fma.ftz over the source
// streams j = 0..3 (comb[j][s]).
__device__ __forceinline__ float residual_update(float post_s, float x, const float comb_js[4],
                                                 const float r[4]) {
  float nu = ptx::mul_ftz(post_s, x);
#pragma unroll
  for (int j = 0; j < 4; ++j) nu = ptx::fma_ftz(comb_js[j], r[j], nu);
  return nu;
}

// li before rounding: IEEE FMA chain from +0 over the rounded new streams.
__device__ __forceinline__ float lagged_collapse(const float pre[4], const float cur[4]) {
  float acc = 0.0f;
#pragma unroll
  for (int j = 0; j < 4; ++j) acc = __fmaf_rn(pre[j], cur[j], acc);
  return acc;
}

struct CoefficientScalars {
  float rms_eps, hc_pre_eps, sinkhorn_eps, post_mult;
  int sinkhorn_iters;
};

// Pre / post / comb of one token from its 24 mixes and the sum of squares of its
// 4*hidden new residual values. scale[3], base[24].
__device__ __forceinline__ void coefficients(const float mix[kMixes], float ssq, int64_t hidden,
                                             const float* scale, const float* base,
                                             const CoefficientScalars& s, float pre[4],
                                             float post[4], float comb[16]) {
  const float rstd =
      dmath::rsqrt_approx(__fadd_rn(__fdiv_rn(ssq, static_cast<float>(4 * hidden)), s.rms_eps));
  float a[kMixes];
#pragma unroll
  for (int n = 0; n < kMixes; ++n) {
    const int g = n < 4 ? 0 : (n < 8 ? 1 : 2);
    a[n] = __fmaf_rn(__fmul_rn(mix[n], rstd), scale[g], base[n]);
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    pre[j] = __fadd_rn(dmath::sigmoid_mhc(a[j]), s.hc_pre_eps);
    post[j] = __fmul_rn(dmath::sigmoid_mhc(a[4 + j]), s.post_mult);
  }
  float c[16];
  const float eps = s.sinkhorn_eps;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float* row = a + 8 + 4 * i;
    const float m = fmaxf(fmaxf(row[0], row[1]), fmaxf(row[2], row[3]));
    float e[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) e[k] = dmath::exp_triton(__fsub_rn(row[k], m));
    const float inv = dmath::rcp_ieee_normal(__fadd_rn(__fadd_rn(__fadd_rn(e[0], e[1]), e[2]), e[3]));
#pragma unroll
    for (int k = 0; k < 4; ++k) c[4 * i + k] = __fmaf_rn(e[k], inv, eps);
  }
  auto column_pass = [&] {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float sum = __fadd_rn(__fadd_rn(__fadd_rn(c[k], c[4 + k]), __fadd_rn(c[8 + k], c[12 + k])), eps);
      const float inv = dmath::rcp_ieee_normal(sum);
#pragma unroll
      for (int i = 0; i < 4; ++i) c[4 * i + k] = __fmul_rn(c[4 * i + k], inv);
    }
  };
  column_pass();
  for (int it = 1; it < s.sinkhorn_iters; ++it) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float sum = __fadd_rn(
          __fadd_rn(__fadd_rn(__fadd_rn(c[4 * i], c[4 * i + 1]), c[4 * i + 2]), c[4 * i + 3]), eps);
      const float inv = dmath::rcp_ieee_normal(sum);
#pragma unroll
      for (int k = 0; k < 4; ++k) c[4 * i + k] = __fmul_rn(c[4 * i + k], inv);
    }
    column_pass();
  }
#pragma unroll
  for (int k = 0; k < 16; ++k) comb[k] = c[k];
}

// What coefficients() gives one lane of a half warp that computes a token together:
// lane e (0..15) holds comb[e] (row e / 4, column e % 4); lanes 0-3 hold pre[e], lanes
// 4-7 post[e - 4] in `pre_post` (other lanes: unspecified).
struct HalfWarpCoefficients {
  float comb, pre_post;
};

// coefficients() on the 16 lanes of a half warp, one matrix element per lane: every
// formula and summation order is coefficients()'s (bitwise the same results), but each
// Sinkhorn pass is one reciprocal per lane after one round of shuffles instead of four
// reciprocals in one lane. A single lane's 39 dependent passes measured 4.9k cycles per
// token on the H200 (docs/design.md). Called by all 32 lanes of the warp (the shuffles
// name the full mask); each half computes its own token. `mix` is that token's 24 mixes.
__device__ __forceinline__ HalfWarpCoefficients coefficients_half_warp(const float* mix, float ssq,
                                                                     int64_t hidden, const float* scale,
                                                                     const float* base,
                                                                     const CoefficientScalars& s) {
  const int e = static_cast<int>(threadIdx.x) & 15;
  const int row = e >> 2, col = e & 3;
  const float rstd =
      dmath::rsqrt_approx(__fadd_rn(__fdiv_rn(ssq, static_cast<float>(4 * hidden)), s.rms_eps));
  auto logit = [&](int n, int g) { return __fmaf_rn(__fmul_rn(mix[n], rstd), scale[g], base[n]); };
  HalfWarpCoefficients out;
  // pre (lanes 0-3) / post (lanes 4-7); the rest compute a discarded value
  const float sig = dmath::sigmoid_mhc(logit(e & 7, e < 4 ? 0 : 1));
  out.pre_post = e < 4 ? __fadd_rn(sig, s.hc_pre_eps) : __fmul_rn(sig, s.post_mult);
  // softmax row of this lane's row; its own exponent recomputed (same bits as r[col])
  float r[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) r[k] = logit(8 + 4 * row + k, 2);
  const float m = fmaxf(fmaxf(r[0], r[1]), fmaxf(r[2], r[3]));
  float x[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) x[k] = dmath::exp_triton(__fsub_rn(r[k], m));
  const float own = dmath::exp_triton(__fsub_rn(logit(8 + e, 2), m));
  const float eps = s.sinkhorn_eps;
  float c = __fmaf_rn(own, dmath::rcp_ieee_normal(__fadd_rn(__fadd_rn(__fadd_rn(x[0], x[1]), x[2]), x[3])), eps);
  constexpr unsigned kAll = 0xffffffffu;
  auto column_pass = [&] {
#pragma unroll
    for (int i = 0; i < 4; ++i) x[i] = __shfl_sync(kAll, c, 4 * i + col, 16);
    c = __fmul_rn(c, dmath::rcp_ieee_normal(__fadd_rn(__fadd_rn(__fadd_rn(x[0], x[1]), __fadd_rn(x[2], x[3])), eps)));
  };
  column_pass();
  for (int it = 1; it < s.sinkhorn_iters; ++it) {
#pragma unroll
    for (int k = 0; k < 4; ++k) x[k] = __shfl_sync(kAll, c, 4 * row + k, 16);
    c = __fmul_rn(c, dmath::rcp_ieee_normal(
                         __fadd_rn(__fadd_rn(__fadd_rn(__fadd_rn(x[0], x[1]), x[2]), x[3]), eps)));
    column_pass();
  }
  out.comb = c;
  return out;
}

// The layer-input RMSNorm factor from the sum of squares of li.
__device__ __forceinline__ float layer_input_rstd(float ssq_li, int64_t hidden, float norm_eps) {
  return dmath::rsqrt_approx(__fadd_rn(__fdiv_rn(ssq_li, static_cast<float>(hidden)), norm_eps));
}

}  // namespace fusedstep::mhc
