// SPDX-License-Identifier: Apache-2.0
// The instruction formulas of docs/numerics.md ("Instruction formulas"), shared by
// the fused kernels and the composed reference paths so both run the same code.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "common/ptx.cuh"

namespace fusedstep::dmath {

inline constexpr float kLog2e = 1.4426950408889634f;

// exp(x) = ex2.approx(x * log2e), a plain RN multiply first (Triton 3.6).
__device__ __forceinline__ float exp_triton(float x) { return ptx::ex2_approx(__fmul_rn(x, kLog2e)); }

// div.full.f32 as ptxas lowers it, for b > 1e-30.
__device__ __forceinline__ float div_full(float a, float b) {
  if (b > 0x1p126f) {
    a = __fmul_rn(a, 0.25f);
    b = __fmul_rn(b, 0.25f);
  }
  return __fmul_rn(a, ptx::rcp_approx_ftz(b));
}

// 1 / x as div.full computes it for 2^-126 <= x <= 2^126.
__device__ __forceinline__ float recip_approx(float x) { return ptx::rcp_approx_ftz(x); }

__device__ __forceinline__ float sqrt_approx(float x) { return ptx::sqrt_approx_ftz(x); }

// tl.sigmoid: 1 / (1 + exp(-x)) with div.full.
__device__ __forceinline__ float sigmoid_triton(float x) {
  return div_full(1.0f, __fadd_rn(1.0f, exp_triton(-x)));
}

// IEEE reciprocal of a normal input: rcp.approx.ftz refined by one Newton step.
__device__ __forceinline__ float rcp_ieee_normal(float x) {
  const float r = ptx::rcp_approx_ftz(x);
  const float e = -__fmaf_rn(x, r, -1.0f);
  return __fmaf_rn(r, e, r);
}

// The mHC sigmoid: the denominator clamped below 2^126 keeps rcp_ieee_normal exact.
__device__ __forceinline__ float sigmoid_mhc(float x) {
  return rcp_ieee_normal(fminf(__fadd_rn(1.0f, exp_triton(-x)), 0x1p126f));
}

__device__ __forceinline__ float rsqrt_approx(float x) { return ptx::rsqrt_approx(x); }

// BF16 round to nearest even and back.
__device__ __forceinline__ float round_bf16(float x) {
  return __bfloat162float(__float2bfloat16_rn(x));
}
__device__ __forceinline__ float bf16_lo(uint32_t pair) { return __uint_as_float(pair << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t pair) { return __uint_as_float(pair & 0xffff0000u); }
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

}  // namespace fusedstep::dmath
