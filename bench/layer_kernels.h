// SPDX-License-Identifier: Apache-2.0
// fusedstep-bench: the kernels of the layer context (layer_context.cc) that are not the
// ops: a GEMM that releases its dependents early, the trivial kernel and the in-place copy
// that stand in the op's place, and the one-time layout copy of the vLLM peer's conv weight.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace fusedstep::bench {

// Split-K scratch of release_gemm: FP32 partial sums and per-tile arrival counters. The
// counters start zeroed and every GEMM leaves them zero, so one scratch serves a chain.
struct GemmScratch {
  float* partial = nullptr;
  int64_t partial_floats = 0;
  int* counters = nullptr;
  int64_t counter_count = 0;
};

// What one release_gemm call needs of its scratch (0 when it runs without split-K).
int64_t release_gemm_partial_floats(int m, int n, int k, int sm_count);
int64_t release_gemm_counters(int m, int n, int k, int sm_count);

// Sets the kernels' shared-memory attributes; once, before the first release_gemm.
cudaError_t release_gemm_setup();

// C[m][n] = bf16(sum_k A[m][k] * B[n][k]) with an FP32 sum: A [m, k] (activations, row
// stride lda), B [n, k] (a weight as engines hold it, out x in, row stride ldb), C [m, n]
// (row stride ldc). BF16 tensor cores (mma.sync), k a multiple of 64, n even. Each CTA
// triggers its dependents' launch (griddepcontrol.launch_dependents) at entry, so a kernel
// launched after it with programmatic dependent launch can start during its last wave.
// Launched without PDL itself.
cudaError_t release_gemm(const __nv_bfloat16* a, int64_t lda, const __nv_bfloat16* b, int64_t ldb,
                         __nv_bfloat16* c, int64_t ldc, int m, int n, int k, int sm_count,
                         const GemmScratch& scratch, cudaStream_t stream);

// One warp that writes one word; with pdl it is launched with programmatic dependent
// launch and waits (griddepcontrol.wait) first. The cost of a launch in the op's place.
cudaError_t launch_trivial(int* flag, bool pdl, cudaStream_t stream);

// Reads `bytes` (a multiple of 16) and writes them back in place, 16 bytes a thread per
// step: the op's bytes (half read, half written) with no arithmetic. With pdl it is
// launched with programmatic dependent launch, and its loads are issued before its
// griddepcontrol.wait, its stores after (as the op reads its state early).
cudaError_t launch_inplace_copy(void* data, int64_t bytes, bool pdl, int sm_count, cudaStream_t stream);

// out[s][j][i] = in[s * section_stride + i * channel_stride + j * tap_stride] for the 3
// sections, 4 taps and `dim` channels of an FP32 conv weight: vLLM's [3, 4, dim] layout.
cudaError_t transpose_conv_weight(const float* in, int64_t section_stride, int64_t channel_stride,
                                  int64_t tap_stride, int64_t dim, float* out, cudaStream_t stream);

}  // namespace fusedstep::bench
