// SPDX-License-Identifier: Apache-2.0
// KDA verify (q = 2..8): the request plan and the gate warp's projection, shared by
// the verify kernel's configurations (verify_kernel.cuh).
#pragma once

#include "kda_decode/kernel_common.cuh"

namespace fusedstep::kda {
namespace {

// docs/numerics.md "Speculative verify": uniform over a request (every CTA of a cluster
// reads the same words), so a padding request never touches the barriers.
struct VerifyRequest {
  bool active = false;
  int accepted = 1;          // A
  int count = 1;             // n
  int32_t read_slot = 0;     // slots[b, A - 1]
  int32_t conv_slot = 0;     // slots[b, 0]
  int64_t record_row = -1;
  int32_t lane_slot = 0;     // slots[b, lane] for lanes < q (warp 0: token t's write slot)
};

__device__ __forceinline__ VerifyRequest plan_verify_request(const VerifyArgs& va, int64_t b) {
  VerifyRequest r;
  const int q = va.tokens;
  // The slots row is loaded with the accepted count, lane t of every warp holding
  // slots[b, t], so that the read slot costs a shuffle, not a second dependent load.
  // Called by every thread of the CTA (the shuffles take whole warps).
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int32_t* row = va.base.slots + b * va.slots_stride;
  const int32_t lane_slot = lane < q ? row[lane] : 0;
  const int accepted = va.accepted[b];
  const int count = va.token_counts != nullptr ? va.token_counts[b] : q;
  const int32_t read_slot = __shfl_sync(kFullMask, lane_slot, (accepted - 1) & 31);
  const int32_t conv_slot = __shfl_sync(kFullMask, lane_slot, 0);
  if (accepted < 1 || accepted > q || count < 1 || count > q) return r;
  if (read_slot <= 0 || read_slot >= va.base.state_slots) return r;
  if (conv_slot <= 0 || conv_slot >= va.base.conv_state_slots) return r;
  if (va.record_correction != nullptr) {
    const int64_t record = va.record_rows != nullptr ? int64_t(va.record_rows[b]) : b;
    if (record < 0 || record >= va.record_slots) return r;
    r.record_row = record;
  }
  r.accepted = accepted;
  r.count = count;
  r.read_slot = read_slot;
  r.conv_slot = conv_slot;
  r.lane_slot = lane_slot;
  r.active = true;
  return r;
}

// C = 1 with q <= 4: the main warps project the second half of the F_B tiles after their
// conv (alone, the gate warp takes about 1 us a tile, and the main warps wait for it once
// their state has landed). At q = 8 the conv is long enough to hide the gate warp, and
// the split there is 2% slower.
__device__ __forceinline__ bool verify_main_tiles(const FusedArgs& a, int q, int cluster) {
  return cluster == 1 && a.gate_source == kGateMma && q <= 4;
}

// One m16 tile of the verify's F_B projection and its decays, as the gate warp's
// project_tile computes them (gate modes 0 and 1; token t is MMA column t, columns >= n
// zero in `bf`): lane (g, j) holds keys g, g + 8 of the tile for tokens 2j, 2j + 1;
// decays to decay[t][key] (rows t >= n to row kDumpRow, unread then), raw_g of
// tokens t < n to `record_gate` (null: none). The gate warp keeps its own copy of these
// lines: calling this function from it changes ptxas's allocation of every C >= 2 variant
// (batch 16 2-4% slower).
template <int kDumpRow>
__device__ __forceinline__ void verify_main_gate_tile(const FusedArgs& a, const uint32_t (&w)[8][4],
                                                      const uint32_t (&bf)[8][2], int tile, int group, int quarter,
                                                      int n, float a_exp, const float* dt_bias,
                                                      float (*decay)[kHead], __nv_bfloat16* record_gate) {
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (a.four_chains) {
    float chain[4][4] = {};
#pragma unroll
    for (int c = 0; c < 8; ++c) ptx::mma_bf16_m16n8k16(chain[c / 2], w[c], bf[c], chain[c / 2]);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      acc[e] = __fadd_rn(0.0f, __fadd_rn(__fadd_rn(__fadd_rn(chain[0][e], chain[1][e]), chain[2][e]), chain[3][e]));
    }
  } else {
#pragma unroll
    for (int c = 0; c < 8; ++c) ptx::mma_bf16_m16n8k16(acc, w[c], bf[c], acc);
  }
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int t = 2 * quarter + (e & 1);
    const int feature = 16 * tile + group + 8 * (e >> 1);
    const float raw = dmath::round_bf16(acc[e]);
    decay[t < n ? t : kDumpRow][feature] = kda::decay(a_exp, raw, dt_bias[feature], a.lower_bound);
    if (t < n && record_gate != nullptr) record_gate[int64_t(t) * (2 * kHead) + feature] = __float2bfloat16_rn(raw);
  }
}

// The verify's gate warp: raw_g and decays of the CTA's kRows keys for tokens t < n,
// multicast token by token. F_B: token t is MMA column t (columns >= n are zeros, as
// in the composed path; a column's result does not depend on the others); lane (g, j)
// ends with keys g, g + 8 of the tile for tokens 2j, 2j + 1 (the D fragment).
// F_B fragments (kGateMma) come from `staged_fb` when the kernel staged them (early 1,
// C >= 2; with staged rows, the second chunk buffer: C = 2 every tile, C = 1 tiles 0-3;
// same per-lane layout as the q = 1 kernel), else from global memory; `bf` holds
// the f_a fragments loaded for tokens < q (zeroed here for tokens >= n); `dt` the
// lane's dt_bias values of features lane + 32 i.
// kFbAlwaysStaged: the variant stages every F_B tile whenever the gate is an MMA (C = 2
// with staged rows), so the unstaged path is not compiled (its two tiles in flight cost
// the four-CTA variants 64 registers).
template <int kCluster, int kTokens, bool kFbAlwaysStaged>
__device__ __forceinline__ void gate_warp_verify(const VerifyArgs& va, SharedVerify<kTokens>& sh, int head, int64_t b,
                                                 int value_base, int lane, const VerifyRequest& r, float a_exp,
                                                 uint32_t (&bf)[8][2], const uint32_t* staged_fb,
                                                 const float (&dt)[(kHead / kCluster + 31) / 32],
                                                 const DeferredChunk& chunk_after_tiles) {
  const FusedArgs& a = va.base;
  constexpr int kRows = kHead / kCluster;
  static_assert(kRows >= 16, "verify: whole m16 tiles (C <= 8)");
  constexpr int kTiles = kRows / 16;
  const int group = lane >> 2, quarter = lane & 3;
  const int n = r.count;
  const int64_t key_base = int64_t(head) * kHead;
  const int64_t first_row = b * va.tokens;
#pragma unroll
  for (int i = 0; i < (kRows + 31) / 32; ++i) {
    if (lane + 32 * i < kRows) sh.dt[lane + 32 * i] = dt[i];
  }
  __syncwarp();
  __nv_bfloat16* record_gate =
      va.record_key_gate == nullptr
          ? nullptr
          : va.record_key_gate + (r.record_row * a.heads + head) * va.tokens * (2 * kHead) + kHead + value_base;
  auto emit = [&](int t, int feature, float raw_g) {
    sh.gate_local[t][feature] = kda::decay(a_exp, raw_g, sh.dt[feature], a.lower_bound);
    if (record_gate != nullptr) record_gate[int64_t(t) * (2 * kHead) + feature] = __float2bfloat16_rn(raw_g);
  };

  bool waited = false;  // the cluster wait (once) is behind us
  if (a.gate_source == kGateGiven) {
    // Tokens in groups of four, every load of a group before its first use: one round
    // trip per group (a load and its use per token make one round trip per token: 15%
    // slower than the f_a path at batch 64, q = 8).
    constexpr int kGroup = 4, kLaneFeatures = (kRows + 31) / 32;
#pragma unroll 1
    for (int t0 = 0; t0 < n; t0 += kGroup) {
      uint16_t raw[kGroup][kLaneFeatures];
#pragma unroll
      for (int u = 0; u < kGroup; ++u) {
        // (formed for every u; read only for tokens < n)
        const __nv_bfloat16* row = a.raw_gate + (first_row + t0 + u) * a.raw_gate_stride + key_base + value_base;
#pragma unroll
        for (int i = 0; i < kLaneFeatures; ++i) {
          if (t0 + u < n && lane + 32 * i < kRows) raw[u][i] = load_bf16_bits(row + lane + 32 * i);
        }
      }
#pragma unroll
      for (int u = 0; u < kGroup; ++u) {
#pragma unroll
        for (int i = 0; i < kLaneFeatures; ++i) {
          if (t0 + u < n && lane + 32 * i < kRows) emit(t0 + u, lane + 32 * i, dmath::bf16_lo(raw[u][i]));
        }
      }
    }
  } else {  // kGateMma (check() keeps the FMA tree at q = 1)
    if (group >= n) {  // columns >= n are zeros, as in the composed gate
#pragma unroll
      for (int c = 0; c < 8; ++c) bf[c][0] = bf[c][1] = 0u;
    }
    if (staged_fb != nullptr) __pipeline_wait_prior(0);
    auto fetch_tile = [&](uint32_t (&w)[8][4], int tile) {
      if (kFbAlwaysStaged || (kCluster > 1 && staged_fb != nullptr)) {
        read_fb_fragments(w, staged_fb, tile, lane);
      } else {
        const __nv_bfloat16* row_lo = a.f_b_weight + (key_base + value_base + 16 * tile + group) * kHead + 4 * quarter;
        load_fb_fragments(w, row_lo, row_lo + 8 * kHead);
      }
    };
    auto project_tile = [&](const uint32_t (&w)[8][4], int tile) {
      float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      if (a.four_chains) {
        float chain[4][4] = {};
#pragma unroll
        for (int c = 0; c < 8; ++c) ptx::mma_bf16_m16n8k16(chain[c / 2], w[c], bf[c], chain[c / 2]);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          acc[e] = __fadd_rn(0.0f, __fadd_rn(__fadd_rn(__fadd_rn(chain[0][e], chain[1][e]), chain[2][e]), chain[3][e]));
        }
      } else {
#pragma unroll
        for (int c = 0; c < 8; ++c) ptx::mma_bf16_m16n8k16(acc, w[c], bf[c], acc);
      }
      // D: acc[0], acc[1] = key g, tokens 2j, 2j + 1; acc[2], acc[3] = key g + 8. The
      // four decays are computed and stored unconditionally (columns >= n hold zeros),
      // so that their MUFU chains interleave: emitted one branch at a time they run one
      // after another (batch 2-16 2-7% slower).
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int t = 2 * quarter + (e & 1);
        const int feature = 16 * tile + group + 8 * (e >> 1);
        const float raw = dmath::round_bf16(acc[e]);
        // Rows t >= n go to the dump row, which no token reads then, so the store
        // needs no branch (with one, ptxas sinks each chain into its own branch).
        constexpr int kDumpRow = SharedVerify<kTokens>::kDumpRow;
        sh.gate_local[t < n ? t : kDumpRow][feature] = kda::decay(a_exp, raw, sh.dt[feature], a.lower_bound);
        if (t < n && record_gate != nullptr) {
          record_gate[int64_t(t) * (2 * kHead) + feature] = __float2bfloat16_rn(raw);
        }
      }
    };
    // C = 1 with verify_main_tiles: the first half (the main warps project the rest).
    const int gate_tiles = verify_main_tiles(a, va.tokens, kCluster) ? kTiles / 2 : kTiles;
    // Tiles first .. gate_tiles - 1 from global memory, two in flight: tile + 2 is
    // requested as soon as tile's fragments are used, so the unstaged F_B (C = 1: eight
    // tiles, from L2 after the prefetch at entry) costs about half as many load round
    // trips as tiles (the C = 1 verify 9-13% faster at batch 16-128).
    auto project_from_global = [&](int first) {
      uint32_t w0[8][4], w1[8][4];
      if (first < gate_tiles) fetch_tile(w0, first);
      if (first + 1 < gate_tiles) fetch_tile(w1, first + 1);
#pragma unroll 1
      for (int tile = first; tile < gate_tiles; tile += 2) {
        project_tile(w0, tile);
        if (tile + 2 < gate_tiles) fetch_tile(w0, tile + 2);
        if (tile + 1 < gate_tiles) {
          project_tile(w1, tile + 1);
          if (tile + 3 < gate_tiles) fetch_tile(w1, tile + 3);
        }
      }
    };
    if constexpr (kCluster == 1) {
      // C = 1: tiles 0-3 staged in the second chunk buffer (`staged_fb`, before the PDL
      // wait), the rest (q = 8: tiles 4-7) from L2, two in flight. Once the staged tiles
      // are read the buffer is chunk 1's (copied below).
      constexpr int kStagedTiles = kTiles / 2;
      const int smem_tiles = staged_fb != nullptr ? kStagedTiles : 0;
#pragma unroll 1
      for (int tile = 0; tile < smem_tiles; ++tile) {
        uint32_t w[8][4];
        read_fb_fragments(w, staged_fb, tile, lane);
        project_tile(w, tile);
      }
      if (chunk_after_tiles.dst != nullptr) {
        __syncwarp();
        cptx::barrier_cluster_wait();  // warp 0's init of the chunk's barrier is visible
        waited = true;
        if (lane == 0) copy_deferred_chunk(chunk_after_tiles);
      }
      // (Requested before the staged tiles, these two tiles' registers spill.)
      project_from_global(smem_tiles);
    } else if (kFbAlwaysStaged || staged_fb != nullptr) {
#pragma unroll 1
      for (int tile = 0; tile < gate_tiles; ++tile) {
        uint32_t w[8][4];
        fetch_tile(w, tile);
        project_tile(w, tile);
      }
    } else if constexpr (!kFbAlwaysStaged) {
      project_from_global(0);
    }
  }
  __syncwarp();

  // Multicast per token: kRows / 4 packets of 16 bytes to each of the kCluster CTAs.
  constexpr int kPackets = kRows / 4;
  const int packet = lane % kPackets;
  const int destination = lane / kPackets;
  if (!waited) cptx::barrier_cluster_wait();  // every CTA's barriers are armed
  // Every lane has read its F_B fragments from the buffer (the __syncwarp above); warp
  // 0's init of the chunk's barrier is visible after the cluster wait.
  if (kCluster > 1 && chunk_after_tiles.dst != nullptr && lane == 0) copy_deferred_chunk(chunk_after_tiles);
  cg::cluster_group cluster = cg::this_cluster();
#pragma unroll 1
  for (int t = 0; t < n; ++t) {
    const float4 d4 = *reinterpret_cast<const float4*>(&sh.gate_local[t][4 * packet]);
    if constexpr (kCluster == 1) {
      // The main warps write their tiles' decays into sh.decay themselves.
      if (!verify_main_tiles(a, va.tokens, kCluster) || 4 * packet < 16 * (kTiles / 2)) {
        *reinterpret_cast<float4*>(&sh.decay[t][4 * packet]) = d4;
      }
      cptx::mbarrier_arrive(&sh.gate_bar[t]);  // armed for the 32 lanes and the main threads
    } else {
      uint32_t words[4] = {__float_as_uint(d4.x), __float_as_uint(d4.y), __float_as_uint(d4.z),
                           __float_as_uint(d4.w)};
      cptx::st_async(cluster.map_shared_rank(reinterpret_cast<uint32_t*>(&sh.decay[t][value_base + 4 * packet]),
                                             destination),
                     words, cluster.map_shared_rank(&sh.gate_bar[t], destination));
    }
  }
}

}  // namespace
}  // namespace fusedstep::kda
