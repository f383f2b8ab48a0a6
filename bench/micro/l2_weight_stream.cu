// SPDX-License-Identifier: Apache-2.0
// Microbenchmark behind docs/design.md, "Large T: the weight from L2, and the serial
// tail": how fast the SMs read the mHC prepared weight out of L2 when every CTA of a wave
// streams its slice at once, as the two-CTA configuration's GEMM does (14 clusters:
// every 1/16 slice read by 14 CTAs). It shows that streaming the k steps that do not fit
// shared memory is not what bounds that GEMM phase (the decision to stream them rather
// than stage the whole slice at one CTA per SM).
//
// Each CTA (256 threads, 8 warps) reads one slice (CTA index mod 16, rotated per rep) of
// an L2-resident buffer shaped like hidden 5120's TF32 weight (16 slices x 80 k steps x 3
// m tiles x 512 bytes = 1.97 MB): warp w its run of 10 steps, 16 bytes a lane a load,
// `kDepth` steps' loads in flight (3 = the kernel's ring), XOR-folded. Dynamic shared
// memory caps the CTAs per SM (112 KB: two, as the two-CTA kernel; 200 KB: one); the grid
// is not a cluster launch, so CTAs spread over every SM before any holds two. Per
// configuration: CTAs, shared memory, reps of the whole slice per CTA in one launch,
// median us of 15 launches (CUDA events), and the rate of bytes the SMs received.
// One rep per launch is the kernel's case (each CTA reads its slice once), launch
// overhead included; 40 reps give the streaming rate.
// H200 (2026-11-30), GB/s at 40 reps (us at 1 rep): 16 CTAs 1058 (6.7); 112 CTAs (one per
// SM) 6612-6629 (7.6-7.7); 224 CTAs (the two-CTA kernel's wave; 92 of the 132 SMs hold
// two) 9327 (8.4); 264 CTAs (two on every SM) 9671 (8.4). With `L1::no_allocate`: 224
// CTAs 11182 (7.8), the rest within 1%. Ten steps in flight a warp instead of three: 112
// CTAs 7592-7599, 224 CTAs 8939. So the two-CTA kernel's 27 MB of weight at T = 336
// stream in about 3 us; the kernel with the whole slice staged (no L2 streaming) and with
// no_allocate loads both measure slower (docs/benchmarks.md, "mHC: the coefficients,
// plain copies, the weight from L2").
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cuda_check.h"

namespace {

constexpr int kSlices = 16, kSteps = 80, kMTiles = 3, kWarps = 8;
constexpr int kStepsPerWarp = kSteps / kWarps;
constexpr int kSliceQuads = kSteps * kMTiles * 32;  // uint4 per slice

template <bool kNoL1>
__device__ __forceinline__ uint4 load(const uint4* p) {
  uint4 v;
  if constexpr (kNoL1) {
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  } else {
    asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  }
  return v;
}

template <int kDepth, bool kNoL1>
__global__ void __launch_bounds__(256) stream_slices(const uint4* w, int reps, uint32_t* out) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  uint32_t acc = 0;
  for (int r = 0; r < reps; ++r) {
    const int slice = (blockIdx.x + r) % kSlices;
    const uint4* run = w + slice * kSliceQuads + warp * kStepsPerWarp * kMTiles * 32 + lane;
    for (int s0 = 0; s0 < kStepsPerWarp; s0 += kDepth) {
      uint4 v[kDepth][kMTiles];
#pragma unroll
      for (int d = 0; d < kDepth; ++d)
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt)
          v[d][mt] = s0 + d < kStepsPerWarp ? load<kNoL1>(run + ((s0 + d) * kMTiles + mt) * 32) : make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int d = 0; d < kDepth; ++d)
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) acc ^= v[d][mt].x ^ v[d][mt].y ^ v[d][mt].z ^ v[d][mt].w;
    }
  }
  if (acc == 0x9e3779b9u) out[blockIdx.x] = acc;  // keeps the loads
}

template <class K>
float median_us(K kernel, int ctas, int smem, const uint4* w, int reps, uint32_t* out, cudaStream_t s) {
  cudaEvent_t a, b;
  CHECK(cudaEventCreate(&a));
  CHECK(cudaEventCreate(&b));
  std::vector<float> t;
  for (int i = 0; i < 17; ++i) {
    CHECK(cudaEventRecord(a, s));
    kernel<<<ctas, 256, smem, s>>>(w, reps, out);
    CHECK(cudaEventRecord(b, s));
    CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    if (i >= 2) t.push_back(ms * 1000.0f);
  }
  std::sort(t.begin(), t.end());
  CHECK(cudaEventDestroy(a));
  CHECK(cudaEventDestroy(b));
  return t[t.size() / 2];
}

template <int kDepth, bool kNoL1>
void run(const char* name, int sms, const uint4* w, uint32_t* out, cudaStream_t s) {
  auto k = stream_slices<kDepth, kNoL1>;
  CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
  CHECK(cudaFuncSetAttribute(k, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
  const double slice_bytes = double(kSliceQuads) * 16;
  struct Case { int ctas, smem_kb; };
  const Case cases[] = {{16, 112}, {112, 200}, {112, 112}, {224, 112}, {2 * sms, 112}};
  for (const Case& c : cases) {
    for (int reps : {1, 40}) {
      const float us = median_us(k, c.ctas, c.smem_kb * 1024, w, reps, out, s);
      std::printf("%-22s ctas %4d  smem %3d KB  reps %2d  %8.2f us  %7.0f GB/s\n", name, c.ctas, c.smem_kb, reps, us,
                  c.ctas * slice_bytes * reps / (us * 1e3));
    }
  }
}

}  // namespace

int main() {
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
  const size_t quads = size_t(kSlices) * kSliceQuads;
  std::vector<uint4> host(quads);
  for (size_t i = 0; i < quads; ++i) host[i] = make_uint4(uint32_t(i), uint32_t(i * 7), uint32_t(i * 13), 1u);
  uint4* w;
  uint32_t* out;
  CHECK(cudaMalloc(&w, quads * 16));
  CHECK(cudaMalloc(&out, 4096 * 4));
  CHECK(cudaMemcpy(w, host.data(), quads * 16, cudaMemcpyHostToDevice));
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s));
  const int sms = prop.multiProcessorCount;
  run<3, false>("depth 3, ld.nc", sms, w, out, s);
  run<3, true>("depth 3, ld.nc no_alloc", sms, w, out, s);
  run<10, false>("depth 10, ld.nc", sms, w, out, s);
  CHECK(cudaStreamSynchronize(s));
  return 0;
}
