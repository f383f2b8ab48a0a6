// SPDX-License-Identifier: Apache-2.0
// mHC boundary: per-element and per-token formulas of docs/numerics.md, shared by the
// fused kernel and the composed reference path (same code, same bits).
#pragma once

#include "common/device_math.cuh"
#include "mhc_boundary/config.h"
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

// The formulas of the coefficients (docs/numerics.md), shared by the one-lane and the
// half-warp forms below so that both give the same bits.
namespace coef {
// rstd of the token's 4*hidden new residual values from their sum of squares.
__device__ __forceinline__ float rstd(float ssq, int64_t hidden, float rms_eps) {
  return dmath::rsqrt_approx(__fadd_rn(__fdiv_rn(ssq, static_cast<float>(4 * hidden)), rms_eps));
}
// Logit of mix n: a = fma(mix * rstd, scale[g], base[n]), g = 0 pre, 1 post, 2 comb.
__device__ __forceinline__ float logit(float mix, float rstd, float scale, float base) {
  return __fmaf_rn(__fmul_rn(mix, rstd), scale, base);
}
__device__ __forceinline__ int group_of(int n) { return n < 4 ? 0 : (n < 8 ? 1 : 2); }
__device__ __forceinline__ float pre(float a, const CoefficientScalars& s) {
  return __fadd_rn(dmath::sigmoid_mhc(a), s.hc_pre_eps);
}
__device__ __forceinline__ float post(float a, const CoefficientScalars& s) {
  return __fmul_rn(dmath::sigmoid_mhc(a), s.post_mult);
}
// Softmax of a comb row: max tree, exponents, the reciprocal of the left-to-right sum.
__device__ __forceinline__ float row_max(const float r[4]) {
  return fmaxf(fmaxf(r[0], r[1]), fmaxf(r[2], r[3]));
}
__device__ __forceinline__ float exp_shifted(float a, float max) { return dmath::exp_triton(__fsub_rn(a, max)); }
__device__ __forceinline__ float softmax_inverse(const float e[4]) {
  return dmath::rcp_ieee_normal(__fadd_rn(__fadd_rn(__fadd_rn(e[0], e[1]), e[2]), e[3]));
}
// Sinkhorn divisors' reciprocals: rows left to right, columns (r0 + r1) + (r2 + r3),
// each sum + eps.
__device__ __forceinline__ float row_inverse(const float x[4], float eps) {
  return dmath::rcp_ieee_normal(__fadd_rn(__fadd_rn(__fadd_rn(__fadd_rn(x[0], x[1]), x[2]), x[3]), eps));
}
__device__ __forceinline__ float column_inverse(const float x[4], float eps) {
  return dmath::rcp_ieee_normal(__fadd_rn(__fadd_rn(__fadd_rn(x[0], x[1]), __fadd_rn(x[2], x[3])), eps));
}
}  // namespace coef

// Pre / post / comb of one token from its 24 mixes and the sum of squares of its
// 4*hidden new residual values, on one lane (the composed path). scale[3], base[24].
__device__ __forceinline__ void coefficients(const float mix[kMixes], float ssq, int64_t hidden,
                                             const float* scale, const float* base,
                                             const CoefficientScalars& s, float pre[4],
                                             float post[4], float comb[16]) {
  const float rstd = coef::rstd(ssq, hidden, s.rms_eps);
  float a[kMixes];
#pragma unroll
  for (int n = 0; n < kMixes; ++n) a[n] = coef::logit(mix[n], rstd, scale[coef::group_of(n)], base[n]);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    pre[j] = coef::pre(a[j], s);
    post[j] = coef::post(a[4 + j], s);
  }
  float c[16];
  const float eps = s.sinkhorn_eps;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float* row = a + 8 + 4 * i;
    const float m = coef::row_max(row);
    float e[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) e[k] = coef::exp_shifted(row[k], m);
    const float inv = coef::softmax_inverse(e);
#pragma unroll
    for (int k = 0; k < 4; ++k) c[4 * i + k] = __fmaf_rn(e[k], inv, eps);
  }
  auto column_pass = [&] {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float col[4] = {c[k], c[4 + k], c[8 + k], c[12 + k]};
      const float inv = coef::column_inverse(col, eps);
#pragma unroll
      for (int i = 0; i < 4; ++i) c[4 * i + k] = __fmul_rn(c[4 * i + k], inv);
    }
  };
  column_pass();
  for (int it = 1; it < s.sinkhorn_iters; ++it) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float inv = coef::row_inverse(c + 4 * i, eps);
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

// coefficients() on the 16 lanes of a half warp, one matrix element per lane: the same
// formulas (coef::) in the same orders, so the same bits, but each Sinkhorn pass is one
// reciprocal per lane after one round of shuffles instead of four reciprocals in one
// lane (about 30% fewer cycles per token on the H200; docs/design.md). Called by
// all 32 lanes of a warp of a 1-D block (the shuffles name the full mask); each half
// computes its own token. `mix` is that token's 24 mixes.
__device__ __forceinline__ HalfWarpCoefficients coefficients_half_warp(const float* mix, float ssq,
                                                                     int64_t hidden, const float* scale,
                                                                     const float* base,
                                                                     const CoefficientScalars& s) {
  const int e = static_cast<int>(threadIdx.x) & 15;
  const int row = e >> 2, col = e & 3;
  const float rstd = coef::rstd(ssq, hidden, s.rms_eps);
  HalfWarpCoefficients out;
  // pre (lanes 0-3) / post (lanes 4-7); the rest compute a discarded value
  const float a = coef::logit(mix[e & 7], rstd, scale[e < 4 ? 0 : 1], base[e & 7]);
  out.pre_post = e < 4 ? coef::pre(a, s) : coef::post(a, s);
  // softmax of this lane's row; its own exponent recomputed (same bits as r[col]'s)
  float r[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) r[k] = coef::logit(mix[8 + 4 * row + k], rstd, scale[2], base[8 + 4 * row + k]);
  const float m = coef::row_max(r);
  float x[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) x[k] = coef::exp_shifted(r[k], m);
  const float own = coef::exp_shifted(coef::logit(mix[8 + e], rstd, scale[2], base[8 + e]), m);
  const float eps = s.sinkhorn_eps;
  float c = __fmaf_rn(own, coef::softmax_inverse(x), eps);
  constexpr unsigned kAll = 0xffffffffu;
  auto column_pass = [&] {
#pragma unroll
    for (int i = 0; i < 4; ++i) x[i] = __shfl_sync(kAll, c, 4 * i + col, 16);
    c = __fmul_rn(c, coef::column_inverse(x, eps));
  };
  column_pass();
  for (int it = 1; it < s.sinkhorn_iters; ++it) {
#pragma unroll
    for (int k = 0; k < 4; ++k) x[k] = __shfl_sync(kAll, c, 4 * row + k, 16);
    c = __fmul_rn(c, coef::row_inverse(x, eps));
    column_pass();
  }
  out.comb = c;
  return out;
}

// Two layer_input values, packed: bf16((li * rstd_li) * norm_weight) for the BF16 pair
// of norm weights in `norm_pair` (low half first).
__device__ __forceinline__ uint32_t layer_input_pair(float li_lo, float li_hi, float rstd_li, uint32_t norm_pair) {
  return dmath::pack_bf16x2(__fmul_rn(__fmul_rn(li_lo, rstd_li), dmath::bf16_lo(norm_pair)),
                            __fmul_rn(__fmul_rn(li_hi, rstd_li), dmath::bf16_hi(norm_pair)));
}

// The layer-input RMSNorm factor from the sum of squares of li.
__device__ __forceinline__ float layer_input_rstd(float ssq_li, int64_t hidden, float norm_eps) {
  return dmath::rsqrt_approx(__fadd_rn(__fdiv_rn(ssq_li, static_cast<float>(hidden)), norm_eps));
}

}  // namespace fusedstep::mhc
