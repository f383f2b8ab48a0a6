// SPDX-License-Identifier: Apache-2.0
// KDA decode: per-element formulas of docs/numerics.md ("KDA decode"), shared by the
// fused kernel and the composed reference path (same code, same bits). Reduction
// trees live with their kernels; their shapes are fixed by the contract.
#pragma once

#include "common/device_math.cuh"

namespace fusedstep::kda {

inline constexpr int kHeadDim = 128;
inline constexpr float kNormSquareEps = 1e-6f;  // inside the q/k L2 norm

// One conv tap: acc = fma(tap, weight, acc) (window order: 3 state taps, then x).
__device__ __forceinline__ float conv_tap(float tap, float weight, float acc) {
  return __fmaf_rn(tap, weight, acc);
}

// SiLU of the conv accumulator, x / (1 + exp(-x)) with div.full, rounded to BF16.
__device__ __forceinline__ float silu_bf16(float acc) {
  return dmath::round_bf16(dmath::div_full(acc, __fadd_rn(1.0f, dmath::exp_triton(-acc))));
}

// sigmoid as Triton computes it (beta, output gate).
__device__ __forceinline__ float sigmoid(float x) { return dmath::sigmoid_triton(x); }

// 1 / sqrt(sum of squares + 1e-6) from the four warp sums of a head (tree of the
// contract: (W0 + W2) + (W1 + W3), then + 1e-6).
__device__ __forceinline__ float inverse_norm(float w0, float w1, float w2, float w3) {
  const float sq = __fadd_rn(__fadd_rn(__fadd_rn(w0, w2), __fadd_rn(w1, w3)), kNormSquareEps);
  return dmath::recip_approx(dmath::sqrt_approx(sq));
}
__device__ __forceinline__ float normalize_q(float q, float inv_norm, float scale) {
  return __fmul_rn(__fmul_rn(q, inv_norm), scale);
}
__device__ __forceinline__ float normalize_k(float k, float inv_norm) { return __fmul_rn(k, inv_norm); }

// decay = exp(lower_bound * sigmoid(exp(a_log) * (raw_g + dt_bias))); `a` = exp(a_log).
__device__ __forceinline__ float exp_a_log(float a_log) { return dmath::exp_triton(a_log); }
__device__ __forceinline__ float decay(float a, float raw_g, float dt_bias, float lower_bound) {
  const float y = __fmul_rn(a, __fadd_rn(raw_g, dt_bias));
  return dmath::exp_triton(__fmul_rn(lower_bound, dmath::sigmoid_triton(y)));
}

// d_i of the row-dot tree: fma(S3, u3, fma(S2, u2, fma(S1, u1, S0 * u0))).
__device__ __forceinline__ float dot4(float4 s, float4 u) {
  float d = __fmul_rn(s.x, u.x);
  d = __fmaf_rn(s.y, u.y, d);
  d = __fmaf_rn(s.z, u.z, d);
  return __fmaf_rn(s.w, u.w, d);
}

// v_new = (v - dk) * beta: a subtract, then a multiply.
__device__ __forceinline__ float delta(float v, float dk, float beta) {
  return __fmul_rn(__fsub_rn(v, dk), beta);
}

// Gated RMSNorm: rstd = 1 / sqrt(sumsq / 128 + eps); out = ((o * rstd) * w) * gate.
__device__ __forceinline__ float norm_rstd(float sumsq, float eps) {
  return dmath::recip_approx(dmath::sqrt_approx(__fadd_rn(__fmul_rn(sumsq, 1.0f / 128.0f), eps)));
}
__device__ __forceinline__ float gated_output(float o, float rstd, float w, float gate) {
  return __fmul_rn(__fmul_rn(__fmul_rn(o, rstd), w), gate);
}

}  // namespace fusedstep::kda
