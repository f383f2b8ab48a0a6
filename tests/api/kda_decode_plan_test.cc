// SPDX-License-Identifier: Apache-2.0
// Contract: kda_decode plan() (host only, a hand-made DeviceInfo) resolves the default
// schedules by heads x batch (docs/benchmarks.md holds the sweeps behind them), keeps
// check()'s rules for the FMA-tree gate and the verify, keeps explicit schedule fields,
// names a bad schedule field, and reports the grid it launches (CTAs, waves).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/kda_built_configs.h"
#include "fusedstep/kda_decode.h"

namespace fusedstep {
namespace {

// A valid call of `batch` requests x `heads` x `tokens` with fake, aligned device
// pointers (plan() and check() never dereference them) and padded strides; q > 1 with
// accepted counts and, with `records`, direct RecoverSSM records.
KdaDecodeParams plan_params(int heads, int batch, int tokens = 1, KdaGateMode gate_mode = KdaGateMode::kOneChain,
                            bool records = false) {
  uintptr_t next = 0x100000;
  auto fake = [&next]() {
    next += 0x100000;
    return next;
  };
  const int64_t dim = int64_t{heads} * kKdaHeadDim;
  KdaDecodeParams p;
  p.batch = batch;
  p.heads = heads;
  p.tokens = tokens;
  p.gate_mode = gate_mode;
  p.x = reinterpret_cast<const __nv_bfloat16*>(fake());
  p.x_stride = 3 * dim + 8;
  p.f_a = reinterpret_cast<const __nv_bfloat16*>(fake());
  p.f_a_stride = kKdaRank + 8;
  p.f_b_weight = reinterpret_cast<const __nv_bfloat16*>(fake());
  p.raw_beta = reinterpret_cast<const __nv_bfloat16*>(fake());
  p.raw_beta_stride = heads + 8;
  p.output_gate = reinterpret_cast<const __nv_bfloat16*>(fake());
  p.output_gate_stride = dim + 8;
  p.conv_weight = reinterpret_cast<const void*>(fake());
  p.conv_weight_channel_stride = kKdaConvWidth;
  p.conv_weight_tap_stride = 1;
  p.a_log = reinterpret_cast<const float*>(fake());
  p.dt_bias = reinterpret_cast<const float*>(fake());
  p.norm_weight = reinterpret_cast<const float*>(fake());
  const int64_t slots = 1 + int64_t{batch} * tokens + 3;
  p.conv_state = reinterpret_cast<void*>(fake());
  p.conv_state_channel_stride = tokens + 2;
  p.conv_state_tap_stride = 1;
  p.conv_state_slot_stride = 3 * dim * (tokens + 2) + 16;
  p.conv_state_slots = slots;
  p.state = reinterpret_cast<float*>(fake());
  p.state_slot_stride = int64_t{heads} * kKdaHeadDim * kKdaHeadDim + 64;
  p.state_slots = slots;
  p.slots = reinterpret_cast<const int32_t*>(fake());
  p.output = reinterpret_cast<__nv_bfloat16*>(fake());
  p.output_stride = dim + 8;
  if (tokens > 1) {
    p.slots_stride = tokens;
    p.accepted = reinterpret_cast<const int32_t*>(fake());
  }
  if (records) {
    p.record_correction = reinterpret_cast<float*>(fake());
    p.record_key_gate = reinterpret_cast<__nv_bfloat16*>(fake());
    p.record_slots = batch;
  }
  return p;
}

// q = 1: the defaults by heads x batch and gate mode; explicit fields kept; bad schedule
// fields named.
TEST(KdaDecodePlan, ResolvesDefaultsAndRejectsBadSchedules) {
  const DeviceInfo device = hopper_device_info_for_tests();
  KdaDecodePlan plan_out;
  struct Want {
    int heads, batch;
    KdaGateMode mode;
    int cluster, lanes, early;
    bool evict;
  };
  const Want table[] = {
      {12, 1, KdaGateMode::kOneChain, 8, 16, 1, false},    {12, 4, KdaGateMode::kOneChain, 4, 16, 1, false},
      {3, 16, KdaGateMode::kOneChain, 4, 16, 1, false},    {12, 8, KdaGateMode::kOneChain, 4, 16, 1, false},
      {12, 16, KdaGateMode::kOneChain, 2, 16, 1, false},   {12, 32, KdaGateMode::kOneChain, 1, 16, 1, true},
      {12, 64, KdaGateMode::kOneChain, 1, 16, 1, true},    {24, 64, KdaGateMode::kFourChains, 1, 16, 1, true},
      {12, 128, KdaGateMode::kOneChain, 1, 16, 1, true},   {12, 20, KdaGateMode::kOneChain, 1, 16, 2, true},
      {12, 29, KdaGateMode::kOneChain, 1, 16, 2, true},    {12, 30, KdaGateMode::kOneChain, 1, 16, 1, true},
      {12, 129, KdaGateMode::kOneChain, 1, 16, 1, true},   {12, 192, KdaGateMode::kOneChain, 1, 16, 1, true},
      {24, 128, KdaGateMode::kOneChain, 1, 16, 1, true},   {12, 256, KdaGateMode::kOneChain, 1, 16, 1, true},
      {12, 1, KdaGateMode::kFmaTree, 8, 16, 1, false},     {12, 32, KdaGateMode::kFmaTree, 4, 16, 1, false},
      {48, 1, KdaGateMode::kOneChain, 8, 16, 1, false},    {96, 1, KdaGateMode::kOneChain, 4, 16, 1, false},
      {12, 6, KdaGateMode::kOneChain, 4, 8, 1, false},     {12, 10, KdaGateMode::kOneChain, 4, 16, 1, false},
      {12, 11, KdaGateMode::kOneChain, 2, 8, 1, false},
  };
  for (const Want& w : table) {
    const auto where = ::testing::Message() << w.heads << " heads, batch " << w.batch;
    const Result r = plan(plan_params(w.heads, w.batch, 1, w.mode), device, &plan_out);
    ASSERT_TRUE(r.ok()) << where << ": " << r.detail();
    const KdaSchedule& s = plan_out.schedule;
    EXPECT_EQ(s.cluster, w.cluster) << where;
    EXPECT_EQ(s.lanes_per_row, w.lanes) << where;
    EXPECT_EQ(s.early, w.early) << where;
    EXPECT_EQ(s.evict_first, w.evict) << where;
    EXPECT_EQ(plan_out.ctas, int64_t(s.cluster) * w.heads * w.batch) << where;
    EXPECT_GE(plan_out.waves, 1) << where;
  }

  KdaDecodeParams params = plan_params(12, 2);
  // Explicit fields are kept; the rest take defaults; evict-first stays off.
  params.schedule.cluster = 2;
  const Result kept = plan(params, device, &plan_out);
  ASSERT_TRUE(kept.ok()) << kept.detail();
  EXPECT_EQ(plan_out.schedule.cluster, 2);
  EXPECT_FALSE(plan_out.schedule.evict_first);
  params.schedule = KdaSchedule{};

  struct Bad {
    KdaSchedule schedule;
    const char* field;
  };
  std::vector<Bad> bad;
  {
    KdaSchedule s;
    s.cluster = 3;
    bad.push_back({s, "schedule.cluster = 3"});
  }
  {
    KdaSchedule s;
    s.lanes_per_row = 4;
    bad.push_back({s, "schedule.lanes_per_row = 4"});
  }
  {
    KdaSchedule s;
    s.early = 4;
    bad.push_back({s, "schedule.early = 4"});
  }
  {
    KdaSchedule s;
    s.early = 1;
    s.evict_first = true;
    bad.push_back({s, "schedule.evict_first"});
  }
  for (const Bad& b : bad) {
    params.schedule = b.schedule;
    const Result r = plan(params, device, &plan_out);
    EXPECT_FALSE(r.ok()) << b.field;
    EXPECT_NE(std::string(r.detail()).find(b.field), std::string::npos) << r.detail();
  }
}

// plan() accepts an explicit schedule exactly when it names a built configuration
// (every schedule check() allows, q = 1 and verify), and names the schedule and the
// built list when it does not.
TEST(KdaDecodePlan, AcceptsExactlyTheBuiltConfigurations) {
  const DeviceInfo device = hopper_device_info_for_tests();
  KdaDecodePlan plan_out;
  for (int variant = 0; variant < 4; ++variant) {  // q = 1 / 3, FP32 / BF16 state: the same list
    const int q = variant % 2 ? 3 : 1;
    KdaDecodeParams params = plan_params(12, 2, q);
    params.state_dtype = variant >= 2 ? DType::kBf16 : DType::kFp32;
    int built = 0;
    for (int cluster : {1, 2, 4, 8, 16}) {
      for (int lanes : {8, 16}) {
        for (int early = 0; early <= (q == 1 ? 3 : 2); ++early) {
          KdaSchedule s;
          s.cluster = cluster;
          s.lanes_per_row = lanes;
          s.early = early;
          if (early == 3 && cluster > 2) continue;  // check(): early 3 needs 1 or 2 CTAs
          if (q > 1 && cluster == 16) continue;     // check(): the verify runs at most 8
          params.schedule = s;
          const Result r = plan(params, device, &plan_out);
          const bool want = testing::is_built(q > 1, cluster, lanes, early);
          const auto where = ::testing::Message() << "q " << q << (variant >= 2 ? ", BF16 state" : "")
                                                  << ", cluster " << cluster << ", lanes " << lanes
                                                  << ", early " << early << ": " << r.detail();
          EXPECT_EQ(r.ok(), want) << where;
          if (!want) {
            EXPECT_EQ(r.status(), Status::kUnsupported) << where;
            EXPECT_NE(std::string(r.detail()).find("has no built"), std::string::npos) << where;
            EXPECT_NE(std::string(r.detail()).find("built: (cluster 1, lanes_per_row 16, staged)"), std::string::npos)
                << where;
          }
          built += r.ok();
        }
      }
    }
    // q = 1: C = 1 at early 0-3 and five register configurations at early 0 / 1;
    // verify: C = 1 at early 0-2, three staged at early 2, three in registers at 0 / 1.
    EXPECT_EQ(built, q == 1 ? 4 + 5 * 2 : 3 + 3 + 3 * 2) << "q " << q;
  }
}

// The wave count takes each configuration's CTAs-per-SM bound: C = 4 with 16 lanes is
// built for four CTAs per SM on sm_90a (12 heads, batch 10: 480 CTAs in the 528 slots of
// one wave), for ptxas's own choice on sm_100a (about 128 registers: three, two waves).
TEST(KdaDecodePlan, WavesFollowTheConfigsCtasPerSm) {
  DeviceInfo device = hopper_device_info_for_tests();
  KdaDecodePlan plan_out;
  const Result r = plan(plan_params(12, 10), device, &plan_out);
  ASSERT_TRUE(r.ok()) << r.detail();
  ASSERT_EQ(plan_out.schedule.cluster, 4);
  ASSERT_EQ(plan_out.schedule.lanes_per_row, 16);
  EXPECT_EQ(plan_out.ctas, 480);
  EXPECT_EQ(plan_out.waves, 1);
  device.cc_major = 10;
  const Result blackwell = plan(plan_params(12, 10), device, &plan_out);
  ASSERT_TRUE(blackwell.ok()) << blackwell.detail();
  EXPECT_EQ(plan_out.waves, 2);
}

// q = 1, C = 1, BF16 state: the four-CTA build (528 slots a wave on 132 SMs, three-CTA
// one 396) runs where it takes at most three quarters of the three-CTA build's waves, for
// default and explicit schedules alike; an FP32 state keeps three CTAs per SM.
TEST(KdaDecodePlan, Bf16StateTakesFourCtasPerSmWhereItSavesAQuarterOfTheWaves) {
  const DeviceInfo device = hopper_device_info_for_tests();
  struct Want {
    int heads, batch, waves;
  };
  // 12 x 32: one wave either way; x 64 and x 96: 2 and 3 either way; x 40: 1 against 2;
  // x 128: 3 against 4; x 256 (and 24 x 128): 6 against 8.
  for (const Want& w : {Want{12, 32, 1}, Want{12, 40, 1}, Want{12, 64, 2}, Want{12, 96, 3}, Want{12, 128, 3},
                        Want{12, 256, 6}, Want{24, 128, 6}}) {
    for (const bool explicit_schedule : {false, true}) {
      KdaDecodeParams params = plan_params(w.heads, w.batch);
      params.state_dtype = DType::kBf16;
      if (explicit_schedule) params.schedule = KdaSchedule{1, 16, 1, false};
      KdaDecodePlan plan_out;
      const Result r = plan(params, device, &plan_out);
      const auto where = ::testing::Message() << w.heads << " heads x " << w.batch
                                              << (explicit_schedule ? ", explicit schedule" : "");
      ASSERT_TRUE(r.ok()) << where << ": " << r.detail();
      ASSERT_EQ(plan_out.schedule.cluster, 1) << where;
      EXPECT_EQ(plan_out.waves, w.waves) << where;
      params.state_dtype = DType::kFp32;
      ASSERT_TRUE(plan(params, device, &plan_out).ok()) << where;
      EXPECT_EQ(plan_out.waves, (int64_t(w.heads) * w.batch + 395) / 396) << where << ", FP32 state";
    }
  }
}

// Verify (q > 1): the defaults at 12 heads; explicit verify schedules kept; check()'s
// verify rules (early <= 2, no 16-CTA clusters) name the field.
TEST(KdaDecodePlan, VerifyDefaultsAndRules) {
  const DeviceInfo device = hopper_device_info_for_tests();
  KdaDecodePlan plan_out;
  // The rows of the verify defaults at 12 heads, q = 4: {batch, cluster, lanes, early}.
  const int table[7][4] = {{1, 8, 8, 2}, {2, 4, 8, 1}, {4, 4, 16, 1}, {6, 4, 16, 2},
                           {8, 2, 8, 2}, {16, 2, 8, 2}, {32, 1, 16, 1}};
  for (const auto& row : table) {
    const int batch = row[0];
    KdaDecodeParams params = plan_params(12, batch, 4, KdaGateMode::kOneChain, batch == 4);
    const Result planned = plan(params, device, &plan_out);
    ASSERT_TRUE(planned.ok()) << "batch " << batch << ": " << planned.detail();
    EXPECT_EQ(plan_out.schedule.cluster, row[1]) << "batch " << batch;
    EXPECT_EQ(plan_out.schedule.lanes_per_row, row[2]) << "batch " << batch;
    EXPECT_EQ(plan_out.schedule.early, row[3]) << "batch " << batch;
    EXPECT_FALSE(plan_out.schedule.evict_first) << "batch " << batch;
    EXPECT_EQ(plan_out.ctas, int64_t(plan_out.schedule.cluster) * 12 * batch);
    if (batch == 16) {
      EXPECT_EQ(plan_out.waves, 1);  // 384 CTAs, three per SM (132 SMs)
    }
    for (const KdaSchedule& s : testing::verify_schedules()) {
      params.schedule = s;
      const Result explicit_plan = plan(params, device, &plan_out);
      ASSERT_TRUE(explicit_plan.ok()) << explicit_plan.detail();
      EXPECT_EQ(plan_out.schedule.cluster, s.cluster);
      EXPECT_EQ(plan_out.schedule.lanes_per_row, s.lanes_per_row);
      EXPECT_EQ(plan_out.schedule.early, s.early);
    }
    KdaSchedule bad_early;
    bad_early.cluster = 2;
    bad_early.early = 3;
    params.schedule = bad_early;
    Result r = plan(params, device, &plan_out);
    EXPECT_FALSE(r.ok());
    EXPECT_NE(std::string(r.detail()).find("schedule.early"), std::string::npos) << r.detail();
    KdaSchedule bad_cluster;
    bad_cluster.cluster = 16;
    params.schedule = bad_cluster;
    r = plan(params, device, &plan_out);
    EXPECT_FALSE(r.ok());
    EXPECT_NE(std::string(r.detail()).find("cluster = 16"), std::string::npos) << r.detail();
  }
  // q > 4 with 9-11 requests keeps its state in registers (16 lanes).
  const Result r = plan(plan_params(12, 10, 8), device, &plan_out);
  ASSERT_TRUE(r.ok()) << r.detail();
  EXPECT_EQ(plan_out.schedule.cluster, 2);
  EXPECT_EQ(plan_out.schedule.lanes_per_row, 16);
  EXPECT_EQ(plan_out.schedule.early, 1);
  // A BF16 state: registers (16 lanes, early 1) on 4-CTA clusters for 5-7 requests, on
  // 2-CTA clusters for 8-10; the FP32 rows elsewhere. {heads, batch, q, cluster, lanes, early}.
  const int bf16_table[][6] = {{12, 4, 4, 4, 16, 1},  {12, 5, 2, 4, 16, 1},  {12, 6, 4, 4, 16, 1},
                               {12, 7, 8, 4, 16, 1},  {24, 3, 2, 4, 16, 1},  {12, 8, 2, 2, 16, 1},
                               {12, 10, 4, 2, 16, 1}, {24, 4, 8, 2, 16, 1},  {12, 11, 4, 2, 8, 2},
                               {12, 11, 8, 2, 16, 1}, {12, 16, 2, 2, 8, 2},  {12, 32, 4, 1, 16, 1}};
  for (const auto& row : bf16_table) {
    KdaDecodeParams params = plan_params(row[0], row[1], row[2]);
    params.state_dtype = DType::kBf16;
    const Result planned = plan(params, device, &plan_out);
    const std::string where = std::to_string(row[0]) + " heads x " + std::to_string(row[1]) + ", q = " +
                              std::to_string(row[2]) + ", BF16 state";
    ASSERT_TRUE(planned.ok()) << where << ": " << planned.detail();
    EXPECT_EQ(plan_out.schedule.cluster, row[3]) << where;
    EXPECT_EQ(plan_out.schedule.lanes_per_row, row[4]) << where;
    EXPECT_EQ(plan_out.schedule.early, row[5]) << where;
  }
}

}  // namespace
}  // namespace fusedstep
