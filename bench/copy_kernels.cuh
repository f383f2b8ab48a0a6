// SPDX-License-Identifier: Apache-2.0
// Copy kernels of the copy-bandwidth floor (copy_bandwidth.cu) and of the copy-pattern
// microbenchmark (micro/copy_patterns.cu), which also times them at other shapes.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/ptx.cuh"

namespace fusedstep::bench {
namespace {  // each including program (the bench, a microbenchmark) has its own copy

// Grid-stride vector copy: each thread moves kUnroll 16-byte vectors per step, loads
// before stores, so enough bytes are in flight per SM to cover HBM latency.
// kStreaming: ld.global.cs / st.global.cs (evict-first), the data is touched once.
template <int kThreads, int kUnroll, bool kStreaming>
__global__ void __launch_bounds__(kThreads) vector_copy_kernel(const uint4* __restrict__ src,
                                                               uint4* __restrict__ dst, int64_t vectors) {
  const int64_t stride = int64_t{gridDim.x} * kThreads;
  int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x;
  for (; i + (kUnroll - 1) * stride < vectors; i += kUnroll * stride) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = kStreaming ? __ldcs(src + i + u * stride) : src[i + u * stride];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (kStreaming) {
        __stcs(dst + i + u * stride, v[u]);
      } else {
        dst[i + u * stride] = v[u];
      }
    }
  }
  for (; i < vectors; i += stride) dst[i] = src[i];
}

// One CTA per kItem-byte item (the grid covers the copy): every thread loads its
// kItem / (16 * kThreads) vectors, then stores them. kPdl: one step of a dependent chain
// under programmatic dependent launch (the next launch may start once every CTA has
// begun, and this one reads only after the one before has completed).
template <int kItem, int kThreads, bool kPdl = false>
__global__ void __launch_bounds__(kThreads) item_copy_kernel(const uint4* __restrict__ src, uint4* __restrict__ dst) {
  if constexpr (kPdl) {
    ptx::griddep_launch_dependents();
    ptx::griddep_wait();
  }
  constexpr int kVectors = kItem / 16 / kThreads;
  const int64_t base = int64_t{blockIdx.x} * (kItem / 16) + threadIdx.x;
  uint4 v[kVectors];
#pragma unroll
  for (int u = 0; u < kVectors; ++u) v[u] = src[base + u * kThreads];
#pragma unroll
  for (int u = 0; u < kVectors; ++u) dst[base + u * kThreads] = v[u];
}

// Counts the 16-byte vectors where dst differs from src: a copy that skipped work would
// otherwise report an inflated bandwidth.
__global__ void count_mismatches_kernel(const uint4* __restrict__ a, const uint4* __restrict__ b, int64_t vectors,
                                        unsigned long long* mismatches) {
  unsigned long long local = 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < vectors;
       i += int64_t{gridDim.x} * blockDim.x) {
    const uint4 x = a[i], y = b[i];
    local += (x.x != y.x) | (x.y != y.y) | (x.z != y.z) | (x.w != y.w);
  }
  if (local) atomicAdd(mismatches, local);
}

}  // namespace
}  // namespace fusedstep::bench
