// mHC boundary: the fused one-wave kernel (one launch per seam) and the host dispatch of
// both fused kernels (the opt-in persistent one is persistent.cu).
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
// of a token's position, so outputs are batch invariant and deterministic. Control flow
// never depends on data (NaN / Inf inputs cannot stall the exchange).
#include <cooperative_groups.h>
#include <cuda/ptx>
#include <cuda_pipeline.h>

#include <algorithm>
#include <mutex>

#include "common/dev_trace.cuh"
#include "common/device_math.cuh"
#include "common/internal.h"
#include "common/launch.h"
#include "common/ptx.cuh"
#include "fusedstep/mhc_boundary.h"
#include "mhc_boundary/check.h"
#include "mhc_boundary/fused_parts.cuh"
#include "mhc_boundary/layout.h"
#include "mhc_boundary/persistent.h"
#include "mhc_boundary/stage_math.cuh"

namespace fusedstep {
namespace mhc {
namespace {

namespace cg = cooperative_groups;
using namespace parts;

// 8 warps, all of them MMA warps: two CTAs of 256 threads per SM keep many 16-CTA
// clusters co-resident and leave 128 registers per thread, enough for all n8 tiles of
// a TF32 tile in one pass with the A fragments of 3 steps in flight (384 threads
// leave 80 and forced two passes, i.e. twice the L2 weight traffic).
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
// Two configurations of the same kernel (a token's bits never depend on which runs):
//  - two CTAs per SM (kCtasPerSm = 2): 112 KB of dynamic shared memory each, so that two
//    fit the 228 KB of an sm_90 SM (1 KB reserved per CTA) and many clusters are
//    co-resident; the k steps that do not fit are streamed from L2 into registers;
//  - one CTA per SM (kCtasPerSm = 1), for T <= 24 / 32 (plan()): 227 KB, enough to stage
//    the whole weight slice (TF32 modes) before the PDL wait. Measured on the H200
//    (T = 1, hidden 5120): weight wait + GEMM 2.1 us with 3 of 10 steps per warp
//    streamed, 1.7 us with all staged; 9.9 -> 7.9 us per call with the other changes.
// One fixed size per configuration gives one occupancy figure.
constexpr int kSmemBytesTwo = 112 * 1024;
constexpr int kSmemBytesOne = 227 * 1024;
__host__ __device__ constexpr int smem_bytes_of(int ctas_per_sm) {
  return ctas_per_sm == 1 ? kSmemBytesOne : kSmemBytesTwo;
}
constexpr int kSmemBytes = kSmemBytesTwo;  // the two-CTA configuration (plan's tile limit)
// Tokens per cluster; plan() takes the smallest that runs the batch in one wave, among
// those whose shared-memory layout fits kSmemBytes for the hidden size (tile 8 only up to
// kSmallTileMaxClusters clusters). No tile below 8 in general: a CTA's latency is about
// the same for 1 to 8 tokens (one n8 MMA tile), while every extra cluster streams the
// whole weight from L2 again (measured on the H200: 11.2 us at 4 one-token clusters,
// 14.3 us at 8); but see one_task_tile() for the one-CTA configuration.
constexpr int kTiles[] = {8, 16, 24, 32};
// The one-CTA-per-SM configuration runs tile 8 for at most three clusters (T <= 24) at
// hidden 4096, four (T <= 32) at 5120, seven (T <= 56, its whole wave on the H200) from
// 7168: the larger the slice,
// the less of it the two-CTA kernel stages, and the more the one-CTA kernel's whole
// staged slice is worth. H200, same-run A/Bs, two rounds (22nd session, after the one-CTA
// kernel lost its later-rounds code; earlier ones in the prediction log of
// docs/benchmarks.md), against the two-CTA plan of the same T: four clusters, T = 25 /
// 28 / 32, +2.7 / -0.9 / -1.5% at hidden 4096 (so not taken), -3.0 / -4.1 / -3.1% at
// 5120 (against tiles of 6; FP32 T = 28 / 32 -2.4 / -1.7%); five clusters, T = 33 / 36 /
// 40, +4.0 / +1.3 / +0.8% at 4096, +1.0 / +1.5 / +1.7% at 5120, -4.7 / -5.2 / -7.0% at
// 7168; at 7168 six clusters, T = 41 / 44 / 48, -1.1 / -2.0 / -2.6%, seven, T = 49 / 52 /
// 56, -0.1 / -0.9 / -3.0%.
constexpr int kSmallTile = 8;
constexpr int one_cta_max_clusters(int64_t hidden) { return hidden >= 7168 ? 7 : (hidden >= 5120 ? 4 : 3); }
// 32-wide chunks of a CTA's hidden slice (k steps 8c .. 8c + 7 of each stream).
int wide_chunks_of(int64_t hidden) { return static_cast<int>(slice_of(hidden) / 32); }
// The most tokens (up to 8) whose elementwise items (a token's 32-wide chunks of the
// slice) make at most one task per warp: 8 at hidden 4096, 6 at 5120, 4 at 7168. Tile 8
// gives two warps of a CTA a second task from hidden 5120 (1 us more at T = 8 than at
// T = 4 on the H200), so the one-CTA configuration takes this tile instead where the
// batch has more tokens than it and its clusters fit half the one-CTA wave (so that the
// next call's clusters still find free GPCs for their prologue). H200, same-run A/B, two
// rounds (21st session): hidden 5120 T = 7-16 -8.6 to -11.4% (T = 8 7.50 -> 6.68 us),
// hidden 7168 T = 5-12 -3.6 to -13.1% (T = 8 8.53 -> 7.41); FP32 -7 to -9% at T = 8. Four
// clusters of it measured slower than three (5120 T = 20 +1.6%) or two (7168 T = 16
// +1.4%) of tile 8.
int one_task_tile(int64_t hidden) {
  const int wide_chunks = wide_chunks_of(hidden);
  int tile = kSmallTile;
  while (tile > 1 && packed_tasks(tile, wide_chunks) > kWarps) --tile;
  return tile;
}
// The two-CTA configuration takes tile 8 for at most 11 clusters (T <= 88), tile 16 above.
// H200 (17th session, docs/benchmarks.md, hidden 4096 / 5120 / 7168): at T = 112 fourteen
// tile-8 clusters (two per GPC) 11.69 / 12.81 / 15.91 us against seven of tile 16
// 10.89 / 12.37 / 15.22; at T = 96-108 tile 16 1-6.5% faster but for hidden 7168 at
// T = 97-100 (+0-3%); at T = 80 (ten clusters) tile 8 2-4% faster.
constexpr int kSmallTileMaxClusters = 11;
// Where the tile above would need more than half the two-CTA wave (so that two clusters
// share a GPC's SMs), plan() takes half the wave of ceil(T / half) tokens instead, if that
// tile is at most kHalfWaveMaxTile, fits and needs no more GEMM passes; from tile 8 only
// from hidden 5120. On the H200 (7 clusters): tiles 9-13 instead of 8 at T = 57-88 from
// hidden 5120, tiles 17-24 instead of 16 (and 24) at T = 113-168 at hidden 4096 and 5120.
// H200, same-run A/Bs, two rounds (21st session): hidden 5120 T = 57-88 -3.5 to -5.7%,
// T = 113-168 -5.6 to -12.4% (T = 113 14.59 -> 12.78 us); hidden 7168 T = 57-88 -5.8 to
// -7.9%; hidden 4096 T = 113-160 -3.7 to -6.9%. Measured slower, so excluded: hidden 4096
// from tile 8 (T = 57 / 64 +3 / +4%, as in the 17th session), tiles 28 and 32 at hidden
// 4096 (T = 192 / 224 +2.4 / +3.1%), and FP32 tiles 19-23 (two GEMM passes where tile 16
// takes one, +12 to +14%). FP32 from tile 8: T = 64 / 80 -3 / -3% (5120), -7.5 / -6% (7168).
constexpr int kHalfWaveMaxTile = 24;
constexpr int64_t kHalfWaveFromSmallTileMinHidden = 5120;
// A tile rounded up to whole n8 MMA tiles (its padding tokens are zeros).
FS_HD constexpr int n8_padded(int tile) { return (tile + 7) / 8 * 8; }
// n8 token tiles per pass of a kernel's GEMM over the k steps (what the accumulators'
// registers allow); a tile of more tokens takes more passes with the same chains, each
// re-reading the weight slice. Tile 8 is one n8 tile: a pass of one keeps the GEMM's code
// to what runs (a small-T call runs most of its code once, so its size counts:
// docs/design.md). H200, same-run A/Bs: one CTA per SM T = 1-4 3-6% faster, T = 8-24
// 0-3.5% (19th session); two CTAs per SM at FP32, T = 32-80 -2 to -7% (20th session);
// but TF32 two CTAs per SM T = 32-80 +3 to +8%, so that kernel keeps passes of four.
constexpr int n8_tiles_per_pass(int m_tiles, int ctas_per_sm, bool wide_tile) {
  return !wide_tile && (ctas_per_sm == 1 || m_tiles == 5) ? 1 : (m_tiles == 3 ? 4 : 2);
}
// GEMM passes of the two-CTA kernel that kernel_for() picks for `tile`.
constexpr int two_cta_gemm_passes(int m_tiles, int tile) {
  const int per_pass = n8_tiles_per_pass(m_tiles, 2, tile > kSmallTile);
  return (n8_padded(tile) / 8 + per_pass - 1) / per_pass;
}
// Elementwise tasks whose loads a warp keeps in flight: a round of the elementwise pass
// is kTasksInFlight * kWarps tasks. Two with one CTA per SM too (where registers allow
// four): its tiles have at most 14 tasks for 8 warps, and the smaller code measured 1-5%
// faster at T = 1-16, FP32 rounding 8% (H200, 16th session).
constexpr int kTasksInFlight = 2;
// The one-CTA kernel has no code for a second round of the elementwise pass: the loop
// that the two-CTA kernel keeps for later rounds, never run there, made its code 77
// rather than 60 KB and its calls slower (H200, same-run A/B, three rounds, 22nd session:
// hidden 5120 T = 1 / 8 / 24 -3.2 / -1.9 / -6.0%, 7168 T = 1 / 16 / 32 -4.0 / -5.8 / -5.0%,
// 4096 T = 4-24 -1.7 to -2.0%). So the one-CTA configuration runs only where tile 8's items
// fit one round (hidden <= 8192). (The same cut in the two-CTA packed-items kernels
// measured 6-10% slower at TF32, and so did the tile-8 two-CTA kernel's: 7-10% at
// hidden 4096-7168 T = 32-48, FP32 about 1% faster. Why is not known: their executed
// code, the GEMM included, has the same instruction mix either way (nvdisasm), at 124-128
// of their 128 registers and no spills; the hot code's placement is untested.)
bool one_cta_fits_one_round(int64_t hidden) {
  return packed_tasks(kSmallTile, wide_chunks_of(hidden)) <= kTasksInFlight * kWarps;
}
// Whether a two-CTA tile of more than 8 tokens runs the packed-items variant: only the
// valid tokens' items in tasks (packed_task_item, as the one-CTA kernel), where that
// makes the elementwise pass one round instead of two (hidden 5120 tiles 9-12, hidden
// 7168 tile 9). H200, same-run A/B, two rounds (21st session): hidden 5120 T = 57 / 64 /
// 72 / 80 -3.1 / -1.5 / -3.8 / -2.1%, 7168 T = 57 -3.1%, every other row unchanged. (The
// packed mapping for every wide tile was 4-5% slower where it saved no round: 7168
// T = 64-96, full tiles at T = 2048.)
bool packed_saves_a_round(int tile, int64_t hidden) {
  const int wide_chunks = wide_chunks_of(hidden);
  const int round = kTasksInFlight * kWarps;
  return tile > kSmallTile && packed_tasks(tile, wide_chunks) <= round &&
         tile_tasks(n8_padded(tile), wide_chunks) > round;
}
// Byte offsets of the shared-memory regions for one (tile, slice).
struct SmemLayout {
  int tp;        // tile rounded up to whole n8 MMA tiles
  int chunks;    // 8-wide chunks per slice
  uint32_t bar;  // mbarriers: the exchange, the weight staging
  uint32_t hc;   // scale[3] | base[24]
  uint32_t res;  // new residual as B fragments: [k step][tp][4 lanes q] x 8 bytes
  uint32_t ssq;  // chunk sums of squares: [residual, li][tp][ssq_pitch(chunks)]
  uint32_t coef; // [tp][kCoefFloats]
  uint32_t mixp; // warp partial mixes: [8 warps][tp][kMixpFloats]
  uint32_t slice_ssq;  // slice sums of squares: [residual, li][tp]
  uint32_t recv_mix;   // pushed to the owner: [kMaxOwned][16 slices][kRecvFloats]
  uint32_t recv_li;    // li sums of squares of every tile token: [16 slices][tp]
  uint32_t rstd_li;    // [tp]
  uint32_t coef_out;   // owned tokens: [kMaxOwned][mix totals 24 | residual sum of squares]
  uint32_t norm;       // this slice of norm_weight (BF16)
  uint32_t total;
  uint32_t stage;  // the rest of kSmemBytes: leading k steps of each MMA warp's A fragments
};

FS_HD SmemLayout smem_layout(int tile, int64_t slice) {
  SmemLayout L{};
  L.tp = n8_padded(tile);
  L.chunks = static_cast<int>(slice / 8);
  RegionAllocator regions;
  auto take = [&regions](uint64_t bytes) { return regions.take(bytes); };
  const uint64_t tp = static_cast<uint64_t>(L.tp);
  L.bar = take(16);
  L.hc = take(32 * 4);
  L.res = take(static_cast<uint64_t>(k_steps(slice * kCluster)) * tp * 4 * 8);
  L.ssq = take(2 * tp * static_cast<uint64_t>(ssq_pitch(L.chunks)) * 4);
  L.coef = take(tp * kCoefFloats * 4);
  L.mixp = take(static_cast<uint64_t>(kMmaWarps) * tp * kMixpFloats * 4);
  L.slice_ssq = take(2 * tp * 4);
  L.recv_mix = take(kMaxOwned * kCluster * kRecvFloats * 4);
  L.recv_li = take(kCluster * tp * 4);
  L.rstd_li = take(tp * 4);
  L.coef_out = take(kMaxOwned * kCoefOutFloats * 4);
  L.norm = take(static_cast<uint64_t>(slice) * 2);
  L.total = regions.end;
  L.stage = regions.aligned_end();
  return L;
}

#if defined(FUSEDSTEP_TRACE)
// Development trace (common/dev_trace.cuh): phase boundaries of the last launch, as
// thread 32 * who sees them. Read by fusedstep-bench's trace build.
__device__ unsigned long long g_trace[trace::kWords];
#endif
#define MHC_TRACE(ev, who) FS_TRACE(g_trace, ev, 32 * (who))

// kMTiles: m16 tiles of the stacked weight parts (3 for the TF32 modes, 5 for FP32);
// kWideTile: built for tiles of more than 8 tokens (the tile-8 build runs any tile too,
// in more GEMM passes).
template <int kMTiles, int kCtasPerSm, bool kWideTile, bool kPackedItems = false>
__global__ void __launch_bounds__(kThreads, kCtasPerSm) fused_boundary_kernel(const KernelArgs args) {
  constexpr int kSmem = smem_bytes_of(kCtasPerSm);
  constexpr int kNtPass = n8_tiles_per_pass(kMTiles, kCtasPerSm, kWideTile);
  // mixer_gemm's kStagedOnce, where it measured faster (TF32 tiles of more than 8).
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
  MHC_TRACE(0, 0);

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
  // cp.async from every thread, waited for at the end of the elementwise pass; two CTAs
  // per SM by bulk copies of thread 0 on bar_weight. H200, same run (6th session): bulk
  // copies had the one-CTA slice land about 5 us after the CTA started (trace, T = 1);
  // cp.async with the item order below: T = 1 7.81 -> 7.23 us. In the two-CTA
  // configuration both measured 1-3% slower (T = 32 ... 2048).
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
  // is a GPU-scope fence that waited for thread 0's bulk copies of the weight: on the
  // H200 trace its prologue took 2.7 us at T = 1 and held the elementwise pass back.)
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
  MHC_TRACE(1, 0);

  ptx::griddep_wait();
  MHC_TRACE(2, 0);

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
    MHC_TRACE(16, 0);
    if constexpr (kCtasPerSm == 1) {
      // One copy of the task code, run again for a warp's second task with that task's
      // inputs moved over (53 rather than 60 KB of code): H200, same-run A/B, three rounds
      // (22nd session), hidden 5120 T = 20 / 24 -1.9 / -1.8%, T = 1-16 -0.5 to -0.8%,
      // 4096 T = 1 -1.2%, 7168 0 to -0.4%; FP32 unchanged. (Not tried in the two-CTA
      // kernels: cutting their code measured slower there, one_cta_fits_one_round().)
      static_assert(kTasksInFlight == 2, "the second task's inputs move over");
      ChunkInputs cur = in[0];
#pragma unroll 1
      for (int d = 0; d < kTasksInFlight; ++d) {
        if (warp + d * kWarps >= tasks) break;
        run_task(warp + d * kWarps, cur);
        if (d == 0) MHC_TRACE(17, 0);
        cur = in[1];
      }
    } else {
#pragma unroll
      for (int d = 0; d < kTasksInFlight; ++d) {
        if (warp + d * kWarps < tasks) run_task(warp + d * kWarps, in[d]);
        if (d == 0) MHC_TRACE(17, 0);
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
  // included: a warp done with its elementwise tasks issues them while the others finish.
  // (Traced at T >= 128, a warp spends 0.9-1.8 us here, 0.1 us at T = 1, with nothing
  // reading the loads' registers yet; before the barrier that overlaps the wait for the
  // others. H200, same-run A/B, two rounds, 24th session: T = 64-2048 -0.2 to -2.2%,
  // T <= 32 within 0.5%.)
  gemm.prime();
  if constexpr (kStageByThreads) __pipeline_wait_prior(0);  // this thread's staged weight steps
  __syncthreads();
  MHC_TRACE(3, 0);
  if (tid < 3 + kMixes) s_hc[tid] = hc_value;  // read after the barrier that follows the GEMM
  // ---- slice sums of squares, chunks in order from +0 (residual [t], li [tp + t]),
  // while the weight arrives (published by the barrier after the GEMM)
  if (tid < 2 * tp) s_slice[tid] = slice_sum(s_ssq + tid * ssq_row, chunks);
  MHC_TRACE(14, 0);

  // ---- mixer GEMM (the weight slice's staged steps have landed)
  while (!cuda::ptx::mbarrier_try_wait_parity(cuda::ptx::sem_acquire, cuda::ptx::scope_cta, bar_weight, 0u)) {
  }
  MHC_TRACE(4, 0);
  mixer_gemm<kMTiles, kNtPass, true, kStagedOnce>(gemm, s_res, tp, warp, lane, s_mixp, [] { MHC_TRACE(15, 0); });
  MHC_TRACE(5, 0);
  __syncthreads();

  MHC_TRACE(6, 0);
  // ---- exchange: every peer's barrier is initialized once the cluster barrier opens
  cluster.barrier_wait();
  MHC_TRACE(7, 0);
  // owners: token t by rank t % 16 (shift 0)
  push_exchange(cluster, tid, kThreads, tile, tp, rank, 0, s_mixp, s_slice, s_recv_mix, s_recv_li, bar);
  MHC_TRACE(8, 0);
  while (!cuda::ptx::mbarrier_try_wait_parity(cuda::ptx::sem_acquire, cuda::ptx::scope_cluster, bar, 0u)) {
  }
  MHC_TRACE(9, 0);
  // Everything this CTA receives has landed; the final cluster barrier keeps every CTA
  // alive until its peers can say the same. Its arrives are relaxed (nothing after the
  // barrier reads another CTA's shared memory): the release form would first wait for
  // this thread's DSMEM pushes to land (the T = 1 trace: 0.6 us from the receive to the
  // end of the 16-slice sums when the coefficient warp arrived with release). The
  // coefficient warp arrives after its coefficients.
  if (warp != kWarps - 1) cuda::ptx::barrier_cluster_arrive(cuda::ptx::sem_relaxed);
  ptx::griddep_launch_dependents();

  if (warp == kWarps - 1) {
    // ---- coefficients of the owned tokens: slices summed in rank order from +0, one
    // lane per (token, mix or residual sum of squares), then one half warp per token.
    // The mixes go through shared memory: registers are short under two CTAs per SM.
    // The sum of squares is parked after the token's mixes.
    sum_owned_slices(lane, owned, s_recv_mix, s_coef_out);
    __syncwarp();
    MHC_TRACE(13, kWarps - 1);
    write_coefficients(args, lane, owned, rank, valid, t0, s_coef_out, s_hc);  // first owned: rank
    // This warp's arrive on the final cluster barrier (it only says "received").
    cuda::ptx::barrier_cluster_arrive(cuda::ptx::sem_relaxed);
    MHC_TRACE(10, kWarps - 1);
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
    MHC_TRACE(11, 0);
  }
  cluster.barrier_wait();
  MHC_TRACE(12, 0);
}

// Grid of `clusters` 16-CTA clusters.
dim3 grid_of(int64_t clusters) { return dim3(static_cast<unsigned>(clusters * kCluster), 1, 1); }

using KernelFn = void (*)(KernelArgs);
// The kernel for a rounding, configuration, tile and hidden size.
KernelFn kernel_for(WeightRounding rounding, int ctas_per_sm, int tile, int64_t hidden) {
  const bool fp32 = m_tiles(rounding) == 5;
  if (ctas_per_sm == 1) return fp32 ? fused_boundary_kernel<5, 1, false> : fused_boundary_kernel<3, 1, false>;
  if (packed_saves_a_round(tile, hidden)) {
    return fp32 ? fused_boundary_kernel<5, 2, true, true> : fused_boundary_kernel<3, 2, true, true>;
  }
  // Tiles of fewer than 8 tokens (one_task_tile()): one task per warp only when packed.
  if (tile < kSmallTile) {
    return fp32 ? fused_boundary_kernel<5, 2, false, true> : fused_boundary_kernel<3, 2, false, true>;
  }
  if (tile > kSmallTile) return fp32 ? fused_boundary_kernel<5, 2, true> : fused_boundary_kernel<3, 2, true>;
  return fp32 ? fused_boundary_kernel<5, 2, false> : fused_boundary_kernel<3, 2, false>;
}
// Every kernel kernel_for() returns, with its configuration.
struct KernelOf {
  KernelFn fn;
  int ctas_per_sm;
};
constexpr KernelOf kAllKernels[] = {
    {fused_boundary_kernel<3, 2, false>, 2}, {fused_boundary_kernel<3, 2, true>, 2},
    {fused_boundary_kernel<5, 2, false>, 2}, {fused_boundary_kernel<5, 2, true>, 2},
    {fused_boundary_kernel<3, 2, true, true>, 2}, {fused_boundary_kernel<5, 2, true, true>, 2},
    {fused_boundary_kernel<3, 2, false, true>, 2}, {fused_boundary_kernel<5, 2, false, true>, 2},
    {fused_boundary_kernel<3, 1, false>, 1}, {fused_boundary_kernel<5, 1, false>, 1}};

// (All of the unified L1 as shared memory, so that two CTAs always fit.)
cudaError_t set_attributes(KernelFn fn, int smem_bytes) {
  return set_cluster_kernel_attributes(reinterpret_cast<const void*>(fn), smem_bytes);
}

// Kernel attributes, set once per device (the device must be current): the two-CTA
// configuration always, the one-CTA one where the device has its 227 KB of opt-in
// shared memory (`one_cta` says whether it was). A failure is returned as a Result
// with the runtime's text, every call after it returns the same, and the runtime's
// last-error slot is left as the caller had it (detail::InitErrorScope).
constexpr int kMaxDevices = 64;
Result set_kernel_attributes(int device, bool* one_cta = nullptr) {
  static std::once_flag once[kMaxDevices];
  static Result status[kMaxDevices];
  static bool one_cta_set[kMaxDevices];
  if (device < 0 || device >= kMaxDevices) {
    return Result::error(Status::kInvalidValue, "mhc_boundary: device = %d out of [0, %d)", device, kMaxDevices);
  }
  std::call_once(once[device], [device] {
    detail::InitErrorScope errors;
    int optin = 0;
    Result r = detail::cuda_result(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
                                   "cudaDeviceGetAttribute(MaxSharedMemoryPerBlockOptin)");
    for (const KernelOf& k : kAllKernels) {
      if (!r.ok()) break;
      if (k.ctas_per_sm == 2) {
        r = detail::cuda_result(set_attributes(k.fn, kSmemBytesTwo),
                                "cudaFuncSetAttribute(mhc_boundary, two CTAs per SM)");
      } else if (optin >= kSmemBytesOne) {
        r = detail::cuda_result(set_attributes(k.fn, kSmemBytesOne),
                                "cudaFuncSetAttribute(mhc_boundary, one CTA per SM)");
      }
    }
    if (r.ok() && optin >= kPersistentSmemBytes) {
      r = detail::cuda_result(persistent_set_attributes(), "cudaFuncSetAttribute(mhc_boundary, persistent)");
    }
    status[device] = r;
    one_cta_set[device] = r.ok() && optin >= kSmemBytesOne;
  });
  if (one_cta != nullptr) *one_cta = one_cta_set[device];
  return status[device];
}

// Largest tile of kTiles whose layout fits for `hidden`.
int max_tile(int64_t hidden) {
  int best = 0;
  for (int tile : kTiles) {
    if (smem_layout(tile, hidden / kCluster).total <= static_cast<uint32_t>(kSmemBytes)) best = tile;
  }
  return best;
}

}  // namespace
}  // namespace mhc

namespace detail {

Result mhc_query_clusters_per_wave(int device, int* two_cta, int* one_cta) noexcept {
  *two_cta = 0;
  *one_cta = 0;
  InitErrorScope errors;
  int previous = 0;
  FS_TRY(cuda_result(cudaGetDevice(&previous), "cudaGetDevice"));
  if (previous != device) FS_TRY(cuda_result(cudaSetDevice(device), "cudaSetDevice"));
  bool one_cta_set = false;
  Result result = mhc::set_kernel_attributes(device, &one_cta_set);
  // Per configuration, the fewest over its kernels (fragment layouts, tile variants).
  int fewest[2] = {-1, -1};  // [two CTAs per SM, one CTA per SM]; -1: none queried yet
  for (const mhc::KernelOf& k : mhc::kAllKernels) {
    if (!result.ok()) break;
    if (k.ctas_per_sm == 1 && !one_cta_set) continue;
    detail::LaunchConfig config(mhc::grid_of(1), dim3(mhc::kThreads), mhc::smem_bytes_of(k.ctas_per_sm), nullptr);
    config.cluster(mhc::kCluster);
    int n = 0;
    result = cuda_result(cudaOccupancyMaxActiveClusters(&n, reinterpret_cast<const void*>(k.fn), config.get()),
                         k.ctas_per_sm == 1 ? "cudaOccupancyMaxActiveClusters(mhc_boundary, one CTA per SM)"
                                            : "cudaOccupancyMaxActiveClusters(mhc_boundary, two CTAs per SM)");
    int& f = fewest[k.ctas_per_sm == 1 ? 1 : 0];
    f = f < 0 ? n : std::min(f, n);
  }
  fewest[0] = std::max(fewest[0], 0);
  fewest[1] = std::max(fewest[1], 0);
  // The persistent kernel is a one-CTA-per-SM kernel too: plan() takes its cluster count
  // from the same figure.
  if (result.ok() && one_cta_set) {
    int n = 0;
    result = cuda_result(mhc::persistent_max_active_clusters(&n),
                         "cudaOccupancyMaxActiveClusters(mhc_boundary, persistent)");
    fewest[1] = std::min(fewest[1], n);
  }
  if (previous != device) (void)cudaSetDevice(previous);
  if (result.ok()) {
    *two_cta = fewest[0];
    *one_cta = fewest[1];
  }
  return result;
}

#if defined(FUSEDSTEP_TRACE)
// The trace of the last fused launch (trace::kWords words).
int mhc_read_trace(unsigned long long* host, int max_words) {
  return trace::read_buffer(mhc::g_trace, host, max_words);
}
#endif

}  // namespace detail

Result plan(const MhcBoundaryParams& params, const DeviceInfo& device, MhcBoundaryPlan* out) noexcept {
  if (out == nullptr) return Result::error(Status::kNullPointer, "mhc_boundary: plan out = null");
  FS_TRY(check(params, device));
  const int largest = mhc::max_tile(params.hidden);
  if (largest == 0) {
    return Result::error(Status::kUnsupported,
                         "mhc_boundary: hidden = %lld leaves no token tile within %d bytes of "
                         "shared memory",
                         static_cast<long long>(params.hidden), mhc::kSmemBytes);
  }
  // plan() is the one place that picks the configuration: launch() runs exactly this
  // plan, so what plan() reports is what runs.
  const int64_t per_wave = device.mhc_clusters_per_wave;
  // One-CTA-per-SM kernels (the small-batch configuration, the persistent kernel) run
  // only where the device has their opt-in shared memory and co-schedules at least one
  // of their clusters (cudaOccupancyMaxActiveClusters, device.mhc_one_cta_clusters_per_wave:
  // each cluster needs 16 SMs of one GPC).
  const int64_t one_cta_clusters = device.max_smem_per_block_optin >= mhc::kSmemBytesOne
                                       ? std::max(device.mhc_one_cta_clusters_per_wave, 0)
                                       : 0;
  MhcBoundaryPlan p;

  // ---- the persistent pipelined kernel, on request only: kAuto does not pick it (on the
  // H200 it measured slower than the one-wave kernel at every token count;
  // docs/benchmarks.md, 12th session).
  if (params.schedule == MhcBoundarySchedule::kPersistent) {
    if (one_cta_clusters < 1 || !mhc::persistent_tile_fits(8, params.hidden, params.rounding)) {
      return Result::error(Status::kUnsupported,
                           "mhc_boundary: schedule = 2 (persistent) does not run at hidden = %lld with rounding = %d "
                           "on this device (it needs a TF32 rounding, a weight slice that fits %d bytes of shared "
                           "memory beside a sub-tile, and device.mhc_one_cta_clusters_per_wave = %d >= 1)",
                           static_cast<long long>(params.hidden), static_cast<int>(params.rounding),
                           mhc::kPersistentSmemBytes, device.mhc_one_cta_clusters_per_wave);
    }
    int tile = params.tile;
    if (tile == 0) {
      // Sub-tiles of 16 once every cluster has at least one of them.
      tile = mhc::persistent_tile_fits(16, params.hidden, params.rounding) &&
                     params.tokens >= 16 * one_cta_clusters
                 ? 16
                 : 8;
    }
    if (!mhc::persistent_tile_fits(tile, params.hidden, params.rounding)) {
      return Result::error(Status::kUnsupported,
                           "mhc_boundary: tile = %d is not a sub-tile of the persistent schedule at hidden = %lld "
                           "(8 or 16 tokens whose buffers fit beside the weight slice: 8 at hidden 4096 and 5120)",
                           tile, static_cast<long long>(params.hidden));
    }
    const int64_t sub_tiles = (params.tokens + tile - 1) / tile;
    p.tile = tile;
    p.ctas_per_sm = 1;
    p.persistent = true;
    p.clusters = std::max<int64_t>(1, std::min(one_cta_clusters, sub_tiles));
    p.waves = static_cast<int>((sub_tiles + p.clusters - 1) / p.clusters);
    *out = p;
    return Result::success();
  }

  // ---- one cluster per tile. The one-CTA-per-SM configuration (small batches) runs
  // tile 8 for at most one_cta_max_clusters() clusters, and only in one wave of it: never more
  // clusters than the device co-schedules in it nor than half the two-CTA wave; where it
  // does not run, the two-CTA rule below picks the tile.
  if (params.tile > largest) {
    return Result::error(Status::kUnsupported,
                         "mhc_boundary: tile = %d does not fit %d bytes of shared memory at hidden = %lld "
                         "(largest tile %d)",
                         params.tile, mhc::kSmemBytes, static_cast<long long>(params.hidden), largest);
  }
  const int64_t per_wave_one =
      mhc::one_cta_fits_one_round(params.hidden)
          ? std::min<int64_t>({per_wave / 2, one_cta_clusters, mhc::one_cta_max_clusters(params.hidden)})
          : 0;
  // Where tile 8 would give a warp a second elementwise task: the one-task tile, if the
  // tile is plan()'s to pick and that tile takes at most `most_clusters` clusters.
  const int one_task = mhc::one_task_tile(params.hidden);
  auto one_task_tile_fits = [&](int64_t most_clusters) {
    return params.tile == 0 && params.tokens > one_task &&
           (params.tokens + one_task - 1) / one_task <= most_clusters;
  };
  p.tile = 0;
  // (Tile 8 fits wherever any tile does: `largest` > 0 here.)
  if (per_wave_one >= 1 && (params.tile == 0 || params.tile == mhc::kSmallTile) &&
      (params.tokens + mhc::kSmallTile - 1) / mhc::kSmallTile <= per_wave_one) {
    p.tile = mhc::kSmallTile;
    p.ctas_per_sm = 1;
    if (one_task_tile_fits(std::min(per_wave_one, one_cta_clusters / 2))) p.tile = one_task;
  }
  if (p.tile == 0) {
    p.tile = params.tile != 0 ? params.tile : largest;
    p.ctas_per_sm = 2;
    for (int tile : mhc::kTiles) {
      const int64_t clusters = (params.tokens + tile - 1) / tile;
      if (tile == mhc::kSmallTile && clusters > mhc::kSmallTileMaxClusters) continue;
      if (params.tile == 0 && tile <= largest && clusters <= per_wave) {
        p.tile = tile;
        break;
      }
    }
    const int64_t half_wave = per_wave / 2;
    // The one-CTA configuration's one-task tile, where its clusters still fit half the
    // wave (one per GPC): hidden 5120 T = 33-42 on the H200, -3.4 to -4.8% (TF32), -1.8
    // to -4.2% (FP32) against two-CTA tile 8 (22nd session). As a runtime branch of the
    // tile-8 kernel it cost 3-7% on every two-CTA row; as its own instantiation it costs
    // nothing.
    if (p.tile == mhc::kSmallTile && one_task_tile_fits(half_wave)) p.tile = one_task;
    if (params.tile == 0 && half_wave >= 1 && (params.tokens + p.tile - 1) / p.tile > half_wave &&
        (p.tile != mhc::kSmallTile || params.hidden >= mhc::kHalfWaveFromSmallTileMinHidden)) {
      const int spread = static_cast<int>((params.tokens + half_wave - 1) / half_wave);
      const int m_tiles = mhc::m_tiles(params.rounding);
      if (spread <= std::min(largest, mhc::kHalfWaveMaxTile) &&
          mhc::two_cta_gemm_passes(m_tiles, spread) <= mhc::two_cta_gemm_passes(m_tiles, p.tile)) {
        p.tile = spread;
      }
    }
  }
  const int64_t wave = p.ctas_per_sm == 1 ? per_wave_one : per_wave;
  p.clusters = (params.tokens + p.tile - 1) / p.tile;
  p.waves = static_cast<int>((p.clusters + wave - 1) / wave);
  *out = p;
  return Result::success();
}

Result launch(const MhcBoundaryParams& params, const LaunchOptions& options, cudaStream_t stream) noexcept {
  const DeviceInfo* device = nullptr;
  FS_TRY(detail::resolve_device(options, &device));
  MhcBoundaryPlan p;
  FS_TRY(plan(params, *device, &p));
  if (params.tokens == 0) return Result::success();
  bool one_cta_set = false;
  FS_TRY(mhc::set_kernel_attributes(device->device, &one_cta_set));
  if (p.ctas_per_sm == 1 && !one_cta_set) {
    return Result::error(Status::kDeviceUnsupported,
                         "mhc_boundary: the DeviceInfo of this launch (mhc_one_cta_clusters_per_wave = %d, "
                         "max_smem_per_block_optin = %d) does not describe device %d, which lacks the %d bytes "
                         "of opt-in shared memory of the one-CTA-per-SM configuration (use get_device_info)",
                         device->mhc_one_cta_clusters_per_wave, device->max_smem_per_block_optin, device->device,
                         mhc::kSmemBytesOne);
  }

  mhc::KernelArgs args{};
  args.x = params.x;
  args.residual = params.residual;
  args.post = params.post;
  args.comb = params.comb;
  args.pre_lag = params.pre_lag;
  args.weight = params.weight;
  args.scale = params.scale;
  args.base = params.base;
  args.norm_weight = params.norm_weight;
  args.residual_out = params.residual_out;
  args.layer_input = params.layer_input;
  args.pre_out = params.pre_out;
  args.post_out = params.post_out;
  args.comb_out = params.comb_out;
  args.tokens = params.tokens;
  args.hidden = params.hidden;
  args.x_stride = mhc::x_stride_of(params);
  args.residual_stride = mhc::residual_stride_of(params);
  args.residual_out_stride = mhc::residual_out_stride_of(params);
  args.layer_input_stride = mhc::layer_input_stride_of(params);
  args.tile = p.tile;
  args.norm_eps = params.norm_eps;
  args.scalars = mhc::CoefficientScalars{params.rms_eps, params.hc_pre_eps, params.sinkhorn_eps,
                                         params.post_mult, params.sinkhorn_iters};

  if (p.persistent) {
    return detail::cuda_result(mhc::launch_persistent(args, p.clusters, options.pdl, stream),
                               "cudaLaunchKernelEx(mhc_boundary, persistent)");
  }
  // The configuration plan() reported (its DeviceInfo decides where the one-CTA one runs).
  detail::LaunchConfig config(mhc::grid_of(p.clusters), dim3(mhc::kThreads), mhc::smem_bytes_of(p.ctas_per_sm),
                              stream);
  config.cluster(mhc::kCluster).pdl(options.pdl);
  return detail::cuda_result(
      cudaLaunchKernelEx(config.get(), mhc::kernel_for(params.rounding, p.ctas_per_sm, p.tile, params.hidden), args),
      "cudaLaunchKernelEx(mhc_boundary)");
}

}  // namespace fusedstep
