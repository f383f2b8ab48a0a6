// SPDX-License-Identifier: Apache-2.0
// KDA decode, q = 1, BF16 state, one CTA per head: the persistent build. Each CTA runs
// requests blockIdx.x, blockIdx.x + gridDim.x, ... of head blockIdx.y, and its loader
// warp prepares request r + 1 while the main warps update request r:
//   - the loader runs the conv with SiLU, the q/k squares, beta and the F_B projection
//     (its fragments staged in shared memory once per CTA) into one of two input
//     buffers, writes the new conv windows, and copies the next request's state rows
//     into the four-chunk ring as the main warps release each chunk;
//   - the main warps normalize q and k, update the rows chunk by chunk (32 rows each),
//     store them and run the gated RMSNorm of the head's output.
// So every request after a CTA's first finds its inputs and state in shared memory: the
// load round trips the one-request-a-CTA kernel pays after the PDL wait (activations,
// F_B fragments, output gate), each behind the wave's state copies, overlap the previous
// request's update instead.
//
// Contract (docs/numerics.md, "KDA decode"): the same reduction trees and roundings as
// kda_decode_kernel (decode_kernel.cuh), the same bits as fusedstep::composed::launch.
// A slot <= 0 or past either cache is padding: a zero output row, no state read or
// written. Before the PDL wait (early >= 1) the loader reads only the first request's
// slot and state rows and the weights (F_B, conv, dt_bias, a_log, norm weight).
#pragma once

#include "common/kernel_variant.h"
#include "kda_decode/kernel_common.cuh"

namespace fusedstep::kda {
namespace {

constexpr int kRingChunks = 4;                          // 32 rows each
constexpr int kRingChunkRows = kHead / kRingChunks;

// One request's inputs, written by the loader warp.
struct alignas(16) PersistentInputs {
  float q[kHead];         // post-conv q, k, v (BF16 values)
  float k[kHead];
  float v[kHead];
  float decay[kHead];
  float out_gate[kHead];  // raw output gate (BF16 values)
  float sums[8];          // warp-order sums of q^2 (0-3), k^2 (4-7)
  float beta;             // sigmoid(raw beta)
  int32_t slot;
};

struct alignas(16) SharedPersistent {
  PersistentInputs in[2];          // request r in in[r & 1]
  float o[2][kHead];               // BF16-rounded outputs of request r in o[r & 1]
  float dt[kHead];                 // the head's dt_bias (the loader's)
  uint64_t ready[2];               // the loader's 32 lanes: in[u] written
  uint64_t released[2];            // the 128 main threads: in[u] and o[u] read
  uint64_t state_bar[kRingChunks]; // a ring chunk's copy landed (tx bytes)
  uint64_t chunk_free[kRingChunks];// the 128 main threads read their rows of the chunk
};

// The loader warp (lane `lane`): requests first, first + step, ... < batch of `head`.
__device__ __forceinline__ void persistent_loader(const FusedArgs& a, SharedPersistent& sh, uint32_t* staged_fb,
                                                   int head, int first, int step, int lane) {
  const int group = lane >> 2, quarter = lane & 3;
  const int dim = a.heads * kHead;
  const int64_t key_base = int64_t(head) * kHead;
  const int requests = (a.batch - first + step - 1) / step;

  if (a.early == 0) ptx::griddep_wait();
  const bool mma = a.gate_source == kGateMma;
  if (mma) {
    stage_fb_fragments<kHead / 16>(staged_fb, lane, [&](int tile, int half) {
      return a.f_b_weight + (key_base + 16 * tile + group + 8 * half) * kHead + 4 * quarter;
    });
  }
  const float a_exp = kda::exp_a_log(a.a_log[head]);
#pragma unroll
  for (int i = 0; i < 4; ++i) sh.dt[lane + 32 * i] = a.dt_bias[key_base + lane + 32 * i];
  __syncwarp();
  if (a.early != 0) ptx::griddep_wait();

  const int64_t w_section = a.conv_weight_section_stride;
  const int64_t w_channel = a.conv_weight_channel_stride;
  const int64_t w_tap = a.conv_weight_tap_stride;
  const int64_t c_channel = a.conv_state_channel_stride;
  const int64_t c_tap = a.conv_state_tap_stride;
  bool fb_waited = false;
  // Request r's inputs into in[r & 1] (the caller has waited for the buffer).
  auto prepare = [&](int r, int32_t req_slot) {
    PersistentInputs& in = sh.in[r & 1];
    const int64_t b = first + int64_t(r) * step;
    if (lane == 0) in.slot = req_slot;
    if (active_slot(a, req_slot)) {
      const int64_t conv_slot = int64_t(req_slot) * a.conv_state_slot_stride;
      const __nv_bfloat16* xrow = a.x + b * a.x_stride;
      // Lane l runs channel 32 w + l of each section s, as main thread 32 w + l of
      // kda_decode_kernel does: the same conv, and the same warp trees for the squares.
      // Every load from memory is issued here, at once (bits, converted where used);
      // the conv weights, cache hits after a CTA's first request, a section ahead.
      auto channel_of = [&](int sec, int w) { return int64_t(sec) * dim + key_base + 32 * w + lane; };
      const uint16_t beta_bits = load_bf16_bits(a.raw_beta + b * a.raw_beta_stride + head);
      uint16_t gate_bits[4];
#pragma unroll
      for (int w = 0; w < 4; ++w) gate_bits[w] = load_bf16_bits(a.output_gate + b * a.output_gate_stride + key_base + 32 * w + lane);
      // The conv state's element type picks the code (one address per tap load).
      auto conv = [&](auto element) {
        using Tap = decltype(element);
        Tap* conv_state = static_cast<Tap*>(a.conv_state);
        // Section sec's x and taps in buffer sec & 1, section sec + 1's requested before
        // sec's conv.
        uint16_t x_bits[2][4];
        Tap tap[2][4][3];
        auto load_section = [&](int sec) {
#pragma unroll
          for (int w = 0; w < 4; ++w) {
            const int64_t channel = int64_t(sec) * dim + ptx::opaque(key_base) + 32 * w + lane;
            x_bits[sec & 1][w] = load_bf16_bits(xrow + channel);
#pragma unroll
            for (int t = 0; t < 3; ++t) tap[sec & 1][w][t] = conv_state[conv_slot + channel * c_channel + t * c_tap];
          }
        };
        load_section(0);
        float weight[4][4], bias[4];
#pragma unroll
        for (int sec = 0; sec < 3; ++sec) {
          if (sec < 2) load_section(sec + 1);
          // Opaque: hoisted out of the request loop, the weights would stay live across it.
          const int64_t weight_head = ptx::opaque(key_base);
#pragma unroll
          for (int w = 0; w < 4; ++w) {
            const int64_t channel = int64_t(sec) * dim + weight_head + 32 * w + lane;
#pragma unroll
            for (int t = 0; t < 4; ++t) {
              weight[w][t] = load_typed(a.conv_weight, sec * w_section + (channel - sec * int64_t(dim)) * w_channel + t * w_tap,
                                        a.conv_weight_bf16);
            }
            bias[w] = a.conv_bias != nullptr ? a.conv_bias[channel] : 0.0f;
          }
          float sq[4];
#pragma unroll
          for (int w = 0; w < 4; ++w) {
            Tap* taps_out = conv_state + conv_slot + channel_of(sec, w) * c_channel;
            float taps[3];
#pragma unroll
            for (int t = 0; t < 3; ++t) taps[t] = float(tap[sec & 1][w][t]);
            const float xin = dmath::bf16_lo(x_bits[sec & 1][w]);
            float c = bias[w];
#pragma unroll
            for (int t = 0; t < 3; ++t) c = kda::conv_tap(taps[t], weight[w][t], c);
            c = kda::conv_tap(xin, weight[w][3], c);
            const float value = kda::silu_bf16(c);
            float* out = sec == 0 ? in.q : sec == 1 ? in.k : in.v;
            out[32 * w + lane] = value;
            sq[w] = __fmul_rn(value, value);
            // The new window [s1, s2, x] (exact in either type): no other CTA reads this
            // slot's conv state.
            taps_out[0] = tap[sec & 1][w][1];
            taps_out[c_tap] = tap[sec & 1][w][2];
            taps_out[2 * c_tap] = Tap(xin);
          }
          if (sec < 2) {
            butterfly_sums<32, 4>(sq);
            if (lane == 0) {
#pragma unroll
              for (int w = 0; w < 4; ++w) in.sums[4 * sec + w] = sq[w];
            }
          }
        }
      };
      if (a.conv_state_bf16) {
        conv(__nv_bfloat16{});
      } else {
        conv(float{});
      }
      if (lane == 0) in.beta = kda::sigmoid(dmath::bf16_lo(beta_bits));
#pragma unroll
      for (int w = 0; w < 4; ++w) in.out_gate[32 * w + lane] = dmath::bf16_lo(gate_bits[w]);
      if (mma) {
        uint32_t bf[8][2];
        load_fa_fragments(bf, a.f_a + b * a.f_a_stride + 4 * quarter);
        if (!fb_waited) {
          __pipeline_wait_prior(0);
          fb_waited = true;
        }
        // Tile t, lane (g, q): one chain of eight MMAs, or four chains of two summed
        // 0 + (((m0 + m1) + m2) + m3); lanes q < 2 emit key 16 t + g + 8 q.
#pragma unroll 1
        for (int tile = 0; tile < kHead / 16; ++tile) {
          uint32_t wf[8][4];
          read_fb_fragments(wf, staged_fb, tile, lane);
          const bool high = (quarter & 1) != 0;
          float acc[4][4] = {};
          float raw;
          if (a.four_chains) {
#pragma unroll
            for (int c = 0; c < 8; ++c) ptx::mma_bf16_m16n8k16(acc[c / 2], wf[c], bf[c], acc[c / 2]);
            float m[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) m[i] = high ? acc[i][2] : acc[i][0];
            raw = __fadd_rn(0.0f, __fadd_rn(__fadd_rn(__fadd_rn(m[0], m[1]), m[2]), m[3]));
          } else {
#pragma unroll
            for (int c = 0; c < 8; ++c) ptx::mma_bf16_m16n8k16(acc[0], wf[c], bf[c], acc[0]);
            raw = high ? acc[0][2] : acc[0][0];
          }
          const int feature = 16 * tile + group + 8 * (quarter & 1);
          if (quarter < 2) {
            in.decay[feature] =
                kda::decay(a_exp, dmath::round_bf16(raw), sh.dt[feature], a.lower_bound);
          }
        }
      } else {  // kGateGiven (plan() never runs the FMA tree here)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int f = lane + 32 * i;
          const float raw = load_bf16(a.raw_gate + b * a.raw_gate_stride + key_base + f);
          in.decay[f] = kda::decay(a_exp, raw, sh.dt[f], a.lower_bound);
        }
      }
    }
    __syncwarp();
    cptx::mbarrier_arrive(&sh.ready[r & 1]);
  };

  // Request r's inputs once request r - 2 released their buffer (during request r - 1).
  int32_t slot = a.slots[first];
#pragma unroll 1
  for (int r = 0; r < requests; ++r) {
    const int32_t next = r + 1 < requests ? a.slots[first + int64_t(r + 1) * step] : 0;
    if (r >= 2) mbarrier_wait_parity(&sh.released[r & 1], uint32_t((r - 2) >> 1) & 1u);
    prepare(r, slot);
    slot = next;
  }
  // F_B fragments staged but never read (every request padding): no copy outlives the CTA.
  __pipeline_wait_prior(0);
}

// The main warps (thread `tid` < kMainThreads): the recurrence and the gated RMSNorm.
__device__ __forceinline__ void persistent_main(const FusedArgs& a, SharedPersistent& sh, __nv_bfloat16* ring,
                                                int head, int first, int step, int tid) {
  constexpr int kLanes = 16;
  constexpr int kGroups = kMainThreads / kLanes;  // rows per pass
  constexpr int kChunks = 32 / kLanes;
  constexpr int kWave = kRingChunkRows / kGroups; // passes per ring chunk
  const int lane = tid & 31;
  const int group = tid / kLanes, group_lane = tid % kLanes;
  const int64_t key_base = int64_t(head) * kHead;
  const int requests = (a.batch - first + step - 1) / step;
  const float norm_weight = load_typed(a.norm_weight, tid, a.norm_weight_bf16);
  int updated = 0;  // active requests so far: the ring's copy phase

  // Thread 0: chunk c of request `slot`'s rows into the ring once the previous copy's
  // rows there are read (copy k waits for phase k - 1 of chunk_free[c]).
  constexpr uint32_t kChunkElements = kRingChunkRows * kHead;
  int copies = 0;
  auto copy_chunk = [&](int32_t slot, int c) {
    const __nv_bfloat16* rows =
        static_cast<const __nv_bfloat16*>(a.state) + int64_t(slot) * a.state_slot_stride + key_base * kHead;
    if (copies > 0) mbarrier_wait_parity(&sh.chunk_free[c], uint32_t(copies - 1) & 1u);
    stage_state_rows(ring + c * kChunkElements, rows + c * kChunkElements,
                     kChunkElements * sizeof(__nv_bfloat16), &sh.state_bar[c], a.evict_first);
  };
  if (a.early == 0) ptx::griddep_wait();
  int32_t next_slot = tid == 0 ? a.slots[first] : 0;
  if (tid == 0 && active_slot(a, next_slot)) {
    for (int c = 0; c < kRingChunks; ++c) copy_chunk(next_slot, c);
    ++copies;
  }

#pragma unroll 1
  for (int r = 0; r < requests; ++r) {
    const int u = r & 1;
    const int64_t b = first + int64_t(r) * step;
    mbarrier_wait_parity(&sh.ready[u], uint32_t(r >> 1) & 1u);
    const PersistentInputs& in = sh.in[u];
    const int32_t slot = in.slot;
    __nv_bfloat16* out_row = a.output + b * a.output_stride + key_base;
    // Thread 0: the next request's slot, its rows copied as this request's are read.
    if (tid == 0) next_slot = r + 1 < requests ? a.slots[b + step] : 0;
    const bool copy_next = tid == 0 && active_slot(a, next_slot);
    if (!active_slot(a, slot)) {
      if (copy_next) {
        for (int c = 0; c < kRingChunks; ++c) copy_chunk(next_slot, c);
        ++copies;
      }
      out_row[tid] = __float2bfloat16_rn(0.0f);
      cptx::mbarrier_arrive(&sh.released[u]);
      continue;
    }
    float4 qn[kChunks], kn[kChunks], dc[kChunks];
    normalized_qk<kLanes, kChunks>(in.q, in.k, in.sums, a.q_scale, group_lane, qn, kn);
    const float beta = in.beta;
#pragma unroll
    for (int j = 0; j < kChunks; ++j) dc[j] = *reinterpret_cast<const float4*>(&in.decay[4 * (group_lane + kLanes * j)]);
    __nv_bfloat16* state_rows =
        static_cast<__nv_bfloat16*>(a.state) + int64_t(slot) * a.state_slot_stride + key_base * kHead;

#pragma unroll 1
    for (int c = 0; c < kRingChunks; ++c) {
      mbarrier_wait_parity(&sh.state_bar[c], uint32_t(updated) & 1u);
      float4 s[kWave][kChunks];
      float v[kWave], o[kWave];
#pragma unroll
      for (int i = 0; i < kWave; ++i) {
        const int row = (c * kWave + i) * kGroups + group;
#pragma unroll
        for (int j = 0; j < kChunks; ++j) s[i][j] = load_state4(&ring[row * kHead + 4 * (group_lane + kLanes * j)]);
        v[i] = in.v[row];
      }
      cptx::mbarrier_arrive(&sh.chunk_free[c]);  // release: the rows are in registers
      float v_new_unused[kWave];
      update_rows<kLanes, kWave, kChunks>(s, kn, qn, dc, v, beta, o, v_new_unused, [] {});
#pragma unroll
      for (int i = 0; i < kWave; ++i) {
        const int row = (c * kWave + i) * kGroups + group;
        if (group_lane == 0) sh.o[u][row] = dmath::round_bf16(o[i]);
#pragma unroll
        for (int j = 0; j < kChunks; ++j) {
          store_state4(state_rows + row * kHead + 4 * (group_lane + kLanes * j), s[i][j], a.evict_first);
        }
      }
      if (copy_next) copy_chunk(next_slot, c);  // after its update: the other threads' reads are done
    }
    ++updated;
    if (copy_next) ++copies;

    // ---- the gated RMSNorm of the head's 128 outputs (kda_decode_kernel's tree).
    ptx::named_barrier_sync(1, kMainThreads);
    const float* o_all = sh.o[u];
    const float o = o_all[tid];
    const int a8 = lane & 7;
    float g_sum[4];
#pragma unroll
    for (int g = 0; g < 4; ++g) {
      const float o0 = o_all[32 * g + a8], o1 = o_all[32 * g + 16 + a8];
      const float o2 = o_all[32 * g + 8 + a8], o3 = o_all[32 * g + 24 + a8];
      const float sq = __fadd_rn(__fadd_rn(__fmul_rn(o0, o0), __fmul_rn(o1, o1)),
                                 __fadd_rn(__fmul_rn(o2, o2), __fmul_rn(o3, o3)));
      g_sum[g] = butterfly_sum<8>(sq);
    }
    const float sumsq = __fadd_rn(__fadd_rn(g_sum[0], g_sum[2]), __fadd_rn(g_sum[1], g_sum[3]));
    const float rstd = kda::norm_rstd(sumsq, a.norm_eps);
    const float out = kda::gated_output(o, rstd, norm_weight, kda::sigmoid(in.out_gate[tid]));
    cptx::mbarrier_arrive(&sh.released[u]);
    out_row[tid] = __float2bfloat16_rn(out);
  }
}

// 136 registers: three 160-thread CTAs per SM (__launch_bounds__(160, 3) stops ptxas at 128,
// where the loader's conv spills).
template <class Cfg>
__global__ void __maxnreg__(136) kda_decode_persistent_kernel(const __grid_constant__ FusedArgs a) {
  static_assert(Cfg::kStateBf16 && Cfg::kCluster == 1, "the persistent build: C = 1, BF16 state");
  __shared__ SharedPersistent sh;
  extern __shared__ __align__(128) unsigned char dynamic_smem[];
  __nv_bfloat16* ring = reinterpret_cast<__nv_bfloat16*>(dynamic_smem);
  uint32_t* staged_fb = reinterpret_cast<uint32_t*>(dynamic_smem + size_t(kHead) * kHead * sizeof(__nv_bfloat16));
  const int tid = threadIdx.x;
  const int head = static_cast<int>(blockIdx.y);
  const int first = static_cast<int>(blockIdx.x), step = static_cast<int>(gridDim.x);

  ptx::griddep_launch_dependents();  // this grid holds its SMs to the end: nothing to gain later
  if (tid == 0) {
    for (int u = 0; u < 2; ++u) {
      cptx::mbarrier_init(&sh.ready[u], 32);
      cptx::mbarrier_init(&sh.released[u], kMainThreads);
    }
    for (int c = 0; c < kRingChunks; ++c) {
      cptx::mbarrier_init(&sh.state_bar[c], 1);
      cptx::mbarrier_init(&sh.chunk_free[c], kMainThreads);
    }
    cptx::fence_mbarrier_init(cptx::sem_release, cptx::scope_cluster);
  }
  __syncthreads();
  if (tid >= kMainThreads) {
    persistent_loader(a, sh, staged_fb, head, first, step, tid - kMainThreads);
  } else {
    persistent_main(a, sh, ring, head, first, step, tid);
  }
}

}  // namespace
}  // namespace fusedstep::kda
