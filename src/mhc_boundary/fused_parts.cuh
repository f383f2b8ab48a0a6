// mHC boundary: the pieces both fused kernels share (fused.cu, the one-wave kernel;
// persistent.cu, the pipelined persistent kernel): kernel arguments, the elementwise
// math of one 8-wide chunk, the mixer GEMM of one tile of tokens, the DSMEM exchange
// and the owner's coefficients. Same code in both, so the same bits (docs/numerics.md).
#pragma once

#include <cooperative_groups.h>
#include <cuda/ptx>

#include "common/device_math.cuh"
#include "common/ptx.cuh"
#include "mhc_boundary/layout.h"
#include "mhc_boundary/stage_math.cuh"

namespace fusedstep::mhc::parts {

namespace cg = cooperative_groups;

constexpr int kMaxTile = 32;                    // tokens of one tile (sub-tile)
constexpr int kMaxOwned = kMaxTile / kCluster;  // tokens one CTA finalizes per tile
// Floats pushed to a token's owner per slice: 24 mixes, the residual sum of squares,
// padding to whole 16-byte st.async quads.
constexpr int kRecvFloats = 28;
constexpr int kRecvQuads = kRecvFloats / 4;
// A warp's partial mixes of one token in shared memory (s_mixp: [8 warps][tp][28]): 24
// mixes, padded so that the GEMM's stores (tokens 2q + e of lane q) and the pushes'
// 16-byte reads (a token per lane) hit different banks (ncu, 23rd session: with
// [8 warps][24][tp] both were 2- to 4-way conflicted). H200, same-run A/B, two rounds
// (24th session): TF32 T = 1-16 -1 to -2.4% at every hidden size, T >= 32 0 to -2.6%;
// FP32 -0.3 to -1.8% but hidden 7168 T = 128 +1%.
constexpr int kMixpFloats = 28;
constexpr int kCoefFloats = 24;             // per token: post 0-3 | comb 4-19 | pre_lag 20-23
constexpr int kCoefOutFloats = kMixes + 1;  // per owned token: mix totals | sum of squares

struct KernelArgs {
  const __nv_bfloat16* x;
  const __nv_bfloat16* residual;
  const float* post;
  const float* comb;
  const float* pre_lag;
  const uint32_t* weight;
  const float* scale;
  const float* base;
  const __nv_bfloat16* norm_weight;
  __nv_bfloat16* residual_out;
  __nv_bfloat16* layer_input;
  float* pre_out;
  float* post_out;
  float* comb_out;
  int64_t tokens;
  int64_t hidden;
  int64_t x_stride, residual_stride, residual_out_stride, layer_input_stride;
  int tile;
  float norm_eps;
  CoefficientScalars scalars;
};

// Shared-memory layouts: regions taken in order, each 128-byte aligned.
struct RegionAllocator {
  uint32_t end = 0;
  FS_HD uint32_t take(uint64_t bytes) {
    end = (end + 127u) / 128u * 128u;
    const uint32_t start = end;
    end += static_cast<uint32_t>(bytes);
    return start;
  }
  FS_HD uint32_t aligned_end() const { return (end + 127u) / 128u * 128u; }
};

// Kernel attributes of a 16-CTA-cluster kernel with `smem_bytes` of dynamic shared
// memory: the opt-in size, the non-portable cluster size, all of L1 as shared memory.
inline cudaError_t set_cluster_kernel_attributes(const void* f, int smem_bytes) {
  cudaError_t err = cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
  if (err == cudaSuccess) err = cudaFuncSetAttribute(f, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  if (err == cudaSuccess) {
    err = cudaFuncSetAttribute(f, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
  }
  return err;
}

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
// __stwb: 16-byte stores (a plain `*p =` compiled to four 4-byte stores for half of the
// streams, where the four words did not sit in an aligned register quad).
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
// bits). H200, 19th session: 1.5-6% faster at tiles 16-32 (hidden 5120 T = 128 / 336 /
// 2048 -3.1 / -1.2 / -4.3%, 7168 T = 2048 -6.3%), but 1-4% slower at tile 8, whose one
// n8 tile reads A once either way (a different schedule): so for tiles of more than 8.
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
// (t + shift) % 16 (the one-wave kernel: shift 0; the persistent kernel rotates owners
// between sub-tiles); the owner finalizes it. Its tokens are first_owned(rank, shift),
// + 16, ... (slot o = t / 16).
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
      // vary fastest across the lanes (quads fastest had put up to 7 lanes on a bank of
      // s_mixp's former [8 warps][24][tp] layout: H200, same-run A/B, two rounds, 23rd
      // session, T = 256-2048 -3.5 to -4.8%, T = 128 -1.5 to -2%).
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

}  // namespace fusedstep::mhc::parts
