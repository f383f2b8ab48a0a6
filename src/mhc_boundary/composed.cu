// SPDX-License-Identifier: Apache-2.0
// mHC boundary: the composed reference path. One plain kernel per stage, each with
// the fused kernel's instructions and reduction orders (docs/numerics.md, "mHC", and
// its "Composed reference path"), so its outputs are the bits the fused kernel must
// reproduce. Every token's result depends only on that token (batch invariant).
//
// Workspace (caller-provided, workspace_bytes(); regions 256-byte aligned, in order):
//   li            bf16 [tokens][hidden]               lagged collapse
//   ssq_chunks    f32  [tokens][hidden / 8]           chunk partials of residual_out^2
//   ssq_li_chunks f32  [tokens][hidden / 8]           chunk partials of li^2
//   mix_partials  f32  [tokens][16 slices][8 warps][24]
//   rstd_li       f32  [tokens]
#include <cuda_runtime.h>

#include <cstdint>

#include "common/device_math.cuh"
#include "common/internal.h"
#include "common/ptx.cuh"
#include "fusedstep/mhc_boundary.h"
#include "mhc_boundary/check.h"
#include "mhc_boundary/layout.h"
#include "mhc_boundary/stage_math.cuh"

namespace fusedstep {
namespace {

using mhc::kCluster;
using mhc::kMixes;
using mhc::kMmaWarps;

constexpr int kThreads = 256;
constexpr int64_t kAlign = 256;

int64_t align_up(int64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

struct WorkspaceLayout {
  int64_t li, ssq_chunks, ssq_li_chunks, mix_partials, rstd_li, total;
};

WorkspaceLayout workspace_layout(int64_t tokens, int64_t hidden) {
  WorkspaceLayout w;
  const int64_t chunks = hidden / 8;
  w.li = 0;
  w.ssq_chunks = align_up(w.li + tokens * hidden * 2);
  w.ssq_li_chunks = align_up(w.ssq_chunks + tokens * chunks * 4);
  w.mix_partials = align_up(w.ssq_li_chunks + tokens * chunks * 4);
  w.rstd_li = align_up(w.mix_partials + tokens * kCluster * kMmaWarps * kMixes * 4);
  w.total = align_up(w.rstd_li + tokens * 4);
  return w;
}

// Views of the workspace and the resolved strides, passed by value to every kernel.
struct ComposedArgs {
  MhcBoundaryParams p;
  int64_t x_stride, residual_stride, residual_out_stride, layer_input_stride;
  __nv_bfloat16* li;
  float* ssq_chunks;
  float* ssq_li_chunks;
  float* mix_partials;
  float* rstd_li;
};

__device__ __forceinline__ float bf16_bits_to_float(uint32_t pair, int half) {
  return half ? dmath::bf16_hi(pair) : dmath::bf16_lo(pair);
}
__device__ __forceinline__ uint32_t word_of(const uint4& v, int i) {
  return i == 0 ? v.x : (i == 1 ? v.y : (i == 2 ? v.z : v.w));
}

// Stage 1, one thread per (token, 8-wide chunk): residual update, lagged collapse and
// the chunk partials of both sums of squares (two lanes e / o, numerics.md step 3).
__global__ void __launch_bounds__(kThreads) mhc_composed_post_kernel(const ComposedArgs a) {
  const MhcBoundaryParams& p = a.p;
  const int64_t H = p.hidden;
  const int64_t chunks = H / 8;
  const int64_t item = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (item >= p.tokens * chunks) return;
  const int64_t t = item / chunks;
  const int64_t h0 = (item % chunks) * 8;

  float post[4], pre[4], comb[16];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    post[j] = p.post[t * 4 + j];
    pre[j] = p.pre_lag[t * 4 + j];
  }
#pragma unroll
  for (int i = 0; i < 16; ++i) comb[i] = p.comb[t * 16 + i];
  const uint4 xw = *reinterpret_cast<const uint4*>(p.x + t * a.x_stride + h0);
  uint4 rw[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    rw[j] = *reinterpret_cast<const uint4*>(p.residual + t * a.residual_stride + j * H + h0);
  }

  float cur[4][8];  // rounded new residual, [stream][element]
  float li[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const float xv = bf16_bits_to_float(word_of(xw, e / 2), e % 2);
    float r[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) r[j] = bf16_bits_to_float(word_of(rw[j], e / 2), e % 2);
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      const float comb_js[4] = {comb[s], comb[4 + s], comb[8 + s], comb[12 + s]};
      cur[s][e] = dmath::round_bf16(mhc::residual_update(post[s], xv, comb_js, r));
    }
    const float cur_e[4] = {cur[0][e], cur[1][e], cur[2][e], cur[3][e]};
    li[e] = dmath::round_bf16(mhc::lagged_collapse(pre, cur_e));
  }

  float even = 0.0f, odd = 0.0f, li_even = 0.0f, li_odd = 0.0f;
#pragma unroll
  for (int q = 0; q < 4; ++q) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      even = __fmaf_rn(cur[j][2 * q], cur[j][2 * q], even);
      odd = __fmaf_rn(cur[j][2 * q + 1], cur[j][2 * q + 1], odd);
    }
    li_even = __fmaf_rn(li[2 * q], li[2 * q], li_even);
    li_odd = __fmaf_rn(li[2 * q + 1], li[2 * q + 1], li_odd);
  }

#pragma unroll
  for (int s = 0; s < 4; ++s) {
    uint4 out;
    out.x = dmath::pack_bf16x2(cur[s][0], cur[s][1]);
    out.y = dmath::pack_bf16x2(cur[s][2], cur[s][3]);
    out.z = dmath::pack_bf16x2(cur[s][4], cur[s][5]);
    out.w = dmath::pack_bf16x2(cur[s][6], cur[s][7]);
    *reinterpret_cast<uint4*>(p.residual_out + t * a.residual_out_stride + s * H + h0) = out;
  }
  uint4 li_words;
  li_words.x = dmath::pack_bf16x2(li[0], li[1]);
  li_words.y = dmath::pack_bf16x2(li[2], li[3]);
  li_words.z = dmath::pack_bf16x2(li[4], li[5]);
  li_words.w = dmath::pack_bf16x2(li[6], li[7]);
  *reinterpret_cast<uint4*>(a.li + t * H + h0) = li_words;
  a.ssq_chunks[item] = __fadd_rn(even, odd);
  a.ssq_li_chunks[item] = __fadd_rn(li_even, li_odd);
}

// Stage 2, one warp per (slice, MMA warp w, group of 8 tokens): w's accumulation
// chains over its k16 steps, B built from residual_out with layout.h's k_coord, then
// the warp partial of each mix (part 0 + part 1 [+ part 2]).
template <int kMTiles>
__global__ void __launch_bounds__(kThreads) mhc_composed_projection_kernel(const ComposedArgs a) {
  constexpr int kRows = kMTiles * 16;
  constexpr int kParts = kMTiles == 3 ? 2 : 3;
  __shared__ float rows[kMmaWarps][kRows][8];  // accumulators, [warp][stacked row][token]
  const MhcBoundaryParams& p = a.p;
  const int64_t H = p.hidden;
  const int w = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int slice = blockIdx.y;
  const int64_t group = blockIdx.x;
  const int g = lane / 4, q = lane % 4;
  const int64_t token = group * 8 + g;
  const bool token_valid = token < p.tokens;
  const __nv_bfloat16* column = p.residual_out + (token_valid ? token : 0) * a.residual_out_stride +
                                slice * mhc::slice_of(H);

  float acc[kMTiles][4];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) acc[mt][0] = acc[mt][1] = acc[mt][2] = acc[mt][3] = 0.0f;
  const int64_t spw = mhc::steps_per_warp(H);
  for (int64_t step = w * spw; step < (w + 1) * spw; ++step) {
    uint32_t b[2] = {0u, 0u};  // columns past the last token multiply zeros
    if (token_valid) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const mhc::KCoord kc = mhc::k_coord(step, 2 * q + 8 * i);
        b[i] = *reinterpret_cast<const uint32_t*>(column + kc.stream * H + kc.hidden_in_slice);
      }
    }
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
      const uint4 words = *reinterpret_cast<const uint4*>(
          p.weight + mhc::weight_word_index(H, p.rounding, slice, step, mt, lane, 0));
      const uint32_t frag[4] = {words.x, words.y, words.z, words.w};
      ptx::mma_bf16_m16n8k16(acc[mt], frag, b, acc[mt]);
    }
  }
  // D fragment: d0, d1 = row g, columns 2q, 2q + 1; d2, d3 = row g + 8.
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
    rows[w][16 * mt + g][2 * q] = acc[mt][0];
    rows[w][16 * mt + g][2 * q + 1] = acc[mt][1];
    rows[w][16 * mt + g + 8][2 * q] = acc[mt][2];
    rows[w][16 * mt + g + 8][2 * q + 1] = acc[mt][3];
  }
  __syncwarp();
  for (int i = lane; i < kMixes * 8; i += 32) {
    const int n = i % kMixes, col = i / kMixes;
    const int64_t t = group * 8 + col;
    if (t >= p.tokens) continue;
    float partial = __fadd_rn(rows[w][n][col], rows[w][kMixes + n][col]);
    if (kParts == 3) partial = __fadd_rn(partial, rows[w][2 * kMixes + n][col]);
    a.mix_partials[((t * kCluster + slice) * kMmaWarps + w) * kMixes + n] = partial;
  }
}

// Stage 3, one thread per token: the fixed-order totals, the coefficients and the
// layer-input RMSNorm factor.
__global__ void __launch_bounds__(kThreads) mhc_composed_token_kernel(const ComposedArgs a) {
  const MhcBoundaryParams& p = a.p;
  const int64_t t = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (t >= p.tokens) return;
  const int64_t H = p.hidden;
  const int64_t chunks = H / 8, chunks_per_slice = mhc::slice_of(H) / 8;
  float ssq = 0.0f, ssq_li = 0.0f;
  for (int r = 0; r < kCluster; ++r) {
    float slice = 0.0f, slice_li = 0.0f;
    for (int64_t c = r * chunks_per_slice; c < (r + 1) * chunks_per_slice; ++c) {
      slice = __fadd_rn(slice, a.ssq_chunks[t * chunks + c]);
      slice_li = __fadd_rn(slice_li, a.ssq_li_chunks[t * chunks + c]);
    }
    ssq = __fadd_rn(ssq, slice);
    ssq_li = __fadd_rn(ssq_li, slice_li);
  }
  float mix[kMixes];
#pragma unroll  // keeps mix[] in registers
  for (int n = 0; n < kMixes; ++n) {
    float total = 0.0f;
    for (int r = 0; r < kCluster; ++r) {
      float slice = 0.0f;
      for (int w = 0; w < kMmaWarps; ++w) {
        slice = __fadd_rn(slice, a.mix_partials[((t * kCluster + r) * kMmaWarps + w) * kMixes + n]);
      }
      total = __fadd_rn(total, slice);
    }
    mix[n] = total;
  }
  const mhc::CoefficientScalars scalars{p.rms_eps, p.hc_pre_eps, p.sinkhorn_eps, p.post_mult,
                                        p.sinkhorn_iters};
  float pre[4], post[4], comb[16];
  mhc::coefficients(mix, ssq, H, p.scale, p.base, scalars, pre, post, comb);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    p.pre_out[t * 4 + j] = pre[j];
    p.post_out[t * 4 + j] = post[j];
  }
#pragma unroll
  for (int i = 0; i < 16; ++i) p.comb_out[t * 16 + i] = comb[i];
  a.rstd_li[t] = mhc::layer_input_rstd(ssq_li, H, p.norm_eps);
}

// Stage 4, one thread per (token, 8-wide chunk): layer_input = bf16((li * rstd) * w).
__global__ void __launch_bounds__(kThreads) mhc_composed_layer_input_kernel(const ComposedArgs a) {
  const MhcBoundaryParams& p = a.p;
  const int64_t H = p.hidden;
  const int64_t chunks = H / 8;
  const int64_t item = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (item >= p.tokens * chunks) return;
  const int64_t t = item / chunks;
  const int64_t h0 = (item % chunks) * 8;
  const uint4 li = *reinterpret_cast<const uint4*>(a.li + t * H + h0);
  const uint4 nw = *reinterpret_cast<const uint4*>(p.norm_weight + h0);
  const float rstd = a.rstd_li[t];
  uint32_t out[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t lw = word_of(li, i);
    out[i] = mhc::layer_input_pair(dmath::bf16_lo(lw), dmath::bf16_hi(lw), rstd, word_of(nw, i));
  }
  *reinterpret_cast<uint4*>(p.layer_input + t * a.layer_input_stride + h0) =
      make_uint4(out[0], out[1], out[2], out[3]);
}

unsigned blocks_for(int64_t items) { return static_cast<unsigned>((items + kThreads - 1) / kThreads); }

}  // namespace

namespace composed {

int64_t workspace_bytes(const MhcBoundaryParams& params) noexcept {
  if (params.tokens <= 0 || !mhc::hidden_supported(params.hidden)) return 0;
  return workspace_layout(params.tokens, params.hidden).total;
}

Result launch(const MhcBoundaryParams& params, void* workspace, cudaStream_t stream) noexcept {
  FS_TRY(mhc::check_params(params));
  if (params.tokens == 0) return Result::success();
  if (workspace == nullptr) {
    return Result::error(Status::kNullPointer,
                         "mhc_boundary (composed): workspace = null must hold workspace_bytes() "
                         "= %lld bytes",
                         static_cast<long long>(workspace_bytes(params)));
  }
  if (reinterpret_cast<uintptr_t>(workspace) % kAlign != 0) {
    return Result::error(Status::kMisaligned,
                         "mhc_boundary (composed): workspace = %p must be 256-byte aligned",
                         workspace);
  }
  const WorkspaceLayout layout = workspace_layout(params.tokens, params.hidden);
  char* base = static_cast<char*>(workspace);
  ComposedArgs a;
  a.p = params;
  a.x_stride = mhc::x_stride_of(params);
  a.residual_stride = mhc::residual_stride_of(params);
  a.residual_out_stride = mhc::residual_out_stride_of(params);
  a.layer_input_stride = mhc::layer_input_stride_of(params);
  a.li = reinterpret_cast<__nv_bfloat16*>(base + layout.li);
  a.ssq_chunks = reinterpret_cast<float*>(base + layout.ssq_chunks);
  a.ssq_li_chunks = reinterpret_cast<float*>(base + layout.ssq_li_chunks);
  a.mix_partials = reinterpret_cast<float*>(base + layout.mix_partials);
  a.rstd_li = reinterpret_cast<float*>(base + layout.rstd_li);

  const int64_t elementwise_items = params.tokens * (params.hidden / 8);
  mhc_composed_post_kernel<<<blocks_for(elementwise_items), kThreads, 0, stream>>>(a);
  FS_TRY(detail::cuda_result(cudaGetLastError(), "mhc_boundary (composed): post kernel"));
  const dim3 projection_grid(static_cast<unsigned>((params.tokens + 7) / 8), kCluster);
  if (mhc::parts_of(params.rounding) == 2) {
    mhc_composed_projection_kernel<3><<<projection_grid, kMmaWarps * 32, 0, stream>>>(a);
  } else {
    mhc_composed_projection_kernel<5><<<projection_grid, kMmaWarps * 32, 0, stream>>>(a);
  }
  FS_TRY(detail::cuda_result(cudaGetLastError(), "mhc_boundary (composed): projection kernel"));
  mhc_composed_token_kernel<<<blocks_for(params.tokens), kThreads, 0, stream>>>(a);
  FS_TRY(detail::cuda_result(cudaGetLastError(), "mhc_boundary (composed): token kernel"));
  mhc_composed_layer_input_kernel<<<blocks_for(elementwise_items), kThreads, 0, stream>>>(a);
  return detail::cuda_result(cudaGetLastError(), "mhc_boundary (composed): layer input kernel");
}

}  // namespace composed
}  // namespace fusedstep
