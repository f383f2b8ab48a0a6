// fusedstep-bench: the copy-bandwidth floor. A plain vectorized copy kernel, not
// cudaMemcpy: on the H200 a device-to-device cudaMemcpy above 512 MiB reaches only
// about 2.8 TB/s while a kernel copy reaches about 4.3 TB/s, and the fused kernels
// are judged against what a kernel can move.
#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "bench.h"
#include "device_util.h"

namespace fusedstep::bench {
namespace {

// Each thread moves kUnroll 16-byte vectors per step, loads before stores, so
// enough bytes are in flight per SM to cover HBM latency.
constexpr int kUnroll = 4;
constexpr int kThreads = 512;

__global__ void __launch_bounds__(kThreads) copy_kernel(const uint4* __restrict__ src,
                                                        uint4* __restrict__ dst, int64_t vectors) {
  const int64_t stride = int64_t{gridDim.x} * kThreads;
  int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x;
  for (; i + (kUnroll - 1) * stride < vectors; i += kUnroll * stride) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = src[i + u * stride];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) dst[i + u * stride] = v[u];
  }
  for (; i < vectors; i += stride) dst[i] = src[i];
}

}  // namespace

double measure_copy_bandwidth(size_t bytes, int iters, cudaStream_t stream, std::string* error) {
  bytes = bytes / sizeof(uint4) * sizeof(uint4);
  DeviceArena arena;
  if (!arena.allocate(2 * bytes, error)) return -1.0;
  uint4* src = arena.take<uint4>(bytes / sizeof(uint4));
  uint4* dst = arena.take<uint4>(bytes / sizeof(uint4));
  // Random source bits (some DRAM paths compress zeros).
  fill_uniform_f32(reinterpret_cast<float*>(src), static_cast<int64_t>(bytes / 4), -1.0f, 1.0f,
                   0x5eedc0deull, stream);
  int device = 0, sms = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  const unsigned grid = static_cast<unsigned>(sms > 0 ? sms * 4 : 512);
  const int64_t vectors = static_cast<int64_t>(bytes / sizeof(uint4));

  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  std::vector<double> seconds;
  for (int r = 0; r < iters + 2; ++r) {  // two warm-up copies
    cudaEventRecord(start, stream);
    copy_kernel<<<grid, kThreads, 0, stream>>>(src, dst, vectors);
    cudaEventRecord(stop, stream);
    cudaError_t err = cudaEventSynchronize(stop);
    if (err == cudaSuccess) err = cudaGetLastError();
    if (err != cudaSuccess) {
      *error = std::string("copy kernel: ") + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")";
      cudaEventDestroy(start);
      cudaEventDestroy(stop);
      return -1.0;
    }
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, start, stop);
    if (r >= 2) seconds.push_back(ms * 1e-3);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return 2.0 * static_cast<double>(bytes) / median(seconds) / 1e9;
}

}  // namespace fusedstep::bench
