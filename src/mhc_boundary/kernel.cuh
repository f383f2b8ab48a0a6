// SPDX-License-Identifier: Apache-2.0
// mHC boundary: the fused kernel, one launch per seam.
//
// A 16-CTA cluster owns `tile` tokens; CTA r owns hidden slice r (layout.h). Per CTA:
//  1. elementwise pass: residual update, lagged collapse and the per-chunk sums of
//     squares of this slice for every tile token; the new residual goes to global
//     memory and, in MMA B-fragment order, to shared memory;
//  2. mixer GEMM: warp w walks k-step run w of A fragments (the prepared weight): the
//     leading steps that fit the free shared memory were bulk-copied there before the
//     PDL wait, the rest stream from L2 straight into mma.sync operands a few steps
//     ahead; the chunk sums of squares are reduced to slice sums while the weight
//     arrives;
//  3. exchange through distributed shared memory: token t's 24 mix partials and
//     residual sum of squares go to its owner CTA (rank t % 16), every token's li sum
//     of squares to every CTA (st.async completing on the receiver's mbarrier);
//  4. the owner's last warp sums the 16 slices in rank order (one lane per mix) and
//     computes pre / post / comb (one lane per token), then arrives on the final
//     cluster barrier; the other warps write this slice of layer_input.
// Every reduction has the fixed order of docs/numerics.md, independent of the tile and
// of a token's position, so outputs are batch invariant and deterministic.
#pragma once

#include <cooperative_groups.h>
#include <cuda/ptx>
#include <cuda_pipeline.h>

#include "common/device_math.cuh"
#include "common/kernel_variant.h"
#include "common/ptx.cuh"
#include "mhc_boundary/config.h"
#include "mhc_boundary/layout.h"
#include "mhc_boundary/stage_math.cuh"

namespace fusedstep::mhc {
namespace {

namespace cg = cooperative_groups;

__device__ __forceinline__ uint4 ldg16(const void* p) { return __ldg(static_cast<const uint4*>(p)); }
__device__ __forceinline__ float word_lo(uint32_t w) { return dmath::bf16_lo(w); }
__device__ __forceinline__ float word_hi(uint32_t w) { return dmath::bf16_hi(w); }
__device__ __forceinline__ uint32_t word_of(const uint4& v, int i) {
  return i == 0 ? v.x : (i == 1 ? v.y : (i == 2 ? v.z : v.w));
}

// The BF16-rounded lagged collapse of the low and high elements of pair p of the new
// residual (BF16 pairs per stream); each stream's two values also go to
// per_stream(lo, hi), in stream order.
template <class PerStream>
__device__ __forceinline__ void collapse_pair(const float* pre, const uint32_t (&cur)[kStreams][4], int p,
                                              float& li_lo, float& li_hi, PerStream&& per_stream) {
  float lo[kStreams], hi[kStreams];
#pragma unroll
  for (int j = 0; j < kStreams; ++j) {
    lo[j] = word_lo(cur[j][p]);
    hi[j] = word_hi(cur[j][p]);
    per_stream(lo[j], hi[j]);
  }
  li_lo = dmath::round_bf16(lagged_collapse(pre, lo));
  li_hi = dmath::round_bf16(lagged_collapse(pre, hi));
}

// ---- elementwise math of one 8-wide chunk of one token
// x and the four residual streams at hidden h .. h + 7.
struct ChunkInputs {
  uint4 x, r[kStreams];
};
__device__ __forceinline__ void load_chunk(const KernelArgs& a, int64_t token, int64_t h, ChunkInputs& in) {
  in.x = ldg16(a.x + token * a.x_stride + h);
#pragma unroll
  for (int j = 0; j < kStreams; ++j) in.r[j] = ldg16(a.residual + token * a.residual_stride + j * a.hidden + h);
}
// The new residual as BF16 pairs per stream; coef is the token's post | comb | pre_lag.
__device__ __forceinline__ void update_chunk(const float* coef, const ChunkInputs& in,
                                             uint32_t (&cur)[kStreams][4]) {
#pragma unroll
  for (int s = 0; s < kStreams; ++s) {
    const float comb_s[4] = {coef[4 + s], coef[8 + s], coef[12 + s], coef[16 + s]};
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      float lo[4], hi[4];
#pragma unroll
      for (int j = 0; j < kStreams; ++j) {
        lo[j] = word_lo(word_of(in.r[j], p));
        hi[j] = word_hi(word_of(in.r[j], p));
      }
      cur[s][p] = dmath::pack_bf16x2(residual_update(coef[s], word_lo(word_of(in.x, p)), comb_s, lo),
                                     residual_update(coef[s], word_hi(word_of(in.x, p)), comb_s, hi));
    }
  }
}
// __stwb: 16-byte stores (a plain `*p =` compiles to four 4-byte stores for half of the
// streams, where the four words do not sit in an aligned register quad).
__device__ __forceinline__ void store_residual_out(const KernelArgs& a, int64_t token, int64_t h,
                                                   const uint32_t (&cur)[kStreams][4]) {
#pragma unroll
  for (int s = 0; s < kStreams; ++s) {
    __stwb(reinterpret_cast<uint4*>(a.residual_out + token * a.residual_out_stride + s * a.hidden + h),
           make_uint4(cur[s][0], cur[s][1], cur[s][2], cur[s][3]));
  }
}
// The chunk's sums of squares (even / odd elements from +0, pairs then streams, then
// even + odd) of the new residual and of li; li itself as BF16 pairs.
__device__ __forceinline__ void chunk_sums(const float* pre, const uint32_t (&cur)[kStreams][4], float& ssq_res,
                                           float& ssq_li, uint32_t (&li)[4]) {
  float e = 0.0f, o = 0.0f, e_li = 0.0f, o_li = 0.0f;
#pragma unroll
  for (int p = 0; p < 4; ++p) {
    float li_lo, li_hi;
    collapse_pair(pre, cur, p, li_lo, li_hi, [&](float lo, float hi) {
      e = __fmaf_rn(lo, lo, e);
      o = __fmaf_rn(hi, hi, o);
    });
    e_li = __fmaf_rn(li_lo, li_lo, e_li);
    o_li = __fmaf_rn(li_hi, li_hi, o_li);
    li[p] = dmath::pack_bf16x2(li_lo, li_hi);
  }
  ssq_res = __fadd_rn(e, o);
  ssq_li = __fadd_rn(e_li, o_li);
}
// The chunk's MMA B fragments: k step 8c + 2s + half holds hidden 8m + 4 half .. + 3
// of stream s (layout.h), for token column t, lane quad q.
__device__ __forceinline__ void store_b_fragments(uint2* s_res, int c, int tp, int t, int q,
                                                  const uint32_t (&cur)[kStreams][4]) {
#pragma unroll
  for (int s = 0; s < kStreams; ++s) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      s_res[((8 * c + 2 * s + half) * tp + t) * 4 + q] = make_uint2(cur[s][2 * half], cur[s][2 * half + 1]);
    }
  }
}
// Slice sums of squares of one row of chunk sums, chunks in order from +0; unrolled
// so that the loads batch, the adds one sequential chain.
__device__ __forceinline__ float slice_sum(const float* chunk, int chunks) {
  float sum = 0.0f;
#pragma unroll 8
  for (int k = 0; k < chunks; ++k) sum = __fadd_rn(sum, chunk[k]);
  return sum;
}

// ---- mixer GEMM of one tile: one accumulator chain per (part, mix, token) from +0 over
// a warp's k steps in order; B fragments of step kk for the pass's n8 tiles, then the
// MMAs of every m tile. The leading `staged` steps come from shared memory, the rest
// stream from L2 into `ring`, kPrefetch steps ahead.
template <int kMTiles, int kPrefetch>
struct GemmStream {
  const uint4* a_warp;    // this lane's first A quad of the warp's run in global memory
  const uint4* a_staged;  // the same in shared memory
  int staged, steps;      // staged steps, steps of the warp's run
  uint4 ring[kPrefetch][kMTiles];

  __device__ __forceinline__ void prime() {
#pragma unroll
    for (int d = 0; d < kPrefetch; ++d) {
      if (staged + d < steps) {
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          ring[d][mt] = ptx::ldg_nc_v4_ordered(a_warp + ((staged + d) * kMTiles + mt) * 32);
        }
      }
    }
  }
};

// All passes of one warp over the tile's n8 tiles; writes the warp partial of every
// mix and token to s_mixp ([8 warps][tp][kMixpFloats]). The first pass's ring must be primed;
// after_staged() runs once the first pass's staged steps are issued. kStreamed = false:
// every step is staged (w.staged == w.steps), and the ring is never touched.
// kStagedOnce: a staged step's A fragments are read from shared memory once for all of
// the pass's n8 tiles, not once per tile (the same MMAs in the same order, so the same
// bits). For tiles of more than 8 (up to 6% faster at tiles 16-32): tile 8's one n8 tile
// reads A once either way, and there the different schedule is slower.
template <int kMTiles, int kNtPass, bool kStreamed = true, bool kStagedOnce = false, int kPrefetch,
          class AfterStaged>
__device__ __forceinline__ void mixer_gemm(GemmStream<kMTiles, kPrefetch>& w, const uint2* s_res, int tp,
                                           int warp, int lane, float* s_mixp, AfterStaged&& after_staged) {
  const int g = lane / 4, q = lane % 4;
  const int n_tiles = tp / 8;
  auto mma_step = [&](float (&acc)[kMTiles][kNtPass][4], auto&& a_of, int kk, int nt0) {
#pragma unroll
    for (int nt = 0; nt < kNtPass; ++nt) {
      if (nt0 + nt < n_tiles) {
        const uint2 bw = s_res[(kk * tp + (nt0 + nt) * 8 + g) * 4 + q];
        const uint32_t b[2] = {bw.x, bw.y};
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          const uint4 a4 = a_of(mt);
          const uint32_t a[4] = {a4.x, a4.y, a4.z, a4.w};
          ptx::mma_bf16_m16n8k16(acc[mt][nt], a, b, acc[mt][nt]);
        }
      }
    }
  };
  // A staged step, its A fragments read from shared memory once for all n8 tiles.
  auto staged_step = [&](float (&acc)[kMTiles][kNtPass][4], const uint4* a_step, int kk, int nt0) {
    uint4 a4[kMTiles];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) a4[mt] = a_step[mt * 32];
    mma_step(acc, [&](int mt) { return a4[mt]; }, kk, nt0);
  };
#pragma unroll 1
  for (int nt0 = 0; nt0 < n_tiles; nt0 += kNtPass) {
    if (kStreamed && nt0 > 0) w.prime();
    float acc[kMTiles][kNtPass][4];
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int nt = 0; nt < kNtPass; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[mt][nt][i] = 0.0f;
#pragma unroll 2
    for (int step = 0; step < w.staged; ++step) {
      if constexpr (kStagedOnce) {
        staged_step(acc, w.a_staged + step * kMTiles * 32, warp * w.steps + step, nt0);
      } else {
        mma_step(acc, [&](int mt) { return w.a_staged[(step * kMTiles + mt) * 32]; }, warp * w.steps + step, nt0);
      }
    }
    if (nt0 == 0) after_staged();
#pragma unroll 1
    for (int s0 = w.staged; kStreamed && s0 < w.steps; s0 += kPrefetch) {
#pragma unroll
      for (int d = 0; d < kPrefetch; ++d) {
        const int step = s0 + d;
        if (step < w.steps) {
          mma_step(acc, [&](int mt) { return w.ring[d][mt]; }, warp * w.steps + step, nt0);
          // The slot is free once its MMAs are issued: refill it kPrefetch steps ahead.
          if (step + kPrefetch < w.steps) {
#pragma unroll
            for (int mt = 0; mt < kMTiles; ++mt) {
              w.ring[d][mt] = ptx::ldg_nc_v4_ordered(w.a_warp + ((step + kPrefetch) * kMTiles + mt) * 32);
            }
          }
        }
      }
    }
    // Warp partial of mix g + 8i: the parts' chains combined, part 0 first. Row group
    // rg (= row / 8) of the stacked weight is part rg / 3, mix g + 8 (rg % 3); it sits
    // in tile rg / 2, accumulator registers 2 (rg % 2) + column parity.
#pragma unroll
    for (int nt = 0; nt < kNtPass; ++nt) {
      if (nt0 + nt < n_tiles) {
#pragma unroll
        for (int i = 0; i < 3; ++i) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float v = __fadd_rn(acc[i / 2][nt][2 * (i % 2) + e], acc[(i + 3) / 2][nt][2 * ((i + 3) % 2) + e]);
            if constexpr (kMTiles == 5) v = __fadd_rn(v, acc[(i + 6) / 2][nt][2 * ((i + 6) % 2) + e]);
            s_mixp[(warp * tp + (nt0 + nt) * 8 + 2 * q + e) * kMixpFloats + g + 8 * i] = v;
          }
        }
      }
    }
  }
}

// ---- exchange through distributed shared memory. Token t of a tile is owned by rank
// (t + shift) % 16 (the kernel passes shift 0; a schedule that runs several tiles per
// cluster could rotate owners between sub-tiles); the owner finalizes it. Its tokens are
// first_owned(rank, shift), + 16, ... (slot o = t / 16).
__device__ __forceinline__ int first_owned(int rank, int shift) { return (rank - shift) & (kCluster - 1); }
__device__ __forceinline__ int owned_count(int tile, int rank, int shift) {
  const int first = first_owned(rank, shift);
  return first < tile ? (tile - first + kCluster - 1) / kCluster : 0;
}
// Thread `tid` of `threads` pushes token t's 24 mix partials (the 8 warps' partials
// summed in order from +0) and its residual slice sum of squares to its owner, into the
// owner's recv_mix[(t / 16) * 16 + rank]; every token's li slice sum of squares to every
// CTA, into recv_li[rank * tp + t]. Each st.async completes on the receiver's `bar`.
__device__ __forceinline__ void push_exchange(const cg::cluster_group& cluster, int tid, int threads, int tile,
                                              int tp, int rank, int shift, const float* s_mixp, const float* s_slice,
                                              float* recv_mix, float* recv_li, uint64_t* bar) {
  const int mix_tasks = tile * kRecvQuads;
#pragma unroll 1
  for (int i = tid; i < mix_tasks + kCluster * (tp / 4); i += threads) {
    if (i < mix_tasks) {
      // quad j of token t: mixes 4j .. 4j + 3, or the residual sum of squares. Tokens
      // vary fastest across the lanes, a token per lane, so that with s_mixp's padded
      // token pitch (kMixpFloats) the reads hit different banks (a [8 warps][24][tp]
      // layout read quads fastest puts up to 7 lanes on a bank: 2-5% slower at T >= 128).
      const int t = i % tile, j = i / tile;
      uint32_t v[4] = {0u, 0u, 0u, 0u};
      if (j < kMixes / 4) {
        float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int w = 0; w < kMmaWarps; ++w) {
          const float4 part = *reinterpret_cast<const float4*>(s_mixp + (w * tp + t) * kMixpFloats + 4 * j);
          sum[0] = __fadd_rn(sum[0], part.x);
          sum[1] = __fadd_rn(sum[1], part.y);
          sum[2] = __fadd_rn(sum[2], part.z);
          sum[3] = __fadd_rn(sum[3], part.w);
        }
#pragma unroll
        for (int k = 0; k < 4; ++k) v[k] = __float_as_uint(sum[k]);
      } else {
        v[0] = __float_as_uint(s_slice[t]);
      }
      const int owner = (t + shift) % kCluster;
      uint32_t* dst = reinterpret_cast<uint32_t*>(recv_mix + ((t / kCluster) * kCluster + rank) * kRecvFloats + 4 * j);
      cuda::ptx::st_async(cluster.map_shared_rank(dst, owner), v, cluster.map_shared_rank(bar, owner));
    } else {
      const int dest = (i - mix_tasks) / (tp / 4), u = (i - mix_tasks) % (tp / 4);
      const float* src = s_slice + tp + 4 * u;
      const uint32_t v[4] = {__float_as_uint(src[0]), __float_as_uint(src[1]), __float_as_uint(src[2]),
                             __float_as_uint(src[3])};
      uint32_t* dst = reinterpret_cast<uint32_t*>(recv_li + rank * tp + 4 * u);
      cuda::ptx::st_async(cluster.map_shared_rank(dst, dest), v, cluster.map_shared_rank(bar, dest));
    }
  }
}
// Bytes a CTA receives per tile: the owned tokens' pushes and every token's li sums.
__host__ __device__ constexpr uint32_t exchange_bytes(int owned, int tp) {
  return static_cast<uint32_t>(owned * kCluster * kRecvFloats * 4 + kCluster * tp * 4);
}

// ---- the owner's coefficients (one warp). Slices summed in rank order from +0, one
// lane per (owned token, mix or residual sum of squares), into coef_out; the sum of
// squares is parked after the token's mixes.
__device__ __forceinline__ void sum_owned_slices(int lane, int owned, const float* recv_mix, float* coef_out) {
  for (int i = lane; i < owned * (kMixes + 1); i += 32) {
    const int o = i / (kMixes + 1), n = i % (kMixes + 1);
    const float* recv = recv_mix + o * kCluster * kRecvFloats + n;
    float sum = 0.0f;
#pragma unroll
    for (int r = 0; r < kCluster; ++r) sum = __fadd_rn(sum, recv[r * kRecvFloats]);
    coef_out[o * kCoefOutFloats + n] = sum;
  }
}
// pre / post / comb of the owned tokens (token first + 16 o of the tile at t0), one half
// warp per token; all 32 lanes call it (the shuffles name every lane).
__device__ __forceinline__ void write_coefficients(const KernelArgs& a, int lane, int owned, int first, int valid,
                                                   int64_t t0, const float* coef_out, const float* s_hc) {
  if (owned == 0) return;  // uniform over the warp
  static_assert(kMaxOwned <= 2, "one half warp per owned token");
  const int o = lane / 16, e = lane % 16;  // a lone token is computed by both halves
  const float* mix = coef_out + (o < owned ? o : 0) * kCoefOutFloats;
  const HalfWarpCoefficients c = coefficients_half_warp(mix, mix[kMixes], a.hidden, s_hc, s_hc + 3, a.scalars);
  const int t = first + kCluster * o;
  if (o < owned && t < valid) {
    const int64_t gt = t0 + t;
    a.comb_out[gt * 16 + e] = c.comb;
    if (e < 4) {
      a.pre_out[gt * 4 + e] = c.pre_post;
    } else if (e < 8) {
      a.post_out[gt * 4 + e - 4] = c.pre_post;
    }
  }
}


template <class Cfg>
__global__ void __launch_bounds__(kThreads, Cfg::kCtasPerSm) mhc_boundary_kernel(const KernelArgs args) {
  constexpr int kMTiles = Cfg::kMTiles, kCtasPerSm = Cfg::kCtasPerSm;
  constexpr bool kWideTile = Cfg::kWideTile, kPackedItems = Cfg::kPackedItems;
  constexpr int kSmem = smem_bytes_of(kCtasPerSm);
  constexpr int kNtPass = n8_tiles_per_pass(kMTiles, kCtasPerSm, kWideTile);
  // mixer_gemm's kStagedOnce, where it is faster (TF32 tiles of more than 8).
  constexpr bool kStagedOnce = kWideTile && kMTiles == 3;
  // A streamed k step's A fragments are loaded this many steps ahead of their MMAs
  // (sm_100a's register allocation spills the FP32 kernel at depth 2).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000
  constexpr int kPrefetch = kMTiles == 3 ? 3 : 1;
#else
  constexpr int kPrefetch = kMTiles == 3 ? 3 : 2;
#endif
  extern __shared__ __align__(128) unsigned char smem[];
  const cg::cluster_group cluster = cg::this_cluster();

  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, q = lane % 4;  // mma fragment row group and thread in group
  const int rank = static_cast<int>(cluster.block_rank());
  const int64_t hidden = args.hidden;
  const int slice = static_cast<int>(hidden / kCluster);
  const int tile = args.tile;
  const SmemLayout L = smem_layout(tile, slice);
  const int tp = L.tp, chunks = L.chunks;
  const int ssq_row = ssq_pitch(chunks);  // s_ssq's row pitch, in floats
  const int wide_chunks = slice / 32;  // 32-wide chunks: k steps 8c .. 8c + 7
  const int steps = static_cast<int>(k_steps(hidden));
  const int steps_per_warp = steps / kMmaWarps;
  const int64_t t0 = static_cast<int64_t>(blockIdx.x / kCluster) * tile;
  const int valid = static_cast<int>(min(static_cast<int64_t>(tile), args.tokens - t0));
  const int64_t h0 = static_cast<int64_t>(rank) * slice;
  const int owned = (tile - rank + kCluster - 1) / kCluster;  // tokens t % 16 == rank

  uint64_t* bar = reinterpret_cast<uint64_t*>(smem + L.bar);
  uint64_t* bar_weight = bar + 1;
  float* s_hc = reinterpret_cast<float*>(smem + L.hc);
  uint2* s_res = reinterpret_cast<uint2*>(smem + L.res);
  float* s_ssq = reinterpret_cast<float*>(smem + L.ssq);
  float* s_coef = reinterpret_cast<float*>(smem + L.coef);
  float* s_mixp = reinterpret_cast<float*>(smem + L.mixp);
  float* s_slice = reinterpret_cast<float*>(smem + L.slice_ssq);
  float* s_recv_mix = reinterpret_cast<float*>(smem + L.recv_mix);
  float* s_recv_li = reinterpret_cast<float*>(smem + L.recv_li);
  float* s_rstd = reinterpret_cast<float*>(smem + L.rstd_li);
  float* s_coef_out = reinterpret_cast<float*>(smem + L.coef_out);
  __nv_bfloat16* s_norm = reinterpret_cast<__nv_bfloat16*>(smem + L.norm);
  uint4* s_stage = reinterpret_cast<uint4*>(smem + L.stage);

  // ---- weights only before the PDL wait. The leading k steps of every MMA warp's run
  // that fit the free shared memory and this slice of norm_weight are copied to shared
  // memory; the first streamed steps go to registers; L2 is warmed with the rest.
  // The staged steps: one CTA per SM (the whole slice, 123 KB at hidden 5120) by 16-byte
  // cp.async from every thread, waited for at the end of the elementwise pass, since bulk
  // copies land that slice about 5 us after the CTA starts (cp.async: 7% faster at
  // T = 1); two CTAs per SM by bulk copies of thread 0 on bar_weight (there cp.async is
  // 1-3% slower).
  constexpr bool kStageByThreads = kCtasPerSm == 1;
  const int staged_steps =
      min(steps_per_warp, static_cast<int>((kSmem - L.stage) / (kMmaWarps * kMTiles * 512)));
  const uint4* w_slice = reinterpret_cast<const uint4*>(args.weight) +
                         static_cast<int64_t>(rank) * steps * kMTiles * 32;
  if (tid == 0) {
    // The exchange barrier expects every byte the peers will push here.
    const uint32_t bytes = exchange_bytes(owned, tp);
    cuda::ptx::mbarrier_init(bar, 1u);
    cuda::ptx::mbarrier_init(bar_weight, 1u);
    cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster);
    cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cluster,
                                         cuda::ptx::space_shared, bar, bytes);
    const uint32_t staged_bytes = static_cast<uint32_t>(staged_steps * kMTiles * 512);  // per warp
    const uint32_t bulk_bytes = (kStageByThreads ? 0u : staged_bytes * kMmaWarps) + static_cast<uint32_t>(slice * 2);
    cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cta, cuda::ptx::space_shared,
                                         bar_weight, bulk_bytes);
    cuda::ptx::cp_async_bulk(cuda::ptx::space_cluster, cuda::ptx::space_global, s_norm, args.norm_weight + h0,
                             static_cast<uint32_t>(slice * 2), bar_weight);
    if (!kStageByThreads && staged_bytes > 0) {
      for (int w = 0; w < kMmaWarps; ++w) {
        cuda::ptx::cp_async_bulk(cuda::ptx::space_cluster, cuda::ptx::space_global,
                                 s_stage + w * staged_steps * kMTiles * 32,
                                 w_slice + static_cast<int64_t>(w) * steps_per_warp * kMTiles * 32,
                                 staged_bytes, bar_weight);
      }
    }
  }
  if constexpr (kStageByThreads) {
    const int per_warp = staged_steps * kMTiles * 32;
#pragma unroll 1
    for (int w = 0; w < kMmaWarps; ++w) {
      const uint4* src = w_slice + static_cast<int64_t>(w) * steps_per_warp * kMTiles * 32;
      uint4* dst = s_stage + w * per_warp;
      for (int i = tid; i < per_warp; i += kThreads) __pipeline_memcpy_async(dst + i, src + i, sizeof(uint4));
    }
    __pipeline_commit();
  }
  GemmStream<kMTiles, kPrefetch> gemm;
  gemm.a_warp = w_slice + static_cast<int64_t>(warp) * steps_per_warp * kMTiles * 32 + lane;
  gemm.a_staged = s_stage + warp * staged_steps * kMTiles * 32 + lane;
  gemm.staged = staged_steps;
  gemm.steps = steps_per_warp;
  if (lane == 0 && staged_steps + kPrefetch < steps_per_warp) {
    ptx::prefetch_l2_bulk(gemm.a_warp - lane + (staged_steps + kPrefetch) * kMTiles * 32,
                          static_cast<uint32_t>((steps_per_warp - staged_steps - kPrefetch) * kMTiles * 512));
  }
  // Peers push into `bar` only after every CTA of the cluster initialized its own: the
  // init's fence.mbarrier_init orders it, so the arrive is relaxed. (The release form
  // is a GPU-scope fence that waits for thread 0's bulk copies of the weight: a 2.7 us
  // prologue at T = 1 that holds the elementwise pass back.)
  cuda::ptx::barrier_cluster_arrive(cuda::ptx::sem_relaxed);
  // scale and base are parameters: loaded now, stored after the elementwise pass.
  float hc_value = 0.0f;
  if (tid < 3) hc_value = __ldg(args.scale + tid);
  else if (tid < 3 + kMixes) hc_value = __ldg(args.base + tid - 3);
  // Padding tokens of a partial tile (their MMA columns and sums of squares) are zeros:
  // written now, since they depend on no input.
  if (valid < tp) {
    const int pad = tp - valid;
    const int pieces = 8 * wide_chunks * pad * 4;  // (k step, token, lane q) of s_res
    for (int i = tid; i < pieces; i += kThreads) {
      const int piece = i % 4, rest = i / 4;
      s_res[((rest / pad) * tp + valid + rest % pad) * 4 + piece] = make_uint2(0u, 0u);
    }
    for (int i = tid; i < 2 * pad * chunks; i += kThreads) {
      const int m = i % chunks, rest = i / chunks;
      s_ssq[((rest / pad) * tp + valid + rest % pad) * ssq_row + m] = 0.0f;
    }
  }

  ptx::griddep_wait();

  // ---- elementwise pass. Lane (g, q) of a warp task takes item (t, c) = tile token t x
  // 32-wide chunk c, 8-wide chunk 4c + q; padding tokens' items are skipped (their
  // fragments and sums were zeroed before the wait). A token's chunks go in pairs, so
  // that its rows move as whole 128-byte lines (layout.h). Two CTAs per SM:
  // tile_task_item, four tokens of a chunk pair per task. One CTA per SM (small batches,
  // mostly partial tiles) and the packed-items variant (packed_saves_a_round()):
  // packed_task_item, only the valid tokens' items, so a T = 1 tile's ten chunks (hidden
  // 5120) run in one round on every lane group rather than on one lane group of eight in
  // two rounds. A warp keeps kTasksInFlight tasks' loads in flight; the tile's post /
  // comb / pre_lag rows load together with the first.
  constexpr bool kPacked = kCtasPerSm == 1 || kPackedItems;
  const int tasks = kPacked ? packed_tasks(valid, wide_chunks) : tile_tasks(tp, wide_chunks);
  auto item_of = [&](int task, int& t, int& c) {
    if constexpr (kPacked) {
      return packed_task_item(task, g, valid, wide_chunks, t, c);
    } else {
      tile_task_item(task, g, wide_chunks, t, c);
      return t < valid;
    }
  };
  auto load_task = [&](int task, ChunkInputs& in) {
    int t, c;
    if (task < tasks && item_of(task, t, c)) load_chunk(args, t0 + t, h0 + 8 * (4 * c + q), in);
  };
  auto run_task = [&](int task, const ChunkInputs& in) {
    int t, c;
    if (!item_of(task, t, c)) return;
    const int m = 4 * c + q;
    const float* coef = s_coef + t * kCoefFloats;
    uint32_t cur[kStreams][4];  // new residual, BF16 pairs, per stream
    update_chunk(coef, in, cur);
    store_residual_out(args, t0 + t, h0 + 8 * m, cur);
    float ssq_res, ssq_li;
    uint32_t li[4];  // unused here: the layer input recomputes li from s_res
    chunk_sums(coef + 20, cur, ssq_res, ssq_li, li);
    store_b_fragments(s_res, c, tp, t, q, cur);
    s_ssq[t * ssq_row + m] = ssq_res;
    s_ssq[(tp + t) * ssq_row + m] = ssq_li;
  };
  {
    // post 0-3 | comb 4-19 | pre_lag 20-23 per token as six 16-byte quads; zero for
    // padding tokens
    const int t = tid / 6, k = tid % 6;
    float4 coef = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (t < valid) {
      const int64_t gt = t0 + t;
      coef = k == 0 ? __ldg(reinterpret_cast<const float4*>(args.post + gt * 4))
                    : (k < 5 ? __ldg(reinterpret_cast<const float4*>(args.comb + gt * 16) + (k - 1))
                             : __ldg(reinterpret_cast<const float4*>(args.pre_lag + gt * 4)));
    }
    ChunkInputs in[kTasksInFlight];
#pragma unroll
    for (int d = 0; d < kTasksInFlight; ++d) load_task(warp + d * kWarps, in[d]);
    if (t < tp) reinterpret_cast<float4*>(s_coef)[tid] = coef;
    __syncthreads();
    if constexpr (kCtasPerSm == 1) {
      // One copy of the task code, run again for a warp's second task with that task's
      // inputs moved over: 53 rather than 60 KB of code, up to 2% faster. (The two-CTA
      // kernels keep a copy per task; the one-copy form is not measured there.)
      static_assert(kTasksInFlight == 2, "the second task's inputs move over");
      ChunkInputs cur = in[0];
#pragma unroll 1
      for (int d = 0; d < kTasksInFlight; ++d) {
        if (warp + d * kWarps >= tasks) break;
        run_task(warp + d * kWarps, cur);
        cur = in[1];
      }
    } else {
#pragma unroll
      for (int d = 0; d < kTasksInFlight; ++d) {
        if (warp + d * kWarps < tasks) run_task(warp + d * kWarps, in[d]);
      }
    }
  }
  // Later rounds keep kTasksInFlight tasks' loads in flight too (two CTAs per SM only:
  // one-CTA tiles take one round, one_cta_fits_one_round()).
  if constexpr (kCtasPerSm == 2) {
#pragma unroll 1
    for (int task = warp + kTasksInFlight * kWarps; task < tasks; task += kTasksInFlight * kWarps) {
      ChunkInputs in[kTasksInFlight];
#pragma unroll
      for (int d = 0; d < kTasksInFlight; ++d) load_task(task + d * kWarps, in[d]);
#pragma unroll
      for (int d = 0; d < kTasksInFlight; ++d) {
        if (task + d * kWarps < tasks) run_task(task + d * kWarps, in[d]);
      }
    }
  }
  // The first pass's streamed A fragments go out before anything waits, the barrier
  // included: a warp done with its elementwise tasks issues them while the others finish
  // (at T >= 128 a warp spends 0.9-1.8 us here, with nothing reading the loads' registers
  // yet; before the barrier that overlaps the wait for the others).
  gemm.prime();
  if constexpr (kStageByThreads) __pipeline_wait_prior(0);  // this thread's staged weight steps
  __syncthreads();
  if (tid < 3 + kMixes) s_hc[tid] = hc_value;  // read after the barrier that follows the GEMM
  // ---- slice sums of squares, chunks in order from +0 (residual [t], li [tp + t]),
  // while the weight arrives (published by the barrier after the GEMM)
  if (tid < 2 * tp) s_slice[tid] = slice_sum(s_ssq + tid * ssq_row, chunks);

  // ---- mixer GEMM (the weight slice's staged steps have landed)
  while (!cuda::ptx::mbarrier_try_wait_parity(cuda::ptx::sem_acquire, cuda::ptx::scope_cta, bar_weight, 0u)) {
  }
  mixer_gemm<kMTiles, kNtPass, true, kStagedOnce>(gemm, s_res, tp, warp, lane, s_mixp, [] {});
  __syncthreads();

  // ---- exchange: every peer's barrier is initialized once the cluster barrier opens
  cluster.barrier_wait();
  // owners: token t by rank t % 16 (shift 0)
  push_exchange(cluster, tid, kThreads, tile, tp, rank, 0, s_mixp, s_slice, s_recv_mix, s_recv_li, bar);
  while (!cuda::ptx::mbarrier_try_wait_parity(cuda::ptx::sem_acquire, cuda::ptx::scope_cluster, bar, 0u)) {
  }
  // Everything this CTA receives has landed; the final cluster barrier keeps every CTA
  // alive until its peers can say the same. Its arrives are relaxed (nothing after the
  // barrier reads another CTA's shared memory): the release form would first wait for
  // this thread's DSMEM pushes to land (0.6 us more on the coefficient warp's path at
  // T = 1). The coefficient warp arrives after its coefficients.
  if (warp != kWarps - 1) cuda::ptx::barrier_cluster_arrive(cuda::ptx::sem_relaxed);
  ptx::griddep_launch_dependents();

  if (warp == kWarps - 1) {
    // ---- coefficients of the owned tokens: slices summed in rank order from +0, one
    // lane per (token, mix or residual sum of squares), then one half warp per token.
    // The mixes go through shared memory: registers are short under two CTAs per SM.
    // The sum of squares is parked after the token's mixes.
    sum_owned_slices(lane, owned, s_recv_mix, s_coef_out);
    __syncwarp();
    write_coefficients(args, lane, owned, rank, valid, t0, s_coef_out, s_hc);  // first owned: rank
    // This warp's arrive on the final cluster barrier (it only says "received").
    cuda::ptx::barrier_cluster_arrive(cuda::ptx::sem_relaxed);
  } else {
    // ---- layer input of this slice: li recomputed from the staged new residual
    if (tid < tp) {
      float sum = 0.0f;
#pragma unroll
      for (int r = 0; r < kCluster; ++r) sum = __fadd_rn(sum, s_recv_li[r * tp + tid]);
      s_rstd[tid] = layer_input_rstd(sum, hidden, args.norm_eps);
    }
    ptx::named_barrier_sync(1, (kWarps - 1) * 32);
#pragma unroll 1
    for (int task = warp; task < tasks; task += kWarps - 1) {
      int t, c;
      const bool active = item_of(task, t, c);
      const int m = 4 * c + q;
      if (active) {
        uint32_t cur[kStreams][4];
#pragma unroll
        for (int s = 0; s < kStreams; ++s) {
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const uint2 w = s_res[((8 * c + 2 * s + half) * tp + t) * 4 + q];
            cur[s][2 * half] = w.x;
            cur[s][2 * half + 1] = w.y;
          }
        }
        const float* pre = s_coef + t * kCoefFloats + 20;
        const float rstd = s_rstd[t];
        const uint4 nw = reinterpret_cast<const uint4*>(s_norm)[m];
        uint32_t out[4];
#pragma unroll
        for (int p = 0; p < 4; ++p) {
          float li_lo, li_hi;
          collapse_pair(pre, cur, p, li_lo, li_hi, [](float, float) {});
          out[p] = layer_input_pair(li_lo, li_hi, rstd, word_of(nw, p));
        }
        *reinterpret_cast<uint4*>(args.layer_input + (t0 + t) * args.layer_input_stride + h0 + 8 * m) =
            make_uint4(out[0], out[1], out[2], out[3]);
      }
    }
  }
  cluster.barrier_wait();
}

}  // namespace

// The kernel of configuration Cfg, as launch.cc runs it.
template <class Cfg>
detail::KernelVariant<KernelArgs> boundary_variant() {
  return {&mhc_boundary_kernel<Cfg>, static_cast<size_t>(Cfg::kSmem)};
}

}  // namespace fusedstep::mhc
