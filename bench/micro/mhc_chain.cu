// SPDX-License-Identifier: Apache-2.0
// Microbenchmark behind docs/design.md, "The dependent chain at small T": the chain a
// T = 1 mHC boundary call cannot avoid on one 16-CTA cluster (launch, the activations'
// round trip, the DSMEM exchange, the coefficients, the weight through the MMAs), built
// up stage by stage, which bounds the small-T call from below (the 5 us target against
// this chain's 4.4 us). Every stage is a kernel with the fused kernel's launch shape
// (one 16-CTA cluster of 256 threads, 227 KB of dynamic shared memory, PDL), timed per
// launch over CUDA-graph replays of back-to-back launches, the activations rotating over
// 512 sets (about 100 MB read and written per replay, so they miss L2 as a real step's
// do) and the weights over 64 sets (128 MB). Stages, each one adding to the one before:
//  0. launch: cluster arrive, griddepcontrol.wait, launch_dependents, cluster wait;
//  1. + one token's activations: each CTA loads its slice of x and of the four residual
//     streams (one 16-byte vector per thread), one FMA a value, stores its slice of the
//     new residual and of layer_input, and reduces a CTA sum (a slice sum of squares);
//  2. + the exchange: every CTA pushes 28 floats to rank 0 by st.async on rank 0's
//     mbarrier (the fused kernel's pushes to a token's owner), rank 0 waits for them;
//  3. + the coefficients: rank 0's last warp sums the 16 slices and runs the fused
//     kernel's coefficients_half_warp (sigmoids, softmax, 20 Sinkhorn iterations), and
//     stores pre / post / comb;
//  4. + the mixer GEMM's weight: each CTA's 123 KB weight slice (hidden 5120, TF32
//     modes) copied to shared memory by cp.async before the PDL wait, as the fused kernel
//     does, and read back into 10 k steps x 3 MMAs per warp after the activations.
// Left out of stage 4: the fused kernel's arithmetic on the activations (the residual
// update of 4 streams, the collapse, the chunk sums, the B-fragment staging), its
// layer-input pass, and its padding and tile logic. The numbers are not bitwise results
// of anything: the kernels only keep the fused kernel's dependencies.
// Usage: micro_mhc_chain [hidden] (default 5120).
// H200 (2026-11-30), us per launch for stages 0-4: hidden 5120 0.75 / 1.44-1.46 /
// 1.58-1.60 / 3.51-3.61 / 4.37-4.40 (two runs); hidden 4096 0.75 / 1.36 / 1.50 / 3.46 /
// 4.21. The fused kernel at T = 1 in the same run: 6.75 / 7.07 us.
#include <cooperative_groups.h>
#include <cuda/ptx>
#include <cuda_pipeline.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "common/launch.h"
#include "common/ptx.cuh"
#include "cuda_check.h"
#include "mhc_boundary/config.h"
#include "mhc_boundary/stage_math.cuh"

namespace {

using namespace fusedstep;
namespace cg = cooperative_groups;

using mhc::kCluster;
using mhc::kMixes;
using mhc::kRecvFloats;  // pushed per slice: the mixes, a sum of squares, padding
constexpr int kThreads = 256, kWarps = kThreads / 32;
constexpr int kSmem = 227 * 1024;
constexpr int kActSets = 512, kWeightSets = 64, kLaunches = 512, kReplays = 15;
constexpr int kMTiles = 3;       // TF32 modes

struct Args {
  const uint4* x;         // [sets][hidden] BF16 as 16-byte vectors
  const uint4* residual;  // [sets][4][hidden]
  const uint4* weight;    // [weight sets][16 ranks][steps][3][32] vectors
  uint4* residual_out;    // [sets][4][hidden]
  uint4* layer_input;     // [sets][hidden]
  float* coef_out;        // [sets][kMixes]
  const float* hc;        // scale[3] | base[24]
  int hidden, set, weight_set;
};

template <int kStage>
__global__ void __launch_bounds__(kThreads, 1) chain_kernel(const Args a) {
  extern __shared__ __align__(128) unsigned char smem[];
  const cg::cluster_group cluster = cg::this_cluster();
  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const int rank = static_cast<int>(cluster.block_rank());
  const int slice_vecs = a.hidden / kCluster / 8;  // 16-byte vectors of a slice row
  const int steps = 4 * (a.hidden / kCluster) / 16 / kWarps;  // k steps per warp
  uint64_t* bar = reinterpret_cast<uint64_t*>(smem);
  float* s_red = reinterpret_cast<float*>(smem + 128);    // warp sums [8] | mixes [24] | ssq
  float* s_recv = reinterpret_cast<float*>(smem + 512);   // [16 ranks][28]
  uint4* s_stage = reinterpret_cast<uint4*>(smem + 4096);  // the weight slice
  const uint4* w = a.weight + (static_cast<int64_t>(a.weight_set) * kCluster + rank) * steps * kWarps * kMTiles * 32;

  if (tid == 0) {
    cuda::ptx::mbarrier_init(bar, 1u);
    cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster);
    if (rank == 0) {
      cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cluster, cuda::ptx::space_shared,
                                           bar, static_cast<uint32_t>(kCluster * kRecvFloats * 4));
    }
  }
  if constexpr (kStage >= 4) {
    const int vecs = steps * kWarps * kMTiles * 32;
    for (int i = tid; i < vecs; i += kThreads) __pipeline_memcpy_async(s_stage + i, w + i, sizeof(uint4));
    __pipeline_commit();
  }
  cuda::ptx::barrier_cluster_arrive(cuda::ptx::sem_relaxed);
  ptx::griddep_wait();

  float partial = 0.0f;
  uint32_t b[2] = {0u, 0u};
  if constexpr (kStage >= 1) {
    // Row r = 0 (x) or 1 + stream; vector v of this CTA's slice.
    const int r = tid / slice_vecs, v = tid % slice_vecs;
    const int64_t col = static_cast<int64_t>(rank) * slice_vecs + v;
    const int64_t hv = a.hidden / 8;
    uint4 in = make_uint4(0u, 0u, 0u, 0u);
    if (r == 0) in = __ldg(a.x + a.set * hv + col);
    else if (r < 5) in = __ldg(a.residual + (static_cast<int64_t>(a.set) * 4 + r - 1) * hv + col);
    if (r < 5) {
      const uint32_t words[4] = {in.x, in.y, in.z, in.w};
      uint32_t out[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float lo = __uint_as_float(words[k] << 16), hi = __uint_as_float(words[k] & 0xffff0000u);
        const float nlo = __fmaf_rn(lo, 1.5f, 0.25f), nhi = __fmaf_rn(hi, 1.5f, 0.25f);
        partial = __fmaf_rn(nlo, nlo, __fmaf_rn(nhi, nhi, partial));
        out[k] = (__float_as_uint(nhi) & 0xffff0000u) | (__float_as_uint(nlo) >> 16);
      }
      b[0] = out[0];
      b[1] = out[1];
      const uint4 o = make_uint4(out[0], out[1], out[2], out[3]);
      if (r == 0) a.layer_input[a.set * hv + col] = o;
      else a.residual_out[(static_cast<int64_t>(a.set) * 4 + r - 1) * hv + col] = o;
    }
  }
  if constexpr (kStage >= 4) {
    __pipeline_wait_prior(0);
    __syncthreads();
    // 10 k steps x 3 MMAs per warp (hidden 5120), A from shared memory, as the fused
    // kernel's staged steps.
    float acc[kMTiles][4] = {};
    const uint4* a_warp = s_stage + warp * steps * kMTiles * 32 + lane;
#pragma unroll 2
    for (int step = 0; step < steps; ++step) {
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        const uint4 a4 = a_warp[(step * kMTiles + mt) * 32];
        const uint32_t af[4] = {a4.x, a4.y, a4.z, a4.w};
        ptx::mma_bf16_m16n8k16(acc[mt], af, b, acc[mt]);
      }
    }
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) partial += acc[mt][0] + acc[mt][1] + acc[mt][2] + acc[mt][3];
  }
  if constexpr (kStage >= 1) {
#pragma unroll
    for (int off = 16; off > 0; off /= 2) partial += __shfl_xor_sync(0xffffffffu, partial, off);
    if (lane == 0) s_red[warp] = partial;
    __syncthreads();
  }
  cluster.barrier_wait();  // every peer's mbarrier is initialized
  if constexpr (kStage >= 2) {
    if (tid < kRecvFloats / 4) {
      uint32_t v[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) v[k] = __float_as_uint(s_red[(4 * tid + k) % kWarps] * static_cast<float>(k + 1));
      uint32_t* dst = reinterpret_cast<uint32_t*>(s_recv + rank * kRecvFloats + 4 * tid);
      cuda::ptx::st_async(cluster.map_shared_rank(dst, 0), v, cluster.map_shared_rank(bar, 0));
    }
    if (rank == 0) {
      while (!cuda::ptx::mbarrier_try_wait_parity(cuda::ptx::sem_acquire, cuda::ptx::scope_cluster, bar, 0u)) {
      }
    }
  }
  cuda::ptx::barrier_cluster_arrive(cuda::ptx::sem_relaxed);
  ptx::griddep_launch_dependents();
  if constexpr (kStage >= 3) {
    if (rank == 0 && warp == kWarps - 1) {
      float* mix = s_red + kWarps;  // the mixes, then the sum of squares
      if (lane <= kMixes) {
        float sum = 0.0f;
#pragma unroll
        for (int r = 0; r < kCluster; ++r) sum = __fadd_rn(sum, s_recv[r * kRecvFloats + lane]);
        mix[lane] = fabsf(sum) * 1e-3f + 1.0f;
      }
      __syncwarp();
      const mhc::CoefficientScalars s{1e-6f, 1e-6f, 1e-6f, 2.0f, 20};
      const mhc::HalfWarpCoefficients c = mhc::coefficients_half_warp(mix, mix[kMixes], a.hidden, a.hc, a.hc + 3, s);
      if (lane < 16) a.coef_out[a.set * kMixes + lane] = c.comb;
      else if (lane < kMixes) a.coef_out[a.set * kMixes + lane] = c.pre_post;
    }
  }
  cluster.barrier_wait();
}

template <int kStage>
void set_attributes() {
  CHECK(cudaFuncSetAttribute(chain_kernel<kStage>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
  CHECK(cudaFuncSetAttribute(chain_kernel<kStage>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
}

template <int kStage>
void launch(const Args& a, cudaStream_t stream) {
  detail::LaunchConfig config(dim3(kCluster), dim3(kThreads), kSmem, stream);
  config.cluster(kCluster).pdl(true);
  CHECK(cudaLaunchKernelEx(config.get(), chain_kernel<kStage>, a));
}

// Microseconds per launch: median over kReplays replays of a graph of kLaunches
// launches, each on the next activation and weight set.
template <int kStage>
double time_stage(Args a, cudaStream_t stream) {
  set_attributes<kStage>();
  cudaGraph_t graph;
  CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < kLaunches; ++i) {
    a.set = i % kActSets;
    a.weight_set = i % kWeightSets;
    launch<kStage>(a, stream);
  }
  CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  std::vector<float> ms;
  for (int r = 0; r < kReplays + 2; ++r) {
    CHECK(cudaEventRecord(start, stream));
    CHECK(cudaGraphLaunch(exec, stream));
    CHECK(cudaEventRecord(stop, stream));
    CHECK(cudaEventSynchronize(stop));
    float t = 0.0f;
    CHECK(cudaEventElapsedTime(&t, start, stop));
    if (r >= 2) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
  CHECK(cudaEventDestroy(start));
  CHECK(cudaEventDestroy(stop));
  return ms[ms.size() / 2] * 1e3 / kLaunches;
}

__global__ void fill(uint32_t* p, size_t n) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u;
    h ^= h >> 15;
    p[i] = (h & 0x3f7f3f7fu) | 0x3c003c00u;  // BF16 pairs of moderate magnitude, never NaN
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int hidden = argc > 1 ? std::atoi(argv[1]) : 5120;
  if (hidden % (kCluster * 32) != 0 || hidden / kCluster / 8 * 5 > kThreads) {
    std::fprintf(stderr, "hidden must be a multiple of 512, at most 6553 (5 slice rows of vectors a thread each)\n");
    return 2;
  }
  const size_t hv = static_cast<size_t>(hidden) / 8;
  const size_t weight_vecs = static_cast<size_t>(kCluster) * (4 * hidden / kCluster / 16) * kMTiles * 32;
  if (weight_vecs / kCluster * 16 + 4096 > static_cast<size_t>(kSmem)) {
    std::fprintf(stderr, "the weight slice of hidden %d does not fit\n", hidden);
    return 2;
  }
  uint4 *x, *residual, *weight, *residual_out, *layer_input;
  float *coef_out, *hc;
  CHECK(cudaMalloc(&x, kActSets * hv * 16));
  CHECK(cudaMalloc(&residual, kActSets * 4 * hv * 16));
  CHECK(cudaMalloc(&weight, kWeightSets * weight_vecs * 16));
  CHECK(cudaMalloc(&residual_out, kActSets * 4 * hv * 16));
  CHECK(cudaMalloc(&layer_input, kActSets * hv * 16));
  CHECK(cudaMalloc(&coef_out, kActSets * kMixes * sizeof(float)));
  CHECK(cudaMalloc(&hc, 32 * sizeof(float)));
  fill<<<1024, 256>>>(reinterpret_cast<uint32_t*>(x), kActSets * hv * 4);
  fill<<<1024, 256>>>(reinterpret_cast<uint32_t*>(residual), kActSets * 4 * hv * 4);
  fill<<<1024, 256>>>(reinterpret_cast<uint32_t*>(weight), kWeightSets * weight_vecs * 4);
  fill<<<1, 32>>>(reinterpret_cast<uint32_t*>(hc), 32);
  CHECK(cudaGetLastError());
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CHECK(cudaDeviceSynchronize());
  const Args a{x, residual, weight, residual_out, layer_input, coef_out, hc, hidden, 0, 0};
  std::printf("mHC T = 1 dependent chain, hidden %d, us per launch (graph replays of %d launches, PDL)\n", hidden,
              kLaunches);
  std::printf("0 launch (arrive, PDL wait, cluster wait)   %6.2f\n", time_stage<0>(a, stream));
  std::printf("1 + one token's activations round trip      %6.2f\n", time_stage<1>(a, stream));
  std::printf("2 + DSMEM exchange to the owner             %6.2f\n", time_stage<2>(a, stream));
  std::printf("3 + coefficients (20 Sinkhorn iterations)   %6.2f\n", time_stage<3>(a, stream));
  std::printf("4 + weight slice staged, 10 x 3 MMAs a warp %6.2f\n", time_stage<4>(a, stream));
  CHECK(cudaDeviceSynchronize());
  return 0;
}
