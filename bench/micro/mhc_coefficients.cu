// SPDX-License-Identifier: Apache-2.0
// Microbenchmark behind docs/design.md, "The coefficients on a half warp": why a token's
// coefficients (sigmoids, softmax, Sinkhorn) run on a half warp, one matrix element per
// lane, and how close that is to the floor of 39 dependent passes.
// First part: latency of one token's coefficients on one lane (mhc::coefficients, the
// composed path) and on a half warp (mhc::coefficients_half_warp, the fused kernel), in
// SM cycles per call, for 1 and 20 Sinkhorn iterations. One warp on one SM; each call's
// result feeds the next call's input, so calls do not overlap. Bitwise agreement of the
// two forms is tested in tests/mhc_boundary/stage_math_test.cu, not here.
// Second part: the Sinkhorn iterations alone (39 passes at 20 iterations) in four
// layouts with the same bits (checked here): the one-lane loop as coefficients() writes
// it, the same with the four rows' (columns') sums, reciprocals and products written
// stage by stage, the half warp (one element per lane, one shuffle round a pass), and
// four lanes holding a row each (rows local, columns by two xor-shuffle rounds).
// H200 (2026-11-30), 20 iterations: one lane 6540 cycles per token, half warp 3381 per
// call of two tokens. Sinkhorn alone, cycles per token: 4692, 4411, 3181, 3369 (about
// 120, 113, 82, 86 a pass). The half warp is the fastest: a pass is one dependent chain
// of shuffle, sum, MUFU.RCP, two FFMAs and the product, and the one-lane forms are bound
// by the four MUFU.RCPs a pass on one warp, not by the chains.
#include <cstdio>

#include "mhc_boundary/stage_math.cuh"

namespace {

using namespace fusedstep;

// Mixes, scale and base in shared memory, as in the fused kernel.
__global__ void latency_kernel(const float* in, float zero, int reps, int iters, long long* cycles, float* sink) {
  __shared__ float smix[2][mhc::kMixes];
  __shared__ float hc[3 + mhc::kMixes];  // scale[3] | base[24]
  if (threadIdx.x < mhc::kMixes) smix[0][threadIdx.x] = smix[1][threadIdx.x] = in[threadIdx.x];
  for (int i = threadIdx.x; i < 3 + mhc::kMixes; i += 32) hc[i] = in[24 + i];
  __syncwarp();
  const mhc::CoefficientScalars s{1e-6f, 1e-6f, 1e-6f, 2.0f, iters};
  // One lane (thread 0 only).
  if (threadIdx.x == 0) {
    float pre[4], post[4], comb[16];
    const long long t0 = clock64();
    for (int r = 0; r < reps; ++r) {
      mhc::coefficients(smix[0], 3.0f, 5120, hc, hc + 3, s, pre, post, comb);
      smix[0][9] = __fmaf_rn(comb[15], zero, smix[0][9]);  // the next call depends on this one
    }
    sink[0] = smix[0][9];
    cycles[0] = clock64() - t0;
  }
  __syncwarp();
  // Half warp per token, two tokens per call.
  const long long t0 = clock64();
  for (int r = 0; r < reps; ++r) {
    const mhc::HalfWarpCoefficients c = mhc::coefficients_half_warp(smix[threadIdx.x / 16], 3.0f, 5120, hc, hc + 3, s);
    if (threadIdx.x == 0) smix[0][9] = __fmaf_rn(c.comb, zero, smix[0][9]);
    __syncwarp();
  }
  if (threadIdx.x == 0) {
    sink[1] = smix[0][9];
    cycles[1] = clock64() - t0;
  }
}

// ---- the Sinkhorn iterations alone, four layouts ----
__device__ __forceinline__ void staged_row_pass(float c[16], float eps) {
  float sum[4], inv[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) sum[i] = __fadd_rn(c[4 * i], c[4 * i + 1]);
#pragma unroll
  for (int i = 0; i < 4; ++i) sum[i] = __fadd_rn(sum[i], c[4 * i + 2]);
#pragma unroll
  for (int i = 0; i < 4; ++i) sum[i] = __fadd_rn(__fadd_rn(sum[i], c[4 * i + 3]), eps);
#pragma unroll
  for (int i = 0; i < 4; ++i) inv[i] = dmath::rcp_ieee_normal(sum[i]);
#pragma unroll
  for (int k = 0; k < 16; ++k) c[k] = __fmul_rn(c[k], inv[k / 4]);
}
__device__ __forceinline__ void staged_column_pass(float c[16], float eps) {
  float lo[4], hi[4], inv[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) lo[k] = __fadd_rn(c[k], c[4 + k]);
#pragma unroll
  for (int k = 0; k < 4; ++k) hi[k] = __fadd_rn(c[8 + k], c[12 + k]);
#pragma unroll
  for (int k = 0; k < 4; ++k) inv[k] = dmath::rcp_ieee_normal(__fadd_rn(__fadd_rn(lo[k], hi[k]), eps));
#pragma unroll
  for (int k = 0; k < 16; ++k) c[k] = __fmul_rn(c[k], inv[k % 4]);
}
__device__ __forceinline__ void sinkhorn_one_lane(float c[16], float eps, int iters, bool staged) {
  auto column_pass = [&] {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float col[4] = {c[k], c[4 + k], c[8 + k], c[12 + k]};
      const float inv = mhc::coef::column_inverse(col, eps);
#pragma unroll
      for (int i = 0; i < 4; ++i) c[4 * i + k] = __fmul_rn(c[4 * i + k], inv);
    }
  };
  if (staged) {
    staged_column_pass(c, eps);
    for (int it = 1; it < iters; ++it) staged_row_pass(c, eps), staged_column_pass(c, eps);
    return;
  }
  column_pass();
  for (int it = 1; it < iters; ++it) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float inv = mhc::coef::row_inverse(c + 4 * i, eps);
#pragma unroll
      for (int k = 0; k < 4; ++k) c[4 * i + k] = __fmul_rn(c[4 * i + k], inv);
    }
    column_pass();
  }
}
// Lane e of a half warp holds element e (as coefficients_half_warp).
__device__ __forceinline__ float sinkhorn_half_warp(float c, float eps, int iters) {
  const int e = threadIdx.x & 15, row = e >> 2, col = e & 3;
  float x[4];
  auto column_pass = [&] {
#pragma unroll
    for (int i = 0; i < 4; ++i) x[i] = __shfl_sync(0xffffffffu, c, 4 * i + col, 16);
    c = __fmul_rn(c, mhc::coef::column_inverse(x, eps));
  };
  column_pass();
  for (int it = 1; it < iters; ++it) {
#pragma unroll
    for (int k = 0; k < 4; ++k) x[k] = __shfl_sync(0xffffffffu, c, 4 * row + k, 16);
    c = __fmul_rn(c, mhc::coef::row_inverse(x, eps));
    column_pass();
  }
  return c;
}
// Lane i of four holds row i; column sums (r0 + r1) + (r2 + r3) by xor shuffles (the
// partner's order differs, the sum is commutative: same bits).
__device__ __forceinline__ void sinkhorn_row_lanes(float r[4], float eps, int iters) {
  auto column_pass = [&] {
    float p[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) p[k] = __fadd_rn(r[k], __shfl_xor_sync(0xffffffffu, r[k], 1));
#pragma unroll
    for (int k = 0; k < 4; ++k) p[k] = __fadd_rn(__fadd_rn(p[k], __shfl_xor_sync(0xffffffffu, p[k], 2)), eps);
#pragma unroll
    for (int k = 0; k < 4; ++k) r[k] = __fmul_rn(r[k], dmath::rcp_ieee_normal(p[k]));
  };
  column_pass();
  for (int it = 1; it < iters; ++it) {
    const float inv = mhc::coef::row_inverse(r, eps);
#pragma unroll
    for (int k = 0; k < 4; ++k) r[k] = __fmul_rn(r[k], inv);
    column_pass();
  }
}

// cycles[0..3]: per call of each layout; out[16 * l + e]: layout l's element e of one call.
__global__ void sinkhorn_layouts_kernel(const float* in, float zero, int reps, int iters, long long* cycles,
                                        float* out, float* sink) {
  const float eps = 1e-6f;
  if (threadIdx.x == 0) {
    for (int staged = 0; staged < 2; ++staged) {
      float c[16];
      for (int k = 0; k < 16; ++k) c[k] = in[k];
      const long long t0 = clock64();
      for (int r = 0; r < reps; ++r) {
        sinkhorn_one_lane(c, eps, iters, staged);
        c[3] = __fmaf_rn(c[15], zero, in[3]);  // the next call depends on this one
      }
      cycles[staged] = clock64() - t0;
      sink[staged] = c[3] + c[5];
      for (int k = 0; k < 16; ++k) c[k] = in[k];
      sinkhorn_one_lane(c, eps, iters, staged);
      for (int k = 0; k < 16; ++k) out[16 * staged + k] = c[k];
    }
  }
  __syncwarp();
  float c = in[threadIdx.x & 15];
  long long t0 = clock64();
  for (int r = 0; r < reps; ++r) c = __fmaf_rn(sinkhorn_half_warp(c, eps, iters), zero, in[threadIdx.x & 15]);
  if (threadIdx.x == 0) cycles[2] = clock64() - t0, sink[2] = c;
  c = sinkhorn_half_warp(in[threadIdx.x & 15], eps, iters);
  if (threadIdx.x < 16) out[32 + threadIdx.x] = c;
  const int i = threadIdx.x & 3;
  float r[4];
  for (int k = 0; k < 4; ++k) r[k] = in[4 * i + k];
  t0 = clock64();
  for (int q = 0; q < reps; ++q) {
    sinkhorn_row_lanes(r, eps, iters);
    r[0] = __fmaf_rn(r[1], zero, in[4 * i]);
  }
  if (threadIdx.x == 0) cycles[3] = clock64() - t0, sink[3] = r[0];
  for (int k = 0; k < 4; ++k) r[k] = in[4 * i + k];
  sinkhorn_row_lanes(r, eps, iters);
  if (threadIdx.x < 4)
    for (int k = 0; k < 4; ++k) out[48 + 4 * i + k] = r[k];
}

}  // namespace

int main() {
  float host[51];
  for (int i = 0; i < 51; ++i) host[i] = 0.1f * ((i * 37) % 11) - 0.4f;
  host[24] = 0.5f, host[25] = 0.7f, host[26] = 1.1f;
  float *in = nullptr, *sink = nullptr;
  long long* cycles = nullptr;
  if (cudaMalloc(&in, sizeof host) != cudaSuccess || cudaMalloc(&sink, 2 * sizeof(float)) != cudaSuccess ||
      cudaMalloc(&cycles, 2 * sizeof(long long)) != cudaSuccess) {
    std::printf("no CUDA device\n");
    return 1;
  }
  cudaMemcpy(in, host, sizeof host, cudaMemcpyHostToDevice);
  const int reps = 100;
  for (int iters : {1, 20}) {
    latency_kernel<<<1, 32>>>(in, 0.0f, reps, iters, cycles, sink);
    long long c[2] = {0, 0};
    if (cudaMemcpy(c, cycles, sizeof c, cudaMemcpyDeviceToHost) != cudaSuccess) return 1;
    std::printf("sinkhorn_iters %2d: one lane %6.0f cycles per token, half warp %6.0f cycles per call (2 tokens)\n",
                iters, double(c[0]) / reps, double(c[1]) / reps);
  }
  // The Sinkhorn iterations alone: a doubly-stochastic-bound positive matrix.
  float mat[16];
  for (int i = 0; i < 16; ++i) mat[i] = 0.02f + 0.07f * ((i * 37) % 11);
  float *dmat = nullptr, *outs = nullptr, *sinks = nullptr;
  long long* lcycles = nullptr;
  if (cudaMalloc(&dmat, sizeof mat) != cudaSuccess || cudaMalloc(&outs, 64 * sizeof(float)) != cudaSuccess ||
      cudaMalloc(&sinks, 4 * sizeof(float)) != cudaSuccess || cudaMalloc(&lcycles, 4 * sizeof(long long)) != cudaSuccess)
    return 1;
  cudaMemcpy(dmat, mat, sizeof mat, cudaMemcpyHostToDevice);
  for (int iters : {1, 20}) {
    sinkhorn_layouts_kernel<<<1, 32>>>(dmat, 0.0f, reps, iters, lcycles, outs, sinks);
    long long c[4] = {0, 0, 0, 0};
    float o[64];
    if (cudaMemcpy(c, lcycles, sizeof c, cudaMemcpyDeviceToHost) != cudaSuccess ||
        cudaMemcpy(o, outs, sizeof o, cudaMemcpyDeviceToHost) != cudaSuccess)
      return 1;
    int same = 0;
    for (int l = 1; l < 4; ++l)
      for (int e = 0; e < 16; ++e) same += o[16 * l + e] == o[e];
    std::printf("Sinkhorn alone, %2d iterations, cycles per token: one lane %5.0f, one lane staged %5.0f, "
                "half warp %5.0f, row lanes %5.0f; %d of 48 elements equal to the one-lane loop's\n",
                iters, double(c[0]) / reps, double(c[1]) / reps, double(c[2]) / reps, double(c[3]) / reps, same);
    if (same != 48) return 1;  // a layout that changed the bits is not a faster form of the same thing
  }
  return cudaDeviceSynchronize() == cudaSuccess ? 0 : 1;
}
