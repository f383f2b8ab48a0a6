// SPDX-License-Identifier: Apache-2.0
// fusedstep-bench: cuBLAS GEMMs (blas.h).
#include "blas.h"

#include <cublas_v2.h>

namespace fusedstep::bench {

struct Blas {
  cublasHandle_t handle = nullptr;
  void* workspace = nullptr;
};

namespace {
constexpr size_t kWorkspaceBytes = size_t{64} << 20;  // above cuBLAS's recommended 32 MiB on Hopper
}

Blas* shared_blas(std::string* error) {
  // Never destroyed: cublasDestroy at static destruction may run after the runtime's teardown.
  static Blas* blas = nullptr;
  static std::string failure;
  if (blas != nullptr || !failure.empty()) {
    if (blas == nullptr) *error = failure;
    return blas;
  }
  auto* b = new Blas;
  cublasStatus_t status = cublasCreate(&b->handle);
  if (status != CUBLAS_STATUS_SUCCESS) {
    failure = std::string("cublasCreate: ") + cublasGetStatusName(status);
  } else if (cudaMalloc(&b->workspace, kWorkspaceBytes) != cudaSuccess) {
    (void)cudaGetLastError();
    failure = "cudaMalloc of the cuBLAS workspace failed";
  } else if ((status = cublasSetWorkspace(b->handle, b->workspace, kWorkspaceBytes)) != CUBLAS_STATUS_SUCCESS) {
    failure = std::string("cublasSetWorkspace: ") + cublasGetStatusName(status);
  }
  if (!failure.empty()) {
    *error = failure;
    return nullptr;
  }
  blas = b;
  return blas;
}

Result blas_gemm(Blas* blas, const __nv_bfloat16* a, int64_t lda, const __nv_bfloat16* b, int64_t ldb,
                 __nv_bfloat16* c, int64_t ldc, int m, int n, int k, cudaStream_t stream) {
  if (blas == nullptr) return Result::error(Status::kInvalidValue, "blas_gemm: no cuBLAS handle");
  cublasStatus_t status = cublasSetStream(blas->handle, stream);
  // Column-major view: C^T [n, m] = B [n, k] (B^T stored, so op T) x A^T [k, m].
  const float alpha = 1.0f, beta = 0.0f;
  if (status == CUBLAS_STATUS_SUCCESS) {
    status = cublasGemmEx(blas->handle, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &alpha, b, CUDA_R_16BF,
                          static_cast<int>(ldb), a, CUDA_R_16BF, static_cast<int>(lda), &beta, c, CUDA_R_16BF,
                          static_cast<int>(ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  }
  if (status != CUBLAS_STATUS_SUCCESS) {
    return Result::error(Status::kCudaError, "cublasGemmEx(m=%d, n=%d, k=%d): %s", m, n, k,
                         cublasGetStatusName(status));
  }
  return Result::success();
}

}  // namespace fusedstep::bench
