// SPDX-License-Identifier: Apache-2.0
// fusedstep-bench: the layer context's own kernels (layer_kernels.h).
#include <cuda_pipeline.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "common/ptx.cuh"
#include "layer_kernels.h"

namespace fusedstep::bench {
namespace {

// ---- release_gemm: CTA tiles of kBm x 64 x 64, four warps, a four-stage cp.async ring,
// ldmatrix + mma.sync m16n8k16. Split-K where the tiles would not fill two CTAs an SM
// (decode's few rows: the weight stream needs every SM), the last CTA of a tile summing
// the partials in split order.
constexpr int kBn = 64;
constexpr int kBk = 64;
constexpr int kGemmThreads = 128;
constexpr int kStages = 4;
constexpr int kPitch = kBk + 8;  // shared row pitch in elements: 144 bytes, ldmatrix rows conflict-free

template <int kBm>
struct WarpGrid;
template <>
struct WarpGrid<16> {
  static constexpr int m = 1, n = 4;
};
template <>
struct WarpGrid<64> {
  static constexpr int m = 2, n = 2;
};
template <>
struct WarpGrid<128> {
  static constexpr int m = 2, n = 2;
};

template <int kBm>
constexpr int gemm_smem_bytes() {
  return kStages * (kBm + kBn) * kPitch * 2;
}

struct GemmPlan {
  int bm = 0, m_tiles = 0, n_tiles = 0, splits = 1, k_per_split = 0, k_tiles = 0;
};

GemmPlan plan_gemm(int m, int n, int k, int sm_count) {
  GemmPlan p;
  p.bm = m <= 16 ? 16 : m <= 64 ? 64 : 128;
  p.m_tiles = (m + p.bm - 1) / p.bm;
  p.n_tiles = (n + kBn - 1) / kBn;
  p.k_tiles = k / kBk;
  const int tiles = p.m_tiles * p.n_tiles;
  const int target = 2 * std::max(sm_count, 1);
  int splits = 1;
  if (tiles < target) splits = std::min({(target + tiles - 1) / tiles, std::max(1, p.k_tiles / 4), 16});
  p.k_per_split = (p.k_tiles + splits - 1) / splits;
  p.splits = (p.k_tiles + p.k_per_split - 1) / p.k_per_split;  // no empty split
  return p;
}

template <int kBm>
__global__ void __launch_bounds__(kGemmThreads, 1)
    release_gemm_kernel(const __nv_bfloat16* __restrict__ a, int64_t lda, const __nv_bfloat16* __restrict__ b,
                        int64_t ldb, __nv_bfloat16* __restrict__ c, int64_t ldc, int m, int n, int k_tiles,
                        int k_per_split, float* __restrict__ partial, int* __restrict__ counters) {
  // The early release: a dependent launched with PDL may start once every CTA got here;
  // its griddepcontrol.wait still waits for this grid's completion and writes.
  ptx::griddep_launch_dependents();
  constexpr int kWm = kBm / WarpGrid<kBm>::m, kWn = kBn / WarpGrid<kBm>::n;
  constexpr int kMt = kWm / 16, kNt = kWn / 8;
  extern __shared__ __align__(16) __nv_bfloat16 smem[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp / WarpGrid<kBm>::n, wn = warp % WarpGrid<kBm>::n;
  const int m0 = blockIdx.x * kBm, n0 = blockIdx.y * kBn;
  const int kt_begin = blockIdx.z * k_per_split;
  const int kt_count = min(k_per_split, k_tiles - kt_begin);

  // Rows past m or n are zero-filled.
  auto load = [&](int stage, int kt) {
    __nv_bfloat16* sa = smem + stage * (kBm + kBn) * kPitch;
    __nv_bfloat16* sb = sa + kBm * kPitch;
    const int64_t k0 = int64_t{kt_begin + kt} * kBk;
    for (int i = tid; i < kBm * 8; i += kGemmThreads) {
      const int row = i >> 3, chunk = i & 7;
      const bool in = m0 + row < m;
      const __nv_bfloat16* src = in ? a + (m0 + row) * lda + k0 + chunk * 8 : a;
      __pipeline_memcpy_async(sa + row * kPitch + chunk * 8, src, 16, in ? 0 : 16);
    }
    for (int i = tid; i < kBn * 8; i += kGemmThreads) {
      const int row = i >> 3, chunk = i & 7;
      const bool in = n0 + row < n;
      const __nv_bfloat16* src = in ? b + (n0 + row) * ldb + k0 + chunk * 8 : b;
      __pipeline_memcpy_async(sb + row * kPitch + chunk * 8, src, 16, in ? 0 : 16);
    }
  };

  float acc[kMt][kNt][4] = {};
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < kt_count) load(s, s);
    __pipeline_commit();
  }
  for (int kt = 0; kt < kt_count; ++kt) {
    __pipeline_wait_prior(kStages - 2);
    __syncthreads();  // stage kt landed for every thread; stage kt - 1 is free to refill
    if (kt + kStages - 1 < kt_count) load((kt + kStages - 1) % kStages, kt + kStages - 1);
    __pipeline_commit();
    const __nv_bfloat16* sa = smem + (kt % kStages) * (kBm + kBn) * kPitch;
    const __nv_bfloat16* sb = sa + kBm * kPitch;
#pragma unroll
    for (int kk = 0; kk < kBk / 16; ++kk) {
      uint32_t af[kMt][4], bf[kNt][2];
#pragma unroll
      for (int mt = 0; mt < kMt; ++mt) {
        const __nv_bfloat16* p = sa + (wm * kWm + mt * 16 + (lane & 15)) * kPitch + kk * 16 + (lane >> 4) * 8;
        ptx::ldmatrix_x4(af[mt], static_cast<uint32_t>(__cvta_generic_to_shared(p)));
      }
#pragma unroll
      for (int np = 0; np < kNt / 2; ++np) {
        const __nv_bfloat16* p =
            sb + (wn * kWn + np * 16 + (lane & 7) + (lane >> 4) * 8) * kPitch + kk * 16 + ((lane >> 3) & 1) * 8;
        uint32_t r[4];
        ptx::ldmatrix_x4(r, static_cast<uint32_t>(__cvta_generic_to_shared(p)));
        bf[2 * np][0] = r[0];
        bf[2 * np][1] = r[1];
        bf[2 * np + 1][0] = r[2];
        bf[2 * np + 1][1] = r[3];
      }
#pragma unroll
      for (int mt = 0; mt < kMt; ++mt)
#pragma unroll
        for (int nt = 0; nt < kNt; ++nt) ptx::mma_bf16_m16n8k16(acc[mt][nt], af[mt], bf[nt], acc[mt][nt]);
    }
  }

  // Fragment element (mt, nt, h) holds rows g (h = 0) and g + 8 (h = 1), columns 2t, 2t + 1.
  const int g = lane >> 2, t = lane & 3;
  auto row_of = [&](int mt, int h) { return m0 + wm * kWm + mt * 16 + g + h * 8; };
  auto col_of = [&](int nt) { return n0 + wn * kWn + nt * 8 + 2 * t; };
  // f(mt, nt, h, row, col) for every fragment element pair inside the m x n output.
  auto each_pair = [&](auto&& f) {
#pragma unroll
    for (int mt = 0; mt < kMt; ++mt)
#pragma unroll
      for (int nt = 0; nt < kNt; ++nt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = row_of(mt, h), col = col_of(nt);
          if (row < m && col < n) f(mt, nt, h, row, col);
        }
  };
  if (gridDim.z == 1) {
    each_pair([&](int mt, int nt, int h, int row, int col) {
      *reinterpret_cast<__nv_bfloat162*>(c + row * ldc + col) =
          __floats2bfloat162_rn(acc[mt][nt][2 * h], acc[mt][nt][2 * h + 1]);
    });
    return;
  }
  each_pair([&](int mt, int nt, int h, int row, int col) {
    *reinterpret_cast<float2*>(partial + (int64_t{blockIdx.z} * m + row) * n + col) =
        make_float2(acc[mt][nt][2 * h], acc[mt][nt][2 * h + 1]);
  });
  __shared__ int last;
  __threadfence();
  __syncthreads();
  if (tid == 0) {
    int* counter = counters + blockIdx.y * gridDim.x + blockIdx.x;
    last = atomicAdd(counter, 1) == static_cast<int>(gridDim.z) - 1;
    if (last) *counter = 0;  // every split has arrived: ready for the next GEMM
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  each_pair([&](int, int, int, int row, int col) {
    float2 sum = make_float2(0.0f, 0.0f);
    for (int s = 0; s < static_cast<int>(gridDim.z); ++s) {
      const float2 v = __ldcg(reinterpret_cast<const float2*>(partial + (int64_t{s} * m + row) * n + col));
      sum.x += v.x;
      sum.y += v.y;
    }
    *reinterpret_cast<__nv_bfloat162*>(c + row * ldc + col) = __floats2bfloat162_rn(sum.x, sum.y);
  });
}

template <int kBm>
cudaError_t launch_gemm(const GemmPlan& p, const __nv_bfloat16* a, int64_t lda, const __nv_bfloat16* b,
                        int64_t ldb, __nv_bfloat16* c, int64_t ldc, int m, int n, const GemmScratch& scratch,
                        cudaStream_t stream) {
  const dim3 grid(p.m_tiles, p.n_tiles, p.splits);
  release_gemm_kernel<kBm><<<grid, kGemmThreads, gemm_smem_bytes<kBm>(), stream>>>(
      a, lda, b, ldb, c, ldc, m, n, p.k_tiles, p.k_per_split, scratch.partial, scratch.counters);
  return cudaGetLastError();
}

// ---- the kernels in the op's place
__global__ void trivial_kernel(int* flag, bool pdl) {
  if (pdl) ptx::griddep_wait();
  if (threadIdx.x == 0) *flag = 1;
}

constexpr int kCopyThreads = 256;
constexpr int kCopyUnroll = 8;

// No __restrict__: the stores go where the loads came from.
__global__ void __launch_bounds__(kCopyThreads) inplace_copy_kernel(uint4* data, int64_t vectors, bool pdl) {
  const int64_t stride = int64_t{gridDim.x} * kCopyThreads;
  bool waited = !pdl;
  for (int64_t i = blockIdx.x * int64_t{kCopyThreads} + threadIdx.x; i < vectors; i += kCopyUnroll * stride) {
    uint4 v[kCopyUnroll];
#pragma unroll
    for (int u = 0; u < kCopyUnroll; ++u) {
      if (i + u * stride < vectors) v[u] = data[i + u * stride];
    }
    if (!waited) {
      ptx::griddep_wait();
      waited = true;
    }
    // Memory may have changed as far as the compiler knows: the stores of the values just
    // loaded stay (otherwise they are dead, and so are the loads).
    asm volatile("" ::: "memory");
#pragma unroll
    for (int u = 0; u < kCopyUnroll; ++u) {
      if (i + u * stride < vectors) data[i + u * stride] = v[u];
    }
  }
  if (!waited) ptx::griddep_wait();
}

__global__ void transpose_conv_weight_kernel(const float* in, int64_t section_stride, int64_t channel_stride,
                                             int64_t tap_stride, int64_t dim, float* out) {
  const int64_t total = 3 * 4 * dim;
  for (int64_t o = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; o < total; o += int64_t{gridDim.x} * blockDim.x) {
    const int64_t s = o / (4 * dim), j = (o / dim) % 4, i = o % dim;
    out[o] = in[s * section_stride + i * channel_stride + j * tap_stride];
  }
}

cudaLaunchAttribute pdl_attribute() {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  return attribute;
}

}  // namespace

int64_t release_gemm_partial_floats(int m, int n, int k, int sm_count) {
  const GemmPlan p = plan_gemm(m, n, k, sm_count);
  return p.splits > 1 ? int64_t{p.splits} * m * n : 0;
}

int64_t release_gemm_counters(int m, int n, int k, int sm_count) {
  const GemmPlan p = plan_gemm(m, n, k, sm_count);
  return p.splits > 1 ? int64_t{p.m_tiles} * p.n_tiles : 0;
}

cudaError_t release_gemm_setup() {
  cudaError_t err = cudaFuncSetAttribute(release_gemm_kernel<16>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         gemm_smem_bytes<16>());
  if (err == cudaSuccess) {
    err = cudaFuncSetAttribute(release_gemm_kernel<64>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               gemm_smem_bytes<64>());
  }
  if (err == cudaSuccess) {
    err = cudaFuncSetAttribute(release_gemm_kernel<128>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               gemm_smem_bytes<128>());
  }
  return err;
}

cudaError_t release_gemm(const __nv_bfloat16* a, int64_t lda, const __nv_bfloat16* b, int64_t ldb,
                         __nv_bfloat16* c, int64_t ldc, int m, int n, int k, int sm_count,
                         const GemmScratch& scratch, cudaStream_t stream) {
  if (m <= 0 || n <= 0 || k <= 0 || k % kBk != 0 || n % 2 != 0 || lda % 8 != 0 || ldb % 8 != 0 || ldc % 2 != 0) {
    return cudaErrorInvalidValue;
  }
  const GemmPlan p = plan_gemm(m, n, k, sm_count);
  if (p.splits > 1 && (scratch.partial_floats < int64_t{p.splits} * m * n ||
                       scratch.counter_count < int64_t{p.m_tiles} * p.n_tiles)) {
    return cudaErrorInvalidValue;
  }
  switch (p.bm) {
    case 16: return launch_gemm<16>(p, a, lda, b, ldb, c, ldc, m, n, scratch, stream);
    case 64: return launch_gemm<64>(p, a, lda, b, ldb, c, ldc, m, n, scratch, stream);
    default: return launch_gemm<128>(p, a, lda, b, ldb, c, ldc, m, n, scratch, stream);
  }
}

cudaError_t launch_trivial(int* flag, bool pdl, cudaStream_t stream) {
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(1);
  config.blockDim = dim3(32);
  config.stream = stream;
  cudaLaunchAttribute attribute = pdl_attribute();
  config.attrs = &attribute;
  config.numAttrs = pdl ? 1 : 0;
  return cudaLaunchKernelEx(&config, trivial_kernel, flag, pdl);
}

cudaError_t launch_inplace_copy(void* data, int64_t bytes, bool pdl, int sm_count, cudaStream_t stream) {
  if (bytes % 16 != 0 || (reinterpret_cast<uintptr_t>(data) & 15) != 0) return cudaErrorInvalidValue;
  const int64_t vectors = bytes / 16;
  // Small copies as many short CTAs, large ones eight CTAs an SM striding over the rest.
  const int64_t blocks = std::clamp<int64_t>((vectors + kCopyThreads - 1) / kCopyThreads, 1,
                                             int64_t{std::max(sm_count, 1)} * 8);
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(blocks));
  config.blockDim = dim3(kCopyThreads);
  config.stream = stream;
  cudaLaunchAttribute attribute = pdl_attribute();
  config.attrs = &attribute;
  config.numAttrs = pdl ? 1 : 0;
  return cudaLaunchKernelEx(&config, inplace_copy_kernel, static_cast<uint4*>(data), vectors, pdl);
}

cudaError_t transpose_conv_weight(const float* in, int64_t section_stride, int64_t channel_stride,
                                  int64_t tap_stride, int64_t dim, float* out, cudaStream_t stream) {
  const int64_t total = 3 * 4 * dim;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>((total + 255) / 256, 1024));
  transpose_conv_weight_kernel<<<blocks, 256, 0, stream>>>(in, section_stride, channel_stride, tap_stride, dim,
                                                            out);
  return cudaGetLastError();
}

}  // namespace fusedstep::bench
