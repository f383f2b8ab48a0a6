// mHC boundary: the persistent pipelined kernel (large batches; docs/design.md, "mHC at
// large T").
//
// One CTA per SM, 16-CTA clusters as many as are co-resident; cluster c takes the
// sub-tiles c, c + clusters, ... of `tile` tokens each and keeps its CTAs' weight slices
// in shared memory for all of them (staged once, before the PDL wait). CTA r owns hidden
// slice r as in the one-wave kernel, and every per-token sum has the same chunks in the
// same order (fused_parts.cuh), so the bits are the one-wave kernel's.
//
// The one-wave kernel leaves HBM idle during its serial tail (GEMM, exchange,
// coefficients). Here the stages of consecutive sub-tiles overlap:
//  - inputs: 16-byte cp.async copies (x, the four residual streams, post / comb /
//    pre_lag) of sub-tile n + 2 go out as soon as sub-tile n has read its input
//    buffer, so two sub-tiles of reads are queued and no register holds them;
//  - eight work warps: the elementwise pass of sub-tile n from shared memory
//    (residual_out, B fragments, chunk sums, li kept in shared memory), its slice sums,
//    GEMM and exchange pushes, then sub-tile n - 1's layer input;
//  - the coefficient warp: receives sub-tile n's exchange, sums the 16 slices (owned
//    tokens' mixes, every token's li sum of squares -> rstd for the work warps), frees
//    the receive buffer and computes the owned tokens' pre / post / comb while the work
//    warps go on; the work warps hand each rstd buffer back with an mbarrier. Owners
//    rotate by `tile` ranks per sub-tile, so that with 8-token sub-tiles every CTA
//    finalizes a token every other sub-tile.
// The exchange is double-buffered: buffer n % 2 with a "full" mbarrier (st.async bytes)
// and an "empty" one (one remote arrive per peer's coefficient warp once it has read
// the buffer): a CTA pushes sub-tile n only after every peer has read sub-tile n - 2.
// Control flow never depends on data.
//
// Measured on the H200 (12th session, docs/benchmarks.md): not yet faster than the
// one-wave kernel. The work warps run each 8-token sub-tile's phases one after another,
// about 5 us a sub-tile (elementwise 1.0, issuing the next copies 1.0, slice sums 0.5,
// GEMM 0.75, exchange 1.0, layer input 0.75), where HBM would allow about 1.8 us; the
// next step is warps specialized per phase.
#include <cooperative_groups.h>
#include <cuda/ptx>
#include <cuda_pipeline.h>

#include "common/launch.h"
#include "mhc_boundary/fused_parts.cuh"
#include "mhc_boundary/persistent.h"

namespace fusedstep::mhc {
namespace {

namespace cg = cooperative_groups;
using namespace parts;

constexpr int kThreads = kPersistentThreads;
constexpr int kWorkThreads = kMmaWarps * 32;
constexpr int kCoefWarp = kMmaWarps;
constexpr int kSmemBytes = kPersistentSmemBytes;
constexpr uint32_t kWorkBarrier = 1;  // named barrier of the work warps
// Sub-tiles of at most 16 tokens (persistent_tile_fits says which fit): a CTA owns at
// most one token of each, and the GEMM takes a sub-tile in one pass.
constexpr int kMaxSubTile = kCluster;
constexpr int kMaxSubOwned = 1;
// A token's inputs in an input buffer: x and the four residual streams of the slice
// (5 rows of `slice` BF16), padded to 16 words mod 32 so that the two tokens of each
// 8-lane phase of a task's 16-byte loads fall on different banks; its post | comb |
// pre_lag rows (24 floats) apart.
constexpr int kInputRows = 1 + kStreams;
FS_HD int input_token_bytes(int64_t slice) {
  const int words = static_cast<int>(kInputRows * slice * 2 / 4);
  return 4 * (words + (16 - words % 32 + 32) % 32);
}

// Byte offsets of the shared-memory regions for one (sub-tile, slice).
struct Layout {
  int tp;        // tile rounded up to whole n8 MMA tiles
  int chunks;    // 8-wide chunks per slice
  uint32_t bar;  // mbarriers: full[2], empty[2], rstd_ready[2], rstd_free[2]
  uint32_t hc;   // scale[3] | base[24]
  uint32_t slice_ssq;  // slice sums of squares: [residual, li][tp]
  uint32_t recv_mix;   // [2][16 slices][kRecvFloats] (one owned token)
  uint32_t recv_li;    // [2][16 slices][tp]
  uint32_t rstd_li;    // [2][tp]
  uint32_t coef_out;   // [kCoefOutFloats]
  uint32_t coef;       // post | comb | pre_lag of both input buffers: [2][tp][kCoefFloats]
  uint32_t mixp;       // warp partial mixes: [8 warps][tp][kMixpFloats]
  uint32_t res;        // new residual as B fragments: [k step][tp][4 lanes q] x 8 bytes
  uint32_t li;         // li (BF16) of both buffers: [2][tp][slice]
  uint32_t ssq;        // chunk sums of squares: [residual, li][tp][ssq_pitch(chunks)]
  uint32_t norm;       // this slice of norm_weight (BF16)
  uint32_t input;      // input buffers: [2][tp][input_token_bytes]
  uint32_t stage;      // the rest: every MMA warp's A fragments (the weight slice)
};

FS_HD Layout layout_of(int tile, int64_t slice) {
  Layout L{};
  L.tp = (tile + 7) / 8 * 8;
  L.chunks = static_cast<int>(slice / 8);
  RegionAllocator regions;
  auto take = [&regions](uint64_t bytes) { return regions.take(bytes); };
  const uint64_t tp = static_cast<uint64_t>(L.tp);
  // Regions sized for the largest sub-tile first: constant offsets hold no registers.
  L.bar = take(8 * 8);
  L.hc = take(32 * 4);
  L.slice_ssq = take(2 * kMaxSubTile * 4);
  L.recv_mix = take(2 * kMaxSubOwned * kCluster * kRecvFloats * 4);
  L.recv_li = take(2 * kCluster * kMaxSubTile * 4);
  L.rstd_li = take(2 * kMaxSubTile * 4);
  L.coef_out = take(kMaxSubOwned * kCoefOutFloats * 4);
  L.coef = take(2 * tp * kCoefFloats * 4);
  L.mixp = take(static_cast<uint64_t>(kMmaWarps) * tp * kMixpFloats * 4);
  L.res = take(static_cast<uint64_t>(k_steps(slice * kCluster)) * tp * 4 * 8);
  L.li = take(2 * tp * static_cast<uint64_t>(slice) * 2);
  L.ssq = take(2 * tp * static_cast<uint64_t>(ssq_pitch(L.chunks)) * 4);
  L.norm = take(static_cast<uint64_t>(slice) * 2);
  L.input = take(2 * tp * static_cast<uint64_t>(input_token_bytes(slice)));
  L.stage = regions.aligned_end();
  return L;
}

__device__ __forceinline__ void wait_parity(uint64_t* bar, uint32_t parity, bool cluster_scope) {
  if (cluster_scope) {
    while (!cuda::ptx::mbarrier_try_wait_parity(cuda::ptx::sem_acquire, cuda::ptx::scope_cluster, bar, parity)) {
    }
  } else {
    while (!cuda::ptx::mbarrier_try_wait_parity(cuda::ptx::sem_acquire, cuda::ptx::scope_cta, bar, parity)) {
    }
  }
}

// The TF32 roundings (3 m16 tiles of stacked weight parts) with the whole weight slice
// staged: nine warps leave 168 registers a thread (three warps share an SM
// sub-partition's 16K registers), no room for the one-wave kernel's streaming ring.
__global__ void __launch_bounds__(kThreads, 1) persistent_boundary_kernel(const KernelArgs args) {
  constexpr int kMTiles = 3;
  // n8 token tiles per pass over the weight: a sub-tile in one pass.
  constexpr int kNtPass = kMaxSubTile / 8;
  extern __shared__ __align__(128) unsigned char smem[];
  const cg::cluster_group cluster = cg::this_cluster();

  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, q = lane % 4;
  const int rank = static_cast<int>(cluster.block_rank());
  const int64_t hidden = args.hidden;
  const int slice = static_cast<int>(hidden / kCluster);
  const int tile = args.tile;
  const Layout L = layout_of(tile, slice);
  const int tp = L.tp, chunks = L.chunks;
  const int ssq_row = ssq_pitch(chunks);  // s_ssq's row pitch, in floats
  const int wide_chunks = slice / 32;
  const int steps = static_cast<int>(k_steps(hidden));
  const int steps_per_warp = steps / kMmaWarps;
  const int64_t h0 = static_cast<int64_t>(rank) * slice;
  const int64_t cluster_id = blockIdx.x / kCluster, clusters = gridDim.x / kCluster;
  const int64_t sub_tiles = (args.tokens + tile - 1) / tile;
  // launch() runs at most one cluster per sub-tile: every cluster has one or more
  const int iters = static_cast<int>((sub_tiles - cluster_id + clusters - 1) / clusters);
  auto t0_of = [&](int n) { return (cluster_id + static_cast<int64_t>(n) * clusters) * tile; };
  auto valid_of = [&](int n) { return static_cast<int>(min(static_cast<int64_t>(tile), args.tokens - t0_of(n))); };
  // Owner rotation: token t of sub-tile n is owned by rank (t + shift_of(n)) % 16.
  auto shift_of = [&](int n) { return static_cast<int>(t0_of(n) % kCluster); };

  uint64_t* full = reinterpret_cast<uint64_t*>(smem + L.bar);
  uint64_t* empty = full + 2;
  uint64_t* rstd_ready = full + 4;
  uint64_t* rstd_free = full + 6;
  float* s_hc = reinterpret_cast<float*>(smem + L.hc);
  uint2* s_res = reinterpret_cast<uint2*>(smem + L.res);
  uint4* s_li = reinterpret_cast<uint4*>(smem + L.li);  // [2][tp][slice / 8]
  float* s_ssq = reinterpret_cast<float*>(smem + L.ssq);
  float* s_coef = reinterpret_cast<float*>(smem + L.coef);
  float* s_mixp = reinterpret_cast<float*>(smem + L.mixp);
  float* s_slice = reinterpret_cast<float*>(smem + L.slice_ssq);
  float* s_recv_mix = reinterpret_cast<float*>(smem + L.recv_mix);
  float* s_recv_li = reinterpret_cast<float*>(smem + L.recv_li);
  float* s_rstd = reinterpret_cast<float*>(smem + L.rstd_li);
  float* s_coef_out = reinterpret_cast<float*>(smem + L.coef_out);
  const uint4* s_norm = reinterpret_cast<const uint4*>(smem + L.norm);
  unsigned char* s_input = smem + L.input;
  uint4* s_stage = reinterpret_cast<uint4*>(smem + L.stage);
  const int recv_mix_floats = kMaxSubOwned * kCluster * kRecvFloats;
  const int token_bytes = input_token_bytes(slice);

  // ---- weights only before the PDL wait: the whole weight slice (every MMA warp's run
  // of k steps) and this slice of norm_weight by 16-byte cp.async from the work warps
  // (the one-wave kernel's one-CTA configuration measured this faster than bulk
  // copies), one commit group older than the first sub-tile's inputs: the work warps'
  // wait for those covers it.
  const int staged_steps = steps_per_warp;
  const uint4* w_slice = reinterpret_cast<const uint4*>(args.weight) + static_cast<int64_t>(rank) * steps * kMTiles * 32;
  if (tid == 0) {
    for (int b = 0; b < 2; ++b) {
      cuda::ptx::mbarrier_init(full + b, 1u);
      cuda::ptx::mbarrier_init(empty + b, static_cast<uint32_t>(kCluster));
      cuda::ptx::mbarrier_init(rstd_ready + b, 32u);
      cuda::ptx::mbarrier_init(rstd_free + b, static_cast<uint32_t>(kWorkThreads));
    }
    cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster);
    // Each buffer's first use; the coefficient warp arms the later ones.
    for (int b = 0; b < 2 && b < iters; ++b) {
      cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cluster,
                                           cuda::ptx::space_shared, full + b,
                                           exchange_bytes(owned_count(tile, rank, shift_of(b)), tp));
    }
  }
  if (tid < kWorkThreads) {  // the work warps read them, after their own wait and a work barrier
    const int per_warp = staged_steps * kMTiles * 32;
#pragma unroll 1
    for (int w = 0; w < kMmaWarps; ++w) {
      const uint4* src = w_slice + static_cast<int64_t>(w) * steps_per_warp * kMTiles * 32;
      uint4* dst = s_stage + w * per_warp;
      for (int i = tid; i < per_warp; i += kWorkThreads) __pipeline_memcpy_async(dst + i, src + i, sizeof(uint4));
    }
    const uint4* norm_src = reinterpret_cast<const uint4*>(args.norm_weight + h0);
    for (int i = tid; i < slice / 8; i += kWorkThreads) {
      __pipeline_memcpy_async(const_cast<uint4*>(s_norm) + i, norm_src + i, sizeof(uint4));
    }
    __pipeline_commit();
  }
  // Peers push into this CTA's barriers only after the cluster barrier says every CTA
  // initialized its own (fence.mbarrier_init orders the inits: the arrive is relaxed).
  cuda::ptx::barrier_cluster_arrive(cuda::ptx::sem_relaxed);

  if (warp == kCoefWarp) {
    // scale and base are parameters: loaded before the wait
    if (lane < 3) s_hc[lane] = __ldg(args.scale + lane);
    else if (lane < 3 + kMixes) s_hc[lane] = __ldg(args.base + lane - 3);
    ptx::griddep_wait();
    cuda::ptx::barrier_cluster_wait();  // the peers' empty barriers exist
    __syncwarp();
    for (int n = 0; n < iters; ++n) {
      const int b = n & 1;
      const int shift = shift_of(n), owned = owned_count(tile, rank, shift);
      wait_parity(full + b, static_cast<uint32_t>((n >> 1) & 1), true);
      if (lane == 0 && n + 2 < iters) {  // the buffer's next use
        cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cluster,
                                             cuda::ptx::space_shared, full + b,
                                             exchange_bytes(owned_count(tile, rank, shift_of(n + 2)), tp));
      }
      const float* recv_li = s_recv_li + b * kCluster * tp;
      sum_owned_slices(lane, owned, s_recv_mix + b * recv_mix_floats, s_coef_out);
      // s_rstd[b] is free once the work warps' layer input of sub-tile n - 2 is done
      if (n >= 2) wait_parity(rstd_free + b, static_cast<uint32_t>(((n >> 1) - 1) & 1), false);
      if (lane < tp) {
        float sum = 0.0f;
#pragma unroll
        for (int r = 0; r < kCluster; ++r) sum = __fadd_rn(sum, recv_li[r * tp + lane]);
        s_rstd[b * tp + lane] = layer_input_rstd(sum, hidden, args.norm_eps);
      }
      __syncwarp();
      // Buffer b is read: every peer may push its use after next (only where one
      // follows, so that no arrive is in flight when a peer exits).
      if (n + 2 < iters && lane < kCluster) {
        cuda::ptx::mbarrier_arrive(cuda::ptx::sem_release, cuda::ptx::scope_cluster, cuda::ptx::space_cluster,
                                   cluster.map_shared_rank(empty + b, lane));
      }
      cuda::ptx::mbarrier_arrive(rstd_ready + b);
      if (n + 1 == iters) ptx::griddep_launch_dependents();
      write_coefficients(args, lane, owned, first_owned(rank, shift), valid_of(n), t0_of(n), s_coef_out, s_hc);
      __syncwarp();  // s_coef_out is rewritten next round
    }
  } else {
    // ---- work warps
    GemmStream<kMTiles, 1> gemm;  // all steps staged: the ring stays unused
    gemm.a_warp = nullptr;
    gemm.a_staged = s_stage + warp * staged_steps * kMTiles * 32 + lane;
    gemm.staged = staged_steps;
    gemm.steps = steps_per_warp;
    auto work_sync = [] { ptx::named_barrier_sync(kWorkBarrier, kWorkThreads); };
    // Inputs of sub-tile n into buffer n % 2 by 16-byte cp.async from the work threads
    // (per token: x and the four residual streams of this slice, post | comb | pre_lag),
    // one commit group per sub-tile. (Bulk copies, five 640-byte ones and three small
    // ones per token, took 2.8 us to issue per 8-token sub-tile on the H200.)
    // Thread i < token_pieces takes piece i of every token: row i / (slice / 8) (x, the
    // streams, then the coefficient quads), no division in the loop.
    const int row_pieces = slice / 8;  // 16-byte pieces of a row
    const int token_pieces = kInputRows * row_pieces + kCoefFloats / 4;
    const int my_row = tid / row_pieces, my_piece = tid - my_row * row_pieces;
    const int my_quad = tid - kInputRows * row_pieces;  // 0 post, 1-4 comb, 5 pre_lag
    const int64_t my_src_offset =
        my_row == 0 ? h0 + 8 * my_piece : (my_row - 1) * hidden + h0 + 8 * my_piece;  // within the token's row(s)
    const uint32_t my_dst_offset = my_row < kInputRows ? static_cast<uint32_t>(my_row * slice * 2 + my_piece * 16)
                                                       : 0u;
    auto load_inputs = [&](int n) {
      const int b = n & 1;
      const int valid = valid_of(n);
      const int64_t t0 = t0_of(n);
      if (tid < token_pieces) {
#pragma unroll 1
        for (int t = 0; t < valid; ++t) {
          const int64_t gt = t0 + t;
          if (my_row < kInputRows) {
            const __nv_bfloat16* src =
                (my_row == 0 ? args.x + gt * args.x_stride : args.residual + gt * args.residual_stride) + my_src_offset;
            __pipeline_memcpy_async(s_input + (b * tp + t) * token_bytes + my_dst_offset, src, 16);
          } else {
            const float* src = my_quad == 0 ? args.post + gt * 4
                                             : (my_quad < 5 ? args.comb + gt * 16 + 4 * (my_quad - 1)
                                                            : args.pre_lag + gt * 4);
            __pipeline_memcpy_async(s_coef + (b * tp + t) * kCoefFloats + 4 * my_quad, src, 16);
          }
        }
      }
      __pipeline_commit();
    };
    // layer_input = bf16((li * rstd) * norm_weight) of sub-tile n, once the coefficient
    // warp has its rstd.
    auto layer_input = [&](int n) {
      const int b = n & 1;
      wait_parity(rstd_ready + b, static_cast<uint32_t>((n >> 1) & 1), false);
      const int64_t t0 = t0_of(n);
      const int valid = valid_of(n);
      const uint4* li_buffer = s_li + b * tp * (slice / 8);
#pragma unroll 1
      for (int i = tid; i < valid * chunks; i += kWorkThreads) {
        const int t = i / chunks, m = i - t * chunks;
        const uint4 li = li_buffer[t * (slice / 8) + m];
        const uint4 nw = s_norm[m];
        const float rstd = s_rstd[b * tp + t];
        uint32_t out[4];
#pragma unroll
        for (int p = 0; p < 4; ++p) {
          out[p] = layer_input_pair(word_lo(word_of(li, p)), word_hi(word_of(li, p)), rstd, word_of(nw, p));
        }
        *reinterpret_cast<uint4*>(args.layer_input + (t0 + t) * args.layer_input_stride + h0 + 8 * m) =
            make_uint4(out[0], out[1], out[2], out[3]);
      }
      cuda::ptx::mbarrier_arrive(rstd_free + b);
    };

    ptx::griddep_wait();
    // Two sub-tiles' loads in flight; a commit group per sub-tile (empty ones past the
    // last), so that "all but the newest group" is always the sub-tile about to run.
    load_inputs(0);
    if (iters > 1) {
      load_inputs(1);
    } else {
      __pipeline_commit();
    }
    // Lane group g of a task takes item (t, c) of tile_task_item (a token's chunks in
    // pairs); lane q takes its 8-wide chunk 4c + q.
    const int tasks = tile_tasks(tp, wide_chunks);
#pragma unroll 1
    for (int n = 0; n < iters; ++n) {
      const int b = n & 1;
      const int valid = valid_of(n);
      const int64_t t0 = t0_of(n);
      // This thread's copies of sub-tile n (and, at n = 0, of the weight slice) have
      // landed; the barrier publishes everyone's. s_res and s_ssq are free (the previous
      // sub-tile's GEMM is done), li buffer b too (sub-tile n - 2's layer input is).
      __pipeline_wait_prior(1);
      work_sync();
      if (valid < tp) {
        // padding tokens' MMA columns and sums of squares are zeros
        const int pad = tp - valid;
        const int pieces = 8 * wide_chunks * pad * 4;
        for (int i = tid; i < pieces; i += kWorkThreads) {
          const int piece = i % 4, rest = i / 4;
          s_res[((rest / pad) * tp + valid + rest % pad) * 4 + piece] = make_uint2(0u, 0u);
        }
        for (int i = tid; i < 2 * pad * chunks; i += kWorkThreads) {
          const int m = i % chunks, rest = i / chunks;
          s_ssq[((rest / pad) * tp + valid + rest % pad) * ssq_row + m] = 0.0f;
        }
      }
      // ---- elementwise pass of sub-tile n from its input buffer
      const unsigned char* input = s_input + b * tp * token_bytes;
      uint4* li_buffer = s_li + b * tp * (slice / 8);
#pragma unroll 1
      for (int task = warp; task < tasks; task += kMmaWarps) {
        int t, c;
        tile_task_item(task, g, wide_chunks, t, c);
        if (t < valid) {
          const int m = 4 * c + q;
          const float* coef = s_coef + (b * tp + t) * kCoefFloats;
          const uint4* rows = reinterpret_cast<const uint4*>(input + t * token_bytes) + m;
          ChunkInputs in;
          in.x = rows[0];
#pragma unroll
          for (int j = 0; j < kStreams; ++j) in.r[j] = rows[(j + 1) * (slice / 8)];
          uint32_t cur[kStreams][4];
          update_chunk(coef, in, cur);
          store_residual_out(args, t0 + t, h0 + 8 * m, cur);
          float ssq_res, ssq_li;
          uint32_t li[4];
          chunk_sums(coef + 20, cur, ssq_res, ssq_li, li);
          store_b_fragments(s_res, c, tp, t, q, cur);
          s_ssq[t * ssq_row + m] = ssq_res;
          s_ssq[(tp + t) * ssq_row + m] = ssq_li;
          li_buffer[t * (slice / 8) + m] = make_uint4(li[0], li[1], li[2], li[3]);
        }
      }
      work_sync();
      // ---- input buffer b is read: sub-tile n + 2's copies go out
      if (n + 2 < iters) {
        load_inputs(n + 2);
      } else {
        __pipeline_commit();
      }
      if (tid < 2 * tp) s_slice[tid] = slice_sum(s_ssq + tid * ssq_row, chunks);
      // ---- mixer GEMM
      mixer_gemm<kMTiles, kNtPass, false>(gemm, s_res, tp, warp, lane, s_mixp, [] {});
      work_sync();
      // ---- exchange: buffer b of every peer is free once each has read its use n - 2
      if (n == 0) {
        cuda::ptx::barrier_cluster_wait();  // every peer's barriers are initialized
      } else if (n >= 2) {
        wait_parity(empty + b, static_cast<uint32_t>(((n >> 1) - 1) & 1), true);
      }
      push_exchange(cluster, tid, kWorkThreads, tile, tp, rank, shift_of(n), s_mixp, s_slice,
                    s_recv_mix + b * recv_mix_floats, s_recv_li + b * kCluster * tp, full + b);
      if (n + 1 == iters) ptx::griddep_launch_dependents();
      if (n >= 1) layer_input(n - 1);
    }
    layer_input(iters - 1);
  }
  // Every CTA stays until its peers have received everything (cluster barrier, relaxed:
  // nothing after it reads shared memory).
  cuda::ptx::barrier_cluster_arrive(cuda::ptx::sem_relaxed);
  cuda::ptx::barrier_cluster_wait();
}

}  // namespace

bool persistent_tile_fits(int tile, int64_t hidden, WeightRounding rounding) {
  if (m_tiles(rounding) != 3 || tile % 8 != 0 || tile < 8 || tile > kMaxSubTile) return false;
  // one 16-byte piece of each token's inputs per work thread
  if (kInputRows * slice_of(hidden) / 8 + kCoefFloats / 4 > kWorkThreads) return false;
  const int64_t weight_bytes = steps_per_warp(hidden) * kMmaWarps * 3 * 512;
  return layout_of(tile, slice_of(hidden)).stage + weight_bytes <= kSmemBytes;
}

cudaError_t persistent_set_attributes() {
  return set_cluster_kernel_attributes(reinterpret_cast<const void*>(persistent_boundary_kernel), kSmemBytes);
}

cudaError_t persistent_max_active_clusters(int* clusters) {
  *clusters = 0;
  detail::LaunchConfig config(dim3(kCluster), dim3(kThreads), kSmemBytes, nullptr);
  config.cluster(kCluster);
  return cudaOccupancyMaxActiveClusters(clusters, reinterpret_cast<const void*>(persistent_boundary_kernel),
                                        config.get());
}

cudaError_t launch_persistent(const KernelArgs& args, int64_t clusters, bool pdl, cudaStream_t stream) {
  detail::LaunchConfig config(dim3(static_cast<unsigned>(clusters * kCluster)), dim3(kThreads), kSmemBytes, stream);
  config.cluster(kCluster).pdl(pdl);
  return cudaLaunchKernelEx(config.get(), persistent_boundary_kernel, args);
}

}  // namespace fusedstep::mhc
