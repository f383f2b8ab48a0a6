// SPDX-License-Identifier: Apache-2.0
// fusedstep-bench: random input generation on the device (counter-hash uniform
// values, so gigabytes of inputs cost milliseconds and need no host upload).
#include <cuda_bf16.h>

#include "device_util.h"

namespace fusedstep::bench {
namespace {

__device__ __forceinline__ uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Uniform in [lo, hi): 24 random bits, so every value is exact in FP32.
__device__ __forceinline__ float uniform_at(uint64_t seed, int64_t i, float lo, float hi) {
  const uint64_t h = splitmix64(seed ^ splitmix64(static_cast<uint64_t>(i)));
  const float unit = static_cast<float>(h >> 40) * (1.0f / 16777216.0f);
  return lo + (hi - lo) * unit;
}

__global__ void fill_bf16_kernel(__nv_bfloat16* out, int64_t count, float lo, float hi,
                                 uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = __float2bfloat16_rn(uniform_at(seed, i, lo, hi));
  }
}

__global__ void fill_f32_kernel(float* out, int64_t count, float lo, float hi, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * blockDim.x) {
    out[i] = uniform_at(seed, i, lo, hi);
  }
}

unsigned grid_for(int64_t count) {
  const int64_t blocks = (count + 255) / 256;
  return static_cast<unsigned>(blocks < 4096 ? (blocks > 0 ? blocks : 1) : 4096);
}

}  // namespace

void fill_uniform_bf16(void* out, int64_t count, float lo, float hi, uint64_t seed,
                       cudaStream_t stream) {
  if (count <= 0) return;
  fill_bf16_kernel<<<grid_for(count), 256, 0, stream>>>(static_cast<__nv_bfloat16*>(out), count,
                                                        lo, hi, seed);
}

void fill_uniform_f32(float* out, int64_t count, float lo, float hi, uint64_t seed,
                      cudaStream_t stream) {
  if (count <= 0) return;
  fill_f32_kernel<<<grid_for(count), 256, 0, stream>>>(out, count, lo, hi, seed);
}

}  // namespace fusedstep::bench
