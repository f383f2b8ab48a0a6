// KDA decode, fused (q = 1; the verify kernel for q = 2..8 and records is further down,
// after the q = 1 kernel): one launch per layer and step runs the causal conv update
// with SiLU, the q/k L2 norms, beta, the F_B gate projection (a fifth "gate" warp),
// the gated delta-rule update of the FP32 state split over a cluster of C CTAs per
// head (128 / C value rows each) and the gated RMSNorm of the head's output.
//
// Data flow inside a cluster (one head of one request):
//   - every CTA runs the conv of the head's 128 q and k channels (each needs all of
//     them for the norms) and of the v channels of its own rows;
//   - every CTA's gate warp projects the 128 / C F_B rows of its rows' keys and
//     multicasts the decays to all CTAs (st.async into their shared memory);
//   - every CTA updates its state rows and pushes the BF16-rounded outputs o to the
//     owner CTA (rank 0; the verify: rank t % C for token t), which runs the gated
//     RMSNorm and writes the output row.
// Every reduction follows docs/numerics.md ("KDA decode"), so every schedule and batch
// size gives the same bits as fusedstep::composed::launch.
#include <cooperative_groups.h>
#include <cuda/ptx>
#include <cuda_bf16.h>
#include <cuda_pipeline.h>

#include <algorithm>
#include <cstdint>
#include <mutex>

#include "common/dev_trace.cuh"
#include "common/device_math.cuh"
#include "common/internal.h"
#include "common/launch.h"
#include "common/ptx.cuh"
#include "fusedstep/kda_decode.h"
#include "kda_decode/params.h"
#include "kda_decode/stage_math.cuh"

namespace fusedstep {
namespace {

namespace cg = cooperative_groups;
namespace cptx = cuda::ptx;

constexpr int kHead = 128;         // keys = values = inputs of F_B per head
constexpr int kMainThreads = 128;  // thread i = element i of the head's q and k
constexpr int kThreads = kMainThreads + 32;
constexpr int kWavePasses = 4;     // staged state: passes updated per wave
constexpr int kVerifyChunkRows = 32;  // verify, staged: rows per chunk (two 16 KB buffers)

#if defined(FUSEDSTEP_TRACE)
// Development trace (common/dev_trace.cuh): the phase boundaries of the q = 1 kernel
// (DecodeTraceEvent) and of the verify kernel (VerifyTraceEvent), as thread 0 (main) or
// the gate warp's lane 0 sees them.
__device__ unsigned long long g_trace[trace::kWords];
#endif
#define KDA_TRACE(event, thread) FS_TRACE(g_trace, event, thread)
enum DecodeTraceEvent {
  kDecodeEntry, kDecodeLoadsIssued, kDecodeWaited, kDecodeGateWaited, kDecodeGateSent, kDecodeArrived,
  kDecodeConv, kDecodeDecays, kDecodeClusterWait, kDecodeUpdated, kDecodeOutputsIn, kDecodeEnd,
};
enum VerifyTraceEvent {
  kTraceEntry, kTraceWaited, kTracePlanned, kTraceGateStart, kTraceGateEmitted, kTraceGateSent,
  kTraceConv, kTraceClusterWait, kTraceStateLanded, kTraceToken0,  // .. + 7: token t done
  kTraceTokensDone = kTraceToken0 + 8, kTraceNorms, kTraceEnd, kTraceInputsIn, kTraceConvPair0,
  kTraceGateTile0,  // the gate warp's first m16 tile projected and emitted (f_a and F_B in)
};

// Verify with staged state (C = 1, or early 2): the CTA's rows in chunks of up to
// kVerifyChunkRows, at most two chunk buffers in shared memory.
template <int kCluster>
constexpr int verify_chunk_rows() {
  return kHead / kCluster < kVerifyChunkRows ? kHead / kCluster : kVerifyChunkRows;
}
template <int kCluster>
constexpr int verify_chunk_buffers() {
  return kHead / kCluster / verify_chunk_rows<kCluster>() >= 2 ? 2 : 1;
}
constexpr unsigned kFullMask = 0xffffffffu;

// The q = 1 kernel loads the norm weight and output gate early on sm_90a; on sm_100a
// ptxas spilled them (8 bytes in the 2-CTA, 8-lane, staged variant), so there they are
// loaded by the owner at the gated norm. The verify loads its state rows (registers
// variants) before the PDL wait on sm_90a, after the activations on sm_100a (8 bytes
// spilled in the 2-CTA, 16-lane variant).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000
#define FS_KDA_LATE_NORM_LOADS 1
#define FS_KDA_VERIFY_LATE_ROWS 1
#else
#define FS_KDA_LATE_NORM_LOADS 0
#define FS_KDA_VERIFY_LATE_ROWS 0
#endif

// Where raw_g comes from (a runtime switch inside the gate warp).
enum GateSource : int { kGateMma = 0, kGateFma = 1, kGateGiven = 2 };

struct FusedArgs {
  const __nv_bfloat16* x;
  int64_t x_stride;
  const __nv_bfloat16* f_a;
  int64_t f_a_stride;
  const __nv_bfloat16* raw_gate;
  int64_t raw_gate_stride;
  const __nv_bfloat16* raw_beta;
  int64_t raw_beta_stride;
  const __nv_bfloat16* output_gate;
  int64_t output_gate_stride;
  const void* conv_weight;
  int64_t conv_weight_channel_stride;
  int64_t conv_weight_tap_stride;
  int64_t conv_weight_section_stride;  // resolved (never 0)
  const float* conv_bias;
  const __nv_bfloat16* f_b_weight;
  const float* a_log;
  const float* dt_bias;
  const float* norm_weight;
  void* conv_state;
  int64_t conv_state_slot_stride;
  int64_t conv_state_channel_stride;
  int64_t conv_state_tap_stride;
  int64_t conv_state_slots;
  float* state;
  int64_t state_slot_stride;
  int64_t state_slots;
  const int32_t* slots;
  __nv_bfloat16* output;
  int64_t output_stride;
  float lower_bound;
  float q_scale;
  float norm_eps;
  int heads;
  int gate_source;      // GateSource
  int four_chains;      // kGateMma: KdaGateMode::kFourChains
  int early;            // 0-3 (the staging itself is the template's kStaged)
  int evict_first;      // staged state: L2 evict-first loads and streaming stores
  int trigger_at_entry; // release dependents at entry (q = 1, batch 1)
  int conv_weight_bf16;
  int conv_state_bf16;
  int batch;
  int state_buffers;    // staged state: 2 = the next request's rows prefetched (clusters
                        // that run several requests), else 1
};

struct alignas(16) SharedCore {
  float q[kHead];           // post-conv q, k (BF16 values) of the head
  float k[kHead];
  float decay[kHead];       // per key; filled by the gate warps of the cluster
  float v[kHead];           // post-conv v of the CTA's rows
  float o[kHead];           // owner: BF16-rounded outputs pushed by the cluster
  float gate_local[kHead];  // gate warp: its decays before the multicast
  float sums[8];            // warp sums of q^2 (0-3) and k^2 (4-7)
  uint64_t gate_bar;        // 512 bytes of decays (one phase per request)
  uint64_t out_bar;         // owner: 512 bytes of outputs (one phase per request)
  uint64_t state_bar[2][4];  // staged state rows, per buffer and copy chunk
};

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
// typed_bits_to_float): converted next to its load, ptxas waited for each load before
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
__device__ __forceinline__ void stage_state_rows(float* dst, const float* src, uint32_t bytes, uint64_t* bar,
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
  float* dst = nullptr;
  const float* src = nullptr;
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

// C = 1, one request per cluster, MMA gate: the main warps project the last four F_B
// tiles (one each) after their conv, the gate warp the first four (traces at batch 64:
// the decays 3 us after the conv, the gate warp about 1.5 us a pair of tiles).
template <int kCluster, bool kStream>
constexpr int kMainGateTiles = kCluster == 1 && !kStream ? kMainThreads / 32 : 0;

// ---------------------------------------------------------------------------------
// The gate warp: raw_g and the decays of the CTA's kRows keys, multicast to every CTA.
// F_B k-index map (docs/numerics.md): k-index 2q + {0,1} <-> column 16c + 4q + {0,1},
// 2q + 8 + {0,1} <-> 16c + 4q + {2,3}: two 8-byte pieces per row and chunk, for every
// cluster size. All eight B columns carry the token, so every D column holds it too.
template <int kCluster, bool kStream>
__device__ __forceinline__ void gate_warp(const FusedArgs& a, SharedCore& sh, uint32_t* staged_fb,
                                          uint32_t* last_chunk, int head, int value_base, int lane) {
  constexpr int kRows = kHead / kCluster;
  constexpr int kTiles = kRows >= 16 ? kRows / 16 : 1;  // m16 tiles (C = 16: half used)
  constexpr int kPairs = (kTiles + 1) / 2;              // lane q >> 1 picks the pair's tile
  const int group = lane >> 2, quarter = lane & 3;
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

  // Clusters that run several requests always stage them (no tiles live across requests).
  const bool stage_fb = (kStream || a.early == 3) && a.gate_source == kGateMma;
  // C = 1, staged rows, one request: tiles 2-3 (the gate warp's second pair; the main
  // warps project 4-7) are staged in the last state copy chunk's buffer before the PDL
  // wait, and the gate warp copies that chunk once it has read them (from L2 after the
  // wait, they queued behind the wave's state copies: the verify's trace, 1.3 us a tile).
  const bool fb_in_chunk = kCluster == 1 && !kStream && last_chunk != nullptr && !stage_fb && a.early != 0 &&
                           a.gate_source == kGateMma;
  uint32_t w0[8][4] = {};
  uint32_t w1[8][4] = {};
  if ((kStream || a.early != 0) && a.gate_source == kGateMma) {
    if (stage_fb) {
      stage_fb_fragments<kTiles>(staged_fb, lane, fb_row);
    } else {
      load_tile(w0, 0);
      if (kTiles > 1) load_tile(w1, 1);
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
  KDA_TRACE(kDecodeGateWaited, kMainThreads);

  // Multicast: kRows / 4 packets of 16 bytes to each of the kCluster CTAs (one per lane).
  constexpr int kPackets = kRows / 4;
  const int packet = lane % kPackets;
  const int destination = lane / kPackets;
  cg::cluster_group cluster = cg::this_cluster();
  // The cluster's requests b = blockIdx.z + k gridDim.z, as the main threads run them;
  // per active request one cluster barrier phase: arrive, project, wait (every CTA has
  // armed its barriers and read the previous request's decays), multicast.
  const int64_t step = gridDim.z;
  int32_t next_slot = a.slots[blockIdx.z];
#pragma unroll 1
  for (int64_t b = blockIdx.z, k = 0; kStream ? b < a.batch : k == 0; b += step, ++k) {
    const int32_t slot = next_slot;
    if (kStream && b + step < a.batch) next_slot = a.slots[b + step];
    if (!active_slot(a, slot)) continue;
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
    } else if (!kStream && a.gate_source == kGateFma) {  // check(): the FMA tree is never staged
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
        if (kStream || stage_fb) {
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
        const bool from_global = !kStream && !stage_fb && !fb_in_chunk;
        constexpr int kGateTiles = kTiles - kMainGateTiles<kCluster, kStream>;  // the rest: main warps
#pragma unroll
        for (int pair = 0; pair < kGateTiles / 2; ++pair) {
          float lo0 = 0.0f, hi0 = 0.0f, lo1 = 0.0f, hi1 = 0.0f;
          const int t0 = 2 * pair, t1 = 2 * pair + 1;
          // The first pair's tiles were loaded before the wait (early >= 1, unstaged).
          const bool fetch = pair > 0 ? !from_global : a.early == 0 || stage_fb;
          if (fetch && fb_in_chunk) {
            __pipeline_wait_prior(0);
            read_fb_fragments(w0, last_chunk, t0 - 2, lane);
          } else if (fetch) {
            fetch_tile(w0, t0);
          }
          project(w0, lo0, hi0);
          if (from_global && t0 + 2 < kGateTiles) fetch_tile(w0, t0 + 2);
          // Clusters that run several requests reuse w0 (one tile live at a time).
          uint32_t (&w)[8][4] = kStream ? w0 : w1;
          if (fetch && fb_in_chunk) {
            read_fb_fragments(w, last_chunk, t1 - 2, lane);
          } else if (fetch) {
            fetch_tile(w, t1);
          }
          project(w, lo1, hi1);
          if (from_global && t1 + 2 < kGateTiles) fetch_tile(w1, t1 + 2);
          emit_pair(pair, lo0, hi0, lo1, hi1);
        }
      } else {
        // One pair (C >= 4). Kept as it was: the loop above, instantiated here, moved
        // ptxas's allocation of the whole kernel (batch 2-8 5-7% slower on the H200).
        float lo0 = 0.0f, hi0 = 0.0f, lo1 = 0.0f, hi1 = 0.0f;
        if (a.early == 0 || stage_fb) fetch_tile(w0, 0);
        project(w0, lo0, hi0);
        if (kTiles > 1) {
          uint32_t (&w)[8][4] = kStream ? w0 : w1;
          if (a.early == 0 || stage_fb) fetch_tile(w, 1);
          project(w, lo1, hi1);
        }
        emit_pair(0, lo0, hi0, lo1, hi1);
      }
    }
    __syncwarp();
    const float4 d4 = *reinterpret_cast<const float4*>(&sh.gate_local[4 * packet]);
    __syncwarp();  // the next request's decays overwrite gate_local
    cptx::barrier_cluster_wait();
    if (fb_in_chunk && lane == 0) {
      // The lanes' reads of the staged tiles are behind the __syncwarp above; thread 0's
      // init of the chunk's barrier is visible after the cluster wait.
      constexpr uint32_t kChunkFloats = kHead * kHead / 4;  // C = 1: the last of four copies
      DeferredChunk chunk;
      chunk.dst = reinterpret_cast<float*>(last_chunk);
      chunk.src = a.state + int64_t(slot) * a.state_slot_stride + int64_t(head) * kHead * kHead + 3 * kChunkFloats;
      chunk.bytes = kChunkFloats * sizeof(float);
      chunk.bar = &sh.state_bar[0][3];
      chunk.evict_first = a.evict_first;
      copy_deferred_chunk(chunk);
    }
    if constexpr (kCluster == 1) {
      // No peers (st.async needs a cluster of two or more): plain stores, then each lane
      // arrives on the decay barrier (armed for 32 arrivals, and the main threads'
      // where they project tiles: they store those keys' decays themselves).
      constexpr int kGateKeys = kRows - 16 * kMainGateTiles<kCluster, kStream>;
      if (a.gate_source != kGateMma || 4 * packet < kGateKeys) *reinterpret_cast<float4*>(&sh.decay[4 * packet]) = d4;
      cptx::mbarrier_arrive(&sh.gate_bar);
    } else {
      uint32_t words[4] = {__float_as_uint(d4.x), __float_as_uint(d4.y), __float_as_uint(d4.z),
                           __float_as_uint(d4.w)};
      cptx::st_async(cluster.map_shared_rank(reinterpret_cast<uint32_t*>(&sh.decay[value_base + 4 * packet]),
                                             destination),
                     words, cluster.map_shared_rank(&sh.gate_bar, destination));
    }
    KDA_TRACE(kDecodeGateSent, kMainThreads);
  }
  // A cluster whose requests were all padding staged F_B fragments it never read: no copy
  // outlives the CTA (a no-op where the projection already waited).
  if (stage_fb || fb_in_chunk) __pipeline_wait_prior(0);
}

// ---------------------------------------------------------------------------------
// The q = 1 kernel's body; the kernels below differ only in their launch bounds and
// (staged) in how many passes one wave updates (kWaveMax; rows are independent, so the
// bits do not depend on it).
//
// A cluster runs the requests b = blockIdx.z, + gridDim.z, ... in turn (one request
// when gridDim.z = batch). Per active request: one phase of the decay and output
// barriers and one cluster barrier phase (every thread arrives once it is done with the
// previous request's shared buffers, and waits before its first DSMEM send), so a peer
// never writes a buffer that is still being read. With two state buffers the next
// request's rows are bulk-copied while this one runs. Every request is computed exactly
// as alone: the bits do not depend on how requests are spread over clusters.
template <int kCluster, int kLanes, bool kStaged, bool kStream, int kWaveMax = kWavePasses>
__device__ __forceinline__ void kda_decode_fused_body(const FusedArgs& a) {
  static_assert(kStaged || !kStream, "clusters that run several requests stage their state");
  constexpr int kRows = kHead / kCluster;
  constexpr int kGroups = kMainThreads / kLanes;            // rows per pass
  constexpr int kPasses = (kRows + kGroups - 1) / kGroups;
  constexpr int kChunks = 32 / kLanes;                      // float4 per lane and row
  constexpr int kWave = kStaged ? (kPasses < kWaveMax ? kPasses : kWaveMax) : kPasses;
  constexpr uint32_t kStateBytes = kRows * kHead * sizeof(float);
  static_assert(kPasses % kWave == 0, "waves tile the passes");

  __shared__ SharedCore sh;
  extern __shared__ __align__(128) unsigned char dynamic_smem[];
  // [state_buffers][kRows][128] state floats when kStaged, then the staged F_B rows.
  float* staged_base = reinterpret_cast<float*>(dynamic_smem);
  uint32_t* staged_fb =
      reinterpret_cast<uint32_t*>(dynamic_smem + (kStaged ? a.state_buffers * kStateBytes : 0));

  const int tid = threadIdx.x;
  const int partition = static_cast<int>(blockIdx.x);  // == rank in the (C, 1, 1) cluster
  const int head = static_cast<int>(blockIdx.y);
  const int value_base = partition * kRows;
  const int dim = a.heads * kHead;
  const int64_t first = blockIdx.z, step = gridDim.z;

  KDA_TRACE(kDecodeEntry, 0);
  if (a.trigger_at_entry) ptx::griddep_launch_dependents();
  if (a.early == 0) ptx::griddep_wait();

  // C = 1, staged, one request: the last copy chunk's buffer first holds F_B tiles 2-3
  // (gate_warp), which copies that chunk itself; MMA gate only.
  constexpr bool kFbInLastChunk = kCluster == 1 && kStaged && !kStream;
  const bool fb_in_last_chunk = kFbInLastChunk && a.early >= 1 && a.early <= 2 && a.gate_source == kGateMma;
  if (tid >= kMainThreads) {
    uint32_t* last_chunk =
        fb_in_last_chunk ? reinterpret_cast<uint32_t*>(staged_base + 3 * (kRows / 4) * kHead) : nullptr;
    gate_warp<kCluster, kStream>(a, sh, staged_fb, last_chunk, head, value_base, tid - kMainThreads);
    return;
  }

  const int64_t head_rows = (int64_t(head) * kHead + value_base) * kHead;  // the CTA's rows in a slot
  auto rows_of = [&](int32_t slot) { return a.state + int64_t(slot) * a.state_slot_stride + head_rows; };
  // Thread 0: the rows of `slot` into state buffer `buffer`, in kCopyChunks copies with a
  // barrier each, so the first wave starts once its rows have landed (64 or 128 rows:
  // four chunks; fewer rows: one).
  constexpr int kCopyChunks = kRows >= 64 ? 4 : 1;
  constexpr int kCopyRows = kRows / kCopyChunks;
  static_assert(!kFbInLastChunk || kCopyChunks == 4, "gate_warp copies the last of four chunks");
  constexpr uint32_t kCopyBytes = kStateBytes / kCopyChunks;
  // Chunks [first_chunk, end_chunk) of them (the late state copy issues them in two steps).
  auto stage_rows = [&](int buffer, int32_t slot, int first_chunk, int end_chunk) {
#pragma unroll
    for (int c = first_chunk; c < end_chunk; ++c) {
      if (kFbInLastChunk && fb_in_last_chunk && c == kCopyChunks - 1) break;  // the gate warp copies it
      stage_state_rows(staged_base + buffer * (kRows * kHead) + c * (kCopyRows * kHead),
                       rows_of(slot) + c * (kCopyRows * kHead), kCopyBytes, &sh.state_bar[buffer][c], a.evict_first);
    }
  };

  // Slots of this cluster's first two requests (the next one's rows are prefetched).
  int32_t slot_cur = a.slots[first];
  int32_t slot_next = kStream && first + step < a.batch ? a.slots[first + step] : 0;

  // C = 1 at early 1: the state copy is issued after the activations are requested,
  // chunks 0-1 at once and chunk 2 after the conv (chunk 3: the gate warp, after its
  // F_B tiles). Once the wave is full (the next call's CTAs cannot start early) an
  // activation load issued after the CTA's 64 KB of copies waited behind them, and
  // every CTA's conv with it (H200, 12 heads, batch 32 / 64 / 128: after the activations
  // -4 / -2 / -1.2%, the split another -3 / -2.4 / -1.9%; batch 20, where the next
  // call's CTAs do start early, +17%: early 2 there).
  const bool late_state_copy = kCluster == 1 && kStaged && !kStream && a.early == 1;
  constexpr int kLateFirstChunks = kCopyChunks / 2;  // issued before the conv

  // ---- setup: thread 0 inits the barriers (and stages the first request's rows).
  if (tid == 0) {
    // C = 1: the gate warp's 32 lanes arrive on the decay barrier and the outputs are
    // plain stores; otherwise both barriers count the bytes the cluster sends.
    cptx::mbarrier_init(&sh.gate_bar, kCluster == 1 ? 32 + (kMainGateTiles<kCluster, kStream> > 0 ? kMainThreads : 0) : 1);
    if (kCluster > 1 && partition == 0) cptx::mbarrier_init(&sh.out_bar, 1);
    if constexpr (kStaged) {
      for (int c = 0; c < kCopyChunks; ++c) {
        cptx::mbarrier_init(&sh.state_bar[0][c], 1);
        cptx::mbarrier_init(&sh.state_bar[1][c], 1);
      }
    }
    cptx::fence_mbarrier_init(cptx::sem_release, cptx::scope_cluster);
    if (kStaged && !late_state_copy && active_slot(a, slot_cur)) stage_rows(0, slot_cur, 0, kCopyChunks);
  }

  // Per-thread index values. Clusters that run several requests recompute them (and
  // what derives from them: addresses) per request from an opaque copy of tid: ptxas
  // would otherwise hoist dozens of per-thread addresses out of the request loop and keep
  // them live across the recurrence (at up to twice the registers).
  int warp, lane, group, group_lane;
  bool has_v;
  int64_t channel[3];
  auto set_thread_indices = [&](int t) {
    warp = t >> 5, lane = t & 31;
    group = t / kLanes, group_lane = t % kLanes;
    has_v = t < kRows;
    channel[0] = int64_t(head) * kHead + t;
    channel[1] = dim + int64_t(head) * kHead + t;
    channel[2] = 2 * int64_t(dim) + int64_t(head) * kHead + value_base + (has_v ? t : 0);
  };
  set_thread_indices(tid);

  // ---- loads of a request before it runs: conv weights and bias (reloaded for each
  // request rather than kept live across the recurrence), conv taps and (not staged)
  // state rows; after the PDL wait, its activations. The first request's weights, taps
  // and rows are read early; each later one's at the end of the previous request.
  float weight[3][4];
  float bias[3];
  float taps[3][3];
  float4 hist[kStaged ? 1 : kPasses][kChunks];
  auto load_request = [&](int32_t slot) {
    // Opaque strides (several requests): the element offsets are recomputed per request
    // rather than hoisted out of the request loop by ptxas and kept live (21 64-bit
    // offsets).
    auto stride = [](int64_t v) { return kStream ? ptx::opaque(v) : v; };
    const int64_t w_section = stride(a.conv_weight_section_stride);
    const int64_t w_channel = stride(a.conv_weight_channel_stride);
    const int64_t w_tap = stride(a.conv_weight_tap_stride);
    const int64_t c_channel = stride(a.conv_state_channel_stride);
    const int64_t c_tap = stride(a.conv_state_tap_stride);
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
      const float* rows = rows_of(slot);
#pragma unroll
      for (int p = 0; p < kPasses; ++p) {
        const int row = (p * kGroups + group) % kRows;
#pragma unroll
        for (int j = 0; j < kChunks; ++j) {
          hist[p][j] = *reinterpret_cast<const float4*>(rows + row * kHead + 4 * (group_lane + kLanes * j));
        }
      }
    }
  };
  // The activations stay BF16 bits until used (dmath::bf16_lo). When they were converted
  // in load_activations, ptxas waited for them there, before this request's cluster
  // arrive, and the gate warp's multicast waits for every thread's arrive (H200 trace,
  // batch 8: the arrive 1.2 us after the PDL wait).
  uint16_t xin_bits[3];
  uint16_t raw_beta_bits;
#if !FS_KDA_LATE_NORM_LOADS
  uint16_t raw_out_gate_bits;
#endif
  // beta and the output gate, consumed only after the conv: with one request per
  // cluster they are loaded after its cluster arrive (below). Loaded with the input,
  // ptxas placed their conversions before the arrive, which then waited for the loads
  // (SASS of the batch-8 schedule), and with it the gate warp's multicast.
  auto load_late_activations = [&](int64_t b) {
    raw_beta_bits = load_bf16_bits(a.raw_beta + b * a.raw_beta_stride + head);
#if !FS_KDA_LATE_NORM_LOADS
    raw_out_gate_bits =
        partition == 0 ? load_bf16_bits(a.output_gate + b * a.output_gate_stride + int64_t(head) * kHead + tid) : 0;
#else
    // sm_100a: ptxas spilled the gate across the shuffle trees; the owner loads it where
    // it uses it (same value, same bits).
#endif
  };
  auto load_activations = [&](int64_t b) {
    const __nv_bfloat16* xrow = a.x + b * a.x_stride;
#pragma unroll
    for (int s = 0; s < 3; ++s) xin_bits[s] = load_bf16_bits(xrow + channel[s]);
    if constexpr (kStream) load_late_activations(b);
  };
  if (active_slot(a, slot_cur)) load_request(slot_cur);
  KDA_TRACE(kDecodeLoadsIssued, 0);
  if (a.early != 0) ptx::griddep_wait();
  KDA_TRACE(kDecodeWaited, 0);
  if (active_slot(a, slot_cur)) load_activations(first);
  if (late_state_copy && tid == 0 && active_slot(a, slot_cur)) stage_rows(0, slot_cur, 0, kLateFirstChunks);

  cg::cluster_group cluster = cg::this_cluster();
  float* remote_o = cluster.map_shared_rank(&sh.o[0], 0);
  uint64_t* remote_out_bar = cluster.map_shared_rank(&sh.out_bar, 0);
  uint32_t parity = 0;        // of the decay and output barriers (flips per active request)
  uint32_t state_parity = 0;  // bit i: of state_bar[i]

#pragma unroll 1
  for (int64_t b = first, k = 0; kStream ? b < a.batch : k == 0; b += step, ++k) {
    const int32_t slot = slot_cur;
    if (kStream && k > 0) set_thread_indices(ptx::opaque(tid));
    const int32_t slot_after = kStream && b + 2 * step < a.batch ? a.slots[b + 2 * step] : 0;
    const int buffer = a.state_buffers == 2 ? int(k & 1) : 0;
    if (k > 0) {
      ptx::named_barrier_sync(1, kMainThreads);  // every main thread is done with request k - 1
      if (kStaged && tid == 0 && a.state_buffers == 1 && active_slot(a, slot)) stage_rows(0, slot, 0, kCopyChunks);
    }
    // Two buffers: the next request's rows go into the other one (read by request k - 1).
    const bool next_active = kStream && b + step < a.batch && active_slot(a, slot_next);
    if (kStaged && tid == 0 && a.state_buffers == 2 && next_active) stage_rows(buffer ^ 1, slot_next, 0, kCopyChunks);
    slot_cur = slot_next;
    slot_next = slot_after;
    if (!active_slot(a, slot)) {
      // Padding: a zero output row; no state of any kind is read or written.
      if (partition == 0) a.output[b * a.output_stride + int64_t(head) * kHead + tid] = __float2bfloat16_rn(0.0f);
      if (kStream && next_active) {
        load_request(slot_cur);
        load_activations(b + step);
      }
      continue;
    }
    float* state_rows = rows_of(slot);
    const int64_t conv_slot = int64_t(slot) * a.conv_state_slot_stride;

    // Arm this request's barrier phases, then arrive: this thread is done with the
    // previous request's decays and outputs (peers send only after the wait below).
    // Relaxed: a release arrive would wait for every load and store in flight (the state
    // rows just written, the activations just requested); the shared reads it has to
    // order were consumed by arithmetic before this point, so they are complete, and a
    // peer's bytes landing before the arming below are counted (tx-count may go below
    // zero within a phase).
    if (tid == 0 && kCluster > 1) {
      cptx::mbarrier_arrive_expect_tx(cptx::sem_release, cptx::scope_cta, cptx::space_shared, &sh.gate_bar,
                                      uint32_t(kHead * sizeof(float)));
      if (partition == 0) {
        cptx::mbarrier_arrive_expect_tx(cptx::sem_release, cptx::scope_cta, cptx::space_shared, &sh.out_bar,
                                        uint32_t(kHead * sizeof(float)));
      }
    }
    cptx::barrier_cluster_arrive(cptx::sem_relaxed);
    KDA_TRACE(kDecodeArrived, 0);
    if constexpr (!kStream) load_late_activations(b);

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
    KDA_TRACE(kDecodeConv, 0);
    if (late_state_copy && tid == 0) stage_rows(0, slot, kLateFirstChunks, kCopyChunks);
    if constexpr (kMainGateTiles<kCluster, kStream> > 0) {
      // Main warp w projects F_B tile kTiles - 4 + w (after the barrier above: thread 0's
      // barrier init is ordered before these arrivals). All D columns hold the token;
      // lane (g, q) with q < 2 emits key g + 8 q of the tile.
      if (a.gate_source == kGateMma) {
        const int tile = kHead / 16 - kMainGateTiles<kCluster, kStream> + warp;
        const int g = lane >> 2, quarter = lane & 3;
        const int64_t key_base = int64_t(head) * kHead;
        const __nv_bfloat16* row_lo = a.f_b_weight + (key_base + 16 * tile + g) * kHead + 4 * quarter;
        uint32_t w[8][4];
        load_fb_fragments(w, row_lo, row_lo + 8 * kHead);
        uint32_t bf[8][2];
        load_fa_fragments(bf, a.f_a + b * a.f_a_stride + 4 * quarter);
        const int feature = 16 * tile + g + 8 * (quarter & 1);
        const float dt = a.dt_bias[key_base + feature];
        // D element 0 (row g) or 2 (row g + 8), selected without indexing the array by a
        // run-time value (that put it in local memory).
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
    mbarrier_wait_parity(&sh.gate_bar, parity);
    KDA_TRACE(kDecodeDecays, 0);
#pragma unroll
    for (int j = 0; j < kChunks; ++j) dc[j] = *reinterpret_cast<const float4*>(&sh.decay[4 * (group_lane + kLanes * j)]);
    const float* staged_state = staged_base + buffer * (kRows * kHead);
    const uint32_t state_phase = (state_parity >> buffer) & 1u;
    if constexpr (kStaged) state_parity ^= 1u << buffer;
    cptx::barrier_cluster_wait();  // the owner's output barrier is armed for this request
    KDA_TRACE(kDecodeClusterWait, 0);

    // ---- the recurrence, a wave of passes at a time (staged: once the copy chunks that
    // hold the wave's rows have landed).
#pragma unroll
    for (int w0 = 0; w0 < kPasses; w0 += kWave) {
      if constexpr (kStaged) {
        const int covered = std::min(w0 * kGroups, kRows);                 // rows of earlier waves
        const int needed = std::min((w0 + kWave) * kGroups, kRows);        // ... and of this one
#pragma unroll
        for (int c = (covered + kCopyRows - 1) / kCopyRows; c * kCopyRows < needed; ++c) {
          mbarrier_wait_parity(&sh.state_bar[buffer][c], state_phase);
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
            s[i][j] = *reinterpret_cast<const float4*>(&staged_state[row * kHead + 4 * (group_lane + kLanes * j)]);
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
          float4* dst = reinterpret_cast<float4*>(state_rows + row * kHead + 4 * (group_lane + kLanes * j));
          if (kStaged && a.evict_first) {
            __stcs(dst, s[i][j]);
          } else {
            __stwb(dst, s[i][j]);  // a plain `*dst =` became four 4-byte stores
          }
        }
      };
      // C >= 4 (12 heads: batch 1-8) stores the new rows before the query dots: there the
      // last stores' drain ends the call. H200 (18th session, same-run A/B): batch 1 / 2 /
      // 4 / 8 -0.4 / -5.9 / -2.7 / -3.0%. C <= 2 keeps them after each row's output push:
      // early, its C = 2 registers variant went 128 -> 138 registers (two CTAs per SM,
      // batch 16 +31%), and the batch >= 32 rows measured 0 to +1%.
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

    KDA_TRACE(kDecodeUpdated, 0);
    // ---- the next request's loads (this one's q/k windows and output gate kept aside).
    const float window[2][3] = {{taps[0][1], taps[0][2], xin[0]}, {taps[1][1], taps[1][2], xin[1]}};
#if !FS_KDA_LATE_NORM_LOADS
    const float out_gate_raw = dmath::bf16_lo(raw_out_gate_bits);
#endif
    if (kStream && next_active) {
      load_request(slot_cur);
      load_activations(b + step);
    }

    // ---- owner: the q/k conv windows; gated RMSNorm of the head's 128 outputs.
    if (partition == 0) {
      // The norm weight is read here, while the outputs arrive: loaded at entry, it was
      // spilled across the recurrence.
      const float norm_weight = a.norm_weight[tid];
      if constexpr (kCluster == 1) {
        ptx::named_barrier_sync(1, kMainThreads);
      } else {
        mbarrier_wait_parity(&sh.out_bar, parity);
      }
      KDA_TRACE(kDecodeOutputsIn, 0);
      // The new q/k windows [s1, s2, x]: every CTA of the cluster read the old taps
      // before pushing its outputs. Written before the norm, not after it: the call ends
      // when its last stores drain (H200, 18th session: batch 1 -1.2%, 12 and 24 heads).
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
      KDA_TRACE(kDecodeEnd, 0);
    }
    parity ^= 1u;
  }
}

// Minimum CTAs per SM (0: ptxas's own choice). On sm_90a <4, 16, unstaged> (batch 2-8 at
// 12 heads) is held to four (<= 102 registers): it took 110 when beta and the output gate
// moved after the arrive, and at three CTAs per SM batch 8's 96 four-CTA clusters no
// longer ran in one wave (H200: 5.8 -> 8.0 us). sm_100a (not measured) spilled under it.
template <int kCluster, int kLanes, bool kStaged>
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000
constexpr int kFusedMinCtas = 0;
#else
constexpr int kFusedMinCtas = (kCluster == 4 && kLanes == 16 && !kStaged) ? 4 : 0;
#endif

template <int kCluster, int kLanes, bool kStaged>
__global__ void __launch_bounds__(kThreads, kFusedMinCtas<kCluster, kLanes, kStaged>)
    kda_decode_fused_kernel(const __grid_constant__ FusedArgs a) {
  kda_decode_fused_body<kCluster, kLanes, kStaged, false>(a);
}

// Clusters that run several requests (schedule.requests_per_cluster > 1; staged state,
// staged F_B fragments).
template <int kCluster, int kLanes>
__global__ void __launch_bounds__(kThreads) kda_decode_stream_kernel(const __grid_constant__ FusedArgs a) {
  kda_decode_fused_body<kCluster, kLanes, true, true, 2>(a);
}

// Built for 4 CTAs per SM (ptxas keeps <= 102 registers a thread; waves of 2 passes);
// selected by schedule.min_ctas_per_sm >= 4 where such a variant exists (dense_variant()).
template <int kCluster, int kLanes, bool kStaged>
__global__ void __launch_bounds__(kThreads, 4) kda_decode_fused_kernel_dense(const __grid_constant__ FusedArgs a) {
  kda_decode_fused_body<kCluster, kLanes, kStaged, false, 2>(a);
}


// ---------------------------------------------------------------------------------
// Speculative verify (q = tokens = 2..8) with token counts and RecoverSSM records: a
// kernel of its own (the q = 1 kernel above stays as it is), built from the same
// helpers and the same cluster layout. Token t's decays and outputs travel through
// per-token arrays and barriers (gate_bar[t], out_bar[t]), each armed once (parity 0)
// and only for t < n; the state stays in registers (or shared memory for C = 1) from
// token to token. Verify schedules: C = 1, 2, 4, 8, early 0-2 (check()).
constexpr int kMaxTokens = kKdaMaxTokens;

struct VerifyArgs {
  FusedArgs base;
  int tokens;                      // q
  int64_t slots_stride;
  const int32_t* accepted;
  const int32_t* token_counts;     // or null: n = q
  float* record_correction;        // null: no records (state slots written)
  __nv_bfloat16* record_key_gate;
  const int32_t* record_rows;      // or null: record row = b
  int64_t record_slots;
};

template <int kTokens>
struct alignas(16) SharedVerify {
  // The gate MMA's eight columns are eight tokens: a column t >= n stores its decays to
  // row kDumpRow, which no token < n reads (kTokens = 8: n <= 7 then).
  static constexpr int kGateRows = kTokens < 8 ? kTokens + 1 : kTokens;
  static constexpr int kDumpRow = kGateRows - 1;
  float q[kTokens][kHead];              // post-conv q, k (BF16 values) per token
  float k[kTokens][kHead];
  float v[kTokens][kHead];              // post-conv v of the CTA's rows per token
  float decay[kGateRows][kHead];        // per token and key; from the cluster's gate warps
  float o[kTokens][kHead];              // owner: BF16-rounded outputs per token
  float gate_local[kGateRows][kHead];   // gate warp: its decays before the multicast
  float sums[kTokens][8];               // per token: warp sums of q^2 (0-3), k^2 (4-7)
  float beta[kTokens];                  // per token: sigmoid(raw_beta)
  int32_t write_slot[kTokens];          // per token: slots[b, t] (the state write rule)
  float out_gate[kTokens][kHead];       // owner: sigmoid(output gate) per token
  float norm_w[kHead];                  // owner: the norm weight (not held in registers)
  float window[2][kTokens + 2][kHead];  // clusters: CTA 0's new q/k conv taps 0 .. n + 1
  float dt[kHead];                      // gate warp: dt_bias of the CTA's keys
  uint64_t gate_bar[kTokens];
  uint64_t out_bar[kTokens];
  uint64_t state_bar[2];                // staged state (C = 1, early 2): the two chunk buffers
};

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
// conv (the gate warp alone took about 1 us a tile; at batch 64 / 128 the main warps had
// waited for it about 4 us after their state landed). At q = 8 the conv is long enough
// for the gate warp (H200: q = 2 / 4 / 8 -5 / -2 / +2% with the split at every q).
__device__ __forceinline__ bool verify_main_tiles(const FusedArgs& a, int q, int cluster) {
  return cluster == 1 && a.gate_source == kGateMma && q <= 4;
}

// One m16 tile of the verify's F_B projection and its decays, as the gate warp's
// project_tile computes them (gate modes 0 and 1; token t is MMA column t, columns >= n
// zero in `bf`): lane (g, j) holds keys g, g + 8 of the tile for tokens 2j, 2j + 1;
// decays to decay[t][key] (rows t >= n to row kDumpRow, unread then), raw_g of
// tokens t < n to `record_gate` (null: none). The gate warp keeps its own copy of these
// lines: calling this function from it changed ptxas's allocation of every C >= 2 variant
// (batch 16 2-4% slower, H200).
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
  KDA_TRACE(kTraceGateStart, kMainThreads);
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
    // trip per group (a load and its use per token had been one round trip per token:
    // batch 64 q = 8 +15% against the f_a path, 15th session).
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
      // so that their MUFU chains interleave: emitted one branch at a time they ran one
      // after another (sm_90a SASS; batch 16: 1.45 us a tile). H200: batch 2-16 -2 to -7%.
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int t = 2 * quarter + (e & 1);
        const int feature = 16 * tile + group + 8 * (e >> 1);
        const float raw = dmath::round_bf16(acc[e]);
        // Rows t >= n go to the dump row, which no token reads then, so the store
        // needs no branch (a branch had ptxas sink each chain into its own).
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
    // trips as tiles (H200: the C = 1 verify 9-13% faster at batch 16-128, q = 2 and 4).
    auto project_from_global = [&](int first) {
      uint32_t w0[8][4], w1[8][4];
      if (first < gate_tiles) fetch_tile(w0, first);
      if (first + 1 < gate_tiles) fetch_tile(w1, first + 1);
#pragma unroll 1
      for (int tile = first; tile < gate_tiles; tile += 2) {
        project_tile(w0, tile);
        if (tile == 0) KDA_TRACE(kTraceGateTile0, kMainThreads);
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
        if (tile == 0) KDA_TRACE(kTraceGateTile0, kMainThreads);
      }
      if (chunk_after_tiles.dst != nullptr) {
        __syncwarp();
        cptx::barrier_cluster_wait();  // warp 0's init of the chunk's barrier is visible
        waited = true;
        if (lane == 0) copy_deferred_chunk(chunk_after_tiles);
      }
      // (Requested before the staged tiles, these two tiles' registers spilled.)
      project_from_global(smem_tiles);
    } else if (kFbAlwaysStaged || staged_fb != nullptr) {
#pragma unroll 1
      for (int tile = 0; tile < gate_tiles; ++tile) {
        uint32_t w[8][4];
        fetch_tile(w, tile);
        project_tile(w, tile);
        if (tile == 0) KDA_TRACE(kTraceGateTile0, kMainThreads);
      }
    } else if constexpr (!kFbAlwaysStaged) {
      project_from_global(0);
    }
  }
  __syncwarp();
  KDA_TRACE(kTraceGateEmitted, kMainThreads);

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
  KDA_TRACE(kTraceGateSent, kMainThreads);
}

// Minimum CTAs per SM (0: ptxas's own choice). C = 1 (the large batches) is built for
// three (up to 136 registers): left to itself ptxas stopped at 128 and spilled 8 bytes
// in the 16-lane variant. The compact variants (kTokens < kMaxTokens, see
// g_verify_compact_variants) for four on sm_90a; sm_100a (not measured) spilled 20
// bytes under that bound in the 8-lane one. On sm_100a C = 2 with staged rows is built
// for three too: left to itself ptxas stopped its 16-lane variant at 96 registers and
// spilled 16 bytes, which failed the FUSEDSTEP_BLACKWELL build (18th session).
template <int kCluster, bool kStaged, int kTokens>
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000
constexpr int kVerifyMinCtas = kCluster == 1 || (kCluster == 2 && kStaged) ? 3 : 0;
#else
constexpr int kVerifyMinCtas = kCluster == 1 ? 3 : kTokens < kMaxTokens ? 4 : 0;
#endif

// kTokens: the largest q the per-token shared arrays hold (SharedVerify<kTokens>).
template <int kCluster, int kLanes, bool kStaged, int kTokens>
__global__ void __launch_bounds__(kThreads, kVerifyMinCtas<kCluster, kStaged, kTokens>)
    kda_verify_fused_kernel(const __grid_constant__ VerifyArgs va) {
  const FusedArgs& a = va.base;
  constexpr int kRows = kHead / kCluster;
  constexpr int kGroups = kMainThreads / kLanes;
  constexpr int kPasses = (kRows + kGroups - 1) / kGroups;
  constexpr int kChunks = 32 / kLanes;
  // Staged: a wave is one chunk of kChunkRows rows.
  constexpr int kChunkRows = verify_chunk_rows<kCluster>();
  constexpr int kWave = kStaged ? kChunkRows / kGroups : kPasses;
  static_assert(kPasses % kWave == 0, "waves tile the passes");
  static_assert(kRows >= kGroups, "every pass row exists (C <= 8)");
  static_assert(!kStaged || kWave * kGroups == kChunkRows, "a chunk is whole passes");

  __shared__ SharedVerify<kTokens> sh;
  extern __shared__ __align__(128) unsigned char dynamic_smem[];
  float* staged_state = reinterpret_cast<float*>(dynamic_smem);  // [2][kChunkRows][128] when kStaged
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

  KDA_TRACE(kTraceEntry, 0);
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
  const float norm_w = a.norm_weight[ctid];
  // The gate warp's weights: dt_bias of the CTA's keys, exp(a_log), the F_B fragments.
  constexpr int kLaneFeatures = (kRows + 31) / 32;
  float dt_pre[kLaneFeatures];
  float a_exp = 0.0f;
  // Not in a buffer of its own with staged state: its 16-32 KB would cost a CTA per SM
  // (H200: batch 16 and C = 1 at batch 64 / 128 5-25% slower).
  constexpr bool kStageFb = kCluster >= 2 && !kStaged;
  // C = 2 with staged rows (batch 9-16) stages F_B (16 KB) in the second chunk buffer,
  // before the PDL wait; the gate warp copies chunk 1 there once its tiles are read.
  // From L2 after the wait, each F_B tile queued behind the wave's state copies (trace,
  // batch 16: 1.3 us a tile, the decays 2 us after the first chunk had landed).
  // C = 1 stages the gate warp's first four tiles there (the second half comes from the
  // main warps, or at q = 8 from L2).
  constexpr bool kFbInChunkBuffer = kStaged && kCluster <= 2;
  const bool stage_fb = ((kStageFb && a.early == 1) || kFbInChunkBuffer) && a.gate_source == kGateMma;
  constexpr int kChunkFbTiles = kCluster == 1 ? kRows / 32 : kRows / 16;  // F_B tiles in the buffer
  if constexpr (kFbInChunkBuffer) {
    static_assert(kChunkFbTiles * 4096 == kChunkRows * kHead * sizeof(float), "F_B fills one chunk buffer");
    staged_fb = reinterpret_cast<uint32_t*>(staged_state + kChunkRows * kHead);
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
  // step's inputs, not the previous kernel's outputs); at early 0 the wait came at entry.
  // H200, batch 1: read after the wait they were two dependent HBM round trips (the
  // plan, then the taps and rows it addresses) before the conv could start.
  const VerifyRequest r = plan_verify_request(va, b);
  KDA_TRACE(kTracePlanned, 0);
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
  // Token t's outputs are normalized by CTA t % C (the seed's rule), so that with C >= q
  // the tokens' norms run at once in different CTAs; rows t in [n, q) are zeroed there.
  // (One owner for every token ran its norms after the last token: H200 trace, batch 1,
  // q = 4: 1.2 us from the median CTA's last token to the owner's norms.)
  auto norm_cta_of = [](int t) { return t % kCluster; };
  const bool norm_cta = partition < q;  // normalizes or zeroes at least one row
  constexpr int kOwnedMax = (kTokens + kCluster - 1) / kCluster;  // tokens per norm CTA
  const int64_t head_rows = (int64_t(head) * kHead + value_base) * kHead;  // the CTA's rows in a slot
  const float* read_rows = a.state + int64_t(r.read_slot) * a.state_slot_stride + head_rows;

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
      chunk_after_tiles.dst = staged_state + kChunkRows * kHead;
      chunk_after_tiles.src = read_rows + kChunkRows * kHead;
      chunk_after_tiles.bytes = kChunkRows * kHead * sizeof(float);
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
    stage_state_rows(staged_state + buffer * (kChunkRows * kHead), read_rows + chunk * (kChunkRows * kHead),
                     kChunkRows * kHead * sizeof(float), &sh.state_bar[buffer], false);
  };

  // ---- setup: lane t of warp 0 inits token t's barriers (t < n) and fences its own
  // inits, then arms them after a __syncwarp (thread 0 alone did it token after token);
  // lane 0 issues the first staged chunks.
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
    // H200: batch 1 (c8l8e2) -2 to -3%; C = 2's two chunks before the wait made batch 16
    // 2-5% slower (they queue ahead of the activations), so those are copied below.
    // (Before the __syncwarp, racecheck reported the inits against the copy's arm.)
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
  // those first); on sm_100a after the activations (before them, ptxas spilled the
  // C = 2, 16-lane variant).
  float4 hist[kStaged ? 1 : kPasses][kChunks];
  auto load_rows = [&] {
    if constexpr (!kStaged) {
#pragma unroll
      for (int p = 0; p < kPasses; ++p) {
        const int row = p * kGroups + group;
#pragma unroll
        for (int j = 0; j < kChunks; ++j) {
          hist[p][j] = *reinterpret_cast<const float4*>(read_rows + row * kHead + 4 * (group_lane + kLanes * j));
        }
      }
    }
  };
  if (!FS_KDA_VERIFY_LATE_ROWS) load_rows();

  // ---- after the wait: the activations of all q rows (they exist for every request;
  // rows >= n go unused: never read for a token < n, nor written back), beta and the
  // output gates. They stay BF16 bits until used, and
  // no load is predicated (rows t >= q repeat row q - 1, a valid address whose value is
  // never used): with `t < q ? load : 0` ptxas converted each value right after its
  // load, which made the loads of the q rows one dependent round trip after another
  // (H200 trace, batch 1: the main warps' request plan done 2.3 us after the wait, the
  // gate warp's 0.9 us).
  if (a.early != 0) ptx::griddep_wait();
  KDA_TRACE(kTraceWaited, 0);
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
  // (ahead of them, the conv's inputs queued behind 32 KB of rows: C = 1 at batch 64 / 128
  // was 1-2% slower).
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
  KDA_TRACE(kTraceInputsIn, 0);

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
  // butterflies interleave; one token at a time they were one serial chain (H200 trace,
  // batch 1: the conv phase grew by about 0.45 us per token). Groups of 4 measured slower
  // at q = 2 (the wasted tokens' work).
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
    if (t0 == 0) KDA_TRACE(kTraceConvPair0, 0);
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
  // windows of a single CTA (C = 1: no other CTA reads them; written at the end they had
  // cost 1-2.5%, H200). In a cluster every CTA reads the q/k taps, so CTA 0 keeps the new
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
  KDA_TRACE(kTraceConv, 0);
  if constexpr (kCluster == 1) {
    // verify_main_tiles: main warp w projects F_B tile kTiles / 2 + w (the gate warp the
    // first half). Its loads are issued here: with the activations ptxas spilled.
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
    // After the barriers: warp 0 has initialized gate_bar (racecheck: an arrive before
    // them raced with the init).
#pragma unroll 1
    for (int t = 0; t < n; ++t) cptx::mbarrier_arrive(&sh.gate_bar[t]);
  }
  KDA_TRACE(kTraceClusterWait, 0);
  float* correction = va.record_correction != nullptr
                          ? va.record_correction + (r.record_row * a.heads + head) * q * kHead + value_base
                          : nullptr;

  // A token's inputs to the recurrence, as every schedule computes them.
  struct TokenInputs {
    float4 qn[kChunks], kn[kChunks], dc[kChunks];
    float beta;
    bool write_state;
    float* write_rows;
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
    in.write_rows = a.state + int64_t(write_slot) * a.state_slot_stride + head_rows;
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
          // __stwb: 16-byte stores (a plain `*p =` became four 4-byte stores: 4x the
          // L2 sectors of the state writes).
          __stwb(reinterpret_cast<float4*>(in.write_rows + row * kHead + 4 * (group_lane + kLanes * j)), s[i][j]);
        }
      }
    }
  };

  // The tokens in order. Staged with C >= 4 and 8 lanes (batch 1's c8l8e2), token t + 1's
  // inputs (shared loads, norms, the decay wait) are read before token t runs, so that
  // they overlap its update chain (H200, batch 1, q = 4 / 8: -4%). With 16 lanes it
  // measured slower (c8l16e2, batch 2: +3 to +5%); at C = 1 / 2 it would cost occupancy
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
      if (c == 0) KDA_TRACE(kTraceStateLanded, 0);
      const float* chunk_rows = staged_state + buffer * (kChunkRows * kHead);
      float4 s[kWave][kChunks];
#pragma unroll
      for (int i = 0; i < kWave; ++i) {
#pragma unroll
        for (int j = 0; j < kChunks; ++j) {
          s[i][j] = *reinterpret_cast<const float4*>(&chunk_rows[(i * kGroups + group) * kHead +
                                                                  4 * (group_lane + kLanes * j)]);
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
        KDA_TRACE(kTraceToken0 + t, 0);
      });
    }
  } else {
    // ---- the tokens in order; the state carries over in registers.
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
      KDA_TRACE(kTraceToken0 + t, 0);
    });
  }
  KDA_TRACE(kTraceTokensDone, 0);

  // ---- norm CTAs: the gated RMSNorm of tokens t with t % C == rank (rows t in [n, q)
  // zero), kNormGroup of them at a time with their butterflies interleaved, each once
  // the cluster's outputs for it are in; in a cluster, CTA 0 then writes the q/k conv
  // windows.
  if (!norm_cta) {
    KDA_TRACE(kTraceEnd, 0);
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
  KDA_TRACE(kTraceNorms, 0);
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
  KDA_TRACE(kTraceEnd, 0);
}

// ---------------------------------------------------------------------------------
// Host side: variant table, one-time attributes, defaults, launch.
using KernelFn = void (*)(FusedArgs);

constexpr int kClusterSizes[5] = {1, 2, 4, 8, 16};

int cluster_index(int cluster) {
  for (int i = 0; i < 5; ++i) {
    if (kClusterSizes[i] == cluster) return i;
  }
  return -1;
}

// [state_buffers] staged state buffers of the CTA's rows, then the staged F_B fragments.
template <int kCluster>
constexpr size_t dynamic_smem_bytes(bool staged, bool stage_fb, int state_buffers = 1) {
  constexpr int kRows = kHead / kCluster;
  constexpr int kTiles = kRows >= 16 ? kRows / 16 : 1;
  return (staged ? size_t(state_buffers) * kRows * kHead * sizeof(float) : 0) +
         (stage_fb ? size_t(kTiles) * 8 * 2 * 32 * 8 : 0);
}

constexpr int kMaxDevices = 64;

using kda::is_staged;

struct Variant {
  KernelFn fn = nullptr;
  size_t max_dynamic_smem = 0;        // with the F_B rows staged (and two state buffers)
  size_t one_buffer_smem = 0;         // the same with one state buffer
  int ctas_per_sm[kMaxDevices] = {};  // per device: occupancy at one_buffer_smem
  int two_buffer_ctas_per_sm[kMaxDevices] = {};  // ... at max_dynamic_smem
};

template <int kCluster, int kLanes, bool kStaged, bool kDense = false>
Variant make_variant() {
  Variant v;
  if constexpr (kDense) {
    v.fn = reinterpret_cast<KernelFn>(&kda_decode_fused_kernel_dense<kCluster, kLanes, kStaged>);
  } else {
    v.fn = reinterpret_cast<KernelFn>(&kda_decode_fused_kernel<kCluster, kLanes, kStaged>);
  }
  v.max_dynamic_smem = v.one_buffer_smem = dynamic_smem_bytes<kCluster>(kStaged, true);
  return v;
}

template <int kCluster, int kLanes>
Variant make_stream_variant() {
  Variant v;
  v.fn = reinterpret_cast<KernelFn>(&kda_decode_stream_kernel<kCluster, kLanes>);
  v.max_dynamic_smem = dynamic_smem_bytes<kCluster>(true, true, 2);
  v.one_buffer_smem = dynamic_smem_bytes<kCluster>(true, true, 1);
  return v;
}

// [cluster index][lanes 8 / 16][staged]. C = 1 always stages its 128 rows in shared
// memory (128 state floats per thread would not fit in registers).
Variant g_variants[5][2][2] = {
    {{make_variant<1, 8, true>(), make_variant<1, 8, true>()}, {make_variant<1, 16, true>(), make_variant<1, 16, true>()}},
    {{make_variant<2, 8, false>(), make_variant<2, 8, true>()}, {make_variant<2, 16, false>(), make_variant<2, 16, true>()}},
    {{make_variant<4, 8, false>(), make_variant<4, 8, true>()}, {make_variant<4, 16, false>(), make_variant<4, 16, true>()}},
    {{make_variant<8, 8, false>(), make_variant<8, 8, true>()}, {make_variant<8, 16, false>(), make_variant<8, 16, true>()}},
    {{make_variant<16, 8, false>(), make_variant<16, 8, true>()}, {make_variant<16, 16, false>(), make_variant<16, 16, true>()}},
};

// Staged q = 1 variants built for 4 CTAs per SM (schedule.min_ctas_per_sm >= 4): only
// C = 4 with 16 lanes (96 registers, no spills); C = 2 with 16 lanes and C = 4 with 8
// lanes spill at that bound (80 and 44 bytes), the others fit 4 CTAs per SM already
// or need more registers.
Variant g_dense_variants[1] = {make_variant<4, 16, true, true>()};

// Clusters that run several requests (requests_per_cluster > 1): [cluster index][lanes
// 8 / 16]. (A C = 4, 16-lane one bounded to 4 CTAs per SM spilled 284 bytes; the
// unbounded one takes 128 registers, 3 CTAs per SM.)
Variant g_stream_variants[5][2] = {
    {make_stream_variant<1, 8>(), make_stream_variant<1, 16>()},
    {make_stream_variant<2, 8>(), make_stream_variant<2, 16>()},
    {make_stream_variant<4, 8>(), make_stream_variant<4, 16>()},
    {make_stream_variant<8, 8>(), make_stream_variant<8, 16>()},
    {make_stream_variant<16, 8>(), make_stream_variant<16, 16>()},
};

bool is_dense(const KdaSchedule& s) {
  return s.min_ctas_per_sm >= 4 && s.early >= 2 && s.cluster == 4 && s.lanes_per_row == 16;
}

// The q = 1 variant a schedule runs.
const Variant& decode_variant(const KdaSchedule& s) {
  const int c = cluster_index(s.cluster), lanes = s.lanes_per_row == 16 ? 1 : 0;
  if (s.requests_per_cluster > 1) return g_stream_variants[c][lanes];
  if (is_dense(s)) return g_dense_variants[0];
  return g_variants[c][lanes][is_staged(s) ? 1 : 0];
}

// Verify: staged state (C = 1, early 2) takes its chunk buffers; state in registers
// (C >= 2, early 0 / 1) with early 1 stages the F_B fragments.
template <int kCluster>
constexpr size_t verify_dynamic_smem_bytes(bool staged, bool stage_fb) {
  return staged ? size_t(verify_chunk_buffers<kCluster>()) * verify_chunk_rows<kCluster>() * kHead * sizeof(float)
                : dynamic_smem_bytes<kCluster>(false, stage_fb);
}

template <int kCluster, int kLanes, bool kStaged, int kTokens = kMaxTokens>
Variant make_verify_variant() {
  Variant v;
  v.fn = reinterpret_cast<KernelFn>(&kda_verify_fused_kernel<kCluster, kLanes, kStaged, kTokens>);
  v.max_dynamic_smem = verify_dynamic_smem_bytes<kCluster>(kStaged, !kStaged);
  v.one_buffer_smem = v.max_dynamic_smem;
  return v;
}

// Verify (q > 1): [cluster index 1, 2, 4, 8][lanes 8 / 16][staged]; C = 1 always stages
// its state, C >= 2 at early 2 (check() keeps early <= 2 for q > 1).
Variant g_verify_variants[4][2][2] = {
    {{make_verify_variant<1, 8, true>(), make_verify_variant<1, 8, true>()},
     {make_verify_variant<1, 16, true>(), make_verify_variant<1, 16, true>()}},
    {{make_verify_variant<2, 8, false>(), make_verify_variant<2, 8, true>()},
     {make_verify_variant<2, 16, false>(), make_verify_variant<2, 16, true>()}},
    {{make_verify_variant<4, 8, false>(), make_verify_variant<4, 8, true>()},
     {make_verify_variant<4, 16, false>(), make_verify_variant<4, 16, true>()}},
    {{make_verify_variant<8, 8, false>(), make_verify_variant<8, 8, true>()},
     {make_verify_variant<8, 16, false>(), make_verify_variant<8, 16, true>()}},
};

// Verify with q <= 4 on C = 2 staged rows and at most two CTAs per SM (12 heads: batch
// 5-11): per-token shared arrays for four tokens (SharedVerify<4>, 22 KB instead of
// 40), built for four CTAs per SM (96 registers), so that the next call's CTAs all find
// a slot and run their prologue and loads before the PDL wait under this call (H200,
// 12 heads, q = 2-4: batch 9-11 -7 to -13%; batch 5-8, where it replaced the register
// variant as the default, -4 to -10%). With more CTAs four per SM measured 6-12%
// slower (batch 12-16: some SMs then run four of this call's CTAs); the same code
// at three per SM (ptxas's 114-126 registers) was within 2% of SharedVerify<8> there,
// so those calls keep the kMaxTokens variant. [lanes 8 / 16].
constexpr int kCompactTokens = 4;
Variant g_verify_compact_variants[2] = {make_verify_variant<2, 8, true, kCompactTokens>(),
                                        make_verify_variant<2, 16, true, kCompactTokens>()};

bool is_compact_verify(const KdaDecodeParams& p, const KdaSchedule& s, int sm_count) {
  return p.tokens > 1 && p.tokens <= kCompactTokens && s.cluster == 2 && is_staged(s) &&
         int64_t(s.cluster) * p.heads * p.batch <= 2 * int64_t(sm_count);
}

// The verify variant a schedule runs.
const Variant& verify_variant(const KdaDecodeParams& p, const KdaSchedule& s, int sm_count) {
  const int lanes = s.lanes_per_row == 16 ? 1 : 0;
  if (is_compact_verify(p, s, sm_count)) return g_verify_compact_variants[lanes];
  return g_verify_variants[cluster_index(s.cluster)][lanes][is_staged(s) ? 1 : 0];
}

// Attributes (opt-in shared memory, 16-CTA clusters) and occupancies, once per device
// (function attributes belong to the device's context; `device` is the current one).
Result init_variants(int device) {
  static std::once_flag once[kMaxDevices];
  static Result results[kMaxDevices];
  if (device < 0 || device >= kMaxDevices) {
    return Result::error(Status::kInvalidValue, "kda_decode: device = %d out of [0, %d)", device, kMaxDevices);
  }
  Result& result = results[device];
  std::call_once(once[device], [device, &result] {
    detail::InitErrorScope errors;  // a failure of this setup is reported, never left pending
    // Every variant table, counted from the tables themselves (a table that grows cannot
    // overrun this array).
    constexpr size_t kVariantCount = (sizeof(g_dense_variants) + sizeof(g_verify_compact_variants) +
                                      sizeof(g_stream_variants) + sizeof(g_variants) + sizeof(g_verify_variants)) /
                                     sizeof(Variant);
    Variant* all[kVariantCount];
    int count = 0;
    for (Variant& v : g_dense_variants) all[count++] = &v;
    for (Variant& v : g_verify_compact_variants) all[count++] = &v;
    for (auto& by_cluster : g_stream_variants) {
      for (Variant& v : by_cluster) all[count++] = &v;
    }
    for (auto& by_cluster : g_variants) {
      for (auto& by_lanes : by_cluster) {
        for (Variant& v : by_lanes) all[count++] = &v;
      }
    }
    for (auto& by_cluster : g_verify_variants) {
      for (auto& by_lanes : by_cluster) {
        for (Variant& v : by_lanes) all[count++] = &v;
      }
    }
    for (int i = 0; i < count; ++i) {
      Variant& v = *all[i];
      const void* fn = reinterpret_cast<const void*>(v.fn);
      Result r = detail::cuda_result(
          cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, int(v.max_dynamic_smem)),
          "cudaFuncSetAttribute(kda fused, MaxDynamicSharedMemorySize)");
      if (r.ok()) {
        r = detail::cuda_result(cudaFuncSetAttribute(fn, cudaFuncAttributeNonPortableClusterSizeAllowed, 1),
                                "cudaFuncSetAttribute(kda fused, NonPortableClusterSizeAllowed)");
      }
      if (r.ok()) {
        r = detail::cuda_result(
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&v.ctas_per_sm[device], fn, kThreads,
                                                          v.one_buffer_smem),
            "cudaOccupancyMaxActiveBlocksPerMultiprocessor(kda fused)");
      }
      if (r.ok()) {
        r = detail::cuda_result(
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&v.two_buffer_ctas_per_sm[device], fn, kThreads,
                                                          v.max_dynamic_smem),
            "cudaOccupancyMaxActiveBlocksPerMultiprocessor(kda fused, two state buffers)");
      }
      if (!r.ok()) {
        result = r;
        return;
      }
    }
  });
  return result;
}

// q = 1 work (heads x batch) from which C = 1 copies its state after the activations
// (early 1), measured on the H200 (docs/benchmarks.md, 13th session).
constexpr int64_t kLateStateCopyWork = 29 * 12;

// Defaults by the work of the call, heads x batch counted in 12-head requests
// (docs/benchmarks.md holds the H200 sweeps behind them). q = 1, 16 lanes per row,
// state rows read into registers before the PDL wait (early 1) except where noted:
// 1 request (or batch 1 of up to 48 heads) 8 CTAs per head, up to 10 requests 4 (8
// lanes at 6-7), up to 16 requests 2 (8 lanes at 11), beyond one CTA per head (state
// staged, evict-first: before the PDL wait up to 29 requests, after the activations
// from 30).
// Evict-first is chosen only when the whole schedule is left to the defaults (its
// `false` cannot mean "default").
// The FMA-tree gate keeps check()'s rule (cluster >= 4, early <= 1). Verify (q > 1,
// early <= 2), from the 11th session's sweep (12 heads batch 3-16, 24 heads 2-8, q = 2-4, 8)
// (docs/benchmarks.md): 8 CTAs per head, 8 lanes, staged, for 1 request (batch 1 up to
// 48 heads); 4 (8 lanes, registers) for 2 requests; 4 (16 lanes) for 3-4 requests in
// registers and for 6-7 staged (8 requests of 4-CTA clusters no longer run in one
// wave); 2 (8 lanes, staged) for 5 and 8-16 requests (q > 4 with 9-11 requests: 16
// lanes, registers); then one CTA per head (16 lanes, staged in chunks).
KdaSchedule resolve_schedule(const KdaDecodeParams& p) {
  KdaSchedule s = p.schedule;
  const bool all_default = s.cluster == 0 && s.lanes_per_row == 0 && s.early < 0 && !s.evict_first &&
                           s.min_ctas_per_sm == 0;
  const int64_t work = int64_t(p.heads) * p.batch;  // 12 = one 12-head request
  const bool fma_gate = p.gate_mode == KdaGateMode::kFmaTree && p.raw_gate == nullptr;
  int cluster, lanes = 16, early = 1;
  bool evict = true;
  if (p.tokens > 1) {
    evict = false;
    if (work <= 12 || (p.batch == 1 && work <= 4 * 12)) {
      cluster = 8, lanes = 8, early = 2;
    } else if (work <= 2 * 12) {
      cluster = 4, lanes = 8, early = 1;
    } else if (work <= 4 * 12) {
      cluster = 4, lanes = 16, early = 1;
    } else if (work >= 6 * 12 && work <= 7 * 12) {  // staged 4-CTA clusters, still one wave
      cluster = 4, lanes = 16, early = 2;
    } else if (work <= 16 * 12) {
      // Staged (q <= 4 at <= 2 CTAs per SM: the compact variant), but q > 4 with 9-11
      // requests keeps its state in registers.
      const bool registers = p.tokens > kCompactTokens && work > 8 * 12 && work < 12 * 12;
      cluster = 2, lanes = registers ? 16 : 8, early = registers ? 1 : 2;
    } else {
      cluster = 1, lanes = 16, early = 1;
    }
  } else if (work <= 12 || (p.batch == 1 && work <= 4 * 12)) {
    cluster = 8;
  } else if (work <= 10 * 12) {
    // 12 heads, batch 6-7: 8 lanes per row 3-7% faster; batch 9-10: C = 4 22% faster
    // than C = 2 (12th session's sweep, docs/benchmarks.md)
    cluster = 4, lanes = work > 5 * 12 && work <= 7 * 12 ? 8 : 16;
  } else if (work <= 16 * 12) {
    cluster = 2, lanes = work <= 11 * 12 ? 8 : 16;  // batch 11: 8 lanes 10% faster
  } else {
    // The state copied after the activations once the CTAs fill the wave (C = 1's
    // late_state_copy); with it C = 1 is ahead of C = 2 (the default from 129 requests
    // until the 13th session) at 129-384 requests (batch 129 / 224 / 256 / 384 -5 / -4 /
    // -2 / -3%), level at 512.
    cluster = 1, early = work > kLateStateCopyWork ? 1 : 2;
  }
  if (fma_gate) {
    cluster = std::max(cluster, 4);
    early = std::min(early, 1);
  }
  if (s.cluster == 0) s.cluster = cluster;
  if (s.lanes_per_row == 0) s.lanes_per_row = lanes;
  if (s.early < 0) s.early = (early == 3 && s.cluster > 2) ? 2 : early;
  // Several requests per cluster run on staged state: a default `early` stages it.
  if (p.tokens == 1 && s.requests_per_cluster > 1 && p.schedule.early < 0 && !fma_gate) s.early = std::max(s.early, 2);
  // Verify (q > 1): early <= 2 (check()).
  if (p.tokens > 1 && p.schedule.early < 0) s.early = std::min(s.early, 2);
  if (all_default && evict && is_staged(s)) s.evict_first = true;
  // One request per cluster by default: clusters that run several requests measured
  // slower or within noise on the H200 (docs/benchmarks.md, "requests per cluster").
  if (s.requests_per_cluster == 0) s.requests_per_cluster = 1;
  return s;
}

// Clusters per head (grid z): each runs requests b = z, z + Z, ... (docs/design.md).
int64_t clusters_per_head(const KdaDecodeParams& p, const KdaSchedule& s) {
  const int64_t r = std::max(1, s.requests_per_cluster);
  return (p.batch + r - 1) / r;
}

Result validate_schedule(const KdaSchedule& s, const KdaDecodeParams& p) {
  if (cluster_index(s.cluster) < 0) {
    return Result::error(Status::kInvalidValue, "kda_decode: schedule.cluster = %d must be 0, 1, 2, 4, 8 or 16",
                         s.cluster);
  }
  if (s.lanes_per_row != 8 && s.lanes_per_row != 16) {
    return Result::error(Status::kInvalidValue, "kda_decode: schedule.lanes_per_row = %d must be 0, 8 or 16",
                         s.lanes_per_row);
  }
  if (s.early < 0 || s.early > 3) {
    return Result::error(Status::kInvalidValue, "kda_decode: schedule.early = %d must be -1 (default) or 0-3",
                         s.early);
  }
  if (s.min_ctas_per_sm < 0 || s.min_ctas_per_sm > 32) {
    return Result::error(Status::kInvalidValue, "kda_decode: schedule.min_ctas_per_sm = %d must be in [0, 32]",
                         s.min_ctas_per_sm);
  }
  if (s.evict_first && !is_staged(s)) {
    return Result::error(Status::kInvalidValue,
                         "kda_decode: schedule.evict_first = true needs staged state (schedule.early = %d must be >= 2, "
                         "or cluster 1)",
                         s.early);
  }
  if (p.tokens > 1) {
    // check() already rejects these for a verify; the verify kernel has no variant for them.
    if (s.cluster > 8 || s.early > 2 || s.evict_first) {
      return Result::error(Status::kUnsupported,
                           "kda_decode: tokens = %d: the fused verify runs cluster 1-8 with early <= 2 and no "
                           "evict_first, have cluster %d, early %d, evict_first %d",
                           p.tokens, s.cluster, s.early, int(s.evict_first));
    }
    if (p.raw_gate == nullptr && p.gate_mode == KdaGateMode::kFmaTree) {
      return Result::error(Status::kUnsupported, "kda_decode: tokens = %d: gate_mode = 2 is q = 1 only", p.tokens);
    }
  }
  if (p.batch > 65535) {
    return Result::error(Status::kUnsupported, "kda_decode: batch = %d must be <= 65535 (grid z)", p.batch);
  }
  if (p.heads > 65535) {
    return Result::error(Status::kUnsupported, "kda_decode: heads = %d must be <= 65535 (grid y)", p.heads);
  }
  if (p.raw_gate == nullptr) {
    // The gate warp reads f_a in 8-byte pieces.
    if (p.f_a_stride % 4 != 0) {
      return Result::error(Status::kInvalidStride, "kda_decode: f_a_stride = %lld must be a multiple of 4",
                           static_cast<long long>(p.f_a_stride));
    }
    if (reinterpret_cast<uintptr_t>(p.f_a) % 8 != 0) {
      return Result::error(Status::kMisaligned, "kda_decode: f_a = %p must be 8-byte aligned",
                           static_cast<const void*>(p.f_a));
    }
    if (reinterpret_cast<uintptr_t>(p.f_b_weight) % 16 != 0) {
      return Result::error(Status::kMisaligned, "kda_decode: f_b_weight = %p must be 16-byte aligned",
                           static_cast<const void*>(p.f_b_weight));
    }
  }
  if (reinterpret_cast<uintptr_t>(p.state) % 16 != 0) {
    return Result::error(Status::kMisaligned, "kda_decode: state = %p must be 16-byte aligned",
                         static_cast<const void*>(p.state));
  }
  return Result::success();
}

FusedArgs make_args(const KdaDecodeParams& p, const KdaSchedule& s) {
  FusedArgs a{};
  a.x = p.x;
  a.x_stride = p.x_stride;
  a.f_a = p.f_a;
  a.f_a_stride = p.f_a_stride;
  a.raw_gate = p.raw_gate;
  a.raw_gate_stride = p.raw_gate_stride;
  a.raw_beta = p.raw_beta;
  a.raw_beta_stride = p.raw_beta_stride;
  a.output_gate = p.output_gate;
  a.output_gate_stride = p.output_gate_stride;
  a.conv_weight = p.conv_weight;
  a.conv_weight_channel_stride = p.conv_weight_channel_stride;
  a.conv_weight_tap_stride = p.conv_weight_tap_stride;
  a.conv_weight_section_stride = kda::conv_weight_section_stride(p);
  a.conv_bias = p.conv_bias;
  a.f_b_weight = p.f_b_weight;
  a.a_log = p.a_log;
  a.dt_bias = p.dt_bias;
  a.norm_weight = p.norm_weight;
  a.conv_state = p.conv_state;
  a.conv_state_slot_stride = p.conv_state_slot_stride;
  a.conv_state_channel_stride = p.conv_state_channel_stride;
  a.conv_state_tap_stride = p.conv_state_tap_stride;
  a.conv_state_slots = p.conv_state_slots;
  a.state = p.state;
  a.state_slot_stride = p.state_slot_stride;
  a.state_slots = p.state_slots;
  a.slots = p.slots;
  a.output = p.output;
  a.output_stride = p.output_stride;
  a.lower_bound = p.lower_bound;
  a.q_scale = p.q_scale;
  a.norm_eps = p.norm_eps;
  a.heads = p.heads;
  a.gate_source = p.raw_gate != nullptr ? kGateGiven
                  : p.gate_mode == KdaGateMode::kFmaTree ? kGateFma
                                                         : kGateMma;
  a.four_chains = p.gate_mode == KdaGateMode::kFourChains;
  a.early = s.early;
  a.evict_first = s.evict_first;
  // Batch 1, q = 1: dependents released at entry. The verify releases them after its conv
  // at every batch: at entry, the next launch's CTAs shared SMs with this one's critical
  // chain (H200, 12 heads, batch 1: q = 2 / 4 / 8 5.44 / 7.65 / 11.91 -> 5.24 / 7.08 /
  // 10.58 us; q = 1 keeps it: 2.94 vs 2.98 us, 48 heads 4.28 vs 4.56).
  a.trigger_at_entry = p.batch == 1 && p.tokens == 1;
  a.conv_weight_bf16 = p.conv_weight_dtype == DType::kBf16;
  a.conv_state_bf16 = p.conv_state_dtype == DType::kBf16;
  a.batch = p.batch;
  a.state_buffers = 1;
  return a;
}

VerifyArgs make_verify_args(const KdaDecodeParams& p, const KdaSchedule& s) {
  VerifyArgs v{};
  v.base = make_args(p, s);
  v.tokens = p.tokens;
  v.slots_stride = p.slots_stride;
  v.accepted = p.accepted;
  v.token_counts = p.token_counts;
  v.record_correction = p.record_correction;
  v.record_key_gate = p.record_key_gate;
  v.record_rows = p.record_rows;
  v.record_slots = p.record_slots;
  return v;
}

// Whether the gate warp stages its F_B fragments in shared memory: q = 1 at early 3 or
// in clusters that run several requests; verify at early 1 with C >= 2.
bool stages_fb(const KdaDecodeParams& p, const KdaSchedule& s) {
  if (p.raw_gate != nullptr || p.gate_mode == KdaGateMode::kFmaTree) return false;
  return p.tokens > 1 ? s.early == 1 && s.cluster >= 2 : s.early == 3 || s.requests_per_cluster > 1;
}

size_t dynamic_smem_for(const KdaSchedule& s, bool verify, bool stage_fb, int state_buffers = 1) {
  const bool staged = is_staged(s);
  if (verify) {
    switch (s.cluster) {
      case 1: return verify_dynamic_smem_bytes<1>(staged, stage_fb);
      case 2: return verify_dynamic_smem_bytes<2>(staged, stage_fb);
      case 4: return verify_dynamic_smem_bytes<4>(staged, stage_fb);
      default: return verify_dynamic_smem_bytes<8>(staged, stage_fb);
    }
  }
  switch (s.cluster) {
    case 1: return dynamic_smem_bytes<1>(staged, stage_fb, state_buffers);
    case 2: return dynamic_smem_bytes<2>(staged, stage_fb, state_buffers);
    case 4: return dynamic_smem_bytes<4>(staged, stage_fb, state_buffers);
    case 8: return dynamic_smem_bytes<8>(staged, stage_fb, state_buffers);
    default: return dynamic_smem_bytes<16>(staged, stage_fb, state_buffers);
  }
}

}  // namespace

Result plan(const KdaDecodeParams& params, const DeviceInfo& device, KdaDecodePlan* out) noexcept {
  if (out == nullptr) return Result::error(Status::kNullPointer, "kda_decode plan: out is null");
  FS_TRY(check(params, device));
  const KdaSchedule s = resolve_schedule(params);
  FS_TRY(validate_schedule(s, params));
  {
    // The resolved schedule obeys the same rules as an explicit one.
    KdaDecodeParams resolved = params;
    resolved.schedule = s;
    FS_TRY(check(resolved, device));
  }
  if (!device.cluster_launch || device.cc_major < 9) {
    return Result::error(Status::kDeviceUnsupported,
                         "kda_decode: the fused kernel needs thread-block clusters (sm_90+), device has cc %d.%d",
                         device.cc_major, device.cc_minor);
  }
  out->schedule = s;
  out->ctas = int64_t(s.cluster) * params.heads * clusters_per_head(params, s);
  // Estimate (pure host): CTAs per SM bounded by shared memory, 160-thread blocks and
  // ~128 registers per thread (96 for the variants built for four CTAs per SM); the
  // launch itself does not depend on it.
  const bool stage_fb = stages_fb(params, s);
  const bool compact = is_compact_verify(params, s, device.sm_count);
  const int64_t static_smem = params.tokens == 1 ? int64_t(sizeof(SharedCore))
                              : compact          ? int64_t(sizeof(SharedVerify<kCompactTokens>))
                                                 : int64_t(sizeof(SharedVerify<kMaxTokens>));
  const int buffers = params.tokens == 1 && is_staged(s) && s.requests_per_cluster > 1 ? 2 : 1;
  const int64_t smem = int64_t(dynamic_smem_for(s, params.tokens > 1, stage_fb, buffers)) + static_smem + 1024;
  const int64_t registers = compact || (params.tokens == 1 && is_dense(s)) ? 96 : 128;
  int64_t per_sm = std::min<int64_t>(2048 / kThreads, 65536 / (kThreads * registers));
  if (device.max_smem_per_block_optin > 0) per_sm = std::min<int64_t>(per_sm, (device.max_smem_per_block_optin + 1024) / smem);
  per_sm = std::max<int64_t>(per_sm, 1);
  const int64_t slots = std::max<int64_t>(int64_t(device.sm_count) * per_sm, 1);
  out->waves = static_cast<int>((out->ctas + slots - 1) / slots);
  return Result::success();
}

Result launch(const KdaDecodeParams& params, const LaunchOptions& options, cudaStream_t stream) noexcept {
  const DeviceInfo* device = nullptr;
  FS_TRY(detail::resolve_device(options, &device));
  KdaDecodePlan pl;
  FS_TRY(plan(params, *device, &pl));
  if (params.batch == 0) return Result::success();
  FS_TRY(init_variants(device->device));
  const KdaSchedule& s = pl.schedule;
  const bool verify = params.tokens > 1;
  const bool streams = s.requests_per_cluster > 1;
  const Variant& v = verify ? verify_variant(params, s, device->sm_count) : decode_variant(s);
  FusedArgs args = make_args(params, s);
  const bool stage_fb = stages_fb(params, s);
  // Clusters that run several requests prefetch the next one's rows into a second buffer
  // where that fits with the occupancy asked for (else they run on one buffer).
  const int want_ctas = std::max(1, s.min_ctas_per_sm);
  if (streams && v.two_buffer_ctas_per_sm[device->device] >= want_ctas) args.state_buffers = 2;
  const int fits = args.state_buffers == 2 ? v.two_buffer_ctas_per_sm[device->device] : v.ctas_per_sm[device->device];
  // An explicit occupancy request is a promise to check; the default's is a preference.
  if (params.schedule.min_ctas_per_sm > 0 && s.min_ctas_per_sm > fits) {
    return Result::error(Status::kUnsupported,
                         "kda_decode: schedule.min_ctas_per_sm = %d exceeds the %d CTAs per SM this variant fits",
                         s.min_ctas_per_sm, fits);
  }

  detail::LaunchConfig config(
      dim3(static_cast<unsigned>(s.cluster), static_cast<unsigned>(params.heads),
           static_cast<unsigned>(clusters_per_head(params, s))),
      dim3(kThreads), dynamic_smem_for(s, verify, stage_fb, args.state_buffers), stream);
  config.cluster(static_cast<unsigned>(s.cluster)).pdl(options.pdl);
  if (verify) {
    const VerifyArgs verify_args = make_verify_args(params, s);
    return detail::cuda_result(
        cudaLaunchKernelEx(config.get(), reinterpret_cast<void (*)(VerifyArgs)>(v.fn), verify_args),
        "cudaLaunchKernelEx(kda fused verify)");
  }
  return detail::cuda_result(cudaLaunchKernelEx(config.get(), v.fn, args), "cudaLaunchKernelEx(kda fused)");
}

#if defined(FUSEDSTEP_TRACE)
namespace detail {
// The trace of the last fused launch, q = 1 or verify (trace::kWords words).
int kda_read_trace(unsigned long long* host, int max_words) {
  return trace::read_buffer(g_trace, host, max_words);
}
}  // namespace detail
#endif

}  // namespace fusedstep
