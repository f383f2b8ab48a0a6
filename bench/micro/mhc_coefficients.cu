// Microbenchmark: latency of one token's mHC coefficients (sigmoids, softmax, Sinkhorn)
// on one lane (mhc::coefficients, the composed path) and on a half warp
// (mhc::coefficients_half_warp, the fused kernel), in SM cycles per call, for 1 and 20
// Sinkhorn iterations. One warp on one SM; the call's result feeds the next call's input,
// so the calls do not overlap. Bitwise agreement of the two forms is tested in
// tests/mhc_boundary/stage_math_test.cu, not here.
// H200, 2026-11-29, with an earlier form of this program (mixes, scale and base in
// registers, the half warp's base indexed from a local array): 20 iterations, one lane
// 4.9k cycles per token (one active thread; 6.7k with 32), half warp 3.4k per call of
// two tokens. This form (operands in shared memory, as in the kernel) was added after
// the session's device time was spent and has not run yet.
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
  return cudaDeviceSynchronize() == cudaSuccess ? 0 : 1;
}
