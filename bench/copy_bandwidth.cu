// SPDX-License-Identifier: Apache-2.0
// fusedstep-bench: the copy-bandwidth floor. Several copies run and the floor is the
// best of their medians, so that no fused kernel is flattered by a weak copy:
// cudaMemcpyAsync device to device (on the H200 the driver runs it as an SM kernel: it
// waited behind a kernel holding every SM's thread slots; 4.20 TB/s at 1 GiB and 4.28 at
// 4 GiB on 2026-11-30, 7-9% above our own copy kernels), plain 16-byte vector copies of
// two shapes (one with streaming cache hints), a bulk-copy ring through shared memory,
// and one CTA per 32 KiB item (contiguous per CTA, short-lived CTAs; 4.04-4.11 TB/s
// there; micro/copy_patterns.cu compares more shapes).
#include <cuda/ptx>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "bench.h"
#include "copy_kernels.cuh"
#include "device_util.h"

namespace fusedstep::bench {
namespace {

// Bulk-copy ring: one thread per CTA moves chunks global -> shared (cp.async.bulk,
// completing on an mbarrier) -> global (cp.async.bulk, bulk groups), kStages chunks
// in flight. CTA b takes chunks b, b + grid, ...
constexpr int kBulkThreads = 32;
constexpr int kBulkStages = 4;
constexpr uint32_t kBulkChunk = 48 * 1024;
constexpr int kBulkSmem = kBulkStages * kBulkChunk;

__global__ void __launch_bounds__(kBulkThreads) bulk_copy_kernel(const char* __restrict__ src,
                                                                 char* __restrict__ dst, int64_t bytes) {
  extern __shared__ __align__(128) char stage[];
  __shared__ __align__(8) uint64_t full[kBulkStages];
  if (threadIdx.x != 0) return;
  const int64_t chunks = (bytes + kBulkChunk - 1) / kBulkChunk;
  // My k-th chunk is blockIdx.x + k * gridDim.x.
  const int64_t mine = chunks > blockIdx.x ? (chunks - blockIdx.x + gridDim.x - 1) / gridDim.x : 0;
  auto chunk_bytes = [&](int64_t k) {
    const int64_t off = (blockIdx.x + k * gridDim.x) * int64_t{kBulkChunk};
    return static_cast<uint32_t>(std::min<int64_t>(kBulkChunk, bytes - off));
  };
  auto offset = [&](int64_t k) { return (blockIdx.x + k * gridDim.x) * int64_t{kBulkChunk}; };
  for (int s = 0; s < kBulkStages; ++s) cuda::ptx::mbarrier_init(&full[s], 1u);
  cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster);
  auto load = [&](int64_t k) {
    const int s = static_cast<int>(k % kBulkStages);
    const uint32_t n = chunk_bytes(k);
    cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta, cuda::ptx::space_shared,
                                         &full[s], n);
    cuda::ptx::cp_async_bulk(cuda::ptx::space_cluster, cuda::ptx::space_global, stage + s * kBulkChunk,
                             src + offset(k), n, &full[s]);
  };
  for (int64_t k = 0; k < std::min<int64_t>(mine, kBulkStages); ++k) load(k);
  for (int64_t k = 0; k < mine; ++k) {
    const int s = static_cast<int>(k % kBulkStages);
    const uint32_t parity = static_cast<uint32_t>((k / kBulkStages) & 1);
    while (!cuda::ptx::mbarrier_try_wait_parity(&full[s], parity)) {
    }
    cuda::ptx::cp_async_bulk(cuda::ptx::space_global, cuda::ptx::space_shared, dst + offset(k),
                             stage + s * kBulkChunk, chunk_bytes(k));
    cuda::ptx::cp_async_bulk_commit_group();
    // The store of chunk k - 1 has read its stage: refill that stage with chunk
    // k - 1 + kStages.
    if (k >= 1 && k - 1 + kBulkStages < mine) {
      cuda::ptx::cp_async_bulk_wait_group_read(cuda::ptx::n32_t<1>{});
      load(k - 1 + kBulkStages);
    }
  }
  cuda::ptx::cp_async_bulk_wait_group(cuda::ptx::n32_t<0>{});
}

constexpr int kItemBytes = 32 * 1024;

struct CopyVariant {
  const char* name;
  cudaError_t (*launch)(const uint4* src, uint4* dst, int64_t vectors, int sms, cudaStream_t stream);
};

template <int kThreads, int kUnroll, bool kStreaming, int kBlocksPerSm>
cudaError_t launch_vector(const uint4* src, uint4* dst, int64_t vectors, int sms, cudaStream_t stream) {
  vector_copy_kernel<kThreads, kUnroll, kStreaming><<<sms * kBlocksPerSm, kThreads, 0, stream>>>(src, dst, vectors);
  return cudaGetLastError();
}

cudaError_t launch_bulk(const uint4* src, uint4* dst, int64_t vectors, int sms, cudaStream_t stream) {
  bulk_copy_kernel<<<sms, kBulkThreads, kBulkSmem, stream>>>(reinterpret_cast<const char*>(src),
                                                             reinterpret_cast<char*>(dst), vectors * 16);
  return cudaGetLastError();
}

// `vectors` is a multiple of an item (measure_copy_bandwidth rounds the size down).
cudaError_t launch_items(const uint4* src, uint4* dst, int64_t vectors, int, cudaStream_t stream) {
  item_copy_kernel<kItemBytes, 512><<<static_cast<unsigned>(vectors * 16 / kItemBytes), 512, 0, stream>>>(src, dst);
  return cudaGetLastError();
}

cudaError_t launch_memcpy(const uint4* src, uint4* dst, int64_t vectors, int, cudaStream_t stream) {
  return cudaMemcpyAsync(dst, src, static_cast<size_t>(vectors) * 16, cudaMemcpyDeviceToDevice, stream);
}

const CopyVariant kVariants[] = {
    {"vector 512x4, 4 CTAs/SM", launch_vector<512, 4, false, 4>},
    {"vector 256x8, 8 CTAs/SM", launch_vector<256, 8, false, 8>},
    {"vector 256x8 streaming, 8 CTAs/SM", launch_vector<256, 8, true, 8>},
    {"bulk ring 4x48 KiB, 1 CTA/SM", launch_bulk},
    {"items of 32 KiB, 512 threads x 4 vectors", launch_items},
    {"cudaMemcpyAsync device to device", launch_memcpy},
};

}  // namespace

double measure_copy_bandwidth(size_t bytes, int iters, cudaStream_t stream, size_t* copied_bytes, std::string* error) {
  // The largest copy that fits, from `bytes` down to 1 GiB (larger copies measure a
  // little faster: cudaMemcpyAsync 4.20 TB/s at 1 GiB, 4.28 at 4 GiB on the H200).
  DeviceArena arena;
  for (;; bytes /= 2) {
    bytes = bytes / kItemBytes * kItemBytes;
    if (arena.allocate(2 * bytes + 256, error)) {
      error->clear();  // a larger size's failed allocation, if any
      break;
    }
    if (bytes / 2 < (size_t{1} << 30)) return -1.0;
  }
  *copied_bytes = bytes;
  uint4* src = arena.take<uint4>(bytes / sizeof(uint4));
  uint4* dst = arena.take<uint4>(bytes / sizeof(uint4));
  // Random source bits (some DRAM paths compress zeros).
  fill_uniform_f32(reinterpret_cast<float*>(src), static_cast<int64_t>(bytes / 4), -1.0f, 1.0f,
                   0x5eedc0deull, stream);
  int device = 0, sms = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (sms <= 0) sms = 132;
  const int64_t vectors = static_cast<int64_t>(bytes / sizeof(uint4));
  cudaFuncSetAttribute(bulk_copy_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kBulkSmem);

  unsigned long long* mismatches = arena.take<unsigned long long>(1);
  if (mismatches == nullptr) {
    *error = "copy bandwidth: arena too small for the mismatch counter";
    return -1.0;
  }

  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  double best_gbps = -1.0;
  std::string report;
  for (const CopyVariant& variant : kVariants) {
    std::vector<double> seconds;
    cudaError_t err = cudaMemsetAsync(dst, 0, bytes, stream);
    for (int r = 0; r < iters + 2 && err == cudaSuccess; ++r) {  // two warm-up copies
      cudaEventRecord(start, stream);
      err = variant.launch(src, dst, vectors, sms, stream);
      cudaEventRecord(stop, stream);
      if (err == cudaSuccess) err = cudaEventSynchronize(stop);
      float ms = 0.0f;
      cudaEventElapsedTime(&ms, start, stop);
      if (r >= 2) seconds.push_back(ms * 1e-3);
    }
    unsigned long long wrong = 0;
    if (err == cudaSuccess) err = cudaMemsetAsync(mismatches, 0, sizeof wrong, stream);
    if (err == cudaSuccess) {
      count_mismatches_kernel<<<sms * 4, 512, 0, stream>>>(src, dst, vectors, mismatches);
      err = cudaMemcpyAsync(&wrong, mismatches, sizeof wrong, cudaMemcpyDeviceToHost, stream);
    }
    if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
    if (err == cudaSuccess && wrong != 0) {
      *error = std::string("copy (") + variant.name + ") copied wrongly: " + std::to_string(wrong) +
               " of " + std::to_string(vectors) + " vectors differ";
      best_gbps = -1.0;
      break;
    }
    if (err != cudaSuccess) {
      *error = std::string("copy (") + variant.name + "): " + cudaGetErrorName(err) + " (" +
               cudaGetErrorString(err) + ")";
      best_gbps = -1.0;
      break;
    }
    const double gbps = 2.0 * static_cast<double>(bytes) / median(seconds) / 1e9;
    std::printf("copy %-42s %6.0f GB/s\n", variant.name, gbps);
    best_gbps = std::max(best_gbps, gbps);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return best_gbps;
}

}  // namespace fusedstep::bench
