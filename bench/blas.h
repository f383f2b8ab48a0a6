// SPDX-License-Identifier: Apache-2.0
// fusedstep-bench: the cuBLAS GEMMs around the ops in the layer context, and the F_B
// projection the vLLM peer needs beside its kernel.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "fusedstep/status.h"

namespace fusedstep::bench {

// One cuBLAS handle for the run, with its workspace allocated up front (so that a GEMM
// captured in a CUDA graph allocates nothing). Created at the first call on a machine
// with a GPU; null with `error` set when that fails.
struct Blas;
Blas* shared_blas(std::string* error);

// C[m][n] = bf16(sum_k A[m][k] * B[n][k]), FP32 sum (cublasGemmEx, CUBLAS_COMPUTE_32F):
// A [m, k] row stride lda, B [n, k] (out x in, as engines hold weights) row stride ldb,
// C [m, n] row stride ldc; what torch.nn.functional.linear runs. On `stream`.
Result blas_gemm(Blas* blas, const __nv_bfloat16* a, int64_t lda, const __nv_bfloat16* b, int64_t ldb,
                 __nv_bfloat16* c, int64_t ldc, int m, int n, int k, cudaStream_t stream);

}  // namespace fusedstep::bench
