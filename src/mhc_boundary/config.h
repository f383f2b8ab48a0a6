// SPDX-License-Identifier: Apache-2.0
// mHC boundary: the compile-time configurations of the fused kernel, the list the
// library builds, the shared-memory layout and the kernel arguments. plan() maps a call
// to one configuration (ConfigKey); launch() runs the kernel compiled for it
// (instantiations/*.cu). Host and device code.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "common/config_list.h"
#include "float_bits.h"  // FS_HD
#include "mhc_boundary/layout.h"

namespace fusedstep::mhc {

// 8 warps, all of them MMA warps: two CTAs of 256 threads per SM keep many 16-CTA
// clusters co-resident and leave 128 registers per thread, enough for all n8 tiles of a
// TF32 tile in one pass with the A fragments of 3 steps in flight.
inline constexpr int kThreads = 256;
inline constexpr int kWarps = kThreads / 32;
// Two CTA-per-SM configurations of the same kernel (a token's bits never depend on which
// runs): two CTAs per SM take 112 KB of dynamic shared memory each (many co-resident
// clusters; the k steps that do not fit stream from L2 into registers); one CTA per SM
// (small batches) takes 227 KB, enough to stage the whole weight slice (TF32 modes)
// before the PDL wait. One fixed size per configuration gives one occupancy figure.
inline constexpr int kSmemBytesTwo = 112 * 1024;
inline constexpr int kSmemBytesOne = 227 * 1024;
FS_HD constexpr int smem_bytes_of(int ctas_per_sm) { return ctas_per_sm == 1 ? kSmemBytesOne : kSmemBytesTwo; }

inline constexpr int kSmallTile = 8;                   // one n8 MMA tile of tokens
inline constexpr int kMaxTile = 32;                    // tokens of one tile
inline constexpr int kMaxOwned = kMaxTile / kCluster;  // tokens one CTA finalizes per tile
// Floats pushed to a token's owner per slice: 24 mixes, the residual sum of squares,
// padding to whole 16-byte st.async quads.
inline constexpr int kRecvFloats = 28;
inline constexpr int kRecvQuads = kRecvFloats / 4;
// A warp's partial mixes of one token in shared memory (s_mixp: [8 warps][tp][28]): 24
// mixes, padded so that the GEMM's stores (tokens 2q + e of lane q) and the pushes'
// 16-byte reads (a token per lane) hit different banks.
inline constexpr int kMixpFloats = 28;
inline constexpr int kCoefFloats = 24;             // per token: post 0-3 | comb 4-19 | pre_lag 20-23
inline constexpr int kCoefOutFloats = kMixes + 1;  // per owned token: mix totals | sum of squares
// Elementwise tasks whose loads a warp keeps in flight: a round of the elementwise pass
// is kTasksInFlight * kWarps tasks (four are slower: the code grows).
inline constexpr int kTasksInFlight = 2;

// A tile rounded up to whole n8 MMA tiles (its padding tokens are zeros).
FS_HD constexpr int n8_padded(int tile) { return (tile + 7) / 8 * 8; }
// n8 token tiles per pass of the GEMM over the k steps (what the accumulators' registers
// allow); a tile of more tokens takes more passes, each re-reading the weight slice.
// Tile 8 is one n8 tile: a pass of one keeps the GEMM's code to what runs, except for
// the two-CTA TF32 kernel, where passes of four are faster.
FS_HD constexpr int n8_tiles_per_pass(int m_tiles, int ctas_per_sm, bool wide_tile) {
  return !wide_tile && (ctas_per_sm == 1 || m_tiles == 5) ? 1 : (m_tiles == 3 ? 4 : 2);
}

struct CoefficientScalars {
  float rms_eps, hc_pre_eps, sinkhorn_eps, post_mult;
  int sinkhorn_iters;
};

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

// A configuration as plan() names it at run time (select_config()).
struct ConfigKey {
  int m_tiles = 0;
  int ctas_per_sm = 0;
  bool wide_tile = false;
  bool packed_items = false;
  friend constexpr bool operator==(const ConfigKey&, const ConfigKey&) = default;
};

// The fused kernel: kMTiles m16 tiles of stacked weight parts (3 for the TF32 modes, 5
// for FP32), kCtasPerSm CTAs per SM (shared memory above), kWideTile: built for tiles
// of more than 8 tokens (the tile-8 build runs any tile, in more GEMM passes),
// kPackedItems: a partial tile's elementwise tasks hold only its valid tokens' items.
template <int MTiles, int CtasPerSm, bool WideTile, bool PackedItems>
struct BoundaryConfig {
  static constexpr int kMTiles = MTiles;
  static constexpr int kCtasPerSm = CtasPerSm;
  static constexpr bool kWideTile = WideTile;
  static constexpr bool kPackedItems = PackedItems;
  static constexpr int kSmem = smem_bytes_of(kCtasPerSm);
  static constexpr ConfigKey key() { return {kMTiles, kCtasPerSm, kWideTile, kPackedItems}; }
};

// Every configuration plan() selects (instantiations/tf32.cu: kMTiles 3, fp32.cu: 5).
using BoundaryConfigs =
    ConfigList<BoundaryConfig<3, 2, false, false>, BoundaryConfig<3, 2, true, false>, BoundaryConfig<3, 2, true, true>,
               BoundaryConfig<3, 2, false, true>, BoundaryConfig<3, 1, false, false>,
               BoundaryConfig<5, 2, false, false>, BoundaryConfig<5, 2, true, false>, BoundaryConfig<5, 2, true, true>,
               BoundaryConfig<5, 2, false, true>, BoundaryConfig<5, 1, false, false>>;

}  // namespace fusedstep::mhc
