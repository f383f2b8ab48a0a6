// SPDX-License-Identifier: Apache-2.0
// The fused KDA speculative verify (q = 2..8) against the composed reference path, byte
// for byte: outputs, states, conv states and RecoverSSM records (direct and deferred)
// for every verify schedule, accepted count and token count; out-of-range counts as
// padding requests; slots and conv taps the verify must not write byte-identical; every
// output element written; the Small case the sanitizers run; graphs and PDL chains.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/gpu_test_util.h"
#include "common/kda_built_configs.h"
#include "fusedstep/fusedstep.h"
#include "kda_decode/fused_test_util.h"
#include "kda_decode/kda_test_util.h"

namespace fusedstep::testing {
namespace {

// Independent of the composed path: every output element written, padding requests'
// rows and rows t >= n zero; state slots the verify must not write (all of them with
// records) and the gaps after the heads byte-identical; conv slots of no active
// request byte-identical, and taps n + 2 .. q + 1 of the active ones unchanged.
void expect_verify_written_and_canaries(const KdaTestData& data, const VerifyExpected& expected,
                                        const std::string& what) {
  const int q = data.tokens();
  const bool records = data.config().records;
  const std::vector<uint16_t> out = data.download_output();
  const int dim = data.dim();
  for (int b = 0; b < data.config().batch; ++b) {
    const auto r = data.request(b, records);
    for (int t = 0; t < q; ++t) {
      const int64_t row = int64_t(b) * q + t;
      const bool zero_row = !r.active || t >= r.count;
      for (int i = 0; i < dim; ++i) {
        const uint16_t v = out[size_t(row * data.output_stride + i)];
        ASSERT_NE(v, 0xffff) << what << ": output row " << row << " element " << i << " not written";
        if (zero_row) ASSERT_EQ(v, 0) << what << ": padding row " << row << " element " << i << " not zero";
      }
    }
  }
  const std::vector<bool> written = data.written_state_slots(records);
  const int64_t state_elem = data.state_element_bytes();
  const int64_t head_bytes = int64_t(data.config().heads) * kKdaHeadDim * kKdaHeadDim * state_elem;
  for (int64_t s = 0; s < data.state_slots; ++s) {
    const int64_t begin = s * data.state_slot_stride * state_elem;
    const int64_t from = written[size_t(s)] ? begin + head_bytes : begin;
    const int64_t end = (s + 1) * data.state_slot_stride * state_elem;
    const int64_t diff = device_first_difference(reinterpret_cast<const uint8_t*>(data.d_state.get()) + from,
                                                 reinterpret_cast<const uint8_t*>(expected.initial_state.get()) + from,
                                                 size_t(end - from));
    ASSERT_EQ(diff, -1) << what << ": state slot " << s << (written[size_t(s)] ? " (gap)" : " (not written)")
                        << " changed at byte " << diff;
  }
  std::set<int64_t> conv_active;
  for (int b = 0; b < data.config().batch; ++b) {
    const auto r = data.request(b, records);
    if (r.active) conv_active.insert(r.conv_slot);
  }
  const int64_t elem = data.config().conv_state_dtype == DType::kBf16 ? 2 : 4;
  for (int64_t s = 0; s < data.conv_state_slots; ++s) {
    if (conv_active.count(s)) continue;
    const int64_t begin = s * data.conv_state_slot_stride * elem;
    const int64_t end = std::min<int64_t>((s + 1) * data.conv_state_slot_stride * elem,
                                          int64_t(expected.initial_conv_state.size()));
    const int64_t diff = device_first_difference(data.d_conv_state.get() + begin,
                                                 expected.initial_conv_state.get() + begin, size_t(end - begin));
    ASSERT_EQ(diff, -1) << what << ": conv slot " << s << " (no active request) changed at byte " << diff;
  }
  const std::vector<uint8_t> conv = data.download_conv_state();
  const std::vector<uint8_t> initial = expected.initial_conv_state.download();
  for (int b = 0; b < data.config().batch; ++b) {
    const auto r = data.request(b, records);
    if (!r.active) continue;
    for (int tap = r.count + 2; tap < q + 2; ++tap) {
      for (int64_t c = 0; c < 3 * int64_t(dim); c += 37) {
        const int64_t at = data.conv_state_offset(r.conv_slot, c, tap) * elem;
        ASSERT_EQ(std::memcmp(conv.data() + at, initial.data() + at, size_t(elem)), 0)
            << what << ": request " << b << " conv tap " << tap << " (>= n + 2) of channel " << c << " changed";
      }
    }
  }
}

std::string describe_verify(const KdaCaseConfig& c, int q) {
  std::string s = "q " + std::to_string(q) + ", heads " + std::to_string(c.heads) + ", batch " +
                  std::to_string(c.batch);
  s += c.raw_gate ? ", raw_gate" : c.gate_mode == KdaGateMode::kFourChains ? ", four chains" : ", one chain";
  if (c.token_counts) s += ", token counts";
  if (c.records) s += c.deferred_records ? ", deferred records" : ", direct records";
  if (c.fixed_accepted) s += ", accepted " + std::to_string(c.fixed_accepted);
  s += c.conv_state_dtype == DType::kFp32 ? ", FP32 conv" : ", BF16 conv";
  s += c.conv_state_tap_major ? " tap-major" : " channel-major";
  if (c.state_dtype == DType::kBf16) s += ", BF16 state";
  if (c.conv_weight_k3_layout) s += ", K3 conv weight";
  if (c.conv_bias) s += ", bias";
  return s;
}

// Runs `schedules` (and the defaults) on one case: fused == composed byte for byte;
// the first run also checks coverage and canaries.
// `edit` may change the host tensors before the upload.
void run_verify_case(const KdaCaseConfig& config, uint64_t seed, const std::vector<KdaSchedule>& schedules,
                     const std::function<void(KdaTestData&)>& edit = {}) {
  KdaTestData data(config, seed);
  if (edit) edit(data);
  data.upload();
  VerifyExpected expected;
  run_composed_verify(data, &expected);
  const std::string base = describe_verify(config, config.tokens);
  int ran = 0;
  for (const KdaSchedule& s : schedules) {
    ASSERT_TRUE(accepted(data, s)) << base << ": check() rejects " << describe(s);
    const std::string what = base + ", " + describe(s);
    FS_EXPECT_OK(launch_fused_verify(data, expected, s, {}, nullptr));
    FS_CUDA_OK(cudaDeviceSynchronize());
    expect_verify_matches(data, expected, what);
    if (ran++ == 0) expect_verify_written_and_canaries(data, expected, what);
    if (::testing::Test::HasFailure()) return;
  }
  FS_EXPECT_OK(launch_fused_verify(data, expected, KdaSchedule{}, {}, nullptr));
  FS_CUDA_OK(cudaDeviceSynchronize());
  expect_verify_matches(data, expected, base + ", default schedule");
}

// Fused verify == composed byte for byte for q = 2..8 over every verify schedule (each
// cluster size, lanes value, early 0/1) and the defaults, with heads 3 and 12, random
// accepted counts, token counts, padding requests of every kind (out-of-range accepted
// and token counts included), skipped write slots, records direct and deferred, BF16
// and FP32 conv state in both layouts, FP32 and BF16 state (one variant each per q),
// every gate source q > 1 allows.
TEST(KdaFusedVerify, MatchesComposedBitwiseEveryScheduleQ2To8) {
  FS_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed());
  const std::vector<KdaSchedule> schedules = verify_schedules();
  const int batches[4] = {1, 3, 9, 17};
  int combo = 0;
  for (int q = 2; q <= kKdaMaxTokens; ++q) {
    for (int variant = 0; variant < 2; ++variant, ++combo) {
      KdaCaseConfig config;
      config.tokens = q;
      config.heads = combo % 2 ? 12 : 3;
      config.batch = batches[combo % 4];
      config.token_counts = (combo / 2) % 2 == 0;
      const int records = combo % 3;  // 0 none, 1 direct, 2 deferred
      config.records = records != 0;
      config.deferred_records = records == 2;
      const int gate = combo % 3;
      config.gate_mode = gate == 1 ? KdaGateMode::kFourChains : KdaGateMode::kOneChain;
      config.raw_gate = gate == 2;
      config.conv_state_dtype = (combo / 3) % 2 ? DType::kFp32 : DType::kBf16;
      config.conv_state_tap_major = (combo / 5) % 2 == 1;
      config.conv_weight_k3_layout = combo % 5 == 4;
      config.conv_weight_channel_major = (combo / 4) % 2 == 0;
      config.conv_weight_dtype = combo % 7 == 3 ? DType::kBf16 : DType::kFp32;
      config.conv_bias = combo % 4 == 1;
      config.state_dtype = variant == 1 ? DType::kBf16 : DType::kFp32;
      run_verify_case(config, rng(), schedules);
      if (::testing::Test::HasFailure()) return;
    }
  }
}

// Every accepted count A = 1..q (the conv window and the read slot move with A), with
// and without token counts: fused == composed byte for byte (two schedules per A,
// rotating through all of them).
TEST(KdaFusedVerify, EveryAcceptedCountMatchesComposed) {
  FS_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed());
  const std::vector<KdaSchedule> schedules = verify_schedules();
  int turn = 0;
  for (int q : {3, 8}) {
    for (int a = 1; a <= q; ++a) {
      KdaCaseConfig config;
      config.tokens = q;
      config.heads = q == 3 ? 12 : 3;
      config.batch = 6;
      config.fixed_accepted = a;
      config.token_counts = a % 2 == 0;
      config.records = a % 3 == 0;
      config.conv_state_dtype = a % 2 ? DType::kBf16 : DType::kFp32;
      config.conv_state_tap_major = a % 4 < 2;
      run_verify_case(config, rng(),
                      {schedules[size_t(turn) % schedules.size()], schedules[size_t(turn + 7) % schedules.size()]});
      ++turn;
      if (::testing::Test::HasFailure()) return;
    }
  }
}

// RecoverSSM records, direct and deferred (record_rows with an out-of-range row), at
// q = 2, 5, 8 with token counts: records byte-equal to the composed path's, rows
// t >= n unwritten, and no state slot written at all (the read slot is a checkpoint).
TEST(KdaFusedVerify, RecordsDirectAndDeferredMatchComposed) {
  FS_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed());
  int turn = 0;
  for (int q : {2, 5, 8}) {
    for (bool deferred : {false, true}) {
      KdaCaseConfig config;
      config.tokens = q;
      config.heads = turn % 2 ? 3 : 12;
      config.batch = 9;
      config.token_counts = true;
      config.records = true;
      config.deferred_records = deferred;
      config.raw_gate = turn % 3 == 2;
      config.gate_mode = turn % 3 == 1 ? KdaGateMode::kFourChains : KdaGateMode::kOneChain;
      ++turn;
      run_verify_case(config, rng(), verify_schedules());
      if (::testing::Test::HasFailure()) return;
    }
  }
}

// Out-of-range accepted and token counts (0, q + 1, negative) make the whole request
// padding: all q rows zero, nothing read or written; the requests around them (first
// and last) run normally. Fused == composed byte for byte on every verify schedule.
TEST(KdaFusedVerify, OutOfRangeCountsArePadding) {
  FS_REQUIRE_GPU();
  KdaCaseConfig config;
  config.tokens = 4;
  config.heads = 3;
  config.batch = 8;
  config.token_counts = true;
  config.padding_requests = false;
  run_verify_case(config, fresh_seed(), verify_schedules(), [](KdaTestData& data) {
    data.accepted[1] = 0;
    data.accepted[2] = 5;
    data.accepted[3] = -1;
    data.token_counts[4] = 0;
    data.token_counts[5] = 5;
    data.token_counts[6] = -2;
    for (int b = 1; b <= 6; ++b) ASSERT_FALSE(data.request(b, false).active) << "request " << b;
    ASSERT_TRUE(data.request(0, false).active);
    ASSERT_TRUE(data.request(7, false).active);
  });
}

// Small verify cases for compute-sanitizer (the gpu-check script runs *Small*): one
// launch per cluster size (lanes and early alternating), with records and without:
// fused == composed byte for byte.
TEST(KdaFusedVerify, SmallCaseEveryClusterSize) {
  FS_REQUIRE_GPU();
  std::mt19937_64 rng(fresh_seed());
  for (int variant = 0; variant < 4; ++variant) {
    const bool records = variant % 2 == 1;
    KdaCaseConfig config;
    config.tokens = 3;
    config.heads = 3;
    config.batch = 3;
    config.token_counts = true;
    config.records = records;
    config.deferred_records = records;
    config.state_dtype = variant >= 2 ? DType::kBf16 : DType::kFp32;
    std::vector<KdaSchedule> schedules;
    for (const BuiltConfig& c : kBuiltVerify) {  // every built configuration, early 0 / 1 alternating
      KdaSchedule s;
      s.cluster = c.cluster;
      s.lanes_per_row = c.lanes;
      s.early = c.staged && c.cluster > 1 ? 2 : (c.cluster + c.lanes / 8) % 2 != records ? 1 : 0;
      schedules.push_back(s);
    }
    run_verify_case(config, rng(), schedules);
    if (::testing::Test::HasFailure()) return;
  }
}

// A verify captured in a CUDA graph with PDL replays to the composed bytes.
TEST(KdaFusedVerify, GraphCaptureAndReplayMatchComposed) {
  FS_REQUIRE_GPU();
  KdaCaseConfig config;
  config.tokens = 4;
  config.heads = 12;
  config.batch = 8;
  config.token_counts = true;
  KdaTestData data(config, fresh_seed());
  data.upload();
  VerifyExpected expected;
  run_composed_verify(data, &expected);
  capture_and_replay(data, expected, [&](int replay) {
    expect_verify_matches(data, expected, "verify graph replay " + std::to_string(replay));
  });
}

// Verify launches chained with PDL on one stream: two layers' calls back to back (the
// second one's plan, conv taps and state rows are read before its PDL wait at early >= 1,
// its activations after it), each byte for byte equal to the composed path, with the
// default schedules of batch 1 and 4 (C = 8 staged, C = 2 registers) and C = 1 staged.
TEST(KdaFusedVerify, PdlChainedLaunchesMatchComposed) {
  FS_REQUIRE_GPU();
  cudaStream_t stream;
  FS_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  KdaSchedule one_cta;
  one_cta.cluster = 1;
  one_cta.lanes_per_row = 16;
  one_cta.early = 1;
  for (int batch : {1, 4}) {
    for (const KdaSchedule& schedule : {KdaSchedule{}, one_cta}) {
      KdaCaseConfig config;
      config.tokens = 4;
      config.heads = 12;
      config.batch = batch;
      config.token_counts = true;
      const std::string what = "verify PDL chain, batch " + std::to_string(batch) + ", " + describe(schedule);
      expect_pdl_chain_matches<VerifyExpected>(config, schedule, stream, what, run_composed_verify,
                                               expect_verify_matches);
      if (::testing::Test::HasFailure()) break;
    }
  }
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace fusedstep::testing
