// Microbenchmark: which copies reach the H200's copy bandwidth, and what a copy of one
// KDA call's size moves. Each line is a median of 15 launches (CUDA events), bytes read +
// written per second; every copy is checked against its source.
//  1. cudaMemcpyAsync device to device against our copy kernels at 4 GiB: a grid-stride
//     16-byte vector copy, and "items" (one CTA per contiguous item, loads then stores,
//     the access pattern of a staged KDA state) of several sizes and shapes.
//  2. Back-to-back launches of one KDA call's size (segments rotating over 4 GiB so that
//     nothing hits L2): what a pure copy of those bytes moves, with each launch's ramp.
//  3. Whether cudaMemcpyAsync runs on the copy engines or the SMs: it is timed beside a
//     kernel that holds every SM's thread slots for about 2 ms.
// H200, 2026-11-30 (this form): 1. memcpy 4261 GB/s; grid-stride 256x8 about 3930; items
// of 4 KiB (256 threads x 1 vector) 4250, 16 KiB (512 x 2) 4159, 32 KiB (512 x 4) 4090,
// 64 KiB (512 x 8) 4034, 64 KiB bulk-copied through shared memory 4069. 2. per launch,
// 24 / 48 / 96 / 192 MiB: memcpy 14.9 / 26.9 / 50.6 / 97.5 us (3384 / 3740 / 3982 / 4130
// GB/s), 32 KiB items 15.6 / 28.0 / 53.0 / 102.0 us. 3. memcpy 2520 us beside the spin
// (512 us alone): an SM kernel of the driver, which waits for the SMs like ours.
#include <cuda/ptx>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

#include "../copy_kernels.cuh"

#define CHECK(x)                                                                   \
  do {                                                                             \
    const cudaError_t e = (x);                                                     \
    if (e != cudaSuccess) {                                                        \
      std::printf("%s: %s\n", #x, cudaGetErrorString(e));                         \
      std::exit(1);                                                                \
    }                                                                              \
  } while (0)

namespace {

using fusedstep::bench::count_mismatches_kernel;
using fusedstep::bench::item_copy_kernel;
using fusedstep::bench::vector_copy_kernel;

// One CTA per 64 KiB item, bulk-copied into shared memory in 16 KiB chunks (as the KDA
// kernel stages a state) and each chunk bulk-stored as soon as it has landed.
constexpr int kBulkItem = 65536, kBulkChunk = 16384, kBulkChunks = kBulkItem / kBulkChunk;
__global__ void __launch_bounds__(32) bulk_item_copy(const char* __restrict__ src, char* __restrict__ dst) {
  extern __shared__ __align__(128) char stage[];
  __shared__ __align__(8) uint64_t full[kBulkChunks];
  if (threadIdx.x != 0) return;
  const int64_t base = int64_t{blockIdx.x} * kBulkItem;
  for (int c = 0; c < kBulkChunks; ++c) cuda::ptx::mbarrier_init(&full[c], 1u);
  cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster);
  for (int c = 0; c < kBulkChunks; ++c) {
    cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta, cuda::ptx::space_shared,
                                         &full[c], kBulkChunk);
    cuda::ptx::cp_async_bulk(cuda::ptx::space_cluster, cuda::ptx::space_global, stage + c * kBulkChunk,
                             src + base + c * kBulkChunk, kBulkChunk, &full[c]);
  }
  for (int c = 0; c < kBulkChunks; ++c) {
    while (!cuda::ptx::mbarrier_try_wait_parity(&full[c], 0u)) {
    }
    cuda::ptx::cp_async_bulk(cuda::ptx::space_global, cuda::ptx::space_shared, dst + base + c * kBulkChunk,
                             stage + c * kBulkChunk, kBulkChunk);
    cuda::ptx::cp_async_bulk_commit_group();
  }
  cuda::ptx::cp_async_bulk_wait_group_read(cuda::ptx::n32_t<0>{});
}

__global__ void spin(long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}

__global__ void fill_bits(uint32_t* p, int64_t words) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < words; i += int64_t{gridDim.x} * blockDim.x)
    p[i] = static_cast<uint32_t>(i * 2654435761u) ^ 0x9e3779b9u;
}

}  // namespace

int main() {
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const size_t total = size_t{4} << 30;
  char *src = nullptr, *dst = nullptr;
  unsigned long long* mismatches = nullptr;
  CHECK(cudaMalloc(&src, total));
  CHECK(cudaMalloc(&dst, total));
  CHECK(cudaMalloc(&mismatches, sizeof(unsigned long long)));
  fill_bits<<<sms * 8, 256>>>(reinterpret_cast<uint32_t*>(src), total / 4);
  cudaStream_t stream;
  CHECK(cudaStreamCreate(&stream));
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  const auto* s4 = reinterpret_cast<const uint4*>(src);
  auto* d4 = reinterpret_cast<uint4*>(dst);

  // Times `copy` (which moves `bytes` per launch, `launches` launches), checks the first
  // `bytes` of dst against src, prints GB/s read + written per launch.
  auto time_copy = [&](const char* name, size_t bytes, const std::function<void()>& copy, int launches = 1) {
    CHECK(cudaMemsetAsync(dst, 0, bytes, stream));
    std::vector<float> ms;
    for (int r = 0; r < 17; ++r) {
      CHECK(cudaEventRecord(start, stream));
      copy();
      CHECK(cudaEventRecord(stop, stream));
      CHECK(cudaEventSynchronize(stop));
      CHECK(cudaGetLastError());
      float t = 0.0f;
      CHECK(cudaEventElapsedTime(&t, start, stop));
      if (r >= 2) ms.push_back(t);
    }
    unsigned long long wrong = 0;
    CHECK(cudaMemsetAsync(mismatches, 0, sizeof wrong, stream));
    count_mismatches_kernel<<<sms * 4, 512, 0, stream>>>(s4, d4, bytes / 16, mismatches);
    CHECK(cudaMemcpyAsync(&wrong, mismatches, sizeof wrong, cudaMemcpyDeviceToHost, stream));
    CHECK(cudaStreamSynchronize(stream));
    std::sort(ms.begin(), ms.end());
    const double seconds = ms[ms.size() / 2] * 1e-3 / launches;
    std::printf("%-48s %5zu MiB %9.1f us %6.0f GB/s%s\n", name, bytes >> 20, seconds * 1e6, 2.0 * bytes / seconds / 1e9,
                wrong ? "  COPIED WRONGLY" : "");
  };

  std::printf("1. 4 GiB copies\n");
  time_copy("cudaMemcpyAsync device to device", total,
            [&] { CHECK(cudaMemcpyAsync(dst, src, total, cudaMemcpyDeviceToDevice, stream)); });
  time_copy("grid-stride 256 threads x 8 vectors, 8 CTAs/SM", total,
            [&] { vector_copy_kernel<256, 8, false><<<sms * 8, 256, 0, stream>>>(s4, d4, total / 16); });
  time_copy("items of 4 KiB, 256 threads x 1 vector", total,
            [&] { item_copy_kernel<4096, 256><<<total / 4096, 256, 0, stream>>>(s4, d4); });
  time_copy("items of 16 KiB, 512 threads x 2 vectors", total,
            [&] { item_copy_kernel<16384, 512><<<total / 16384, 512, 0, stream>>>(s4, d4); });
  time_copy("items of 32 KiB, 512 threads x 4 vectors", total,
            [&] { item_copy_kernel<32768, 512><<<total / 32768, 512, 0, stream>>>(s4, d4); });
  time_copy("items of 64 KiB, 512 threads x 8 vectors", total,
            [&] { item_copy_kernel<65536, 512><<<total / 65536, 512, 0, stream>>>(s4, d4); });
  CHECK(cudaFuncSetAttribute(bulk_item_copy, cudaFuncAttributeMaxDynamicSharedMemorySize, kBulkItem));
  time_copy("items of 64 KiB, bulk copies through shared", total,
            [&] { bulk_item_copy<<<total / kBulkItem, 32, kBulkItem, stream>>>(src, dst); });

  std::printf("2. back-to-back launches of one call's size (20 launches, per launch)\n");
  for (size_t mib : {size_t{24}, size_t{48}, size_t{96}, size_t{192}}) {
    const size_t seg = mib << 20;
    const int segments = static_cast<int>(total / seg), launches = 20;
    int next = 0;
    char name[96];
    std::snprintf(name, sizeof name, "%zu MiB: cudaMemcpyAsync", mib);
    time_copy(name, seg, [&] {
      for (int l = 0; l < launches; ++l, next = (next + 1) % segments)
        CHECK(cudaMemcpyAsync(dst + next * seg, src + next * seg, seg, cudaMemcpyDeviceToDevice, stream));
    }, launches);
    std::snprintf(name, sizeof name, "%zu MiB: items of 32 KiB", mib);
    time_copy(name, seg, [&] {
      for (int l = 0; l < launches; ++l, next = (next + 1) % segments)
        item_copy_kernel<32768, 512><<<seg / 32768, 512, 0, stream>>>(s4 + next * seg / 16, d4 + next * seg / 16);
    }, launches);
  }

  std::printf("3. copy engines or SMs\n");
  {
    cudaStream_t other;
    CHECK(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
    const size_t bytes = size_t{1} << 30;
    spin<<<sms * 2, 1024, 0, stream>>>(4000000);  // every thread slot of every SM, about 2 ms
    CHECK(cudaEventRecord(start, other));
    CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, other));
    CHECK(cudaEventRecord(stop, other));
    CHECK(cudaDeviceSynchronize());
    float t = 0.0f;
    CHECK(cudaEventElapsedTime(&t, start, stop));
    std::printf("1 GiB cudaMemcpyAsync beside a 2 ms kernel holding every SM: %.0f us "
                "(about 500 us alone; far more means it waited for the SMs)\n", t * 1e3);
  }
  return 0;
}
