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
//  - eight work warps: the elementwise pass of sub-tile n (residual_out, B fragments,
//    chunk sums, li kept in shared memory), then the loads of sub-tile n + 1 go out and
//    land under sub-tile n's slice sums, GEMM and exchange pushes and sub-tile n - 1's
//    layer input;
//  - the coefficient warp: receives sub-tile n's exchange, sums the 16 slices (owned
//    tokens' mixes, every token's li sum of squares -> rstd for the work warps), frees
//    the receive buffer and computes the owned tokens' pre / post / comb while the work
//    warps go on.
// The exchange is double-buffered: buffer n % 2 with a "full" mbarrier (st.async bytes)
// and an "empty" one (one remote arrive per peer's coefficient warp once it has read
// the buffer): a CTA pushes sub-tile n only after every peer has read sub-tile n - 2.
// Control flow never depends on data.
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
// Sub-tiles of at most 16 tokens (kPersistentTiles): a CTA owns at most one token of
// each, and the GEMM takes a sub-tile in one pass.
constexpr int kMaxSubTile = kCluster;
constexpr int kMaxSubOwned = 1;

// Byte offsets of the shared-memory regions for one (sub-tile, slice).
struct Layout {
  int tp;        // tile rounded up to whole n8 MMA tiles
  int chunks;    // 8-wide chunks per slice
  uint32_t bar;  // mbarriers: full[2], empty[2], rstd_ready[2]
  uint32_t hc;   // scale[3] | base[24]
  uint32_t slice_ssq;  // slice sums of squares: [residual, li][tp]
  uint32_t recv_mix;   // [2][16 slices][kRecvFloats] (one owned token)
  uint32_t recv_li;    // [2][16 slices][tp]
  uint32_t rstd_li;    // [2][tp]
  uint32_t coef_out;   // [kCoefOutFloats]
  uint32_t coef;       // [tp][kCoefFloats]
  uint32_t mixp;       // warp partial mixes: [8 warps][24][tp]
  uint32_t res;  // new residual as B fragments: [k step][tp][4 lanes q] x 8 bytes
  uint32_t li;   // li (BF16) of both buffers: [2][tp][slice]
  uint32_t ssq;  // chunk sums of squares: [residual, li][tp][chunks]
  uint32_t norm;       // this slice of norm_weight (BF16)
  uint32_t stage;      // the rest: leading k steps of each MMA warp's A fragments
};

FS_HD Layout layout_of(int tile, int64_t slice) {
  Layout L{};
  L.tp = (tile + 7) / 8 * 8;
  L.chunks = static_cast<int>(slice / 8);
  uint32_t off = 0;
  auto take = [&off](uint64_t bytes) {
    off = (off + 127u) / 128u * 128u;
    const uint32_t start = off;
    off += static_cast<uint32_t>(bytes);
    return start;
  };
  const uint64_t tp = static_cast<uint64_t>(L.tp);
  // Regions sized for the largest sub-tile first: constant offsets hold no registers.
  L.bar = take(6 * 8);
  L.hc = take(32 * 4);
  L.slice_ssq = take(2 * kMaxSubTile * 4);
  L.recv_mix = take(2 * kMaxSubOwned * kCluster * kRecvFloats * 4);
  L.recv_li = take(2 * kCluster * kMaxSubTile * 4);
  L.rstd_li = take(2 * kMaxSubTile * 4);
  L.coef_out = take(kMaxSubOwned * kCoefOutFloats * 4);
  L.coef = take(tp * kCoefFloats * 4);
  L.mixp = take(static_cast<uint64_t>(kMmaWarps) * kMixes * tp * 4);
  L.res = take(static_cast<uint64_t>(k_steps(slice * kCluster)) * tp * 4 * 8);
  L.li = take(2 * tp * static_cast<uint64_t>(slice) * 2);
  L.ssq = take(2 * tp * static_cast<uint64_t>(L.chunks) * 4);
  L.norm = take(static_cast<uint64_t>(slice) * 2);
  L.stage = (off + 127u) / 128u * 128u;
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
  // n8 token tiles per pass over the weight: two (a sub-tile in one pass) leave
  // registers for the next sub-tile's loads.
  constexpr int kNtPass = 2;
  // Elementwise tasks whose loads a work warp keeps in flight (the next sub-tile's first
  // round is loaded under this one's GEMM): what 168 registers hold without spilling.
  constexpr int kInFlight = 2;
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
  const int wide_chunks = slice / 32;
  const int steps = static_cast<int>(k_steps(hidden));
  const int steps_per_warp = steps / kMmaWarps;
  const int64_t h0 = static_cast<int64_t>(rank) * slice;
  const int owned = (tile - rank + kCluster - 1) / kCluster;
  const int64_t cluster_id = blockIdx.x / kCluster, clusters = gridDim.x / kCluster;
  const int64_t sub_tiles = (args.tokens + tile - 1) / tile;
  // launch() runs at most one cluster per sub-tile: every cluster has one or more
  const int iters = static_cast<int>((sub_tiles - cluster_id + clusters - 1) / clusters);
  auto t0_of = [&](int n) { return (cluster_id + static_cast<int64_t>(n) * clusters) * tile; };
  auto valid_of = [&](int n) { return static_cast<int>(min(static_cast<int64_t>(tile), args.tokens - t0_of(n))); };

  uint64_t* full = reinterpret_cast<uint64_t*>(smem + L.bar);
  uint64_t* empty = full + 2;
  uint64_t* rstd_ready = full + 4;
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
  uint4* s_stage = reinterpret_cast<uint4*>(smem + L.stage);
  const int recv_mix_floats = kMaxSubOwned * kCluster * kRecvFloats;

  // ---- weights only before the PDL wait: the whole weight slice (every MMA warp's run
  // of k steps) and this slice of norm_weight by 16-byte cp.async from the work warps
  // (the one-wave kernel's one-CTA configuration measured this faster than bulk
  // copies), waited for before the first GEMM.
  const int staged_steps = steps_per_warp;
  const uint4* w_slice = reinterpret_cast<const uint4*>(args.weight) + static_cast<int64_t>(rank) * steps * kMTiles * 32;
  if (tid == 0) {
    for (int b = 0; b < 2; ++b) {
      cuda::ptx::mbarrier_init(full + b, 1u);
      cuda::ptx::mbarrier_init(empty + b, static_cast<uint32_t>(kCluster));
      cuda::ptx::mbarrier_init(rstd_ready + b, 32u);
    }
    cuda::ptx::fence_mbarrier_init(cuda::ptx::sem_release, cuda::ptx::scope_cluster);
    // Each buffer's first use; the coefficient warp arms the later ones.
    for (int b = 0; b < 2; ++b) {
      cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cluster,
                                           cuda::ptx::space_shared, full + b, exchange_bytes(owned, tp));
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
      wait_parity(full + b, static_cast<uint32_t>((n >> 1) & 1), true);
      if (lane == 0 && n + 2 < iters) {  // the buffer's next use
        cuda::ptx::mbarrier_arrive_expect_tx(cuda::ptx::sem_release, cuda::ptx::scope_cluster,
                                             cuda::ptx::space_shared, full + b, exchange_bytes(owned, tp));
      }
      const float* recv_li = s_recv_li + b * kCluster * tp;
      sum_owned_slices(lane, owned, s_recv_mix + b * recv_mix_floats, s_coef_out);
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
      write_coefficients(args, lane, owned, rank, valid_of(n), t0_of(n), s_coef_out, s_hc);
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
    // A task is 8 tokens (t = 8 * (task / wide_chunks) + g) of 32-wide chunk
    // task % wide_chunks; lane q takes its 8-wide chunk 4c + q.
    const int tasks = (tp / 8) * wide_chunks;
    ChunkInputs in[kInFlight];
    float4 coef_row = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    // post 0-3 | comb 4-19 | pre_lag 20-23 of the sub-tile's tokens as six 16-byte quads
    // per token; zero for padding tokens.
    auto load_coef_row = [&](int n) {
      const int t = tid / 6, k = tid % 6;
      coef_row = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (t < valid_of(n)) {
        const int64_t gt = t0_of(n) + t;
        coef_row = k == 0 ? __ldg(reinterpret_cast<const float4*>(args.post + gt * 4))
                          : (k < 5 ? __ldg(reinterpret_cast<const float4*>(args.comb + gt * 16) + (k - 1))
                                   : __ldg(reinterpret_cast<const float4*>(args.pre_lag + gt * 4)));
      }
    };
    auto load_round = [&](int n, int first) {
      const int64_t t0 = t0_of(n);
      const int valid = valid_of(n);
#pragma unroll
      for (int d = 0; d < kInFlight; ++d) {
        const int task = first + warp + d * kMmaWarps;
        const int t = (task / wide_chunks) * 8 + g, c = task % wide_chunks;
        if (task < tasks && t < valid) load_chunk(args, t0 + t, h0 + 8 * (4 * c + q), in[d]);
      }
    };
    auto run_round = [&](int n, int first) {
      const int64_t t0 = t0_of(n);
      const int valid = valid_of(n);
      uint4* li_buffer = s_li + (n & 1) * tp * (slice / 8);
#pragma unroll
      for (int d = 0; d < kInFlight; ++d) {
        const int task = first + warp + d * kMmaWarps;
        const int t = (task / wide_chunks) * 8 + g, c = task % wide_chunks;
        if (task < tasks && t < valid) {
          const int m = 4 * c + q;
          const float* coef = s_coef + t * kCoefFloats;
          uint32_t cur[kStreams][4];
          update_chunk(coef, in[d], cur);
          store_residual_out(args, t0 + t, h0 + 8 * m, cur);
          float ssq_res, ssq_li;
          uint32_t li[4];
          chunk_sums(coef + 20, cur, ssq_res, ssq_li, li);
          store_b_fragments(s_res, c, tp, t, q, cur);
          s_ssq[t * chunks + m] = ssq_res;
          s_ssq[(tp + t) * chunks + m] = ssq_li;
          li_buffer[t * (slice / 8) + m] = make_uint4(li[0], li[1], li[2], li[3]);
        }
      }
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
          out[p] = dmath::pack_bf16x2(__fmul_rn(__fmul_rn(word_lo(word_of(li, p)), rstd), word_lo(word_of(nw, p))),
                                      __fmul_rn(__fmul_rn(word_hi(word_of(li, p)), rstd), word_hi(word_of(nw, p))));
        }
        *reinterpret_cast<uint4*>(args.layer_input + (t0 + t) * args.layer_input_stride + h0 + 8 * m) =
            make_uint4(out[0], out[1], out[2], out[3]);
      }
    };

    ptx::griddep_wait();
    load_coef_row(0);
    load_round(0, 0);
#pragma unroll 1
    for (int n = 0; n < iters; ++n) {
      const int b = n & 1;
      const int valid = valid_of(n);
      // s_coef, s_res and s_ssq are free: the previous sub-tile's GEMM is done
      if (tid < 6 * tp) reinterpret_cast<float4*>(s_coef)[tid] = coef_row;
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
          s_ssq[((rest / pad) * tp + valid + rest % pad) * chunks + m] = 0.0f;
        }
      }
      work_sync();
      // ---- elementwise pass of sub-tile n (its first round's loads are in flight)
      run_round(n, 0);
#pragma unroll 1
      for (int first = kInFlight * kMmaWarps; first < tasks; first += kInFlight * kMmaWarps) {
        load_round(n, first);
        run_round(n, first);
      }
      // ---- sub-tile n + 1's first loads go out: they land under what follows
      if (n + 1 < iters) {
        load_coef_row(n + 1);
        load_round(n + 1, 0);
      }
      if (n == 0) __pipeline_wait_prior(0);  // this thread's staged weight
      work_sync();
      if (tid < 2 * tp) s_slice[tid] = slice_sum(s_ssq + tid * chunks, chunks);
      // ---- mixer GEMM
      mixer_gemm<kMTiles, kNtPass, false>(gemm, s_res, tp, warp, lane, s_mixp, [] {});
      work_sync();
      // ---- exchange: buffer b of every peer is free once each has read its use n - 2
      if (n == 0) {
        cuda::ptx::barrier_cluster_wait();  // every peer's barriers are initialized
      } else if (n >= 2) {
        wait_parity(empty + b, static_cast<uint32_t>(((n >> 1) - 1) & 1), true);
      }
      push_exchange(cluster, tid, kWorkThreads, tile, tp, rank, s_mixp, s_slice, s_recv_mix + b * recv_mix_floats,
                    s_recv_li + b * kCluster * tp, full + b);
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
  const int64_t weight_bytes = steps_per_warp(hidden) * kMmaWarps * 3 * 512;
  return layout_of(tile, slice_of(hidden)).stage + weight_bytes <= kSmemBytes;
}

cudaError_t persistent_set_attributes() {
  cudaError_t err = cudaSuccess;
  {
    const void* f = reinterpret_cast<const void*>(persistent_boundary_kernel);
    if (err == cudaSuccess) err = cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
    if (err == cudaSuccess) err = cudaFuncSetAttribute(f, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    if (err == cudaSuccess) {
      err = cudaFuncSetAttribute(f, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
    }
  }
  return err;
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
