// SPDX-License-Identifier: Apache-2.0
// Contract: mhc_boundary plan() (host only, a hand-made DeviceInfo) picks the tile and the
// configuration that launch() then runs, and reports them truthfully. One-wave schedule:
// the one-CTA-per-SM configuration only where the DeviceInfo says the device runs it and
// only for a batch that fits one wave of it; otherwise the two-CTA configuration and its
// wave count. Persistent schedule (on request only): only where its kernel runs (TF32
// rounding, weight slice resident, one-CTA clusters co-resident), at most the
// co-resident clusters.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>

#include "common/mhc_plan_params.h"
#include "fusedstep/mhc_boundary.h"

namespace fusedstep {
namespace {

using testing::mhc_plan_params;

struct Expect {
  int64_t hidden, tokens;
  int tile;
  int64_t clusters;
  int waves;
  int ctas_per_sm;
  WeightRounding rounding = WeightRounding::kTf32Rna;
};

MhcBoundaryParams one_wave_params(int64_t hidden, int64_t tokens,
                                  WeightRounding rounding = WeightRounding::kTf32Rna) {
  MhcBoundaryParams p = mhc_plan_params(hidden, tokens);
  p.rounding = rounding;
  return p;
}

void expect_plans(const DeviceInfo& info, std::initializer_list<Expect> table, const char* device) {
  for (const Expect& e : table) {
    MhcBoundaryPlan out;
    const Result r = plan(one_wave_params(e.hidden, e.tokens, e.rounding), info, &out);
    ASSERT_TRUE(r.ok()) << r.detail();
    const auto where = ::testing::Message() << device << ", hidden " << e.hidden << ", tokens " << e.tokens;
    EXPECT_EQ(out.tile, e.tile) << where;
    EXPECT_EQ(out.clusters, e.clusters) << where;
    EXPECT_EQ(out.waves, e.waves) << where;
    EXPECT_EQ(out.ctas_per_sm, e.ctas_per_sm) << where;
  }
}

// Small batches take the one-CTA-per-SM configuration (tile 8, at most three clusters,
// T <= 24, at hidden 4096; four, T <= 32, at 5120; seven, T <= 56, from 7168; where tile
// 8 would give a warp two elementwise tasks, the most tokens that give each warp one, 6
// at hidden 5120 and 4 at 7168, while that takes at most three clusters); others the smallest tile
// that runs the batch in one wave of the two-CTA configuration (14 clusters on the H200;
// tile 8 for at most 11 clusters, T <= 88), else the largest tile that fits shared
// memory and more waves. Where that tile is 8, the one-task tile while that takes at
// most half the wave (hidden 5120 T = 33-42: tiles of 6). Where the tile would need more
// than half the wave (7 clusters), half the wave of ceil(T / 7) tokens if that tile is
// at most 24 and fits; from tile 8 only from hidden 5120.
TEST(MhcBoundaryPlan, PicksOneWaveTileElseMoreWaves) {
  const DeviceInfo info = hopper_device_info_for_tests();  // 14 and 7 clusters per wave
  ASSERT_EQ(info.mhc_clusters_per_wave, 14);
  ASSERT_EQ(info.mhc_one_cta_clusters_per_wave, 7);
  expect_plans(info,
               {{5120, 0, 8, 0, 0, 1}, {5120, 1, 8, 1, 1, 1}, {5120, 6, 8, 1, 1, 1}, {5120, 7, 6, 2, 1, 1},
                {5120, 14, 6, 3, 1, 1}, {5120, 18, 6, 3, 1, 1}, {5120, 19, 8, 3, 1, 1}, {5120, 24, 8, 3, 1, 1},
                {5120, 25, 8, 4, 1, 1}, {5120, 32, 8, 4, 1, 1}, {7168, 4, 8, 1, 1, 1}, {7168, 5, 4, 2, 1, 1},
                {7168, 12, 4, 3, 1, 1}, {7168, 13, 8, 2, 1, 1}, {4096, 16, 8, 2, 1, 1},
                {5120, 33, 6, 6, 1, 2}, {5120, 42, 6, 7, 1, 2}, {5120, 43, 8, 6, 1, 2}, {4096, 24, 8, 3, 1, 1}, {4096, 25, 8, 4, 1, 2}, {7168, 32, 8, 4, 1, 1}, {7168, 33, 8, 5, 1, 1}, {7168, 41, 8, 6, 1, 1}, {7168, 56, 8, 7, 1, 1}, {7168, 57, 9, 7, 1, 2}, {5120, 56, 8, 7, 1, 2}, {5120, 57, 9, 7, 1, 2}, {5120, 64, 10, 7, 1, 2},
                {5120, 88, 13, 7, 1, 2}, {7168, 64, 10, 7, 1, 2}, {4096, 64, 8, 8, 1, 2}, {4096, 88, 8, 11, 1, 2},
                {5120, 89, 16, 6, 1, 2}, {5120, 112, 16, 7, 1, 2}, {5120, 113, 17, 7, 1, 2}, {5120, 128, 19, 7, 1, 2}, {5120, 168, 24, 7, 1, 2},
                {5120, 169, 16, 11, 1, 2}, {5120, 336, 24, 14, 1, 2}, {5120, 337, 24, 15, 2, 2},
                {4096, 112, 16, 7, 1, 2}, {4096, 113, 17, 7, 1, 2}, {4096, 168, 24, 7, 1, 2},
                {4096, 169, 16, 11, 1, 2}, {4096, 224, 16, 14, 1, 2}, {4096, 225, 24, 10, 1, 2},
                {4096, 448, 32, 14, 1, 2}, {7168, 225, 16, 15, 2, 2}, {5120, 16384, 24, 683, 49, 2},
                // where tile 8 is the largest that fits, it runs up to the whole wave
                {16384, 100, 8, 13, 1, 2}},
               "H200");
  EXPECT_EQ(plan(mhc_plan_params(5120, 64), info, nullptr).status(), Status::kNullPointer);
  DeviceInfo no_clusters = info;
  no_clusters.mhc_clusters_per_wave = 0;
  MhcBoundaryPlan out;
  EXPECT_EQ(plan(mhc_plan_params(5120, 64), no_clusters, &out).status(), Status::kDeviceUnsupported);
}

// The half-wave tiles never cost a GEMM pass: at FP32 the wide-tile kernel takes two n8
// tiles a pass, so tiles 17-24 (three) would take two passes where tile 16 takes one
// (H200: 12-14% slower); tiles 9-13 take one pass, as tile 8 does.
TEST(MhcBoundaryPlan, HalfWaveTilesOnlyWithoutAnotherGemmPass) {
  const DeviceInfo info = hopper_device_info_for_tests();
  constexpr WeightRounding kFp32 = WeightRounding::kFp32;
  expect_plans(info,
               {{5120, 64, 10, 7, 1, 2, kFp32}, {5120, 88, 13, 7, 1, 2, kFp32}, {5120, 113, 16, 8, 1, 2, kFp32},
                {5120, 168, 16, 11, 1, 2, kFp32}, {7168, 64, 10, 7, 1, 2, kFp32}, {4096, 64, 8, 8, 1, 2, kFp32},
                {5120, 113, 17, 7, 1, 2, WeightRounding::kTf32Rne}, {5120, 168, 24, 7, 1, 2, WeightRounding::kTf32Rne}},
               "H200");
}

// Where the device cannot run the one-CTA configuration (no room for its 227 KB of
// shared memory, or no 16-CTA cluster of it fits: mhc_one_cta_clusters_per_wave = 0),
// plan() says two CTAs per SM and picks the two-CTA tile, so that what plan() reports is
// what launch() runs.
TEST(MhcBoundaryPlan, TwoCtasWhereTheOneCtaConfigurationDoesNotRun) {
  DeviceInfo small_smem = hopper_device_info_for_tests();
  small_smem.max_smem_per_block_optin = 200 * 1024;
  DeviceInfo none_fit = hopper_device_info_for_tests();
  none_fit.mhc_one_cta_clusters_per_wave = 0;
  for (const DeviceInfo& info : {small_smem, none_fit}) {
    expect_plans(info,
                 {{5120, 1, 8, 1, 1, 2}, {5120, 8, 6, 2, 1, 2}, {5120, 64, 10, 7, 1, 2}, {5120, 112, 16, 7, 1, 2},
                  {5120, 113, 17, 7, 1, 2}, {5120, 336, 24, 14, 1, 2}},
                 info.max_smem_per_block_optin < 227 * 1024 ? "200 KB opt-in" : "no one-CTA cluster fits");
  }
  // The one-CTA kernel runs its elementwise pass in one round of two tasks per warp:
  // tile 8 fits that up to hidden 8192 (16 tasks of eight (token, 32-wide chunk) items),
  // not at 8704 (17).
  expect_plans(hopper_device_info_for_tests(), {{8192, 1, 8, 1, 1, 1}, {8704, 1, 8, 1, 1, 2}},
               "one-CTA elementwise pass in one round");
}

// A device that co-schedules a single one-CTA cluster: the one-CTA configuration only
// while the batch fits it (so its wave count of 1 is true), the two-CTA configuration
// past it; a device with room for many never runs more than seven one-CTA clusters (four
// at hidden 5120, three at 4096), nor more than half its two-CTA wave.
TEST(MhcBoundaryPlan, OneCtaOnlyWithinItsOwnWave) {
  DeviceInfo info = hopper_device_info_for_tests();
  info.mhc_one_cta_clusters_per_wave = 1;
  expect_plans(info, {{5120, 8, 8, 1, 1, 1}, {5120, 9, 6, 2, 1, 2}, {5120, 16, 6, 3, 1, 2}}, "1 one-CTA cluster");
  info.mhc_one_cta_clusters_per_wave = 10;
  expect_plans(info, {{5120, 32, 8, 4, 1, 1}, {5120, 33, 6, 6, 1, 2}, {7168, 56, 8, 7, 1, 1}, {4096, 24, 8, 3, 1, 1}, {4096, 25, 8, 4, 1, 2}},
               "10 one-CTA clusters");
  info.mhc_one_cta_clusters_per_wave = 2;
  expect_plans(info, {{5120, 16, 8, 2, 1, 1}, {5120, 17, 6, 3, 1, 2}}, "2 one-CTA clusters");
  info.mhc_one_cta_clusters_per_wave = 10;
  info.mhc_clusters_per_wave = 2;
  // (T = 9: tile 8 would need more than half the two-CTA wave, so one cluster of 9)
  expect_plans(info, {{5120, 8, 8, 1, 1, 1}, {5120, 9, 9, 1, 1, 2}, {4096, 9, 8, 2, 1, 2}}, "two-CTA wave of 2");
}

// Whatever the device facts, a one-CTA plan is a single wave of tile 8 (or fewer tokens,
// then at most half of mhc_one_cta_clusters_per_wave clusters) and at most
// mhc_one_cta_clusters_per_wave, half of mhc_clusters_per_wave and four clusters (at
// hidden 5120), and a plan's waves cover its clusters with the co-resident clusters of
// the configuration it names.
TEST(MhcBoundaryPlan, WavesMatchTheReportedConfiguration) {
  for (int two : {1, 2, 7, 14, 16}) {
    for (int one : {0, 1, 3, 7, 8}) {
      DeviceInfo info = hopper_device_info_for_tests();
      info.mhc_clusters_per_wave = two;
      info.mhc_one_cta_clusters_per_wave = one;
      for (int64_t tokens : {int64_t{1}, int64_t{7}, int64_t{9}, int64_t{12}, int64_t{17}, int64_t{63}, int64_t{100}, int64_t{129},
                             int64_t{500}, int64_t{4097}}) {
        MhcBoundaryPlan out;
        const Result r = plan(one_wave_params(5120, tokens), info, &out);
        ASSERT_TRUE(r.ok()) << r.detail();
        const auto where = ::testing::Message() << "two-CTA wave " << two << ", one-CTA wave " << one
                                                << ", tokens " << tokens;
        ASSERT_TRUE(out.ctas_per_sm == 1 || out.ctas_per_sm == 2) << where;
        EXPECT_EQ(out.clusters, (tokens + out.tile - 1) / out.tile) << where;
        if (out.ctas_per_sm == 1) {
          EXPECT_GE(one, 1) << where;
          EXPECT_LE(out.clusters, std::min({one, two / 2, 4})) << where;
          EXPECT_LE(out.tile, 8) << where;
          if (out.tile < 8) {
            EXPECT_LE(out.clusters, one / 2) << where;
          }
          EXPECT_EQ(out.waves, 1) << where;
        } else {
          EXPECT_EQ(out.waves, (out.clusters + two - 1) / two) << where;
        }
      }
    }
  }
}

// A forced tile is honoured (more waves if need be) or rejected, never replaced.
TEST(MhcBoundaryPlan, ForcedTile) {
  const DeviceInfo info = hopper_device_info_for_tests();
  auto planned = [&](int64_t hidden, int64_t tokens, int tile, MhcBoundaryPlan* out) {
    MhcBoundaryParams p = mhc_plan_params(hidden, tokens);
    p.tile = tile;
    return plan(p, info, out);
  };
  MhcBoundaryPlan out;
  ASSERT_TRUE(planned(5120, 336, 8, &out).ok());
  EXPECT_EQ(out.tile, 8);
  EXPECT_EQ(out.clusters, 42);
  EXPECT_EQ(out.waves, 3);
  EXPECT_EQ(out.ctas_per_sm, 2);
  ASSERT_TRUE(planned(5120, 3, 8, &out).ok());
  EXPECT_EQ(out.ctas_per_sm, 1);
  EXPECT_EQ(planned(7168, 64, 32, &out).status(), Status::kUnsupported);
  // Values outside the tile set are rejected by check().
  EXPECT_EQ(planned(5120, 64, 12, &out).status(), Status::kInvalidValue);
}

}  // namespace
}  // namespace fusedstep
