// SPDX-License-Identifier: Apache-2.0
// Microbenchmark behind docs/design.md, "Judged against the byte floor", "What bounds
// q = 1 at large batch", "What bounds the verify" and KDA's "Not in the product": the copy
// bandwidth every percentage is measured against, and what the KDA kernels' memory access
// patterns move with no arithmetic at all (the bound under the bandwidth targets; and why
// clusters that run several requests, a persistent ring of state items, are not built).
// Medians of 15 launches (CUDA events), bytes read + written; whole-array copies are
// checked against their source. Sections (argv[1], e.g. "35"; default all):
//  1. cudaMemcpyAsync device to device against our copy kernels at 4 GiB: a grid-stride
//     16-byte vector copy, and "items" (one CTA per contiguous item, loads then stores)
//     of 4-64 KiB, plain or bulk-copied through shared memory.
//  2. Back-to-back launches of one call's size (segments rotating over 4 GiB, so that
//     nothing hits L2): sizes in KiB read per launch from argv[2] (default: the KDA q = 1
//     calls' 24-192 MiB); cudaMemcpyAsync, 32 KiB items in a stream, and 4 KiB items as a
//     CUDA graph of PDL launches (each waits for the one before, as decode kernels do).
//     `micro_copy_patterns 2 1012,4168,17792,18732,17044,103552` gives the mHC calls'
//     sizes (hidden 5120 T = 1 / 64 / 336, 4096 T = 448, 7168 T = 224, 5120 T = 2048).
//  3. The KDA q = 1 shape (kda_shaped_copy: a CTA per state item, its slot read first,
//     its 16 KiB chunks bulk-copied in, `work` cycles per chunk, per-thread 16-byte
//     stores): 64 KiB items at 3 CTAs per SM (C = 1), 32 KiB at 6 (C = 2), 16 KiB at 11
//     (C = 4), slots a permutation or in order; and kda_ring_copy (a persistent CTA per
//     SM with three 64 KiB buffers, two items inbound while one is stored: the shape of
//     a cluster that runs several requests).
//  4. Whether cudaMemcpyAsync runs on the copy engines or the SMs: timed beside a kernel
//     that holds every SM's thread slots for about 2 ms.
//  5. The KDA verify's shape (kda_shaped_copy with write slots: an item's read slot,
//     the item bulk-copied in once, stored q times to q random slots) and a plain
//     read-once-write-q copy, 20 back-to-back launches of one call's size.
//  6. Section 5's C = 1 shape with its first store held back until X us after each CTA's
//     entry, item by item or in the kernel's order (each 16 KiB chunk to every write
//     slot, then the next), with `work` cycles per chunk and slot.
//  7. The mHC elementwise pass's memory shape (mhc_shaped_copy: a lane loads the five
//     16-byte quads of an 8-wide chunk, x and four residual streams, two or four chunks
//     in flight, and stores five, the new streams and li) on 256-thread CTAs held to two
//     or to one CTA per SM by their shared memory, 20 back-to-back launches of hidden
//     5120's T = 336 and T = 2048 bytes: what one streaming CTA an SM (a cluster
//     streaming beside one in its serial tail) moves against two (docs/design.md, mHC's
//     "Large T").
//  8. BF16 C = 1 requests (32 KiB items, slot read first) whose store waits X us after
//     the request starts (its chain): a CTA a request at three or six CTAs an SM, and a
//     CTA that keeps two requests in flight (kda_chain_ring), 12 heads, batch 64 and 256
//     (docs/design.md, "What bounds q = 1 at large batch").
// H200 (2026-11-30), GB/s unless noted:
//  1. memcpy 4261-4264; 4 KiB items 4250, 16 KiB 4159-4182, 32 KiB 4090, 64 KiB 4033,
//     64 KiB bulk-copied 4069-4074; grid-stride about 3930.
//  2. per launch, 24 / 48 / 96 / 192 MiB: memcpy 14.9 / 26.8 / 50.4 / 97.6 us (3385 /
//     3757 / 3994 / 4127 GB/s), 32 KiB items 15.6 / 28.0 / 52.9 / 101.8 us. mHC sizes,
//     memcpy / graph + PDL, us: 6.8 / 1.5, 6.9 / 3.2, 11.7 / 9.9 (3682 GB/s), 12.1 / 10.4,
//     11.3 / 9.5, 53.2 / 51.0 (4159 GB/s); the memcpy column moves by up to 20% between
//     runs.
//  3. (work 0; 1000 cycles a chunk costs 0-2%, the ring 4-10%) 4 GiB / 12 MiB x 20 (us a
//     launch; 2026-12-03) / 48 MiB x 20 / 192 MiB x 20: 64 KiB items 3870-3890 / 10.1 /
//     30.0-30.2 / 107.8-108.4; slots in order 4073 / 9.8 / 29.0 / 103.2; 32 KiB items 3864
//     / 9.9 / 30.0 / 108.5; 16 KiB items 3854 / 10.0 / 30.6 / 108.8; ring 3873 / 10.4 /
//     29.9 / 110.8.
//  4. memcpy 2514-2525 us beside the spin (512 us alone): an SM kernel of the driver.
//  5. batch 16 q = 2 / 4 / 8 (C = 2): 2952 / 3291 / 3617; batch 64 (C = 1): 3484 / 3677 /
//     3842; batch 128 q = 2 / 8: 3544 / 3736; plain 2985-3656.
//  6. a first store up to 9 us late costs under 0.5%; the kernel's order 1.5-2%.
//  7. (2026-12-02) T = 336 / 2048, us a launch: two CTAs an SM 11.8-11.9 / 56.9-57.7,
//     one CTA 12.0-12.3 / 57.4-58.0 (2 or 4 chunks in flight: within 2%).
//  8. (2026-12-02) batch 64 / 256, us a launch, chain 0 / 4 / 8 us: a CTA a request at
//     three an SM 17.0 / 17.1 / 24.0 and 56.4 / 56.6 / 77.5, at six 16.4 and 56.6-57.0
//     throughout; two requests a CTA at three an SM 16.6 and 57.3 / 57.8 / 60.9.
#include <cuda/ptx>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#include "../copy_kernels.cuh"
#include "common/launch.h"
#include "cuda_check.h"

namespace {

using fusedstep::bench::count_mismatches_kernel;
using fusedstep::bench::item_copy_kernel;
using fusedstep::bench::vector_copy_kernel;

constexpr int kBulkItem = 65536, kBulkChunk = 16384, kBulkChunks = kBulkItem / kBulkChunk;
// Back-to-back launches of one call's size per timed sample (sections 2, 3, 5, 6).
constexpr int kCallLaunches = 20;

// A KDA-shaped item: the C = 1 staged state is 64 KiB per CTA of 128 threads, three CTAs
// per SM (its shared memory); C = 2 / 4 would be 32 / 16 KiB. Launched with 1/8 more
// shared memory than the item (the kernel's other buffers): 3, 6 or 11 CTAs per SM. The item's slot is read
// first (a dependent round trip, as the state address is), its 16 KiB chunks are
// bulk-copied in, then per chunk `work` cycles (the update's arithmetic: no bytes of this
// CTA inbound meanwhile) and the chunk stored by every thread with 16-byte stores.
constexpr int kShapedThreads = 128;
constexpr int kChunkVectors = kBulkChunk / 16;

// Thread 0: `count` single-arrival mbarriers, their init made visible to the copies.
__device__ __forceinline__ void init_barriers(uint64_t* full, int count) {
  for (int c = 0; c < count; ++c) cuda::ptx::mbarrier_init(&full[c], 1u);
  cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster);
}
// Thread 0: the `chunks` 16 KiB chunks of item `slot` bulk-copied into `buffer`, chunk c
// completing on full[c].
__device__ __forceinline__ void issue_item(uint4* buffer, uint64_t* full, const uint4* src, int32_t slot, int chunks) {
  for (int c = 0; c < chunks; ++c) {
    cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta, cuda::ptx::space_shared,
                                         &full[c], kBulkChunk);
    cuda::ptx::cp_async_bulk(cuda::ptx::space_cluster, cuda::ptx::space_global, buffer + c * kChunkVectors,
                             src + int64_t{slot} * chunks * kChunkVectors + c * kChunkVectors, kBulkChunk, &full[c]);
  }
}
__device__ __forceinline__ void store_item(const uint4* buffer, uint64_t* full, uint32_t parity, uint4* dst,
                                           int32_t slot, int chunks, long long work) {
  const int64_t base = int64_t{slot} * chunks * kChunkVectors;
  for (int c = 0; c < chunks; ++c) {
    while (!cuda::ptx::mbarrier_try_wait_parity(&full[c], parity)) {
    }
    const long long t0 = clock64();
    while (clock64() - t0 < work) {
    }
#pragma unroll
    for (int u = 0; u < kChunkVectors / kShapedThreads; ++u) {
      const int v = c * kChunkVectors + u * kShapedThreads + threadIdx.x;
      dst[base + v] = buffer[v];
    }
  }
}

// One CTA per 64 KiB item, bulk-copied into shared memory in 16 KiB chunks (as the KDA
// kernel stages a state) and each chunk bulk-stored as soon as it has landed.
__global__ void __launch_bounds__(32) bulk_item_copy(const uint4* __restrict__ src, uint4* __restrict__ dst) {
  extern __shared__ __align__(128) uint4 stage[];
  __shared__ __align__(8) uint64_t full[kBulkChunks];
  if (threadIdx.x != 0) return;
  init_barriers(full, kBulkChunks);
  issue_item(stage, full, src, static_cast<int32_t>(blockIdx.x), kBulkChunks);
  const int64_t base = int64_t{blockIdx.x} * (kBulkItem / 16);
  for (int c = 0; c < kBulkChunks; ++c) {
    while (!cuda::ptx::mbarrier_try_wait_parity(&full[c], 0u)) {
    }
    cuda::ptx::cp_async_bulk(cuda::ptx::space_global, cuda::ptx::space_shared, dst + base + c * kChunkVectors,
                             stage + c * kChunkVectors, kBulkChunk);
    cuda::ptx::cp_async_bulk_commit_group();
  }
  cuda::ptx::cp_async_bulk_wait_group_read(cuda::ptx::n32_t<0>{});
}

// kda_shaped_copy: the q = 1 kernel's shape, the item stored once to its own slot, with
// `work` cycles per chunk. With write_slots, the KDA verify's shape: the item (64 KiB at
// C = 1, 32 KiB at C = 2) bulk-copied in once, then stored q times, token by token as the
// verify writes the state after each token, to write_slots[item * q + t].
// Section 6's variations of the verify's shape: no store before `first_store_ns` after
// the CTA's entry (the kernel's conv and gate come first), and `chunk_outer`: chunk c
// stored to every write slot before chunk c + 1 (the kernel's order: rows outer, tokens
// inner) instead of one whole item per write slot.
template <int kItem>
__global__ void __launch_bounds__(kShapedThreads)
    kda_shaped_copy(const uint4* __restrict__ src, uint4* __restrict__ dst, const int32_t* __restrict__ slots,
                    long long work, const int32_t* __restrict__ write_slots = nullptr, int q = 1,
                    long long first_store_ns = 0, bool chunk_outer = false) {
  constexpr int kChunks = kItem / kBulkChunk;
  extern __shared__ __align__(128) uint4 rows[];
  __shared__ __align__(8) uint64_t full[kChunks];
  __shared__ int32_t s_slot;
  const uint64_t entry = cuda::ptx::get_sreg_globaltimer();
  if (threadIdx.x == 0) {
    s_slot = slots[blockIdx.x];
    init_barriers(full, kChunks);
    issue_item(rows, full, src, s_slot, kChunks);
  }
  __syncthreads();
  while (cuda::ptx::get_sreg_globaltimer() < entry + first_store_ns) {
  }
  if (chunk_outer) {
    for (int c = 0; c < kChunks; ++c) {
      for (int t = 0; t < q; ++t) {
        // One chunk of the item: store_item over a one-chunk view of buffer and slot.
        const int32_t to = write_slots[blockIdx.x * q + t];
        store_item(rows + c * kChunkVectors, full + c, 0u, dst + (int64_t{to} * kChunks + c) * kChunkVectors, 0, 1,
                   work);
      }
    }
    return;
  }
  for (int t = 0; t < q; ++t) {
    const int32_t to = write_slots != nullptr ? write_slots[blockIdx.x * q + t] : s_slot;
    store_item(rows, full, 0u, dst, to, kChunks, work);
  }
}

// Reads `n` vectors and writes them `q` times (copy t at dst + t * n): the plain form of
// the verify's 1 : q read-to-write ratio.
__global__ void read_once_write_q(const uint4* __restrict__ src, uint4* __restrict__ dst, int64_t n, int q) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const uint4 v = src[i];
    for (int t = 0; t < q; ++t) dst[t * n + i] = v;
  }
}

// The same 64 KiB items through a persistent ring: one CTA per SM with three item buffers
// (192 KiB), CTA b taking items b, b + grid, ...; an item's copy is issued as soon as
// its buffer is free, so two items are inbound while a third is stored (the shape of a
// pipelined several-requests KDA kernel).
constexpr int kRingBuffers = 3;
__global__ void __launch_bounds__(kShapedThreads) kda_ring_copy(const uint4* __restrict__ src, uint4* __restrict__ dst,
                                                                const int32_t* __restrict__ slots, int items,
                                                                long long work) {
  constexpr int kChunks = kBulkItem / kBulkChunk;
  extern __shared__ __align__(128) uint4 rows[];
  __shared__ __align__(8) uint64_t full[kRingBuffers][kChunks];
  __shared__ int32_t s_slot[kRingBuffers];
  const int mine = items > static_cast<int>(blockIdx.x) ? (items - blockIdx.x + gridDim.x - 1) / gridDim.x : 0;
  auto item_of = [&](int k) { return static_cast<int>(blockIdx.x) + k * static_cast<int>(gridDim.x); };
  auto issue = [&](int k, int32_t slot) {
    s_slot[k % kRingBuffers] = slot;
    issue_item(rows + (k % kRingBuffers) * (kBulkItem / 16), full[k % kRingBuffers], src, slot, kChunks);
  };
  if (threadIdx.x == 0) {
    init_barriers(&full[0][0], kRingBuffers * kChunks);
    for (int k = 0; k < mine && k < kRingBuffers; ++k) issue(k, slots[item_of(k)]);
  }
  __syncthreads();
  for (int k = 0; k < mine; ++k) {
    const int buffer = k % kRingBuffers;
    const bool refill = threadIdx.x == 0 && k + kRingBuffers < mine;
    const int32_t next_slot = refill ? slots[item_of(k + kRingBuffers)] : 0;  // read ahead of its use
    store_item(rows + buffer * (kBulkItem / 16), full[buffer], static_cast<uint32_t>((k / kRingBuffers) & 1), dst,
               s_slot[buffer], kChunks, work);
    __syncthreads();  // every thread has read the buffer
    if (refill) issue(k + kRingBuffers, next_slot);
  }
}

// Launchers of the shapes (n items, `work` cycles per chunk); shared memory 1/8 above the
// item's, as the kernel's other buffers take.
template <int kItem>
void launch_shaped(const uint4* src, uint4* dst, const int32_t* slots, int n, long long work, int, cudaStream_t stream) {
  kda_shaped_copy<kItem><<<n, kShapedThreads, kItem + kItem / 8, stream>>>(src, dst, slots, work);
}
void launch_ring(const uint4* src, uint4* dst, const int32_t* slots, int n, long long work, int sm_count,
                 cudaStream_t stream) {
  kda_ring_copy<<<sm_count, kShapedThreads, kRingBuffers * kBulkItem, stream>>>(src, dst, slots, n, work);
}

// Section 8: a CTA that keeps two requests in flight: items b, b + grid, ... (32 KiB: a
// BF16 state at C = 1) in two buffers. An item is stored no earlier than `chain_ns` after
// its slot read and copy were issued (the request's own chain: conv, gate, norms), and the
// copy of item k + 2 is issued as soon as item k is stored, so one request's chain runs
// while the one before it is stored.
template <int kItem>
__global__ void __launch_bounds__(kShapedThreads) kda_chain_ring(const uint4* __restrict__ src, uint4* __restrict__ dst,
                                                                 const int32_t* __restrict__ slots, int items,
                                                                 long long chain_ns) {
  constexpr int kChunks = kItem / kBulkChunk, kBuffers = 2;
  extern __shared__ __align__(128) uint4 rows[];
  __shared__ __align__(8) uint64_t full[kBuffers][kChunks];
  __shared__ int32_t s_slot[kBuffers];
  __shared__ unsigned long long s_issued[kBuffers];
  const int mine = items > static_cast<int>(blockIdx.x) ? (items - blockIdx.x + gridDim.x - 1) / gridDim.x : 0;
  auto issue = [&](int k) {
    const int b = k % kBuffers;
    s_issued[b] = cuda::ptx::get_sreg_globaltimer();
    s_slot[b] = slots[static_cast<int>(blockIdx.x) + k * static_cast<int>(gridDim.x)];
    issue_item(rows + b * (kItem / 16), full[b], src, s_slot[b], kChunks);
  };
  if (threadIdx.x == 0) {
    init_barriers(&full[0][0], kBuffers * kChunks);
    for (int k = 0; k < mine && k < kBuffers; ++k) issue(k);
  }
  __syncthreads();
  for (int k = 0; k < mine; ++k) {
    const int b = k % kBuffers;
    while (cuda::ptx::get_sreg_globaltimer() < s_issued[b] + chain_ns) {
    }
    store_item(rows + b * (kItem / 16), full[b], static_cast<uint32_t>((k / kBuffers) & 1), dst, s_slot[b], kChunks, 0);
    __syncthreads();  // every thread has read the buffer
    if (threadIdx.x == 0 && k + kBuffers < mine) issue(k + kBuffers);
  }
}

// Section 7: quad i of each of five streams (stream s at s * quads), kInFlight chunks in
// flight per lane.
template <int kInFlight>
__global__ void __launch_bounds__(256) mhc_shaped_copy(const uint4* __restrict__ src, uint4* __restrict__ dst,
                                                       int64_t quads) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < quads; i += kInFlight * stride) {
    uint4 v[kInFlight][5];
#pragma unroll
    for (int d = 0; d < kInFlight; ++d) {
#pragma unroll
      for (int s = 0; s < 5; ++s) {
        if (i + d * stride < quads) v[d][s] = src[s * quads + i + d * stride];
      }
    }
#pragma unroll
    for (int d = 0; d < kInFlight; ++d) {
#pragma unroll
      for (int s = 0; s < 5; ++s) {
        if (i + d * stride < quads) dst[s * quads + i + d * stride] = v[d][s];
      }
    }
  }
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

// 0 .. n - 1 in order, or shuffled by a fixed xorshift stream from `seed` (slots are
// a permutation, as in a batch).
std::vector<int32_t> permutation(int n, bool shuffled, uint64_t seed = 0x9e3779b97f4a7c15ull) {
  std::vector<int32_t> order(n);
  for (int i = 0; i < n; ++i) order[i] = i;
  if (!shuffled) return order;
  uint64_t x = seed;
  for (int i = n - 1; i > 0; --i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    std::swap(order[i], order[static_cast<int>(x % static_cast<uint64_t>(i + 1))]);
  }
  return order;
}

}  // namespace

// Usage: micro_copy_patterns [SECTIONS], e.g. "35" for sections 3 and 5 (default: all).
int main(int argc, char** argv) {
  auto want = [&](int section) { return argc < 2 || std::strchr(argv[1], '0' + section) != nullptr; };
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
  // Sections 3 and 5: 64 KiB items with 1/8 more shared memory (kda_shaped_copy).
  CHECK(cudaFuncSetAttribute(kda_shaped_copy<65536>, cudaFuncAttributeMaxDynamicSharedMemorySize, 65536 + 65536 / 8));
  const auto* s4 = reinterpret_cast<const uint4*>(src);
  auto* d4 = reinterpret_cast<uint4*>(dst);

  // Median milliseconds of `reps` timed runs of `run` (after two untimed ones).
  auto median_ms = [&](const std::function<void()>& run, int reps) {
    std::vector<float> ms;
    for (int r = 0; r < reps + 2; ++r) {
      CHECK(cudaEventRecord(start, stream));
      run();
      CHECK(cudaEventRecord(stop, stream));
      CHECK(cudaEventSynchronize(stop));
      CHECK(cudaGetLastError());
      float t = 0.0f;
      CHECK(cudaEventElapsedTime(&t, start, stop));
      if (r >= 2) ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    return static_cast<double>(ms[ms.size() / 2]);
  };
  // Times `copy` (which moves `bytes` per launch, `launches` launches), checks the first
  // `bytes` of dst against src, prints GB/s read + written per launch.
  auto time_copy = [&](const char* name, size_t bytes, const std::function<void()>& copy, int launches = 1) {
    CHECK(cudaMemsetAsync(dst, 0, bytes, stream));
    const double seconds = median_ms(copy, 15) * 1e-3 / launches;
    unsigned long long wrong = 0;
    CHECK(cudaMemsetAsync(mismatches, 0, sizeof wrong, stream));
    count_mismatches_kernel<<<sms * 4, 512, 0, stream>>>(s4, d4, bytes / 16, mismatches);
    CHECK(cudaMemcpyAsync(&wrong, mismatches, sizeof wrong, cudaMemcpyDeviceToHost, stream));
    CHECK(cudaStreamSynchronize(stream));
    std::printf("%-48s %5zu MiB %9.1f us %6.0f GB/s%s\n", name, bytes >> 20, seconds * 1e6, 2.0 * bytes / seconds / 1e9,
                wrong ? "  COPIED WRONGLY" : "");
  };

  if (want(1)) {
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
              [&] { bulk_item_copy<<<total / kBulkItem, 32, kBulkItem, stream>>>(s4, d4); });
  }
  if (want(2)) {
    std::printf("2. back-to-back launches of one call's size (20 launches, per launch)\n");
    // Sizes in KiB read per launch: argv[2] (comma-separated), else the KDA calls' sizes.
    std::vector<size_t> kib_list;
    for (const char* p = argc > 2 ? argv[2] : "24576,49152,98304,196608"; *p != '\0'; ++p) {
      char* end = nullptr;
      const size_t kib = std::strtoull(p, &end, 10);
      if (kib > 0) kib_list.push_back(kib);
      p = end;
      if (*p == '\0') break;
    }
    for (size_t kib : kib_list) {
      const size_t seg = kib << 10;
      const int segments = static_cast<int>(total / seg), launches = kCallLaunches;
      int next = 0;
      char name[96];
      std::snprintf(name, sizeof name, "%zu KiB: cudaMemcpyAsync", kib);
      time_copy(name, seg, [&] {
        for (int l = 0; l < launches; ++l, next = (next + 1) % segments)
          CHECK(cudaMemcpyAsync(dst + next * seg, src + next * seg, seg, cudaMemcpyDeviceToDevice, stream));
      }, launches);
      // Items of 4 KiB (the best copy kernel at 4 GiB) as a CUDA graph of PDL launches,
      // the way the fused kernels are timed; enough launches to cover 256 MiB, so that
      // replays miss L2.
      if (seg % 4096 == 0) {
        const int graph_launches = std::max<int>(launches, static_cast<int>((size_t{256} << 20) / seg));
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
        for (int l = 0; l < graph_launches; ++l) {
          const size_t off = static_cast<size_t>(l % segments) * seg / 16;
          fusedstep::detail::LaunchConfig config(dim3(static_cast<unsigned>(seg / 4096)), dim3(256), 0, stream);
          config.pdl(true);
          CHECK(cudaLaunchKernelEx(config.get(), item_copy_kernel<4096, 256, true>, s4 + off, d4 + off));
        }
        CHECK(cudaStreamEndCapture(stream, &graph));
        CHECK(cudaGraphInstantiate(&exec, graph, 0));
        std::snprintf(name, sizeof name, "%zu KiB: 4 KiB items, graph + PDL", kib);
        time_copy(name, seg, [&] { CHECK(cudaGraphLaunch(exec, stream)); }, graph_launches);
        CHECK(cudaGraphExecDestroy(exec));
        CHECK(cudaGraphDestroy(graph));
      }
      if (seg % 32768 != 0) continue;
      std::snprintf(name, sizeof name, "%zu KiB: items of 32 KiB", kib);
      time_copy(name, seg, [&] {
        for (int l = 0; l < launches; ++l, next = (next + 1) % segments)
          item_copy_kernel<32768, 512><<<seg / 32768, 512, 0, stream>>>(s4 + next * seg / 16, d4 + next * seg / 16);
      }, launches);
    }
  }
  if (want(3)) {
    std::printf("3. KDA-shaped items (slot first, bulk loads, per-thread stores, per-chunk work)\n");
    int32_t* slots = nullptr;
    CHECK(cudaMalloc(&slots, total / kBulkChunk * sizeof(int32_t)));
    using Launch = void (*)(const uint4*, uint4*, const int32_t*, int, long long, int, cudaStream_t);
    struct Shape {
      const char* name;
      int item;
      Launch launch;
      bool shuffled = true;
    };
    const Shape shapes[] = {
        {"64 KiB items, 3 CTAs/SM (C = 1)", 65536, launch_shaped<65536>},
        {"64 KiB items, 3 CTAs/SM, slots in order", 65536, launch_shaped<65536>, false},
        {"32 KiB items, 6 CTAs/SM (C = 2)", 32768, launch_shaped<32768>},
        {"16 KiB items, 11 CTAs/SM (C = 4)", 16384, launch_shaped<16384>},
        {"64 KiB items, ring of 3 in 1 CTA/SM", 65536, launch_ring},
    };
    CHECK(cudaFuncSetAttribute(kda_ring_copy, cudaFuncAttributeMaxDynamicSharedMemorySize, kRingBuffers * kBulkItem));
    for (const Shape& shape : shapes) {
      const int items = static_cast<int>(total / shape.item);
      const std::vector<int32_t> order = permutation(items, shape.shuffled);
      CHECK(cudaMemcpy(slots, order.data(), items * sizeof(int32_t), cudaMemcpyHostToDevice));
      for (long long work : {0ll, 1000ll}) {
        char name[96];
        std::snprintf(name, sizeof name, "%s, work %lld", shape.name, work);
        time_copy(name, total, [&] { shape.launch(s4, d4, slots, items, work, sms, stream); });
        for (size_t mib : {size_t{12}, size_t{48}, size_t{192}}) {
          // Launches over successive windows of the permutation (slots anywhere in the
          // 4 GiB: not checked here; the 4 GiB line above copies and checks them all).
          const int per = static_cast<int>((mib << 20) / shape.item), launches = kCallLaunches;
          int next = 0;
          const double ms = median_ms([&] {
            for (int l = 0; l < launches; ++l, next = (next + per) % (items - per + 1))
              shape.launch(s4, d4, slots + next, per, work, sms, stream);
          }, 10);
          const double seconds = ms * 1e-3 / launches, bytes = double(per) * shape.item;
          std::snprintf(name, sizeof name, "  %zu MiB x 20", mib);
          std::printf("%-48s %5zu MiB %9.1f us %6.0f GB/s\n", name, mib, seconds * 1e6, 2.0 * bytes / seconds / 1e9);
        }
      }
    }
    CHECK(cudaFree(slots));
  }
  if (want(5) || want(6)) {
    const int items64 = static_cast<int>(total / 65536);
    const std::vector<int32_t> read_order = permutation(items64, true, 0x2545f4914f6cdd1dull);
    const std::vector<int32_t> write_order = permutation(items64, true, 0x9e3779b97f4a7c15ull);
    int32_t *slots = nullptr, *write_slots = nullptr;
    CHECK(cudaMalloc(&slots, 2 * items64 * sizeof(int32_t)));
    CHECK(cudaMalloc(&write_slots, 2 * items64 * sizeof(int32_t)));
    struct Case {
      int batch, q, cluster;
    };
    // One call's size of the shape, 20 launches; us a launch and GB/s.
    auto time_shape = [&](const Case c, long long first_store_ns, bool chunk_outer, long long work, double& us,
                          double& gbs) {
      const int item = 65536 / c.cluster, n = c.batch * 12 * c.cluster, launches = kCallLaunches;
      const int slots_total = static_cast<int>(total / item);
      const auto shaped = item == 65536 ? kda_shaped_copy<65536> : kda_shaped_copy<32768>;
      // Item indices of this size: the 64 KiB permutations, split in halves at C = 2.
      std::vector<int32_t> r(slots_total), w(slots_total);
      for (int i = 0; i < slots_total; ++i) {
        r[i] = c.cluster == 1 ? read_order[i] : 2 * read_order[i / 2] + i % 2;
        w[i] = c.cluster == 1 ? write_order[i] : 2 * write_order[i / 2] + i % 2;
      }
      CHECK(cudaMemcpy(slots, r.data(), slots_total * sizeof(int32_t), cudaMemcpyHostToDevice));
      CHECK(cudaMemcpy(write_slots, w.data(), slots_total * sizeof(int32_t), cudaMemcpyHostToDevice));
      int next_r = 0, next_w = 0;
      const double ms = median_ms([&] {
        for (int l = 0; l < launches; ++l) {
          const int32_t* rs = slots + next_r;
          const int32_t* ws = write_slots + next_w;
          shaped<<<n, kShapedThreads, item + item / 8, stream>>>(s4, d4, rs, work, ws, c.q, first_store_ns,
                                                                 chunk_outer);
          next_r = (next_r + n) % (slots_total - n + 1);
          next_w = (next_w + n * c.q) % (slots_total - n * c.q + 1);
        }
      }, 10);
      const double seconds = ms * 1e-3 / launches;
      us = seconds * 1e6;
      gbs = double(n) * item * (1 + c.q) / seconds / 1e9;
    };
    if (want(5)) {
      std::printf("5. the verify's shape: items read once, written q times "
                  "(20 launches of one call's size, per launch)\n");
      for (const Case c : {Case{16, 2, 2}, Case{16, 4, 2}, Case{16, 8, 2}, Case{64, 2, 1}, Case{64, 4, 1},
                           Case{64, 8, 1}, Case{128, 2, 1}, Case{128, 8, 1}}) {
        double us = 0, gbs = 0;
        time_shape(c, 0, false, 0, us, gbs);
        const size_t read_bytes = size_t{static_cast<size_t>(c.batch)} * 12 * 65536;
        const int64_t vectors = static_cast<int64_t>(read_bytes / 16);
        int plain_next = 0;
        const int plain_segments = static_cast<int>(total / (read_bytes * c.q));
        const int launches = kCallLaunches;
        const double plain_ms = median_ms([&] {
          for (int l = 0; l < launches; ++l, plain_next = (plain_next + 1) % plain_segments) {
            read_once_write_q<<<sms * 8, 256, 0, stream>>>(s4 + plain_next * vectors, d4 + plain_next * vectors * c.q,
                                                           vectors, c.q);
          }
        }, 10);
        const double plain_seconds = plain_ms * 1e-3 / launches, bytes = double(read_bytes) * (1 + c.q);
        std::printf("batch %3d q = %d C = %d: %6.1f MB a call: shape %7.1f us %6.0f GB/s; read once, write q (plain) "
                    "%7.1f us %6.0f GB/s\n",
                    c.batch, c.q, c.cluster, bytes / 1e6, us, gbs, plain_seconds * 1e6, bytes / plain_seconds / 1e9);
      }
    }
    if (want(6)) {
      std::printf("6. the verify's shape, C = 1: no store before X us after a CTA's entry; whole items per "
                  "write slot / the kernel's order (a chunk to every write slot, then the next chunk)\n");
      for (const Case c : {Case{64, 4, 1}, Case{64, 8, 1}, Case{128, 8, 1}}) {
        for (const long long ns : {0LL, 3000LL, 6000LL, 9000LL}) {
          double us_item = 0, gbs_item = 0, us_chunk = 0, gbs_chunk = 0;
          time_shape(c, ns, false, 0, us_item, gbs_item);
          time_shape(c, ns, true, 0, us_chunk, gbs_chunk);
          std::printf("batch %3d q = %d, first store >= %4.1f us: items %7.1f us %6.0f GB/s; chunks %7.1f us %6.0f "
                      "GB/s\n",
                      c.batch, c.q, ns * 1e-3, us_item, gbs_item, us_chunk, gbs_chunk);
        }
        // The kernel's arithmetic between a token's stores: `work` cycles per chunk and
        // write slot, in the kernel's order, first store 6 us after entry.
        for (const long long work : {500LL, 1000LL, 2000LL, 4000LL}) {
          double us = 0, gbs = 0;
          time_shape(c, 6000, true, work, us, gbs);
          std::printf("batch %3d q = %d, kernel's order, %4lld cycles per chunk and slot: %7.1f us %6.0f GB/s\n", c.batch,
                      c.q, work, us, gbs);
        }
      }
    }
    CHECK(cudaFree(slots));
    CHECK(cudaFree(write_slots));
  }
  if (want(7)) {
    std::printf("7. the mHC elementwise shape, 20 launches per size (per launch)\n");
    CHECK(cudaFuncSetAttribute(mhc_shaped_copy<2>, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
    CHECK(cudaFuncSetAttribute(mhc_shaped_copy<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
    for (const int64_t tokens : {int64_t{336}, int64_t{2048}}) {
      const int64_t quads = 5120 * tokens * 2 / 16;  // per stream: one row of H BF16 values per token
      const size_t bytes = size_t(5 * quads * 16), segment = (bytes + (1u << 20) - 1) >> 20 << 20;
      for (const int per_sm : {2, 1}) {
        for (const int in_flight : {2, 4}) {
          char name[112];
          std::snprintf(name, sizeof name, "hidden 5120 T = %lld, %d streaming CTA%s per SM, %d chunks in flight",
                        static_cast<long long>(tokens), per_sm, per_sm == 1 ? "" : "s", in_flight);
          const size_t smem = per_sm == 1 ? 200 * 1024 : 112 * 1024;
          auto kernel = in_flight == 2 ? mhc_shaped_copy<2> : mhc_shaped_copy<4>;
          time_copy(name, bytes, [&] {
            for (int n = 0; n < 20; ++n) {
              const size_t off = (n * segment) % (total - segment);
              kernel<<<sms * per_sm, 256, smem, stream>>>(reinterpret_cast<const uint4*>(src + off),
                                                          reinterpret_cast<uint4*>(dst + off), quads);
            }
          }, 20);
        }
      }
    }
  }
  if (want(8)) {
    std::printf("8. BF16 C = 1 requests (32 KiB items) with a chain of X us before the store, 12 heads, "
                "20 launches of one call's size (per launch)\n");
    constexpr int kItem = 32768;
    const int items = static_cast<int>(total / kItem);
    const std::vector<int32_t> order = permutation(items, true);
    int32_t* slots = nullptr;
    CHECK(cudaMalloc(&slots, items * sizeof(int32_t)));
    CHECK(cudaMemcpy(slots, order.data(), items * sizeof(int32_t), cudaMemcpyHostToDevice));
    // Three CTAs an SM (the kernel's 128 registers) in every form: 72 KiB of shared memory.
    const int three = 2 * kItem + kItem / 4;
    CHECK(cudaFuncSetAttribute(kda_shaped_copy<kItem>, cudaFuncAttributeMaxDynamicSharedMemorySize, three));
    CHECK(cudaFuncSetAttribute(kda_chain_ring<kItem>, cudaFuncAttributeMaxDynamicSharedMemorySize, three));
    for (const int batch : {64, 256}) {
      const int n = batch * 12;
      for (const long long ns : {0LL, 4000LL, 8000LL}) {
        double us[3];
        for (int form = 0; form < 3; ++form) {  // a CTA a request at three / six an SM; two requests a CTA
          int next = 0;
          const double ms = median_ms([&] {
            for (int l = 0; l < kCallLaunches; ++l, next = (next + n) % (items - n + 1)) {
              if (form == 2) {
                kda_chain_ring<kItem><<<3 * sms, kShapedThreads, three, stream>>>(s4, d4, slots + next, n, ns);
              } else {
                kda_shaped_copy<kItem><<<n, kShapedThreads, form == 0 ? three : kItem + kItem / 8, stream>>>(
                    s4, d4, slots + next, 0, nullptr, 1, ns, false);
              }
            }
          }, 10);
          us[form] = ms * 1e3 / kCallLaunches;
        }
        std::printf("batch %3d, chain %4.1f us: a CTA a request, 3 / SM %7.1f us, 6 / SM %7.1f us; two requests a "
                    "CTA, 3 / SM %7.1f us\n",
                    batch, ns * 1e-3, us[0], us[1], us[2]);
      }
    }
    CHECK(cudaFree(slots));
  }
  if (want(4)) {
    std::printf("4. copy engines or SMs\n");
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
    CHECK(cudaStreamDestroy(other));
  }
  return 0;
}
