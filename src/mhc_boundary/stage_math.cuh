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

// The layer-input RMSNorm factor from the sum of squares of li.
__device__ __forceinline__ float layer_input_rstd(float ssq_li, int64_t hidden, float norm_eps) {
  return dmath::rsqrt_approx(__fadd_rn(__fdiv_rn(ssq_li, static_cast<float>(hidden)), norm_eps));
}

}  // namespace fusedstep::mhc
