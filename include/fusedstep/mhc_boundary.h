// SPDX-License-Identifier: Apache-2.0
// fusedstep: the DeepSeek-V4.1 shifted mHC boundary, one launch per seam.
//
// Per token (hc_mult = 4 streams of width `hidden`; the contract, instruction by
// instruction, is docs/numerics.md section "mHC shifted boundary"):
//   residual_out[s] = bf16(post[s] * x + sum_j comb[j][s] * residual[j])
//   li              = bf16(sum_j pre_lag[j] * residual_out[j])
//   layer_input     = bf16((li * rsqrt(sum li^2 / hidden + norm_eps)) * norm_weight)
//   mix[n]          = sum_k W[n][k] * residual_out_flat[k]        (k = j * hidden + h)
//   rstd            = rsqrt(sum residual_out^2 / (4 hidden) + rms_eps)
//   a[n]            = fma(mix[n] * rstd, scale[group(n)], base[n])
//   pre_out         = sigmoid(a[0:4]) + hc_pre_eps
//   post_out        = sigmoid(a[4:8]) * post_mult
//   comb_out        = sinkhorn(softmax_rows(a[8:24] as 4x4) + sinkhorn_eps)
// W is fn [24, 4 * hidden] (FP32) after WeightRounding, prepared once per layer by
// prepare_mhc_boundary_weight into the fragment layout the kernel streams.
// Outputs of a token are bitwise independent of the token count, of the tile and of
// the token's position in the batch, and identical run to run.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "fusedstep/device.h"
#include "fusedstep/status.h"
#include "fusedstep/weight_rounding.h"

namespace fusedstep {

inline constexpr int kMhcStreams = 4;        // hc_mult
inline constexpr int kMhcMixes = 24;         // 4 pre + 4 post + 16 comb
inline constexpr int kMhcCluster = 16;       // CTAs per cluster; CTA r owns hidden slice r
inline constexpr int64_t kMhcMaxTokens = 1 << 20;

struct MhcBoundaryParams {
  // ---- inputs (device pointers)
  const __nv_bfloat16* x = nullptr;         // [tokens, hidden]; row stride x_stride
  const __nv_bfloat16* residual = nullptr;  // [tokens, 4, hidden]; token stride residual_stride,
                                            //   streams and hidden contiguous
  const float* post = nullptr;              // [tokens, 4] contiguous (also [tokens, 4, 1])
  const float* comb = nullptr;              // [tokens, 4, 4] contiguous, comb[t][j][s]: j = source
  const float* pre_lag = nullptr;           // [tokens, 4] contiguous: the previous site's pre
  const uint32_t* weight = nullptr;         // prepared mixer weight, mhc_boundary_weight_words() words
  const float* scale = nullptr;             // [3]: pre, post, comb
  const float* base = nullptr;              // [24]: pre 0-3 | post 4-7 | comb 8-23 (row-major i*4+k)
  const __nv_bfloat16* norm_weight = nullptr;  // [hidden]
  // ---- outputs (device pointers, fully written for every valid token)
  __nv_bfloat16* residual_out = nullptr;    // [tokens, 4, hidden]; token stride residual_out_stride
  __nv_bfloat16* layer_input = nullptr;     // [tokens, hidden]; row stride layer_input_stride
  float* pre_out = nullptr;                 // [tokens, 4]
  float* post_out = nullptr;                // [tokens, 4] (viewable as [tokens, 4, 1])
  float* comb_out = nullptr;                // [tokens, 4, 4]
  // ---- sizes and strides (elements). A stride of 0 means "contiguous".
  int64_t tokens = 0;                       // 0 is a valid, empty call
  int64_t hidden = 0;                       // multiple of 512: 4096, 5120, 7168, ...
  int hc_mult = kMhcStreams;                // must be 4
  int64_t x_stride = 0;                     // >= hidden, multiple of 8 (16-byte rows)
  int64_t residual_stride = 0;              // >= 4 * hidden, multiple of 8
  int64_t residual_out_stride = 0;          // >= 4 * hidden, multiple of 8
  int64_t layer_input_stride = 0;           // >= hidden, multiple of 8
  // ---- scalars
  WeightRounding rounding = WeightRounding::kTf32Rna;  // how `weight` was prepared
  float rms_eps = 1e-6f;       // eps of the mix statistic rsqrt(ssq / (4 hidden) + rms_eps)
  float hc_pre_eps = 1e-6f;    // added to sigmoid for pre
  float sinkhorn_eps = 1e-6f;  // softmax + eps and every Sinkhorn denominator
  float post_mult = 2.0f;      // post = sigmoid * post_mult
  float norm_eps = 1e-6f;      // eps of the layer-input RMSNorm
  int sinkhorn_iters = 20;     // >= 1: one column pass, then iters - 1 (row, column) passes
  // ---- schedule (for benchmarks and tests; tile 0 is what serving wants)
  int tile = 0;  // tokens per cluster: 0 = plan()'s choice, else 8, 16, 24 or 32
};

// How the fused kernel covers `tokens` on a device.
struct MhcBoundaryPlan {
  int tile = 0;      // tokens per 16-CTA cluster (two CTAs per SM: the smallest of 8,
                     // 16, 24, 32 that runs one wave, 8 for at most 11 clusters, or
                     // tokens / (half the wave) rounded up, one cluster per GPC, see
                     // src/mhc_boundary/plan.cc; one CTA per SM: 8, or fewer where 8
                     // would give a warp two elementwise tasks)
  int64_t clusters = 0;
  int waves = 0;     // ceil(clusters / co-resident clusters)
  // 1: the small-batch configuration (one CTA per SM; the whole weight slice staged in
  // shared memory for the TF32 roundings, most of it for FP32; at most three clusters of
  // at most 8 tokens, four at hidden 5120, seven from 7168; hidden <= 8192), only where
  // the DeviceInfo says the device runs it (mhc_one_cta_clusters_per_wave >= 1, no more
  // than half of mhc_clusters_per_wave) and the batch fits one wave of it; 2: two CTAs
  // per SM. launch() runs exactly this.
  // Tokens' bits never depend on it.
  int ctas_per_sm = 2;
};

// ---- weight preparation
// 32-bit words of the prepared weight for `hidden` and `rounding`.
int64_t mhc_boundary_weight_words(int64_t hidden, WeightRounding rounding) noexcept;
// fn: host [24, 4 * hidden] FP32, row-major -> out: host buffer of
// mhc_boundary_weight_words() words.
Result prepare_mhc_boundary_weight(const float* fn, int64_t hidden, WeightRounding rounding,
                                   uint32_t* out) noexcept;
// Same, for fn and out in device memory; enqueued on `stream`, no allocation or sync.
Result prepare_mhc_boundary_weight_device(const float* fn, int64_t hidden,
                                          WeightRounding rounding, uint32_t* out,
                                          cudaStream_t stream) noexcept;

// ---- the fused boundary
// Validates every field against the kernel's needs (pure host; no GPU access).
Result check(const MhcBoundaryParams& params, const DeviceInfo& device) noexcept;
// Tile, configuration and wave count of the launch (pure host: the DeviceInfo holds every
// device fact it needs). launch() runs exactly the plan this returns for its DeviceInfo.
Result plan(const MhcBoundaryParams& params, const DeviceInfo& device,
            MhcBoundaryPlan* out) noexcept;
// One kernel launch (more waves of the same kernel past one wave of clusters). Never
// allocates, synchronizes or queries the device.
Result launch(const MhcBoundaryParams& params, const LaunchOptions& options,
              cudaStream_t stream) noexcept;

namespace composed {
// The composed reference path: one simple kernel per stage with the fused kernel's
// instructions and reduction orders. Oracle of the bitwise tests; not for serving.
int64_t workspace_bytes(const MhcBoundaryParams& params) noexcept;
Result launch(const MhcBoundaryParams& params, void* workspace, cudaStream_t stream) noexcept;
}  // namespace composed

}  // namespace fusedstep
