// SPDX-License-Identifier: Apache-2.0
// mHC boundary: the tile and configuration a call runs on a device. Pure host code: the
// CPU suites test every rule here against hand-made DeviceInfo values.
#include "mhc_boundary/plan.h"

#include <algorithm>
#include <cstdint>

#include "common/internal.h"
#include "mhc_boundary/check.h"
#include "mhc_boundary/config.h"
#include "mhc_boundary/layout.h"

namespace fusedstep::mhc {
namespace {

// The two-CTA configuration's shared memory bounds the tile (plan's limit).
constexpr int kSmemBytes = kSmemBytesTwo;
// Tokens per cluster: the smallest that runs the batch in one wave among those whose
// layout fits kSmemBytes. No tile below 8 in general: a CTA's latency is about the same
// for 1 to 8 tokens (one n8 MMA tile), while every extra cluster streams the whole weight
// from L2 again (eight one-token clusters take 28% longer than four).
constexpr int kTiles[] = {8, 16, 24, 32};
// The one-CTA configuration runs tile 8 for at most three clusters at hidden 4096, four
// at 5120, seven (its whole wave on the H200) from 7168: the larger the slice, the less
// of it the two-CTA kernel stages, and the more the one-CTA kernel's staged slice is
// worth (H200, against the two-CTA plan of the same T: 1-7% faster where taken).
constexpr int one_cta_max_clusters(int64_t hidden) { return hidden >= 7168 ? 7 : (hidden >= 5120 ? 4 : 3); }
// 32-wide chunks of a CTA's hidden slice (k steps 8c .. 8c + 7 of each stream).
int wide_chunks_of(int64_t hidden) { return static_cast<int>(slice_of(hidden) / 32); }
// The most tokens (up to 8) whose elementwise items make at most one task per warp: 8 at
// hidden 4096, 6 at 5120, 4 at 7168. Tile 8 gives two warps a second task from hidden
// 5120, so the one-CTA configuration takes this tile where its clusters fit half the
// one-CTA wave (4-13% faster where taken).
int one_task_tile(int64_t hidden) {
  const int wide_chunks = wide_chunks_of(hidden);
  int tile = kSmallTile;
  while (tile > 1 && packed_tasks(tile, wide_chunks) > kWarps) --tile;
  return tile;
}
// The two-CTA configuration takes tile 8 for at most 11 clusters (T <= 88), tile 16
// above: twelve to fourteen tile-8 clusters put two clusters on a GPC's SMs.
constexpr int kSmallTileMaxClusters = 11;
// Where that tile would need more than half the two-CTA wave, plan() takes half the
// wave (one cluster per GPC) of ceil(T / half) tokens instead, if that tile is at most
// kHalfWaveMaxTile, fits and needs no more GEMM passes; from tile 8 only from hidden
// 5120 (4-12% faster where taken; at hidden 4096 the spread from tile 8 is slower).
constexpr int kHalfWaveMaxTile = 24;
constexpr int64_t kHalfWaveFromSmallTileMinHidden = 5120;
// GEMM passes of the two-CTA kernel select_config() picks for `tile`.
constexpr int two_cta_gemm_passes(int m_tiles, int tile) {
  const int per_pass = n8_tiles_per_pass(m_tiles, 2, tile > kSmallTile);
  return (n8_padded(tile) / 8 + per_pass - 1) / per_pass;
}
// The one-CTA kernel has code for one round of the elementwise pass only (the later
// rounds' loop adds 17 KB of code and makes it 2-6% slower): it runs where tile 8's
// items fit one round (hidden <= 8192).
bool one_cta_fits_one_round(int64_t hidden) {
  return packed_tasks(kSmallTile, wide_chunks_of(hidden)) <= kTasksInFlight * kWarps;
}
// A two-CTA tile of more than 8 tokens runs the packed-items variant where that makes
// the elementwise pass one round instead of two (hidden 5120 tiles 9-12, 7168 tile 9:
// 2-4% faster on the H200); elsewhere the whole-tile mapping is faster.
bool packed_saves_a_round(int tile, int64_t hidden) {
  const int wide_chunks = wide_chunks_of(hidden);
  const int round = kTasksInFlight * kWarps;
  return tile > kSmallTile && packed_tasks(tile, wide_chunks) <= round &&
         tile_tasks(n8_padded(tile), wide_chunks) > round;
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

ConfigKey select_config(const MhcBoundaryParams& params, const MhcBoundaryPlan& plan) noexcept {
  const int mt = m_tiles(params.rounding);
  if (plan.ctas_per_sm == 1) return {mt, 1, false, false};
  if (packed_saves_a_round(plan.tile, params.hidden)) return {mt, 2, true, true};
  // Tiles of fewer than 8 tokens (one_task_tile()): one task per warp only when packed.
  if (plan.tile < kSmallTile) return {mt, 2, false, true};
  return {mt, 2, plan.tile > kSmallTile, false};
}

}  // namespace fusedstep::mhc

namespace fusedstep {

using namespace mhc;

Result plan(const MhcBoundaryParams& params, const DeviceInfo& device, MhcBoundaryPlan* out) noexcept {
  if (out == nullptr) return Result::error(Status::kNullPointer, "mhc_boundary: plan out = null");
  FS_TRY(check(params, device));
  const int largest = max_tile(params.hidden);
  if (largest == 0) {
    return Result::error(Status::kUnsupported,
                         "mhc_boundary: hidden = %lld leaves no token tile within %d bytes of "
                         "shared memory",
                         static_cast<long long>(params.hidden), kSmemBytes);
  }
  // plan() is the one place that picks the configuration: launch() runs exactly this
  // plan, so what plan() reports is what runs.
  const int64_t per_wave = device.mhc_clusters_per_wave;
  // The one-CTA-per-SM configuration runs only where the device has its opt-in shared
  // memory and co-schedules at least one of its clusters (cudaOccupancyMaxActiveClusters,
  // device.mhc_one_cta_clusters_per_wave: each cluster needs 16 SMs of one GPC).
  const int64_t one_cta_clusters = device.max_smem_per_block_optin >= kSmemBytesOne
                                       ? std::max(device.mhc_one_cta_clusters_per_wave, 0)
                                       : 0;
  MhcBoundaryPlan p;

  // ---- one cluster per tile. The one-CTA-per-SM configuration (small batches) runs
  // tile 8 for at most one_cta_max_clusters() clusters, and only in one wave of it: never
  // more clusters than the device co-schedules in it nor than half the two-CTA wave;
  // where it does not run, the two-CTA rule below picks the tile.
  if (params.tile > largest) {
    return Result::error(Status::kUnsupported,
                         "mhc_boundary: tile = %d does not fit %d bytes of shared memory at hidden = %lld "
                         "(largest tile %d)",
                         params.tile, kSmemBytes, static_cast<long long>(params.hidden), largest);
  }
  const int64_t per_wave_one =
      one_cta_fits_one_round(params.hidden)
          ? std::min<int64_t>({per_wave / 2, one_cta_clusters, one_cta_max_clusters(params.hidden)})
          : 0;
  // Where tile 8 would give a warp a second elementwise task: the one-task tile, if the
  // tile is plan()'s to pick and that tile takes at most `most_clusters` clusters.
  const int one_task = one_task_tile(params.hidden);
  auto one_task_tile_fits = [&](int64_t most_clusters) {
    return params.tile == 0 && params.tokens > one_task &&
           (params.tokens + one_task - 1) / one_task <= most_clusters;
  };
  p.tile = 0;
  // (Tile 8 fits wherever any tile does: `largest` > 0 here.)
  if (per_wave_one >= 1 && (params.tile == 0 || params.tile == kSmallTile) &&
      (params.tokens + kSmallTile - 1) / kSmallTile <= per_wave_one) {
    p.tile = kSmallTile;
    p.ctas_per_sm = 1;
    if (one_task_tile_fits(std::min(per_wave_one, one_cta_clusters / 2))) p.tile = one_task;
  }
  if (p.tile == 0) {
    p.tile = params.tile != 0 ? params.tile : largest;
    p.ctas_per_sm = 2;
    for (int tile : kTiles) {
      const int64_t clusters = (params.tokens + tile - 1) / tile;
      if (tile == kSmallTile && clusters > kSmallTileMaxClusters) continue;
      if (params.tile == 0 && tile <= largest && clusters <= per_wave) {
        p.tile = tile;
        break;
      }
    }
    const int64_t half_wave = per_wave / 2;
    // The one-task tile, where its clusters still fit half the wave (one per GPC): hidden
    // 5120 T = 33-42, 2-5% faster than tile 8 on the H200 (its own instantiation: as a
    // runtime branch of the tile-8 kernel it costs every two-CTA call 3-7%).
    if (p.tile == kSmallTile && one_task_tile_fits(half_wave)) p.tile = one_task;
    if (params.tile == 0 && half_wave >= 1 && (params.tokens + p.tile - 1) / p.tile > half_wave &&
        (p.tile != kSmallTile || params.hidden >= kHalfWaveFromSmallTileMinHidden)) {
      const int spread = static_cast<int>((params.tokens + half_wave - 1) / half_wave);
      const int mt = mhc::m_tiles(params.rounding);
      if (spread <= std::min(largest, kHalfWaveMaxTile) &&
          two_cta_gemm_passes(mt, spread) <= two_cta_gemm_passes(mt, p.tile)) {
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

}  // namespace fusedstep
