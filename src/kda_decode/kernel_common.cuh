// SPDX-License-Identifier: Apache-2.0
// KDA decode / verify: device helpers shared by the q = 1 and verify kernels (loads,
// butterflies, the row update, F_B fragments, state staging).
#pragma once

#include <cooperative_groups.h>
#include <cuda/ptx>
#include <cuda_bf16.h>
#include <cuda_pipeline.h>

#include <cstdint>

#include "common/device_math.cuh"
#include "common/ptx.cuh"
#include "kda_decode/args.h"
#include "kda_decode/stage_math.cuh"
#include "kda_decode/state_access.cuh"

namespace fusedstep::kda {
namespace {

namespace cg = cooperative_groups;
namespace cptx = cuda::ptx;

constexpr unsigned kFullMask = 0xffffffffu;

// The q = 1 kernel loads the output gate with beta on sm_90a; on sm_100a ptxas spills it
// there (8 bytes in a 2-CTA variant), so the owner loads it at the gated norm. The
// verify loads its state rows (registers variants) before the PDL wait on sm_90a, after
// the activations on sm_100a (before them, 8 bytes spill in the 2-CTA, 16-lane variant).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000
#define FS_KDA_LATE_NORM_LOADS 1
#define FS_KDA_VERIFY_LATE_ROWS 1
#else
#define FS_KDA_LATE_NORM_LOADS 0
#define FS_KDA_VERIFY_LATE_ROWS 0
#endif

// A request a cluster runs: its state slot must be a slot of both caches (else padding).
__device__ __forceinline__ bool active_slot(const FusedArgs& a, int32_t slot) {
  return slot > 0 && slot < a.state_slots && slot < a.conv_state_slots;
}

__device__ __forceinline__ float load_bf16(const __nv_bfloat16* p) { return __bfloat162float(*p); }

__device__ __forceinline__ float load_typed(const void* base, int64_t index, int is_bf16) {
  return is_bf16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(base)[index])
                 : static_cast<const float*>(base)[index];
}

// Loads on a latency-critical path keep the bits (load_bf16_bits, load_typed_bits: BF16
// zero-extended) and convert where the value is used (dmath::bf16_lo,
// typed_bits_to_float): converted next to its load, ptxas waits for each load before
// issuing the next.
__device__ __forceinline__ uint16_t load_bf16_bits(const __nv_bfloat16* p) {
  return *reinterpret_cast<const uint16_t*>(p);
}
__device__ __forceinline__ uint32_t load_typed_bits(const void* base, int64_t index, int is_bf16) {
  return is_bf16 ? uint32_t(static_cast<const uint16_t*>(base)[index]) : static_cast<const uint32_t*>(base)[index];
}
__device__ __forceinline__ float typed_bits_to_float(uint32_t bits, int is_bf16) {
  return is_bf16 ? dmath::bf16_lo(bits) : __uint_as_float(bits);
}

__device__ __forceinline__ void store_typed(void* base, int64_t index, float value, int is_bf16) {
  if (is_bf16) {
    static_cast<__nv_bfloat16*>(base)[index] = __float2bfloat16_rn(value);  // exact: a BF16 value
  } else {
    static_cast<float*>(base)[index] = value;
  }
}

// Butterfly over `kWidth` lanes (xor kWidth/2 .. 1); every lane ends with the same bits.
template <int kWidth>
__device__ __forceinline__ float butterfly_sum(float v) {
#pragma unroll
  for (int d = kWidth / 2; d >= 1; d /= 2) v = __fadd_rn(v, __shfl_xor_sync(kFullMask, v, d));
  return v;
}

// kN butterflies of butterfly_sum<kWidth> (the same bits each), level by level so that
// their shuffles overlap.
template <int kWidth, int kN>
__device__ __forceinline__ void butterfly_sums(float (&v)[kN]) {
#pragma unroll
  for (int d = kWidth / 2; d >= 1; d /= 2) {
#pragma unroll
    for (int i = 0; i < kN; ++i) v[i] = __fadd_rn(v[i], __shfl_xor_sync(kFullMask, v[i], d));
  }
}

// The lane's share of the row-dot tree: with 16 lanes per row it holds groups l and
// l + 16 (the ^16 level); with 8 lanes, l, l + 8, l + 16, l + 24 (^16, then ^8).
template <int kChunks>
__device__ __forceinline__ float lane_dot(const float4 (&s)[kChunks], const float4 (&u)[kChunks]) {
  if constexpr (kChunks == 2) {
    return __fadd_rn(kda::dot4(s[0], u[0]), kda::dot4(s[1], u[1]));
  } else {
    static_assert(kChunks == 4, "8 or 16 lanes per row");
    const float p0 = kda::dot4(s[0], u[0]), p1 = kda::dot4(s[1], u[1]);
    const float p2 = kda::dot4(s[2], u[2]), p3 = kda::dot4(s[3], u[3]);
    return __fadd_rn(__fadd_rn(p0, p2), __fadd_rn(p1, p3));
  }
}

__device__ __forceinline__ float4 mul4(float4 a, float4 b) {
  return make_float4(__fmul_rn(a.x, b.x), __fmul_rn(a.y, b.y), __fmul_rn(a.z, b.z), __fmul_rn(a.w, b.w));
}
__device__ __forceinline__ float4 fma4(float4 k, float v, float4 s) {
  return make_float4(__fmaf_rn(k.x, v, s.x), __fmaf_rn(k.y, v, s.y), __fmaf_rn(k.z, v, s.z),
                     __fmaf_rn(k.w, v, s.w));
}

__device__ __forceinline__ void mbarrier_wait_parity(uint64_t* bar, uint32_t parity) {
  while (!cptx::mbarrier_try_wait_parity(cptx::sem_acquire, cptx::scope_cluster, bar, parity)) {
  }
}

__device__ __forceinline__ void wait_parity0(uint64_t* bar) { mbarrier_wait_parity(bar, 0u); }

// Thread 0: `bytes` of state rows from global `src` into shared `dst`, counted on `bar`
// (armed here for them); L2 evict-first on request.
__device__ __forceinline__ void stage_state_rows(void* dst, const void* src, uint32_t bytes, uint64_t* bar,
                                                 bool evict_first) {
  cptx::mbarrier_arrive_expect_tx(cptx::sem_release, cptx::scope_cta, cptx::space_shared, bar, bytes);
  if (evict_first) {
    ptx::bulk_copy_g2s_hinted(static_cast<uint32_t>(__cvta_generic_to_shared(dst)), src, bytes,
                              static_cast<uint32_t>(__cvta_generic_to_shared(bar)), ptx::l2_policy_evict_first());
  } else {
    cptx::cp_async_bulk(cptx::space_cluster, cptx::space_global, dst, src, bytes, bar);
  }
}

// A chunk of staged state rows whose buffer first holds the gate warp's staged F_B
// fragments (dst == nullptr: none): the gate warp copies it once it has read them.
struct DeferredChunk {
  void* dst = nullptr;
  const void* src = nullptr;
  uint32_t bytes = 0;
  uint64_t* bar = nullptr;
  bool evict_first = false;
};

// One lane of the gate warp: the deferred chunk's copy, after a __syncwarp (every lane's
// reads of the buffer are done) and the cluster wait (the barrier's init is visible).
__device__ __forceinline__ void copy_deferred_chunk(const DeferredChunk& chunk) {
  cptx::fence_proxy_async(cptx::space_shared);  // the lanes' reads before the copy's writes
  stage_state_rows(chunk.dst, chunk.src, chunk.bytes, chunk.bar, chunk.evict_first);
}

// Decay, delta-rule update and query dot of kN rows (one per pass) of one lane group,
// interleaving the rows at every butterfly level for instruction-level parallelism.
// kStoreEarly: after_state() runs once every row's new state is known, before the query
// dots (the caller stores the rows there); otherwise it is not called.
template <int kLanes, int kN, int kChunks, bool kStoreEarly = false, class AfterState>
__device__ __forceinline__ void update_rows(float4 (&s)[kN][kChunks], const float4 (&kn)[kChunks],
                                            const float4 (&qn)[kChunks], const float4 (&dc)[kChunks],
                                            const float (&v)[kN], float beta, float (&o)[kN],
                                            float (&v_new_out)[kN], AfterState&& after_state) {
  float dk[kN];
#pragma unroll
  for (int i = 0; i < kN; ++i) {
#pragma unroll
    for (int j = 0; j < kChunks; ++j) s[i][j] = mul4(s[i][j], dc[j]);
    dk[i] = lane_dot<kChunks>(s[i], kn);
  }
#pragma unroll
  for (int d = kLanes / 2; d >= 1; d /= 2) {
#pragma unroll
    for (int i = 0; i < kN; ++i) dk[i] = __fadd_rn(dk[i], __shfl_xor_sync(kFullMask, dk[i], d));
  }
#pragma unroll
  for (int i = 0; i < kN; ++i) {
    const float v_new = kda::delta(v[i], dk[i], beta);
    v_new_out[i] = v_new;  // the records' correction (unused, hence dropped, for q = 1)
#pragma unroll
    for (int j = 0; j < kChunks; ++j) s[i][j] = fma4(kn[j], v_new, s[i][j]);
    if constexpr (!kStoreEarly) o[i] = lane_dot<kChunks>(s[i], qn);
  }
  if constexpr (kStoreEarly) {
    after_state();
#pragma unroll
    for (int i = 0; i < kN; ++i) o[i] = lane_dot<kChunks>(s[i], qn);
  }
#pragma unroll
  for (int d = kLanes / 2; d >= 1; d /= 2) {
#pragma unroll
    for (int i = 0; i < kN; ++i) o[i] = __fadd_rn(o[i], __shfl_xor_sync(kFullMask, o[i], d));
  }
}

// Stages kTiles F_B tiles for read_fb_fragments: lane `lane` copies its own 8-byte
// pieces, chunk c of tile t, half h from `row(t, h) + 16 c` (row(t, h): the tile row
// this lane's A fragment holds, at the lane's column 4 (lane % 4)).
template <int kTiles, class RowPointer>
__device__ __forceinline__ void stage_fb_fragments(uint32_t* staged_fb, int lane, RowPointer row) {
#pragma unroll
  for (int t = 0; t < kTiles; ++t) {
#pragma unroll
    for (int c = 0; c < 8; ++c) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        __pipeline_memcpy_async(staged_fb + ((((t * 8 + c) * 2 + h) * 32 + lane) * 2), row(t, h) + 16 * c, 8);
      }
    }
  }
  __pipeline_commit();
}

// The A fragments of staged F_B tile `tile` ([tile][chunk][half][lane] pieces of two
// words, as the q = 1 and verify gate warps stage them), after __pipeline_wait_prior.
__device__ __forceinline__ void read_fb_fragments(uint32_t (&w)[8][4], const uint32_t* staged_fb, int tile, int lane) {
#pragma unroll
  for (int c = 0; c < 8; ++c) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t* src = staged_fb + ((((tile * 8 + c) * 2 + h) * 32 + lane) * 2);
      w[c][h] = src[0];
      w[c][h + 2] = src[1];
    }
  }
}

// The same fragments of one tile straight from global memory: `row_lo` and `row_hi` are
// the lane's rows g and g + 8 of the tile at its column 4 (lane % 4).
__device__ __forceinline__ void load_fb_fragments(uint32_t (&w)[8][4], const __nv_bfloat16* row_lo,
                                                  const __nv_bfloat16* row_hi) {
#pragma unroll
  for (int c = 0; c < 8; ++c) {
    const uint2 lo = *reinterpret_cast<const uint2*>(row_lo + 16 * c);
    const uint2 hi = *reinterpret_cast<const uint2*>(row_hi + 16 * c);
    w[c][0] = lo.x;
    w[c][2] = lo.y;
    w[c][1] = hi.x;
    w[c][3] = hi.y;
  }
}

// The B fragments of one token's f_a row: `fa` is the row at the lane's column 4 (lane % 4).
__device__ __forceinline__ void load_fa_fragments(uint32_t (&bf)[8][2], const __nv_bfloat16* fa) {
#pragma unroll
  for (int c = 0; c < 8; ++c) {
    const uint2 x = *reinterpret_cast<const uint2*>(fa + 16 * c);
    bf[c][0] = x.x;
    bf[c][1] = x.y;
  }
}

// The lane's columns 4 (group_lane + kLanes j) + 0..3 of the head's q and k (shared
// memory), L2-normalized, q also scaled; `sums` = the warp sums of q^2 (0-3), k^2 (4-7).
template <int kLanes, int kChunks>
__device__ __forceinline__ void normalized_qk(const float* q, const float* k, const float* sums, float q_scale,
                                              int group_lane, float4 (&qn)[kChunks], float4 (&kn)[kChunks]) {
  const float inv_q = kda::inverse_norm(sums[0], sums[1], sums[2], sums[3]);
  const float inv_k = kda::inverse_norm(sums[4], sums[5], sums[6], sums[7]);
#pragma unroll
  for (int j = 0; j < kChunks; ++j) {
    const int col = 4 * (group_lane + kLanes * j);
    const float4 q4 = *reinterpret_cast<const float4*>(q + col);
    const float4 k4 = *reinterpret_cast<const float4*>(k + col);
    qn[j] = make_float4(kda::normalize_q(q4.x, inv_q, q_scale), kda::normalize_q(q4.y, inv_q, q_scale),
                        kda::normalize_q(q4.z, inv_q, q_scale), kda::normalize_q(q4.w, inv_q, q_scale));
    kn[j] = make_float4(kda::normalize_k(k4.x, inv_k), kda::normalize_k(k4.y, inv_k),
                        kda::normalize_k(k4.z, inv_k), kda::normalize_k(k4.w, inv_k));
  }
}

}  // namespace
}  // namespace fusedstep::kda
