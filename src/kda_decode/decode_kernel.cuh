// SPDX-License-Identifier: Apache-2.0
// KDA decode, q = 1: one launch per layer and step runs the causal conv update with
// SiLU, the q/k L2 norms, beta, the F_B gate projection (a fifth "gate" warp), the gated
// delta-rule update of the state (FP32 or BF16, updated in FP32) split over a cluster of C
// CTAs per head (128 / C value rows each) and the gated RMSNorm of the head's output.
//
// Contract (docs/numerics.md, "KDA decode"): every reduction follows the fixed trees of
// the contract, so every configuration and batch size gives the bits of
// fusedstep::composed::launch. Grid (C, heads, batch), clusters (C, 1, 1), kThreads
// threads: cluster z runs request z of head y. A slot <= 0 or past either cache is
// padding: the output row is zeros, no state or conv state is read or written.
// Before the PDL wait (schedule.early >= 1) it reads only the slots, conv weights and
// bias, the conv-state taps, the state rows (registers at early 1, shared memory at
// >= 2), F_B, dt_bias and a_log: never what the preceding kernel writes in a decode step.
//
// Data flow inside a cluster (one head of one request):
//   - every CTA runs the conv of the head's 128 q and k channels (each needs all of
//     them for the norms) and of the v channels of its own rows;
//   - every CTA's gate warp projects the 128 / C F_B rows of its rows' keys and
//     multicasts the decays to all CTAs (st.async into their shared memory);
//   - every CTA updates its state rows and pushes the BF16-rounded outputs o to the
//     owner CTA (rank 0), which runs the gated RMSNorm and writes the output row.
#pragma once

#include "common/kernel_variant.h"
#include "kda_decode/kernel_common.cuh"

namespace fusedstep::kda {
namespace {

// C = 1, MMA gate: the main warps project the last four F_B tiles (one each) after
// their conv, the gate warp the first four: alone, the gate warp delivers the decays
// about 3 us after the conv (batch 64).
template <int kCluster>
constexpr int kMainGateTiles = kCluster == 1 ? kMainThreads / 32 : 0;

// ---------------------------------------------------------------------------------
// The gate warp: raw_g and the decays of the CTA's kRows keys, multicast to every CTA.
// F_B k-index map (docs/numerics.md): k-index 2q + {0,1} <-> column 16c + 4q + {0,1},
// 2q + 8 + {0,1} <-> 16c + 4q + {2,3}: two 8-byte pieces per row and chunk, for every
// cluster size. All eight B columns carry the token, so every D column holds it too.
template <int kCluster, class State, bool kFirstPairStaged>
__device__ __forceinline__ void gate_warp(const FusedArgs& a, SharedCore& sh, uint32_t* staged_fb,
                                          uint32_t* last_chunk, int head, int value_base, int lane) {
  constexpr int kRows = kHead / kCluster;
  constexpr int kTiles = kRows >= 16 ? kRows / 16 : 1;  // m16 tiles (C = 16: half used)
  constexpr int kPairs = (kTiles + 1) / 2;              // lane q >> 1 picks the pair's tile
  const int group = lane >> 2, quarter = lane & 3;
  // C = 8 (batch 1) reads the slot before the PDL wait: read after it, it puts a load round
  // trip ahead of the f_a loads (batch 1 2-3% faster); the other sizes read it after the
  // wait (before it, C = 4 with an FP32 state is 3-5% slower).
  const int64_t b = blockIdx.z;
  int32_t slot = kCluster == 8 ? a.slots[b] : 0;
  const float a_exp = kda::exp_a_log(a.a_log[head]);
  const int64_t key_base = int64_t(head) * kHead;
  // Tiles start at multiples of 16 keys of the head, as in the composed path (C = 16:
  // the CTA's 8 keys are one half of a tile; `offset` says which).
  const int offset = value_base & 15;
  const int tile_base = value_base - offset;
  auto fb_row = [&](int tile, int half) -> const __nv_bfloat16* {
    const int row = tile_base + 16 * tile + group + 8 * half;
    return a.f_b_weight + (key_base + row) * kHead + 4 * quarter;
  };
  auto load_tile = [&](uint32_t (&w)[8][4], int tile) { load_fb_fragments(w, fb_row(tile, 0), fb_row(tile, 1)); };
  auto emit = [&](int feature, float raw_g, float dt) {
    if (feature >= 0 && feature < kRows) sh.gate_local[feature] = kda::decay(a_exp, raw_g, dt, a.lower_bound);
  };
  // The feature lane (g, q) emits for tile pair p (MMA path; -1 when none).
  auto pair_feature = [&](int pair) {
    const int tile = 2 * pair + (quarter >> 1);
    const int f = 16 * tile + group + 8 * (quarter & 1) - offset;
    return (tile < kTiles && f >= 0 && f < kRows) ? f : -1;
  };
  // dt_bias of the keys this lane emits: a weight, loaded with the other early loads
  // (before the PDL wait) so that no load sits between the projection and the decays.
  constexpr int kLaneFeatures = (kRows + 31) / 32;  // raw_g given / FMA tree: f = lane + 32 i
  float dt_lane[kLaneFeatures];
  float dt_pair[kPairs];
  const float* dt_rows = a.dt_bias + key_base + value_base;
  if (a.gate_source == kGateMma) {
#pragma unroll
    for (int pair = 0; pair < kPairs; ++pair) {
      const int f = pair_feature(pair);
      dt_pair[pair] = f >= 0 ? dt_rows[f] : 0.0f;
    }
  } else {
#pragma unroll
    for (int i = 0; i < kLaneFeatures; ++i) {
      const int f = lane + 32 * i;
      dt_lane[i] = f < kRows ? dt_rows[f] : 0.0f;
    }
  }

  const bool stage_fb = a.early == 3 && a.gate_source == kGateMma;
  // C = 1, staged rows: tiles 2-3 (the gate warp's second pair; the main warps project
  // 4-7) are staged in the last state copy chunk's buffer before the PDL wait, and the
  // gate warp copies that chunk once it has read them: loaded from L2 after the wait,
  // they queue behind the wave's state copies (about 1.3 us a tile).
  const bool fb_in_chunk = kCluster == 1 && last_chunk != nullptr && !stage_fb && a.early != 0 &&
                           a.gate_source == kGateMma;
  // kFirstPairStaged (the four-CTA build): tiles 0-1 are staged as well (after the state
  // rows) rather than held in registers across the PDL wait, which fits the kernel in the
  // 96 registers of four CTAs per SM (config.h).
  uint32_t w0[8][4] = {};
  uint32_t w1[8][4] = {};
  if (a.early != 0 && a.gate_source == kGateMma) {
    if (stage_fb) {
      stage_fb_fragments<kTiles>(staged_fb, lane, fb_row);
    } else {
      if (kFirstPairStaged && fb_in_chunk) {
        stage_fb_fragments<2>(staged_fb, lane, fb_row);
      } else if constexpr (!kFirstPairStaged) {
        load_tile(w0, 0);
        if (kTiles > 1) load_tile(w1, 1);
      }
      if (fb_in_chunk) {
        stage_fb_fragments<2>(last_chunk, lane, [&](int t, int h) { return fb_row(2 + t, h); });
      }
      // The tiles after these two are loaded pair by pair at the projection: pull their
      // rows (one contiguous block) into L2 now, so those loads do not each go to HBM.
      if constexpr (kTiles > 2) {
        if (lane == 0 && !fb_in_chunk) {
          ptx::prefetch_l2_bulk(fb_row(2, 0) - 4 * quarter - group * kHead,
                                uint32_t((kTiles - 2) * 16 * kHead * sizeof(__nv_bfloat16)));
        }
      }
    }
  }
  if (a.early != 0) ptx::griddep_wait();

  // Multicast: kRows / 4 packets of 16 bytes to each of the kCluster CTAs (one per lane).
  constexpr int kPackets = kRows / 4;
  const int packet = lane % kPackets;
  const int destination = lane / kPackets;
  cg::cluster_group cluster = cg::this_cluster();
  // The request's one cluster barrier phase: arrive, project, wait (every CTA has armed
  // its barriers), multicast. A padding request projects nothing.
  if constexpr (kCluster != 8) slot = a.slots[b];
  if (active_slot(a, slot)) {
    cptx::barrier_cluster_arrive(cptx::sem_relaxed);  // no shared reads to order
    if (a.gate_source == kGateGiven) {
#pragma unroll
      for (int f0 = 0; f0 < kRows; f0 += 32) {
        const int f = f0 + lane;
        if (f < kRows) {
          const float raw = load_bf16(a.raw_gate + b * a.raw_gate_stride + key_base + value_base + f);
          emit(f, raw, dt_lane[f0 / 32]);
        }
      }
    } else if (!kFirstPairStaged && a.gate_source == kGateFma) {  // check(): C >= 4, never staged
      // Sixteen 8-FMA partials over the inputs in order, then the butterfly of the
      // contract (p[i] += p[i + d], d = 8, 4, 2, 1).
      const __nv_bfloat16* fa = a.f_a + b * a.f_a_stride;
#pragma unroll 1
      for (int f0 = 0; f0 < kRows; f0 += 32) {
        const int f = f0 + lane;
        const int row = (value_base + (f & (kRows - 1))) & (kHead - 1);
        const __nv_bfloat16* wrow = a.f_b_weight + (key_base + row) * kHead;
        float p[16];
#pragma unroll
        for (int i = 0; i < 16; ++i) {
          const uint4 wv = *reinterpret_cast<const uint4*>(wrow + 8 * i);
          const uint2 x0 = *reinterpret_cast<const uint2*>(fa + 8 * i);
          const uint2 x1 = *reinterpret_cast<const uint2*>(fa + 8 * i + 4);
          const uint32_t ws[4] = {wv.x, wv.y, wv.z, wv.w};
          const uint32_t xs[4] = {x0.x, x0.y, x1.x, x1.y};
          float acc = 0.0f;
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            acc = __fmaf_rn(dmath::bf16_lo(xs[e]), dmath::bf16_lo(ws[e]), acc);
            acc = __fmaf_rn(dmath::bf16_hi(xs[e]), dmath::bf16_hi(ws[e]), acc);
          }
          p[i] = acc;
        }
#pragma unroll
        for (int i = 0; i < 8; ++i) p[i] = __fadd_rn(p[i], p[i + 8]);
#pragma unroll
        for (int i = 0; i < 4; ++i) p[i] = __fadd_rn(p[i], p[i + 4]);
        p[0] = __fadd_rn(p[0], p[2]);
        p[1] = __fadd_rn(p[1], p[3]);
        p[0] = __fadd_rn(p[0], p[1]);
        // check() keeps this path to C >= 4 (one feature per lane); other C read dt here.
        emit(f, dmath::round_bf16(p[0]), kLaneFeatures == 1 ? dt_lane[0] : dt_rows[f & (kRows - 1)]);
      }
    } else {
      uint32_t bf[8][2];
      load_fa_fragments(bf, a.f_a + b * a.f_a_stride + 4 * quarter);
      if (stage_fb) __pipeline_wait_prior(0);
      auto fetch_tile = [&](uint32_t (&w)[8][4], int tile) {
        if (stage_fb) {
          read_fb_fragments(w, staged_fb, tile, lane);
        } else {
          load_tile(w, tile);
        }
      };
      // One m16 tile: mode 0 = one chain of eight MMAs; mode 1 = four chains of two,
      // 0 + (((m0 + m1) + m2) + m3). Returns D elements 0 (row g) and 2 (row g + 8).
      auto project = [&](const uint32_t (&w)[8][4], float& row_lo, float& row_hi) {
        float acc[4][4] = {};
        if (a.four_chains) {
#pragma unroll
          for (int c = 0; c < 8; ++c) ptx::mma_bf16_m16n8k16(acc[c / 2], w[c], bf[c], acc[c / 2]);
          row_lo = __fadd_rn(0.0f, __fadd_rn(__fadd_rn(__fadd_rn(acc[0][0], acc[1][0]), acc[2][0]), acc[3][0]));
          row_hi = __fadd_rn(0.0f, __fadd_rn(__fadd_rn(__fadd_rn(acc[0][2], acc[1][2]), acc[2][2]), acc[3][2]));
        } else {
#pragma unroll
          for (int c = 0; c < 8; ++c) ptx::mma_bf16_m16n8k16(acc[0], w[c], bf[c], acc[0]);
          row_lo = acc[0][0];
          row_hi = acc[0][2];
        }
      };
      // Lane (g, q) takes tile 2 pair + (q >> 1), row g + 8 (q & 1): one key per lane.
      auto emit_pair = [&](int pair, float lo0, float hi0, float lo1, float hi1) {
        const bool second = (quarter >> 1) != 0;
        const bool high = (quarter & 1) != 0;
        const float raw = second ? (high ? hi1 : lo1) : (high ? hi0 : lo0);
        emit(pair_feature(pair), dmath::round_bf16(raw), dt_pair[pair]);
      };
      if constexpr (kTiles > 2) {
        // Several pairs (C <= 2), tiles from global memory (L2 after the prefetch): tile
        // + 2 is requested as soon as tile's fragments are used, so each pair after the
        // first waits for one load round trip less (as the verify's gate warp does).
        // (kFirstPairStaged: one tile in registers at a time on every path.)
        const bool from_global = !kFirstPairStaged && !stage_fb && !fb_in_chunk;
        constexpr int kGateTiles = kTiles - kMainGateTiles<kCluster>;  // the rest: main warps
#pragma unroll
        for (int pair = 0; pair < kGateTiles / 2; ++pair) {
          float lo0 = 0.0f, hi0 = 0.0f, lo1 = 0.0f, hi1 = 0.0f;
          const int t0 = 2 * pair, t1 = 2 * pair + 1;
          // The first pair's tiles were loaded before the wait (early >= 1, unstaged).
          const bool fetch = pair > 0 ? !from_global : a.early == 0 || stage_fb || (kFirstPairStaged && fb_in_chunk);
          if (kFirstPairStaged && pair == 0 && fb_in_chunk) {
            __pipeline_wait_prior(1);  // the first pair's copies; tiles 2-3's may still run
            read_fb_fragments(w0, staged_fb, 0, lane);
          } else if (fetch && fb_in_chunk) {
            __pipeline_wait_prior(0);
            read_fb_fragments(w0, last_chunk, t0 - 2, lane);
          } else if (fetch) {
            fetch_tile(w0, t0);
          }
          project(w0, lo0, hi0);
          if (from_global && t0 + 2 < kGateTiles) fetch_tile(w0, t0 + 2);
          if (kFirstPairStaged && pair == 0 && fb_in_chunk) {
            read_fb_fragments(w1, staged_fb, 1, lane);
          } else if (fetch && fb_in_chunk) {
            read_fb_fragments(w1, last_chunk, t1 - 2, lane);
          } else if (fetch) {
            fetch_tile(w1, t1);
          }
          project(w1, lo1, hi1);
          if (from_global && t1 + 2 < kGateTiles) fetch_tile(w1, t1 + 2);
          emit_pair(pair, lo0, hi0, lo1, hi1);
        }
      } else {
        // One pair (C >= 4), written out: the loop above, instantiated here, changes
        // ptxas's allocation of the whole kernel (batch 2-8 5-7% slower on the H200).
        float lo0 = 0.0f, hi0 = 0.0f, lo1 = 0.0f, hi1 = 0.0f;
        if (a.early == 0 || stage_fb) fetch_tile(w0, 0);
        project(w0, lo0, hi0);
        if (kTiles > 1) {
          if (a.early == 0 || stage_fb) fetch_tile(w1, 1);
          project(w1, lo1, hi1);
        }
        emit_pair(0, lo0, hi0, lo1, hi1);
      }
    }
    __syncwarp();
    const float4 d4 = *reinterpret_cast<const float4*>(&sh.gate_local[4 * packet]);
    __syncwarp();  // every lane has read gate_local
    cptx::barrier_cluster_wait();
    if (fb_in_chunk && lane == 0) {
      // The lanes' reads of the staged tiles are behind the __syncwarp above; thread 0's
      // init of the chunk's barrier is visible after the cluster wait.
      constexpr uint32_t kChunkElements = kHead * kHead / 4;  // C = 1: the last of four copies
      DeferredChunk chunk;
      chunk.dst = last_chunk;
      chunk.src = static_cast<const State*>(a.state) + int64_t(slot) * a.state_slot_stride +
                  int64_t(head) * kHead * kHead + 3 * kChunkElements;
      chunk.bytes = kChunkElements * sizeof(State);
      chunk.bar = &sh.state_bar[3];
      chunk.evict_first = a.evict_first;
      copy_deferred_chunk(chunk);
    }
    if constexpr (kCluster == 1) {
      // No peers (st.async needs a cluster of two or more): plain stores, then each lane
      // arrives on the decay barrier (armed for 32 arrivals, and the main threads'
      // where they project tiles: they store those keys' decays themselves).
      constexpr int kGateKeys = kRows - 16 * kMainGateTiles<kCluster>;
      if (a.gate_source != kGateMma || 4 * packet < kGateKeys) *reinterpret_cast<float4*>(&sh.decay[4 * packet]) = d4;
      cptx::mbarrier_arrive(&sh.gate_bar);
    } else {
      uint32_t words[4] = {__float_as_uint(d4.x), __float_as_uint(d4.y), __float_as_uint(d4.z),
                           __float_as_uint(d4.w)};
      cptx::st_async(cluster.map_shared_rank(reinterpret_cast<uint32_t*>(&sh.decay[value_base + 4 * packet]),
                                             destination),
                     words, cluster.map_shared_rank(&sh.gate_bar, destination));
    }
  }
  // A padding request staged F_B fragments it never read: no copy outlives the CTA (a
  // no-op where the projection already waited).
  if (stage_fb || fb_in_chunk) __pipeline_wait_prior(0);
}

// The q = 1 kernel's body: cluster blockIdx.z runs request b = blockIdx.z of head
// blockIdx.y, with one phase of the decay and output barriers and one cluster barrier
// phase (every thread arrives once its barriers are armed and waits before its first
// DSMEM send).
template <int kCluster, int kLanes, bool kStaged, class State, bool kFourCtas>
__device__ __forceinline__ void kda_decode_fused_body(const FusedArgs& a) {
  constexpr int kRows = kHead / kCluster;
  constexpr int kGroups = kMainThreads / kLanes;            // rows per pass
  constexpr int kPasses = (kRows + kGroups - 1) / kGroups;
  constexpr int kChunks = 32 / kLanes;                      // float4 per lane and row
  constexpr int kWave = kStaged ? (kPasses < kWavePasses ? kPasses : kWavePasses) : kPasses;
  constexpr uint32_t kStateBytes = kRows * kHead * sizeof(State);
  static_assert(kPasses % kWave == 0, "waves tile the passes");

  __shared__ SharedCore sh;
  extern __shared__ __align__(128) unsigned char dynamic_smem[];
  // [kRows][128] state elements when kStaged, then the staged F_B rows.
  State* staged_base = reinterpret_cast<State*>(dynamic_smem);
  uint32_t* staged_fb =
      reinterpret_cast<uint32_t*>(dynamic_smem + (kStaged ? kStateBytes : 0));

  const int tid = threadIdx.x;
  const int partition = static_cast<int>(blockIdx.x);  // == rank in the (C, 1, 1) cluster
  const int head = static_cast<int>(blockIdx.y);
  const int value_base = partition * kRows;
  const int dim = a.heads * kHead;
  const int64_t b = blockIdx.z;

  if (a.trigger_at_entry) ptx::griddep_launch_dependents();
  if (a.early == 0) ptx::griddep_wait();

  // C = 1, staged: the last copy chunk's buffer first holds F_B tiles 2-3
  // (gate_warp), which copies that chunk itself; MMA gate only.
  constexpr bool kFbInLastChunk = kCluster == 1 && kStaged;
  const bool fb_in_last_chunk = kFbInLastChunk && a.early >= 1 && a.early <= 2 && a.gate_source == kGateMma;
  if (tid >= kMainThreads) {
    uint32_t* last_chunk =
        fb_in_last_chunk ? reinterpret_cast<uint32_t*>(staged_base + 3 * (kRows / 4) * kHead) : nullptr;
    gate_warp<kCluster, State, kFourCtas>(a, sh, staged_fb, last_chunk, head, value_base, tid - kMainThreads);
    return;
  }

  const int64_t head_rows = (int64_t(head) * kHead + value_base) * kHead;  // the CTA's rows in a slot
  auto rows_of = [&](int32_t slot) {
    return static_cast<State*>(a.state) + int64_t(slot) * a.state_slot_stride + head_rows;
  };
  // Thread 0: the rows of `slot` into shared memory, in kCopyChunks copies with a
  // barrier each, so the first wave starts once its rows have landed (64 or 128 rows:
  // four chunks; fewer rows: one).
  constexpr int kCopyChunks = kRows >= 64 ? 4 : 1;
  constexpr int kCopyRows = kRows / kCopyChunks;
  static_assert(!kFbInLastChunk || kCopyChunks == 4, "gate_warp copies the last of four chunks");
  static_assert(!kFbInLastChunk || kStateBytes / kCopyChunks >= 2 * fb_fragment_bytes(kCluster) / fb_tiles(kCluster),
                "F_B tiles 2-3 fit in the last chunk's buffer");
  constexpr uint32_t kCopyBytes = kStateBytes / kCopyChunks;
  // Chunks [first_chunk, end_chunk) of them (the late state copy issues them in two steps).
  auto stage_rows = [&](int32_t slot, int first_chunk, int end_chunk) {
#pragma unroll
    for (int c = first_chunk; c < end_chunk; ++c) {
      if (kFbInLastChunk && fb_in_last_chunk && c == kCopyChunks - 1) break;  // the gate warp copies it
      stage_state_rows(staged_base + c * (kCopyRows * kHead),
                       rows_of(slot) + c * (kCopyRows * kHead), kCopyBytes, &sh.state_bar[c], a.evict_first);
    }
  };

  const int32_t slot = a.slots[b];

  // C = 1 at early 1: the state copy is issued after the activations are requested,
  // chunks 0-1 at once and chunk 2 after the conv (chunk 3: the gate warp, after its
  // F_B tiles). Once the wave is full (the next call's CTAs cannot start early), an
  // activation load issued after the CTA's 64 KB of copies waits behind them, and every
  // CTA's conv with it. Where the next call's CTAs do start early (batch 20) this order
  // is 17% slower, so plan() runs those calls at early 2.
  const bool late_state_copy = kCluster == 1 && kStaged && a.early == 1;
  constexpr int kLateFirstChunks = kCopyChunks / 2;  // issued before the conv

  // ---- setup: thread 0 inits the barriers (and stages the state rows).
  if (tid == 0) {
    // C = 1: the gate warp's 32 lanes arrive on the decay barrier and the outputs are
    // plain stores; otherwise both barriers count the bytes the cluster sends.
    cptx::mbarrier_init(&sh.gate_bar, kCluster == 1 ? 32 + (kMainGateTiles<kCluster> > 0 ? kMainThreads : 0) : 1);
    if (kCluster > 1 && partition == 0) cptx::mbarrier_init(&sh.out_bar, 1);
    if constexpr (kStaged) {
      for (int c = 0; c < kCopyChunks; ++c) {
        cptx::mbarrier_init(&sh.state_bar[c], 1);
      }
    }
    cptx::fence_mbarrier_init(cptx::sem_release, cptx::scope_cluster);
    if (kStaged && !late_state_copy && active_slot(a, slot)) stage_rows(slot, 0, kCopyChunks);
  }

  // Per-thread index values: thread t holds channel t of the head's q and k, and v row t.
  const int warp = tid >> 5, lane = tid & 31;
  const int group = tid / kLanes, group_lane = tid % kLanes;
  const bool has_v = tid < kRows;
  const int64_t channel[3] = {int64_t(head) * kHead + tid, dim + int64_t(head) * kHead + tid,
                              2 * int64_t(dim) + int64_t(head) * kHead + value_base + (has_v ? tid : 0)};

  // ---- loads before the PDL wait: conv weights and bias, conv taps and (not staged)
  // state rows; after it, the activations.
  float weight[3][4];
  float bias[3];
  float taps[3][3];
  // Registers configs: the rows as FP32 (a BF16 state converted at the load: held as
  // bits, its <4, 16> config needs more than the 96 registers of four CTAs per SM).
  float4 hist[kStaged ? 1 : kPasses][kChunks];
  auto load_request = [&](int32_t slot) {
    const int64_t w_section = a.conv_weight_section_stride;
    const int64_t w_channel = a.conv_weight_channel_stride;
    const int64_t w_tap = a.conv_weight_tap_stride;
    const int64_t c_channel = a.conv_state_channel_stride;
    const int64_t c_tap = a.conv_state_tap_stride;
    const int64_t conv_slot = int64_t(slot) * a.conv_state_slot_stride;
#pragma unroll
    for (int s = 0; s < 3; ++s) {
#pragma unroll
      for (int t = 0; t < 4; ++t) {
        weight[s][t] = load_typed(a.conv_weight, s * w_section + (channel[s] - s * int64_t(dim)) * w_channel + t * w_tap,
                                  a.conv_weight_bf16);
      }
      bias[s] = a.conv_bias != nullptr ? a.conv_bias[channel[s]] : 0.0f;
      const int64_t cbase = conv_slot + channel[s] * c_channel;
#pragma unroll
      for (int t = 0; t < 3; ++t) taps[s][t] = load_typed(a.conv_state, cbase + t * c_tap, a.conv_state_bf16);
    }
    if constexpr (!kStaged) {
      const State* rows = rows_of(slot);
#pragma unroll
      for (int p = 0; p < kPasses; ++p) {
        const int row = (p * kGroups + group) % kRows;
#pragma unroll
        for (int j = 0; j < kChunks; ++j) hist[p][j] = load_state4(rows + row * kHead + 4 * (group_lane + kLanes * j));
      }
    }
  };
  // The activations stay BF16 bits until used (dmath::bf16_lo): converted in
  // load_activations, ptxas waits for them there, before this request's cluster arrive,
  // and the gate warp's multicast waits for every thread's arrive (batch 8: the arrive
  // then comes 1.2 us after the PDL wait).
  uint16_t xin_bits[3];
  uint16_t raw_beta_bits;
#if !FS_KDA_LATE_NORM_LOADS
  uint16_t raw_out_gate_bits;
#endif
  // beta and the output gate, consumed only after the conv, are loaded after the
  // cluster arrive (below): loaded with the input, ptxas places their conversions before
  // the arrive, which then waits for the loads, and the gate warp's multicast with it.
  auto load_late_activations = [&](int64_t b) {
    raw_beta_bits = load_bf16_bits(a.raw_beta + b * a.raw_beta_stride + head);
#if !FS_KDA_LATE_NORM_LOADS
    raw_out_gate_bits =
        partition == 0 ? load_bf16_bits(a.output_gate + b * a.output_gate_stride + int64_t(head) * kHead + tid) : 0;
#else
    // sm_100a: loaded here, the gate spills across the shuffle trees; the owner loads it
    // where it uses it (same value, same bits).
#endif
  };
  auto load_activations = [&](int64_t b) {
    const __nv_bfloat16* xrow = a.x + b * a.x_stride;
#pragma unroll
    for (int s = 0; s < 3; ++s) xin_bits[s] = load_bf16_bits(xrow + channel[s]);
  };
  // C = 1, MMA gate, BF16 state, three-CTA build: main warp w's F_B tile and f_a fragments
  // are requested with the activations, not after the conv, where they would wait a second
  // round trip behind the wave's state copies (batch 32-64 5-9% faster). With an FP32
  // state that order is 3-7% slower, and the four-CTA build has no registers for them.
  constexpr bool kEarlyMainTile = kMainGateTiles<kCluster> > 0 && !kFourCtas && std::is_same_v<State, __nv_bfloat16>;
  uint32_t main_w[8][4];
  uint32_t main_bf[8][2];
  auto load_main_tile = [&] {
    const int tile = kHead / 16 - kMainGateTiles<kCluster> + warp;
    const int g = lane >> 2, quarter = lane & 3;
    const __nv_bfloat16* row_lo = a.f_b_weight + (int64_t(head) * kHead + 16 * tile + g) * kHead + 4 * quarter;
    load_fb_fragments(main_w, row_lo, row_lo + 8 * kHead);
    load_fa_fragments(main_bf, a.f_a + b * a.f_a_stride + 4 * quarter);
  };
  if (active_slot(a, slot)) load_request(slot);
  if (a.early != 0) ptx::griddep_wait();
  if (active_slot(a, slot)) load_activations(b);
  if constexpr (kEarlyMainTile) {
    if (active_slot(a, slot) && a.gate_source == kGateMma) load_main_tile();
  }
  if (late_state_copy && tid == 0 && active_slot(a, slot)) stage_rows(slot, 0, kLateFirstChunks);

  cg::cluster_group cluster = cg::this_cluster();
  float* remote_o = cluster.map_shared_rank(&sh.o[0], 0);
  uint64_t* remote_out_bar = cluster.map_shared_rank(&sh.out_bar, 0);

  // The request runs as the body of a one-pass loop: ptxas schedules that better than
  // straight-line code (batch 1-4 about 3% faster on the H200).
#pragma unroll 1
  for (int pass = 0; pass < 1; ++pass) {
    if (!active_slot(a, slot)) {
      // Padding: a zero output row; no state of any kind is read or written.
      if (partition == 0) a.output[b * a.output_stride + int64_t(head) * kHead + tid] = __float2bfloat16_rn(0.0f);
      continue;
    }
    State* state_rows = rows_of(slot);
    const int64_t conv_slot = int64_t(slot) * a.conv_state_slot_stride;

    // Arm the barrier phases, then arrive (peers send only after the wait below). Relaxed:
    // a release arrive would wait for every load in flight (the activations just
    // requested); a peer's bytes landing before the arming are counted (tx-count may go
    // below zero within a phase).
    if (tid == 0 && kCluster > 1) {
      cptx::mbarrier_arrive_expect_tx(cptx::sem_release, cptx::scope_cta, cptx::space_shared, &sh.gate_bar,
                                      uint32_t(kHead * sizeof(float)));
      if (partition == 0) {
        cptx::mbarrier_arrive_expect_tx(cptx::sem_release, cptx::scope_cta, cptx::space_shared, &sh.out_bar,
                                        uint32_t(kHead * sizeof(float)));
      }
    }
    cptx::barrier_cluster_arrive(cptx::sem_relaxed);
    load_late_activations(b);

    if (!a.trigger_at_entry) ptx::griddep_launch_dependents();

    // ---- conv (3 state taps, then the input) and SiLU.
    const float xin[3] = {dmath::bf16_lo(xin_bits[0]), dmath::bf16_lo(xin_bits[1]), dmath::bf16_lo(xin_bits[2])};
    const float x_v = xin[2];
    float qkv[3];
#pragma unroll
    for (int s = 0; s < 3; ++s) {
      float c = bias[s];
#pragma unroll
      for (int t = 0; t < 3; ++t) c = kda::conv_tap(taps[s][t], weight[s][t], c);
      c = kda::conv_tap(xin[s], weight[s][3], c);
      qkv[s] = kda::silu_bf16(c);
    }
    sh.q[tid] = qkv[0];
    sh.k[tid] = qkv[1];
    if (has_v) sh.v[tid] = qkv[2];
    const float sq_q = butterfly_sum<32>(__fmul_rn(qkv[0], qkv[0]));
    const float sq_k = butterfly_sum<32>(__fmul_rn(qkv[1], qkv[1]));
    if (lane == 0) {
      sh.sums[warp] = sq_q;
      sh.sums[4 + warp] = sq_k;
    }
    // The new v-channel window [s1, s2, x] (this thread read the old taps above).
    if (has_v) {
      const int64_t cbase = conv_slot + channel[2] * a.conv_state_channel_stride;
      store_typed(a.conv_state, cbase, taps[2][1], a.conv_state_bf16);
      store_typed(a.conv_state, cbase + a.conv_state_tap_stride, taps[2][2], a.conv_state_bf16);
      store_typed(a.conv_state, cbase + 2 * a.conv_state_tap_stride, x_v, a.conv_state_bf16);
    }
    ptx::named_barrier_sync(1, kMainThreads);
    if (late_state_copy && tid == 0) stage_rows(slot, kLateFirstChunks, kCopyChunks);
    if constexpr (kMainGateTiles<kCluster> > 0) {
      // Main warp w projects F_B tile kTiles - 4 + w (after the barrier above: thread 0's
      // barrier init is ordered before these arrivals). All D columns hold the token;
      // lane (g, q) with q < 2 emits key g + 8 q of the tile.
      if (a.gate_source == kGateMma) {
        const int tile = kHead / 16 - kMainGateTiles<kCluster> + warp;
        const int g = lane >> 2, quarter = lane & 3;
        const int64_t key_base = int64_t(head) * kHead;
        if constexpr (!kEarlyMainTile) load_main_tile();
        const uint32_t (&w)[8][4] = main_w;
        const uint32_t (&bf)[8][2] = main_bf;
        const int feature = 16 * tile + g + 8 * (quarter & 1);
        const float dt = a.dt_bias[key_base + feature];
        // D element 0 (row g) or 2 (row g + 8), selected without indexing the array by a
        // run-time value (that puts it in local memory).
        const bool high = (quarter & 1) != 0;
        float acc[4][4] = {};
        float raw;
        if (a.four_chains) {
#pragma unroll
          for (int c = 0; c < 8; ++c) ptx::mma_bf16_m16n8k16(acc[c / 2], w[c], bf[c], acc[c / 2]);
          float m[4];
#pragma unroll
          for (int i = 0; i < 4; ++i) m[i] = high ? acc[i][2] : acc[i][0];
          raw = __fadd_rn(0.0f, __fadd_rn(__fadd_rn(__fadd_rn(m[0], m[1]), m[2]), m[3]));
        } else {
#pragma unroll
          for (int c = 0; c < 8; ++c) ptx::mma_bf16_m16n8k16(acc[0], w[c], bf[c], acc[0]);
          raw = high ? acc[0][2] : acc[0][0];
        }
        if (quarter < 2) {
          sh.decay[feature] = kda::decay(kda::exp_a_log(a.a_log[head]), dmath::round_bf16(raw), dt, a.lower_bound);
        }
      }
      cptx::mbarrier_arrive(&sh.gate_bar);
    }

    // ---- operands of the lane's columns: normalized q, k; beta; decays.
    float4 qn[kChunks], kn[kChunks], dc[kChunks];
    normalized_qk<kLanes, kChunks>(sh.q, sh.k, sh.sums, a.q_scale, group_lane, qn, kn);
    const float beta = kda::sigmoid(dmath::bf16_lo(raw_beta_bits));
    // The cluster wait (the owner's output barrier is armed) comes before the decay wait,
    // since the peers' gate warps send the decays after their own cluster waits; in the
    // other order racecheck reports a deadlock, while the hardware completes it. C = 8
    // (batch 1) keeps that other order: 0.2 us faster (2.96 against 3.17 us, 12 heads).
    constexpr bool kClusterWaitFirst = kCluster < 8;
    if constexpr (kClusterWaitFirst) cptx::barrier_cluster_wait();
    wait_parity0(&sh.gate_bar);
#pragma unroll
    for (int j = 0; j < kChunks; ++j) dc[j] = *reinterpret_cast<const float4*>(&sh.decay[4 * (group_lane + kLanes * j)]);
    if constexpr (!kClusterWaitFirst) cptx::barrier_cluster_wait();

    // ---- the recurrence, a wave of passes at a time (staged: once the copy chunks that
    // hold the wave's rows have landed).
#pragma unroll
    for (int w0 = 0; w0 < kPasses; w0 += kWave) {
      if constexpr (kStaged) {
        const int covered = std::min(w0 * kGroups, kRows);                 // rows of earlier waves
        const int needed = std::min((w0 + kWave) * kGroups, kRows);        // ... and of this one
#pragma unroll
        for (int c = (covered + kCopyRows - 1) / kCopyRows; c * kCopyRows < needed; ++c) {
          wait_parity0(&sh.state_bar[c]);
        }
      }
      float4 s[kWave][kChunks];
      float v[kWave], o[kWave];
#pragma unroll
      for (int i = 0; i < kWave; ++i) {
        const int row = ((w0 + i) * kGroups + group) % kRows;
#pragma unroll
        for (int j = 0; j < kChunks; ++j) {
          if constexpr (kStaged) {
            s[i][j] = load_state4(&staged_base[row * kHead + 4 * (group_lane + kLanes * j)]);
          } else {
            s[i][j] = hist[w0 + i][j];
          }
        }
        v[i] = sh.v[row];
      }
      float v_new_unused[kWave];
      auto store_row = [&](int i) {
        const int row = (w0 + i) * kGroups + group;
        if (row >= kRows) return;
#pragma unroll
        for (int j = 0; j < kChunks; ++j) {
          store_state4(state_rows + row * kHead + 4 * (group_lane + kLanes * j), s[i][j], kStaged && a.evict_first);
        }
      };
      // C >= 4 (12 heads: batch 1-8) stores the new rows before the query dots: there the
      // last stores' drain ends the call (batch 2-8 3-6% faster). C <= 2 stores them
      // after each row's output push: stored early, its C = 2 registers variant takes 138
      // registers instead of 128 (two CTAs per SM: batch 16 31% slower), and batch >= 32
      // gains nothing.
      constexpr bool kStoreEarly = kCluster >= 4;
      update_rows<kLanes, kWave, kChunks, kStoreEarly>(s, kn, qn, dc, v, beta, o, v_new_unused, [&] {
#pragma unroll
        for (int i = 0; i < kWave; ++i) store_row(i);
      });
#pragma unroll
      for (int i = 0; i < kWave; ++i) {
        const int row = (w0 + i) * kGroups + group;
        if (row < kRows) {
          if (group_lane == 0) {
            if constexpr (kCluster == 1) {
              sh.o[row] = dmath::round_bf16(o[i]);
            } else {
              cptx::st_async(reinterpret_cast<uint32_t*>(remote_o + value_base + row),
                             __float_as_uint(dmath::round_bf16(o[i])), remote_out_bar);
            }
          }
          if constexpr (!kStoreEarly) store_row(i);
        }
      }
    }

    // The q/k windows and output gate, kept aside for the owner.
    const float window[2][3] = {{taps[0][1], taps[0][2], xin[0]}, {taps[1][1], taps[1][2], xin[1]}};
#if !FS_KDA_LATE_NORM_LOADS
    const float out_gate_raw = dmath::bf16_lo(raw_out_gate_bits);
#endif

    // ---- owner: the q/k conv windows; gated RMSNorm of the head's 128 outputs.
    if (partition == 0) {
      // The norm weight is read here, while the outputs arrive: loaded at entry, it spills
      // across the recurrence.
      const float norm_weight = load_typed(a.norm_weight, tid, a.norm_weight_bf16);
      if constexpr (kCluster == 1) {
        ptx::named_barrier_sync(1, kMainThreads);
      } else {
        wait_parity0(&sh.out_bar);
      }
      // The new q/k windows [s1, s2, x]: every CTA of the cluster has read the old taps
      // before pushing its outputs. Written before the norm, not after it: the call ends
      // when its last stores drain (batch 1 about 1% faster).
#pragma unroll
      for (int s = 0; s < 2; ++s) {
        const int64_t cbase = conv_slot + channel[s] * a.conv_state_channel_stride;
#pragma unroll
        for (int t = 0; t < 3; ++t) store_typed(a.conv_state, cbase + t * a.conv_state_tap_stride, window[s][t], a.conv_state_bf16);
      }
      const float o = sh.o[tid];
      const int a8 = lane & 7;
      float g_sum[4];
#pragma unroll
      for (int g = 0; g < 4; ++g) {
        const float o0 = sh.o[32 * g + a8], o1 = sh.o[32 * g + 16 + a8];
        const float o2 = sh.o[32 * g + 8 + a8], o3 = sh.o[32 * g + 24 + a8];
        const float s = __fadd_rn(__fadd_rn(__fmul_rn(o0, o0), __fmul_rn(o1, o1)),
                                  __fadd_rn(__fmul_rn(o2, o2), __fmul_rn(o3, o3)));
        g_sum[g] = butterfly_sum<8>(s);
      }
      const float sumsq = __fadd_rn(__fadd_rn(g_sum[0], g_sum[2]), __fadd_rn(g_sum[1], g_sum[3]));
      const float rstd = kda::norm_rstd(sumsq, a.norm_eps);
#if FS_KDA_LATE_NORM_LOADS
      const float out_gate_raw = load_bf16(a.output_gate + b * a.output_gate_stride + int64_t(head) * kHead + tid);
#endif
      const float out = kda::gated_output(o, rstd, norm_weight, kda::sigmoid(out_gate_raw));
      a.output[b * a.output_stride + int64_t(head) * kHead + tid] = __float2bfloat16_rn(out);
    }
  }
}

template <class Cfg>
__global__ void __launch_bounds__(kThreads, Cfg::kMinCtas) kda_decode_kernel(const __grid_constant__ FusedArgs a) {
  kda_decode_fused_body<Cfg::kCluster, Cfg::kLanes, Cfg::kStaged, typename Cfg::State, Cfg::kFourCtas>(a);
}
}  // namespace

// The q = 1 kernel of configuration Cfg, as launch.cc runs it.
template <class Cfg>
detail::KernelVariant<FusedArgs> decode_variant() {
  return {&kda_decode_kernel<Cfg>, Cfg::kMaxDynamicSmem};
}

}  // namespace fusedstep::kda
