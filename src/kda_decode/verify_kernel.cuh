// SPDX-License-Identifier: Apache-2.0
// KDA speculative verify (q = tokens = 2..8) with token counts and RecoverSSM records,
// one launch per layer and step.
//
// Contract (docs/numerics.md, "Speculative verify"): request b's state is read from
// slots[b, accepted[b] - 1]; tokens t < n = token_counts[b] (or q) run the q = 1 step's
// formulas one after the other, each on the state the previous token left; token t's
// state is written to slots[b, t] (without records), or its correction and k | raw_g go
// to the record row (with records; the read slot is then a checkpoint left unchanged).
// Rows t >= n are zeros. Every configuration gives the bits of fusedstep::composed.
// Grid (C, heads, batch), clusters (C, 1, 1): token t's decays and outputs travel
// through per-token arrays and barriers (gate_bar[t], out_bar[t]), each armed once
// (parity 0) and only for t < n; the owner of token t's gated norm is CTA t % C. The
// state stays in registers (or shared memory for C = 1 and early 2) from token to token.
// Before the PDL wait (early >= 1) it reads its request plan (slots row, accepted,
// token_counts, record_rows), the conv-state taps and (registers) the state rows.
#pragma once

#include "common/kernel_variant.h"
#include "kda_decode/verify_parts.cuh"

namespace fusedstep::kda {
namespace {

// Cfg::kTokens: the largest q the per-token shared arrays hold (SharedVerify<kTokens>).
template <class Cfg>
__global__ void __launch_bounds__(kThreads, Cfg::kMinCtas) kda_verify_kernel(const __grid_constant__ VerifyArgs va) {
  constexpr int kCluster = Cfg::kCluster, kLanes = Cfg::kLanes, kTokens = Cfg::kTokens;
  constexpr bool kStaged = Cfg::kStaged;
  using State = typename Cfg::State;
  const FusedArgs& a = va.base;
  constexpr int kRows = kHead / kCluster;
  constexpr int kGroups = kMainThreads / kLanes;
  constexpr int kPasses = (kRows + kGroups - 1) / kGroups;
  constexpr int kChunks = 32 / kLanes;
  // Staged: a wave is one chunk of kChunkRows rows.
  constexpr int kChunkRows = verify_chunk_rows(kCluster);
  constexpr int kWave = kStaged ? kChunkRows / kGroups : kPasses;
  static_assert(kPasses % kWave == 0, "waves tile the passes");
  static_assert(kRows >= kGroups, "every pass row exists (C <= 8)");
  static_assert(!kStaged || kWave * kGroups == kChunkRows, "a chunk is whole passes");

  __shared__ SharedVerify<kTokens> sh;
  extern __shared__ __align__(128) unsigned char dynamic_smem[];
  // Staged: two chunk buffers of kChunkBufferBytes, each holding kChunkRows state rows.
  constexpr size_t kChunkBufferBytes = verify_chunk_buffer_bytes(kCluster);
  auto chunk_buffer = [&](int buffer) { return reinterpret_cast<State*>(dynamic_smem + buffer * kChunkBufferBytes); };
  // State in registers (C >= 2, early 1) with the MMA gate: the gate warp's F_B
  // fragments (the q = 1 kernel's early-3 layout), copied before the PDL wait.
  uint32_t* staged_fb = reinterpret_cast<uint32_t*>(dynamic_smem);

  const int tid = threadIdx.x;
  const int partition = static_cast<int>(blockIdx.x);
  const int head = static_cast<int>(blockIdx.y);
  const int64_t b = blockIdx.z;
  const int value_base = partition * kRows;
  const int dim = a.heads * kHead;
  const int q = va.tokens;
  const bool main_thread = tid < kMainThreads;
  const int ctid = main_thread ? tid : 0;  // the gate warp loads thread 0's weights (unused)

  if (a.trigger_at_entry) ptx::griddep_launch_dependents();
  if (a.early == 0) ptx::griddep_wait();

  // Request-independent loads (early 1: before the wait): conv weights, bias, norm weight.
  const bool has_v = ctid < kRows;
  const int64_t channel[3] = {int64_t(head) * kHead + ctid, dim + int64_t(head) * kHead + ctid,
                              2 * int64_t(dim) + int64_t(head) * kHead + value_base + (has_v ? ctid : 0)};
  uint32_t weight_bits[3][4];  // converted at the conv (typed_bits_to_float)
  float bias[3];
#pragma unroll
  for (int s = 0; s < 3; ++s) {
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      weight_bits[s][t] = load_typed_bits(
          a.conv_weight,
          s * a.conv_weight_section_stride + (channel[s] - s * int64_t(dim)) * a.conv_weight_channel_stride +
              t * a.conv_weight_tap_stride,
          a.conv_weight_bf16);
    }
    bias[s] = a.conv_bias != nullptr ? a.conv_bias[channel[s]] : 0.0f;
  }
  const float norm_w = load_typed(a.norm_weight, ctid, a.norm_weight_bf16);
  // The gate warp's weights: dt_bias of the CTA's keys, exp(a_log), the F_B fragments.
  constexpr int kLaneFeatures = (kRows + 31) / 32;
  float dt_pre[kLaneFeatures];
  float a_exp = 0.0f;
  // Not in a buffer of its own with staged state: its 16-32 KB would cost a CTA per SM
  // (up to 25% slower at batch 16-128).
  constexpr bool kStageFb = kCluster >= 2 && !kStaged;
  // C = 2 with staged rows (batch 9-16) stages F_B (16 KB) in the second chunk buffer,
  // before the PDL wait; the gate warp copies chunk 1 there once its tiles are read:
  // loaded from L2 after the wait, each F_B tile queues behind the wave's state copies
  // (about 1.3 us a tile at batch 16).
  // C = 1 stages the gate warp's first four tiles there (the second half comes from the
  // main warps, or at q = 8 from L2).
  constexpr bool kFbInChunkBuffer = kStaged && kCluster <= 2;
  const bool stage_fb = ((kStageFb && a.early == 1) || kFbInChunkBuffer) && a.gate_source == kGateMma;
  constexpr int kChunkFbTiles = kCluster == 1 ? kRows / 32 : kRows / 16;  // F_B tiles in the buffer
  if constexpr (kFbInChunkBuffer) {
    static_assert(kChunkFbTiles * 4096 == kChunkBufferBytes, "F_B fills one chunk buffer");
    staged_fb = reinterpret_cast<uint32_t*>(chunk_buffer(1));
  }
  if (!main_thread) {
    const int lane = tid - kMainThreads;
#pragma unroll
    for (int i = 0; i < kLaneFeatures; ++i) {
      const int f = lane + 32 * i;
      dt_pre[i] = f < kRows ? a.dt_bias[int64_t(head) * kHead + value_base + f] : 0.0f;
    }
    a_exp = kda::exp_a_log(a.a_log[head]);
    if (stage_fb) {
      const int group = lane >> 2, quarter = lane & 3;
      stage_fb_fragments<kFbInChunkBuffer ? kChunkFbTiles : kRows / 16>(staged_fb, lane, [&](int t, int h) {
        return a.f_b_weight + (int64_t(head) * kHead + value_base + 16 * t + group + 8 * h) * kHead + 4 * quarter;
      });
    } else if (a.gate_source == kGateMma && lane == 0) {
      // Unstaged F_B (early 0, or staged rows at C >= 4): the CTA's rows are one
      // contiguous block; pull it into L2 now so that the tile loads do not each go to HBM.
      ptx::prefetch_l2_bulk(a.f_b_weight + (int64_t(head) * kHead + value_base) * kHead,
                            uint32_t(kRows * kHead * sizeof(__nv_bfloat16)));
    }
  }

  // ---- the request: its plan (slots row, accepted count, token count, record row), its
  // conv-state taps and state rows. At early >= 1 they are read before the PDL wait, as
  // the q = 1 kernel reads its slot, taps and rows (docs/integration.md: they are the
  // step's inputs, not the previous kernel's outputs); at early 0 the wait is at entry.
  // Read after the wait, they would be two dependent HBM round trips (the plan, then the
  // taps and rows it addresses) before the conv can start.
  const VerifyRequest r = plan_verify_request(va, b);
  const int64_t first_row = b * q;
  if (!r.active) {
    if (stage_fb && !main_thread) __pipeline_wait_prior(0);  // no copy outlives the CTA
    if (a.early != 0) ptx::griddep_wait();                   // no global write before it
    if (partition == 0 && main_thread) {
#pragma unroll 1
      for (int t = 0; t < q; ++t) {
        a.output[(first_row + t) * a.output_stride + int64_t(head) * kHead + tid] = __float2bfloat16_rn(0.0f);
      }
    }
    return;
  }
  const int n = r.count;
  // Token t's outputs are normalized by CTA t % C, so that with C >= q the tokens' norms
  // run at once in different CTAs; rows t in [n, q) are zeroed there. (One owner for
  // every token runs all the norms after the last token: 1.2 us more at batch 1, q = 4.)
  auto norm_cta_of = [](int t) { return t % kCluster; };
  const bool norm_cta = partition < q;  // normalizes or zeroes at least one row
  constexpr int kOwnedMax = (kTokens + kCluster - 1) / kCluster;  // tokens per norm CTA
  const int64_t head_rows = (int64_t(head) * kHead + value_base) * kHead;  // the CTA's rows in a slot
  const State* read_rows = static_cast<const State*>(a.state) + int64_t(r.read_slot) * a.state_slot_stride + head_rows;

  if (!main_thread) {
    // The gate warp: f_a of the q rows after the wait (columns >= n are zeroed in
    // gate_warp_verify).
    cptx::barrier_cluster_arrive(cptx::sem_relaxed);
    if (a.early != 0) ptx::griddep_wait();
    uint32_t bf[8][2] = {};
    if (a.gate_source == kGateMma) {
      const int lane = tid - kMainThreads;
      const int group = lane >> 2, quarter = lane & 3;
      const __nv_bfloat16* fa = a.f_a + (first_row + (group < q ? group : 0)) * a.f_a_stride + 4 * quarter;
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        uint2 x = make_uint2(0u, 0u);
        if (group < q) x = *reinterpret_cast<const uint2*>(fa + 16 * c);
        bf[c][0] = x.x;
        bf[c][1] = x.y;
      }
    }
    DeferredChunk chunk_after_tiles;
    if (kFbInChunkBuffer && stage_fb) {
      chunk_after_tiles.dst = chunk_buffer(1);
      chunk_after_tiles.src = read_rows + kChunkRows * kHead;
      chunk_after_tiles.bytes = kChunkRows * kHead * sizeof(State);
      chunk_after_tiles.bar = &sh.state_bar[1];
    }
    constexpr bool kFbAlwaysStaged = kFbInChunkBuffer && kCluster == 2;
    gate_warp_verify<kCluster, kTokens, kFbAlwaysStaged>(va, sh, head, b, value_base, tid - kMainThreads, r, a_exp,
                                                          bf, stage_fb ? staged_fb : nullptr, dt_pre,
                                                          chunk_after_tiles);
    return;
  }

  // Staged state (C = 1, early 2) runs its rows in chunks of kChunkRows (a wave of
  // passes), two chunk buffers in a ring: thread 0 bulk-copies chunk `chunk` of the read
  // slot's rows.
  constexpr int kChunkCount = kPasses / kWave;
  auto stage_chunk = [&](int chunk) {
    const int buffer = chunk & 1;
    stage_state_rows(chunk_buffer(buffer), read_rows + chunk * (kChunkRows * kHead), kChunkRows * kHead * sizeof(State),
                     &sh.state_bar[buffer], false);
  };

  // ---- setup: lane t of warp 0 inits token t's barriers (t < n) and fences its own
  // inits, then arms them after a __syncwarp (in parallel, not thread 0 token after
  // token); lane 0 issues the first staged chunks.
  if (tid < 32) {
    if (tid < n) {
      // C = 1: the gate warp's lanes and every main thread arrive (both may write decays).
      cptx::mbarrier_init(&sh.gate_bar[tid], kCluster == 1 ? 32 + kMainThreads : 1);
      if (kCluster > 1 && norm_cta_of(tid) == partition) cptx::mbarrier_init(&sh.out_bar[tid], 1);
    }
    if (kStaged && tid == 0) {
      cptx::mbarrier_init(&sh.state_bar[0], 1);
      cptx::mbarrier_init(&sh.state_bar[1], 1);
    }
    if (tid < n) cptx::fence_mbarrier_init(cptx::sem_release, cptx::scope_cluster);
    __syncwarp();
    // Staged rows, C >= 4 (one chunk of at most 16 KB): copied now, before the PDL wait
    // (the read slot is a step input, like the rows the registers variants load early).
    // C = 2's two chunks are copied below: before the wait they queue ahead of the
    // activations (batch 16 2-5% slower). After the __syncwarp: before it, racecheck
    // reports the inits against the copy's arm.
    if constexpr (kStaged && kCluster >= 4) {
      static_assert(kChunkCount == 1, "C >= 4 stages its rows as one chunk");
      if (tid == 0) stage_chunk(0);
    }
    if (kCluster > 1 && tid < n) {
      cptx::mbarrier_arrive_expect_tx(cptx::sem_release, cptx::scope_cta, cptx::space_shared, &sh.gate_bar[tid],
                                      uint32_t(kHead * sizeof(float)));
      if (norm_cta_of(tid) == partition) {
        cptx::mbarrier_arrive_expect_tx(cptx::sem_release, cptx::scope_cta, cptx::space_shared, &sh.out_bar[tid],
                                        uint32_t(kHead * sizeof(float)));
      }
    }
  }
  cptx::barrier_cluster_arrive(cptx::sem_relaxed);

  const int warp = tid >> 5, lane = tid & 31;
  const int group = tid / kLanes, group_lane = tid % kLanes;

  // The old taps of all three channels: one load round trip, not one per channel, and
  // kept as raw bits (converted at the conv: a conversion next to its load would make
  // the loads after it wait).
  const int64_t conv_slot = int64_t(r.conv_slot) * a.conv_state_slot_stride;
  uint32_t tap_bits[3][3];  // v taps of threads without a v row: a valid address, unused
#pragma unroll
  for (int s = 0; s < 3; ++s) {
    const int64_t cbase = conv_slot + channel[s] * a.conv_state_channel_stride;
#pragma unroll
    for (int i = 0; i < 3; ++i) {
      tap_bits[s][i] = load_typed_bits(a.conv_state, cbase + (r.accepted - 1 + i) * a.conv_state_tap_stride,
                                       a.conv_state_bf16);
    }
  }
  // ---- the read slot's rows into registers (C >= 2), after the taps (the conv needs
  // those first); on sm_100a after the activations (before them, ptxas spills the
  // C = 2, 16-lane variant).
  // The rows as loaded (a BF16 state as bits), converted before token 0; sm_100a converts
  // a BF16 state at the load (held as bits, its C = 2, 16-lane variant spills there).
  using RowBits = std::conditional_t<kSm100, float4, StateBits<State>>;
  RowBits hist_bits[kStaged ? 1 : kPasses][kChunks];
  auto load_rows = [&] {
    if constexpr (!kStaged) {
#pragma unroll
      for (int p = 0; p < kPasses; ++p) {
        const int row = p * kGroups + group;
#pragma unroll
        for (int j = 0; j < kChunks; ++j) {
          const State* quad = read_rows + row * kHead + 4 * (group_lane + kLanes * j);
          if constexpr (kSm100) {
            hist_bits[p][j] = load_state4(quad);
          } else {
            hist_bits[p][j] = load_state_bits(quad);
          }
        }
      }
    }
  };
  if (!FS_KDA_VERIFY_LATE_ROWS) load_rows();

  // ---- after the wait: the activations of all q rows (they exist for every request;
  // rows >= n go unused: never read for a token < n, nor written back), beta and the
  // output gates. They stay BF16 bits until used, and no load is predicated (rows
  // t >= q repeat row q - 1, a valid address whose value is never used): with
  // `t < q ? load : 0` ptxas converts each value right after its load, which makes the
  // loads of the q rows one dependent round trip after another.
  if (a.early != 0) ptx::griddep_wait();
  const __nv_bfloat16* xrows = a.x + first_row * a.x_stride;
  uint16_t x_raw[3][kTokens];
#pragma unroll
  for (int s = 0; s < 3; ++s) {
#pragma unroll
    for (int t = 0; t < kTokens; ++t) x_raw[s][t] = load_bf16_bits(xrows + min(t, q - 1) * a.x_stride + channel[s]);
  }
  const int token = min(tid, q - 1);  // threads t < q: token t's beta
  const uint16_t raw_beta_bits = load_bf16_bits(a.raw_beta + (first_row + token) * a.raw_beta_stride + head);
  uint16_t out_gate_raw[kTokens] = {};
  if (norm_cta) {
    const __nv_bfloat16* gate = a.output_gate + first_row * a.output_gate_stride + int64_t(head) * kHead + tid;
#pragma unroll
    for (int t = 0; t < kTokens; ++t) out_gate_raw[t] = load_bf16_bits(gate + min(t, q - 1) * a.output_gate_stride);
  }
  if (FS_KDA_VERIFY_LATE_ROWS) load_rows();
  // Staged rows, C <= 2: the first chunks are copied after the activations are requested
  // (ahead of them, the conv's inputs queue behind 32 KB of rows: C = 1 at batch 64-128
  // 1-2% slower).
  if constexpr (kStaged && kCluster < 4) {
    static_assert(kChunkCount >= 2, "C <= 2 stages its rows through both chunk buffers");
    if (tid == 0) {
      stage_chunk(0);
      if (!(kFbInChunkBuffer && stage_fb)) stage_chunk(1);  // else the gate warp copies it
    }
  }
  // Read after the named barrier after the conv (out_gate: by this thread).
  if (tid < n) {
    sh.beta[tid] = kda::sigmoid(dmath::bf16_lo(raw_beta_bits));
    sh.write_slot[tid] = r.lane_slot;  // warp 0: lane t holds slots[b, t]
  }
  if (norm_cta) {
#pragma unroll
    for (int t = 0; t < kTokens; ++t) {  // all computed, so that they interleave
      const float gate = kda::sigmoid(dmath::bf16_lo(out_gate_raw[t]));
      if (t < n && norm_cta_of(t) == partition) sh.out_gate[t][tid] = gate;
    }
    sh.norm_w[tid] = norm_w;
  }

  // ---- conv of every token: w = [c_{A-1}, c_A, c_{A+1}, x_0 .. x_{q-1}], token t
  // convolves w[t .. t + 3]; q, k of the head and v of the CTA's rows to shared memory.
  // Records (q > 1): k of the head (owner) and v_new of the CTA's rows, per token.
  __nv_bfloat16* record_k =
      va.record_correction != nullptr && partition == 0
          ? va.record_key_gate + (r.record_row * a.heads + head) * q * (2 * kHead) + tid
          : nullptr;
  float window[3][3 + kTokens], weight[3][4];
#pragma unroll
  for (int s = 0; s < 3; ++s) {
#pragma unroll
    for (int t = 0; t < 4; ++t) weight[s][t] = typed_bits_to_float(weight_bits[s][t], a.conv_weight_bf16);
#pragma unroll
    for (int i = 0; i < 3; ++i) window[s][i] = typed_bits_to_float(tap_bits[s][i], a.conv_state_bf16);
#pragma unroll
    for (int t = 0; t < kTokens; ++t) window[s][3 + t] = dmath::bf16_lo(x_raw[s][t]);
  }
  // Tokens in pairs, both computed (a token >= n unused), so that their SiLUs and q/k
  // butterflies interleave; one token at a time they form one serial chain (about 0.45 us
  // per token at batch 1). Groups of 4 are slower at q = 2 (the wasted tokens' work).
  constexpr int kConvGroup = 2;
#pragma unroll
  for (int t0 = 0; t0 < kTokens; t0 += kConvGroup) {
    if (t0 >= n) break;
    float sq[2 * kConvGroup];  // q^2 of the group's tokens, then k^2
#pragma unroll
    for (int s = 0; s < 3; ++s) {
#pragma unroll
      for (int i = 0; i < kConvGroup; ++i) {
        const int t = t0 + i;
        float c = bias[s];
#pragma unroll
        for (int k = 0; k < 4; ++k) c = kda::conv_tap(window[s][t + k], weight[s][k], c);
        const float value = kda::silu_bf16(c);
        if (s < 2) sq[s * kConvGroup + i] = __fmul_rn(value, value);
        if (t < n) {
          if (s == 2) {
            if (has_v) sh.v[t][tid] = value;
          } else {
            (s == 0 ? sh.q : sh.k)[t][tid] = value;
            if (s == 1 && record_k != nullptr) record_k[int64_t(t) * (2 * kHead)] = __float2bfloat16_rn(value);
          }
        }
      }
    }
    butterfly_sums<32>(sq);
    if (lane == 0) {
#pragma unroll
      for (int i = 0; i < kConvGroup; ++i) {
        if (t0 + i < n) {
          sh.sums[t0 + i][warp] = sq[i];
          sh.sums[t0 + i][4 + warp] = sq[kConvGroup + i];
        }
      }
    }
  }
  // The windows become [c_A, c_{A+1}, x_0 .. x_{n-1}] (taps 0 .. n + 1). This thread read
  // every old tap of its v channel above, so that window is written now; so are the q/k
  // windows of a single CTA (C = 1: no other CTA reads them; written at the end they
  // cost 1-2.5%). In a cluster every CTA reads the q/k taps, so CTA 0 keeps the new
  // windows and writes them at the end, once every CTA has pushed token 0's outputs.
  if (has_v) {
    const int64_t cbase = conv_slot + channel[2] * a.conv_state_channel_stride;
#pragma unroll
    for (int i = 0; i < kTokens + 2; ++i) {
      if (i >= n + 2) break;
      store_typed(a.conv_state, cbase + i * a.conv_state_tap_stride, window[2][i + 1], a.conv_state_bf16);
    }
  }
  if (partition == 0) {
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      const int64_t cbase = conv_slot + channel[s] * a.conv_state_channel_stride;
#pragma unroll
      for (int i = 0; i < kTokens + 2; ++i) {
        if (i >= n + 2) break;
        if constexpr (kCluster == 1) {
          store_typed(a.conv_state, cbase + i * a.conv_state_tap_stride, window[s][i + 1], a.conv_state_bf16);
        } else {
          sh.window[s][i][tid] = window[s][i + 1];
        }
      }
    }
  }
  if constexpr (kCluster == 1) {
    // verify_main_tiles: main warp w projects F_B tile kTiles / 2 + w (the gate warp the
    // first half). Its loads are issued here: with the activations, ptxas spills.
    if (verify_main_tiles(a, q, kCluster)) {
      const int tile = kRows / 16 / 2 + warp;
      const int g = lane >> 2, quarter = lane & 3;
      const int64_t key_base = int64_t(head) * kHead;
      uint32_t w[8][4];
      const __nv_bfloat16* row_lo = a.f_b_weight + (key_base + 16 * tile + g) * kHead + 4 * quarter;
      load_fb_fragments(w, row_lo, row_lo + 8 * kHead);
      uint32_t bf[8][2];  // f_a of token g (columns >= n zero)
      const __nv_bfloat16* fa = a.f_a + (first_row + (g < n ? g : 0)) * a.f_a_stride + 4 * quarter;
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        const uint2 x = g < n ? *reinterpret_cast<const uint2*>(fa + 16 * c) : make_uint2(0u, 0u);
        bf[c][0] = x.x;
        bf[c][1] = x.y;
      }
      __nv_bfloat16* record_gate =
          va.record_key_gate == nullptr
              ? nullptr
              : va.record_key_gate + (r.record_row * a.heads + head) * q * (2 * kHead) + kHead;
      verify_main_gate_tile<SharedVerify<kTokens>::kDumpRow>(a, w, bf, tile, g, quarter, n,
                                                             kda::exp_a_log(a.a_log[head]), a.dt_bias + key_base,
                                                             sh.decay, record_gate);
    }
  }
  if (!a.trigger_at_entry) ptx::griddep_launch_dependents();
  ptx::named_barrier_sync(1, kMainThreads);

  cg::cluster_group cluster = cg::this_cluster();
  cptx::barrier_cluster_wait();  // the norm CTAs' output barriers are armed
  if constexpr (kCluster == 1) {
    // After the barriers: warp 0 has initialized gate_bar (an arrive before them races
    // with the init; racecheck reports it).
#pragma unroll 1
    for (int t = 0; t < n; ++t) cptx::mbarrier_arrive(&sh.gate_bar[t]);
  }
  float* correction = va.record_correction != nullptr
                          ? va.record_correction + (r.record_row * a.heads + head) * q * kHead + value_base
                          : nullptr;

  // A token's inputs to the recurrence, as every schedule computes them.
  struct TokenInputs {
    float4 qn[kChunks], kn[kChunks], dc[kChunks];
    float beta;
    bool write_state;
    State* write_rows;
    float* o_dst;      // token t's outputs in its norm CTA
    uint64_t* o_bar;   // ... and their barrier
  };
  auto token_inputs = [&](int t) {
    TokenInputs in;
    normalized_qk<kLanes, kChunks>(sh.q[t], sh.k[t], sh.sums[t], a.q_scale, group_lane, in.qn, in.kn);
    in.beta = sh.beta[t];
    // Without records the state after token t goes to slots[b, t] when that is a slot.
    const int32_t write_slot = correction != nullptr ? 0 : sh.write_slot[t];
    in.write_state = write_slot > 0 && write_slot < a.state_slots;
    in.write_rows = static_cast<State*>(a.state) + int64_t(write_slot) * a.state_slot_stride + head_rows;
    if constexpr (kCluster > 1) {
      in.o_dst = cluster.map_shared_rank(&sh.o[t][value_base], norm_cta_of(t));
      in.o_bar = cluster.map_shared_rank(&sh.out_bar[t], norm_cta_of(t));
    }
    wait_parity0(&sh.gate_bar[t]);
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      in.dc[j] = *reinterpret_cast<const float4*>(&sh.decay[t][4 * (group_lane + kLanes * j)]);
    }
    return in;
  };
  // Token t over a wave of kWave passes from pass p0 (s: their rows, updated in place):
  // outputs to the owner, the records' corrections, the state after t to its slot.
  auto run_wave = [&](int t, const TokenInputs& in, int p0, float4 (&s)[kWave][kChunks]) {
    float v[kWave], o[kWave], v_new[kWave];
#pragma unroll
    for (int i = 0; i < kWave; ++i) v[i] = sh.v[t][(p0 + i) * kGroups + group];
    update_rows<kLanes, kWave, kChunks>(s, in.kn, in.qn, in.dc, v, in.beta, o, v_new, [] {});
#pragma unroll
    for (int i = 0; i < kWave; ++i) {
      const int row = (p0 + i) * kGroups + group;
      if (group_lane == 0) {
        if constexpr (kCluster == 1) {
          sh.o[t][row] = dmath::round_bf16(o[i]);
        } else {
          cptx::st_async(reinterpret_cast<uint32_t*>(in.o_dst + row), __float_as_uint(dmath::round_bf16(o[i])),
                         in.o_bar);
        }
        if (correction != nullptr) correction[int64_t(t) * kHead + row] = v_new[i];
      }
      if (in.write_state) {
#pragma unroll
        for (int j = 0; j < kChunks; ++j) {
          store_state4(in.write_rows + row * kHead + 4 * (group_lane + kLanes * j), s[i][j], false);
        }
      }
    }
  };

  // The tokens in order. Staged with C >= 4 and 8 lanes (batch 1's C = 8, 8 lanes,
  // early 2), token t + 1's inputs (shared loads, norms, the decay wait) are read before
  // token t runs, so that they overlap its update chain (batch 1, q = 4-8: 4% faster).
  // With 16 lanes it is slower (C = 8 at batch 2); at C = 1 / 2 it would cost occupancy
  // (up to 180 registers) or spill.
  constexpr bool kPipelineTokens = kStaged && kCluster >= 4 && kLanes == 8;
  auto for_each_token = [&](auto&& run) {
    if constexpr (kPipelineTokens) {
      TokenInputs next = token_inputs(0);
#pragma unroll 1
      for (int t = 0; t < n; ++t) {
        const TokenInputs in = next;
        if (t + 1 < n) next = token_inputs(t + 1);
        run(t, in);
      }
    } else {
#pragma unroll 1
      for (int t = 0; t < n; ++t) run(t, token_inputs(t));
    }
  };
  if constexpr (kStaged) {
    // ---- staged: chunk by chunk (rows are independent), every token of a chunk while
    // its rows stay in registers; chunk c + 2 is copied into the buffer chunk c leaves.
    // A token's inputs are recomputed per chunk (a few shared loads and multiplies),
    // rather than kept in registers for all q tokens.
#pragma unroll
    for (int c = 0; c < kChunkCount; ++c) {
      const int buffer = c & 1;
      mbarrier_wait_parity(&sh.state_bar[buffer], uint32_t(c >> 1) & 1u);
      const State* chunk_rows = chunk_buffer(buffer);
      float4 s[kWave][kChunks];
#pragma unroll
      for (int i = 0; i < kWave; ++i) {
#pragma unroll
        for (int j = 0; j < kChunks; ++j) {
          s[i][j] = load_state4(&chunk_rows[(i * kGroups + group) * kHead + 4 * (group_lane + kLanes * j)]);
        }
      }
      if (c + 2 < kChunkCount) {
        ptx::named_barrier_sync(2, kMainThreads);  // every thread has read the buffer
        if (tid == 0) {
          cptx::fence_proxy_async(cptx::space_shared);  // those reads before the copy's writes
          stage_chunk(c + 2);
        }
      }
      for_each_token([&](int t, const TokenInputs& in) {
        run_wave(t, in, c * kWave, s);
      });
    }
  } else {
    // ---- the tokens in order; the state carries over in registers, in FP32 (a BF16
    // state is rounded only where it is stored).
    float4 hist[kPasses][kChunks];
#pragma unroll
    for (int p = 0; p < kPasses; ++p) {
#pragma unroll
      for (int j = 0; j < kChunks; ++j) hist[p][j] = state_to_float4(hist_bits[p][j]);
    }
    for_each_token([&](int t, const TokenInputs& in) {
#pragma unroll
      for (int w0 = 0; w0 < kPasses; w0 += kWave) {
        float4 s[kWave][kChunks];
#pragma unroll
        for (int i = 0; i < kWave; ++i) {
#pragma unroll
          for (int j = 0; j < kChunks; ++j) s[i][j] = hist[w0 + i][j];
        }
        run_wave(t, in, w0, s);
#pragma unroll
        for (int i = 0; i < kWave; ++i) {
#pragma unroll
          for (int j = 0; j < kChunks; ++j) hist[w0 + i][j] = s[i][j];
        }
      }
    });
  }

  // ---- norm CTAs: the gated RMSNorm of tokens t with t % C == rank (rows t in [n, q)
  // zero), kNormGroup of them at a time with their butterflies interleaved, each once
  // the cluster's outputs for it are in; in a cluster, CTA 0 then writes the q/k conv
  // windows.
  if (!norm_cta) {
    return;
  }
  if constexpr (kCluster == 1) ptx::named_barrier_sync(1, kMainThreads);
  constexpr int kNormGroup = 2;
  const int a8 = lane & 7;
#pragma unroll
  for (int i0 = 0; i0 < kOwnedMax; i0 += kNormGroup) {
    if (partition + kCluster * i0 >= q) break;
    int token[kNormGroup];
    bool real[kNormGroup];  // rows >= n hold no outputs
#pragma unroll
    for (int i = 0; i < kNormGroup; ++i) {
      token[i] = partition + kCluster * (i0 + i);
      real[i] = i0 + i < kOwnedMax && token[i] < n;
      if (kCluster > 1 && real[i]) wait_parity0(&sh.out_bar[token[i]]);
    }
    float g_sum[4 * kNormGroup];  // [token i][group g]
#pragma unroll
    for (int i = 0; i < kNormGroup; ++i) {
      const float* o = sh.o[real[i] ? token[i] : 0];
#pragma unroll
      for (int g = 0; g < 4; ++g) {
        const float o0 = real[i] ? o[32 * g + a8] : 0.0f, o1 = real[i] ? o[32 * g + 16 + a8] : 0.0f;
        const float o2 = real[i] ? o[32 * g + 8 + a8] : 0.0f, o3 = real[i] ? o[32 * g + 24 + a8] : 0.0f;
        g_sum[4 * i + g] = __fadd_rn(__fadd_rn(__fmul_rn(o0, o0), __fmul_rn(o1, o1)),
                                     __fadd_rn(__fmul_rn(o2, o2), __fmul_rn(o3, o3)));
      }
    }
    butterfly_sums<8>(g_sum);
#pragma unroll
    for (int i = 0; i < kNormGroup; ++i) {
      const int t = token[i];
      if (i0 + i >= kOwnedMax || t >= q) break;
      __nv_bfloat16* out = a.output + (first_row + t) * a.output_stride + int64_t(head) * kHead + tid;
      if (!real[i]) {
        *out = __float2bfloat16_rn(0.0f);
        continue;
      }
      const float* gs = g_sum + 4 * i;
      const float sumsq = __fadd_rn(__fadd_rn(gs[0], gs[2]), __fadd_rn(gs[1], gs[3]));
      const float rstd = kda::norm_rstd(sumsq, a.norm_eps);
      *out = __float2bfloat16_rn(kda::gated_output(sh.o[t][tid], rstd, sh.norm_w[tid], sh.out_gate[t][tid]));
    }
  }
  if (kCluster > 1 && partition == 0) {
    // q/k windows (C >= 2): every CTA pushes one output per state row for token 0 after
    // its conv read the old taps, and CTA 0 has waited for them (token 0 is real), so no
    // CTA still needs those taps. (Making token 0's pushes conditional would break this.)
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      const int64_t cbase = conv_slot + channel[s] * a.conv_state_channel_stride;
#pragma unroll 1
      for (int i = 0; i < n + 2; ++i) {
        store_typed(a.conv_state, cbase + i * a.conv_state_tap_stride, sh.window[s][i][tid], a.conv_state_bf16);
      }
    }
  }
}

}  // namespace

// The verify kernel of configuration Cfg, as launch.cc runs it.
template <class Cfg>
detail::KernelVariant<VerifyArgs> verify_variant() {
  return {&kda_verify_kernel<Cfg>, Cfg::kMaxDynamicSmem};
}

}  // namespace fusedstep::kda
