// SPDX-License-Identifier: Apache-2.0
// Microbenchmark: mma.sync m16n8k16 BF16 latency, and the mHC fused kernel's staged GEMM
// step (the B fragment and three A fragments from shared memory, three MMAs) for 10
// steps, on one warp and with 12 warps of the SM reading shared memory at once. H200,
// 2026-11-29 (the same kernel launched on 16 CTAs, one per SM): 24 cycles per dependent
// MMA; 10 steps 0.96k cycles on one warp, 1.95k with 12 warps (shared-memory bandwidth:
// 14 wavefronts per step and warp).
#include <cstdint>
#include <cstdio>

#include "common/ptx.cuh"

namespace {

using namespace fusedstep;

constexpr int kSteps = 10;

__global__ void mma_kernel(long long* cycles, float* sink) {
  __shared__ uint4 a_s[kSteps * 3 * 32];
  __shared__ uint2 b_s[kSteps * 32];
  for (int i = threadIdx.x; i < kSteps * 3 * 32; i += blockDim.x) a_s[i] = make_uint4(0x3f803f80u + i, 0x3f80u, i, 1);
  for (int i = threadIdx.x; i < kSteps * 32; i += blockDim.x) b_s[i] = make_uint2(0x3f803f80u, i);
  __syncthreads();
  const int lane = threadIdx.x & 31;
  const uint32_t a[4] = {0x3f803f80u, 0x3f803f80u, 0x3f803f80u, 0x3f803f80u}, b[2] = {0x3f803f80u, 0x3f803f80u};
  float acc[3][4] = {};
  long long t0 = clock64();
  for (int s = 0; s < 64; ++s) ptx::mma_bf16_m16n8k16(acc[0], a, b, acc[0]);
  __syncwarp();
  const long long chain = clock64() - t0;
  t0 = clock64();
#pragma unroll 2
  for (int s = 0; s < kSteps; ++s) {
    const uint2 bw = b_s[s * 32 + lane];
    const uint32_t bb[2] = {bw.x, bw.y};
#pragma unroll
    for (int mt = 0; mt < 3; ++mt) {
      const uint4 a4 = a_s[(s * 3 + mt) * 32 + lane];
      const uint32_t aa[4] = {a4.x, a4.y, a4.z, a4.w};
      ptx::mma_bf16_m16n8k16(acc[mt], aa, bb, acc[mt]);
    }
  }
  __syncwarp();
  const long long staged = clock64() - t0;
  float s = 0.0f;
  for (int m = 0; m < 3; ++m) {
    for (int i = 0; i < 4; ++i) s += acc[m][i];
  }
  sink[threadIdx.x] = s;
  if (threadIdx.x == 0) {
    cycles[0] = chain;
    cycles[1] = staged;
  }
}

}  // namespace

int main() {
  long long* cycles = nullptr;
  float* sink = nullptr;
  if (cudaMalloc(&cycles, 2 * sizeof(long long)) != cudaSuccess || cudaMalloc(&sink, 384 * sizeof(float)) != cudaSuccess) {
    std::printf("no CUDA device\n");
    return 1;
  }
  for (int threads : {32, 384}) {
    mma_kernel<<<1, threads>>>(cycles, sink);
    long long c[2] = {0, 0};
    if (cudaMemcpy(c, cycles, sizeof c, cudaMemcpyDeviceToHost) != cudaSuccess) return 1;
    std::printf("%2d warps: dependent MMA %.1f cycles; %d staged steps %lld cycles (warp 0)\n", threads / 32,
                double(c[0]) / 64, kSteps, c[1]);
  }
  return cudaDeviceSynchronize() == cudaSuccess ? 0 : 1;
}
