// SPDX-License-Identifier: Apache-2.0
// Which CUDA runtime calls of fusedstep's one-time setup reset a pending error? Arms a
// caller's error (cudaSetDevice(-1): 101), makes each call the setup makes, and prints
// the last-error slot after it. On the H200 with CUDA 13.0 (2026-11-29) both
// cudaFuncSetAttribute calls printed 0 (reset); every other call kept 101. Built as a
// tool, not a test (include/fusedstep/device.h states the consequence).
#include <cuda_runtime.h>
#include <cstdio>
__global__ void k(float* p) { if (p) p[0] = 1; }
__global__ void __cluster_dims__(2, 1, 1) kc(float* p) { if (p) p[0] = 1; }
static void check(const char* what) {
  const cudaError_t e = cudaPeekAtLastError();
  std::printf("%-58s pending after: %d\n", what, int(e));
  (void)cudaGetLastError();
  (void)cudaSetDevice(-1);  // re-arm the caller's error (101)
}
int main() {
  setenv("CUDA_MODULE_LOADING", "EAGER", 1);
  cudaFree(nullptr);
  (void)cudaGetLastError();
  (void)cudaSetDevice(-1);
  std::printf("armed: %d\n", int(cudaPeekAtLastError()));
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0); check("cudaGetDeviceProperties");
  int v; cudaDeviceGetAttribute(&v, cudaDevAttrClusterLaunch, 0); check("cudaDeviceGetAttribute");
  cudaFuncSetAttribute((const void*)k, cudaFuncAttributeMaxDynamicSharedMemorySize, 100000); check("cudaFuncSetAttribute(MaxDynamicSmem)");
  cudaFuncSetAttribute((const void*)k, cudaFuncAttributeNonPortableClusterSizeAllowed, 1); check("cudaFuncSetAttribute(NonPortableCluster)");
  int n; cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k, 256, 1000); check("cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  cudaLaunchConfig_t cfg{}; cfg.gridDim = dim3(16); cfg.blockDim = dim3(256);
  cudaLaunchAttribute at{}; at.id = cudaLaunchAttributeClusterDimension; at.val.clusterDim.x = 16; at.val.clusterDim.y = 1; at.val.clusterDim.z = 1;
  cfg.attrs = &at; cfg.numAttrs = 1;
  int c; cudaOccupancyMaxActiveClusters(&c, (const void*)k, &cfg); check("cudaOccupancyMaxActiveClusters");
  cudaFuncAttributes fa; cudaFuncGetAttributes(&fa, (const void*)k); check("cudaFuncGetAttributes");
  int dev; cudaGetDevice(&dev); check("cudaGetDevice");
  size_t f, t; cudaMemGetInfo(&f, &t); check("cudaMemGetInfo");
  return 0;
}
