// SPDX-License-Identifier: Apache-2.0
// synccheck_cluster_probe: does compute-sanitizer's synccheck handle mbarriers in
// clusters of more than 8 CTAs (the non-portable sizes fusedstep's kernels use)?
//
// The protocol is the one both fused kernels use, reduced to its bones: thread 0 of
// each CTA initializes an mbarrier, fences the init to the cluster, arms it with
// arrive.expect_tx for 16 bytes, a cluster barrier; then thread 0 pushes 16 bytes
// with st.async into the next rank's buffer, completing on that rank's mbarrier; every
// CTA waits on its own mbarrier, checks the received value, and a final cluster
// barrier keeps the shared memory alive until every push has landed.
//
// Usage: synccheck_cluster_probe CLUSTER [CLUSTERS [cta]]   (prints "ok" or the mismatches;
//        "cta" arms the mbarrier with .cta scope, as the KDA kernel does)
// Run under: compute-sanitizer --tool synccheck <build>/tests/tools/synccheck_cluster_probe 16
// (scripts/gpu-check.sh does, at 8 and at 16 CTAs, before it reads the fused kernels'
// synccheck reports). Measured on the H200 (2026-11-29, compute-sanitizer of CUDA 13.0):
// 8 CTAs: no report; 16 CTAs: "Missing wait" at the arrive.expect_tx, only in CTAs of
// rank 8-15, while every pushed value arrives where it should.
#include <cooperative_groups.h>
#include <cuda/ptx>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

namespace cg = cooperative_groups;
namespace cptx = cuda::ptx;

__global__ void probe_kernel(unsigned* errors, bool arm_cta_scope) {
  __shared__ alignas(16) uint32_t inbox[4];
  __shared__ alignas(8) uint64_t bar;
  cg::cluster_group cluster = cg::this_cluster();
  const unsigned rank = cluster.block_rank();
  const unsigned size = cluster.num_blocks();
  if (threadIdx.x == 0) {
    cptx::mbarrier_init(&bar, 1u);
    cptx::fence_mbarrier_init(cptx::sem_release, cptx::scope_cluster);
    if (arm_cta_scope) {  // as the KDA kernel arms its decay barrier
      cptx::mbarrier_arrive_expect_tx(cptx::sem_release, cptx::scope_cta, cptx::space_shared, &bar,
                                      uint32_t{sizeof(inbox)});
    } else {  // as the mHC kernel arms its exchange barrier
      cptx::mbarrier_arrive_expect_tx(cptx::sem_release, cptx::scope_cluster, cptx::space_shared, &bar,
                                      uint32_t{sizeof(inbox)});
    }
  }
  cluster.sync();
  if (threadIdx.x == 0) {
    const unsigned next = (rank + 1) % size;
    const uint32_t v[4] = {blockIdx.x, rank, 0x5eedu, 0u};
    cptx::st_async(cluster.map_shared_rank(inbox, next), v, cluster.map_shared_rank(&bar, next));
  }
  while (!cptx::mbarrier_try_wait_parity(cptx::sem_acquire, cptx::scope_cluster, &bar, 0u)) {
  }
  if (threadIdx.x == 0) {
    const unsigned prev = (rank + size - 1) % size;
    if (inbox[1] != prev || inbox[2] != 0x5eedu || inbox[0] != blockIdx.x - rank + prev) atomicAdd(errors, 1u);
  }
  cluster.sync();
}

int main(int argc, char** argv) {
  const int cluster = argc > 1 ? std::atoi(argv[1]) : 16;
  const int clusters = argc > 2 ? std::atoi(argv[2]) : 64;
  const bool arm_cta_scope = argc > 3 && argv[3][0] == 'c';
  if (cluster > 8) cudaFuncSetAttribute(probe_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  unsigned* errors = nullptr;
  cudaMalloc(&errors, sizeof(unsigned));
  cudaMemset(errors, 0, sizeof(unsigned));
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(cluster * clusters);
  config.blockDim = dim3(64);
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = cluster;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  config.attrs = attr;
  config.numAttrs = 1;
  cudaError_t err = cudaLaunchKernelEx(&config, probe_kernel, errors, arm_cta_scope);
  if (err == cudaSuccess) err = cudaDeviceSynchronize();
  unsigned host = 0;
  if (err == cudaSuccess) err = cudaMemcpy(&host, errors, sizeof host, cudaMemcpyDeviceToHost);
  if (err != cudaSuccess) {
    std::printf("cluster %d: CUDA error %s\n", cluster, cudaGetErrorString(err));
    return 2;
  }
  std::printf("cluster %d x %d clusters, %s-scope arm: %s (%u wrong values)\n", cluster, clusters,
              arm_cta_scope ? "cta" : "cluster", host ? "WRONG" : "ok", host);
  return host ? 1 : 0;
}
