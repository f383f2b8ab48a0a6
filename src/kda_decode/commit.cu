// SPDX-License-Identifier: Apache-2.0
// RecoverSSM commit: fold the first n = clamp(accepted[b], 0, tokens) tokens of a
// record verify into request b's checkpoint state, in place.
//
// For t = 0 .. n - 1 in order, every state element S[v][k] of the checkpoint slot does
//   S = S * decay_t[k];  S = fma(k_n_t[k], correction_t[v], S)
// with k_n_t recomputed from the recorded BF16 k by the verify's norm tree (element i
// on thread i, warp butterflies, (W0 + W2) + (W1 + W3) + 1e-6) and decay_t from the
// recorded raw_g by the verify's formula. These are exactly the verify's state updates
// (the correction is its FP32 v_new), so the committed state is bitwise the state a
// non-record verify writes after token n - 1 (docs/numerics.md, "RecoverSSM commit").
// A BF16 checkpoint converts exactly when loaded and is rounded once, when stored.
//
// Grid (batch, heads, value blocks of 32 rows), 128 threads: each CTA recomputes the
// n key vectors and decays (n x 1 KiB of records) and streams its 16 KiB of state
// with 16-byte loads and stores. With PDL the kernel waits before its first read:
// slots, counts and records may all come from the stream's previous kernels.
#include <cuda_runtime.h>

#include <cstdint>

#include "common/device_math.cuh"
#include "common/internal.h"
#include "common/launch.h"
#include "common/ptx.cuh"
#include "fusedstep/kda_decode.h"
#include "kda_decode/stage_math.cuh"
#include "kda_decode/state_access.cuh"

namespace fusedstep {
namespace kda {
namespace {

constexpr int kCommitThreads = 128;
constexpr int kCommitRows = 32;                                  // value rows per CTA
constexpr int kCommitBlocks = kHeadDim / kCommitRows;            // CTAs per head
constexpr int kVectorsPerThread = kCommitRows * kHeadDim / 4 / kCommitThreads;

template <class State>
__global__ void __launch_bounds__(kCommitThreads) commit_kernel(const KdaCommitParams p) {
  __shared__ __align__(16) float k_n[kKdaMaxTokens][kHeadDim];
  __shared__ __align__(16) float decays[kKdaMaxTokens][kHeadDim];
  __shared__ float corrections[kKdaMaxTokens][kCommitRows];
  __shared__ float warp_sums[kKdaMaxTokens][4];

  ptx::griddep_wait();
  ptx::griddep_launch_dependents();
  const int b = blockIdx.x, h = blockIdx.y, block = blockIdx.z;
  const int32_t slot = p.slots[b];
  if (slot <= 0 || slot >= p.state_slots) return;
  const int64_t record = p.record_rows != nullptr ? p.record_rows[b] : b;
  if (record < 0 || record >= p.record_slots) return;
  const int n = min(max(p.accepted[b], 0), p.tokens);
  if (n == 0) return;

  const int i = threadIdx.x, warp = i / 32, lane = i % 32;
  // State first: its 16-byte loads are in flight while the records are reduced.
  State* state = static_cast<State*>(p.state) + slot * p.state_slot_stride +
                 (int64_t(h) * kHeadDim + block * kCommitRows) * kHeadDim;
  StateBits<State> s[kVectorsPerThread];
  for (int j = 0; j < kVectorsPerThread; ++j) s[j] = load_state_bits(state + 4 * (i + kCommitThreads * j));

  const int64_t first = (record * p.heads + h) * p.tokens;  // record row of token 0
  const float a = exp_a_log(p.a_log[h]);
  const float bias = p.dt_bias[h * kHeadDim + i];
  // Every token's record loads are issued together (addresses clamped to token 0, which
  // exists since n >= 1, so no load waits on a branch), then reduced token by token.
  float k[kKdaMaxTokens], raw_g[kKdaMaxTokens], correction[kKdaMaxTokens];
#pragma unroll
  for (int t = 0; t < kKdaMaxTokens; ++t) {
    const int64_t row = first + (t < n ? t : 0);
    const __nv_bfloat16* kg = p.record_key_gate + row * 2 * kHeadDim;
    k[t] = __bfloat162float(kg[i]);
    raw_g[t] = __bfloat162float(kg[kHeadDim + i]);
    correction[t] = i < kCommitRows ? p.record_correction[row * kHeadDim + block * kCommitRows + i] : 0.0f;
  }
#pragma unroll
  for (int t = 0; t < kKdaMaxTokens; ++t) {
    if (t >= n) break;
    decays[t][i] = decay(a, raw_g[t], bias, p.lower_bound);
    float sq = __fmul_rn(k[t], k[t]);
    for (int d = 16; d >= 1; d /= 2) sq = __fadd_rn(sq, __shfl_xor_sync(0xffffffffu, sq, d));
    if (lane == 0) warp_sums[t][warp] = sq;
    if (i < kCommitRows) corrections[t][i] = correction[t];
  }
  __syncthreads();
  for (int t = 0; t < kKdaMaxTokens; ++t) {
    if (t >= n) break;
    const float* w = warp_sums[t];
    k_n[t][i] = normalize_k(k[t], inverse_norm(w[0], w[1], w[2], w[3]));
  }
  __syncthreads();

  for (int j = 0; j < kVectorsPerThread; ++j) {
    const int vec = i + kCommitThreads * j;
    const int row = vec / (kHeadDim / 4), col = 4 * (vec % (kHeadDim / 4));
    float4 v = state_to_float4(s[j]);
    for (int t = 0; t < kKdaMaxTokens; ++t) {
      if (t >= n) break;
      const float4 d = *reinterpret_cast<const float4*>(&decays[t][col]);
      const float4 kn = *reinterpret_cast<const float4*>(&k_n[t][col]);
      const float c = corrections[t][row];
      v.x = __fmaf_rn(kn.x, c, __fmul_rn(v.x, d.x));
      v.y = __fmaf_rn(kn.y, c, __fmul_rn(v.y, d.y));
      v.z = __fmaf_rn(kn.z, c, __fmul_rn(v.z, d.z));
      v.w = __fmaf_rn(kn.w, c, __fmul_rn(v.w, d.w));
    }
    store_state4(state + 4 * vec, v, false);
  }
}

}  // namespace
}  // namespace kda

Result launch(const KdaCommitParams& p, const LaunchOptions& options, cudaStream_t stream) noexcept {
  const DeviceInfo* device = nullptr;
  FS_TRY(detail::resolve_device(options, &device));
  FS_TRY(check(p, *device));
  if (p.batch == 0) return Result::success();

  detail::LaunchConfig config(dim3(p.batch, p.heads, kda::kCommitBlocks), dim3(kda::kCommitThreads), 0, stream);
  config.pdl(options.pdl);
  return detail::cuda_result(p.state_dtype == DType::kBf16
                                 ? cudaLaunchKernelEx(config.get(), kda::commit_kernel<__nv_bfloat16>, p)
                                 : cudaLaunchKernelEx(config.get(), kda::commit_kernel<float>, p),
                             "kda_commit: cudaLaunchKernelEx");
}

}  // namespace fusedstep
