// SPDX-License-Identifier: Apache-2.0
// The fused KDA decode (q = 1) against the composed reference path, bit for bit:
// outputs, states and conv states for every schedule, gate mode, head count and batch
// size; slots no request owns byte-identical; every output element written; the Small
// cases the sanitizers run; run-to-run determinism, graphs, PDL chains, non-finite
// inputs, the empty batch; and the BF16 norm weight, which gives the FP32 bits through
// this kernel and the verify kernel alike.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/gpu_test_util.h"
#include "common/kda_built_configs.h"
#include "fusedstep/fusedstep.h"
#include "kda_decode/fused_test_util.h"
#include "kda_decode/kda_test_util.h"

namespace fusedstep::testing {
namespace {

// Every q = 1 schedule of the built configurations: early 0 / 1 in registers; staged
// (C = 1) early 0-3, with and without evict-first.
std::vector<KdaSchedule> all_schedules() {
  std::vector<KdaSchedule> out;
  for (const BuiltConfig& c : kBuiltDecode) {
    for (int early : {0, 1, 2, 3}) {
      for (bool evict : {false, true}) {
        if (!c.staged && (early >= 2 || evict)) continue;
        KdaSchedule s;
        s.cluster = c.cluster;
        s.lanes_per_row = c.lanes;
        s.early = early;
        s.evict_first = evict;
        out.push_back(s);
      }
    }
  }
  return out;
}

// One fused launch with schedule `s` on the uploaded data, compared with the composed run.
void run_schedule_and_compare(KdaTestData& data, const Expected& expected, const KdaSchedule& s) {
  FS_EXPECT_OK(launch_fused(data, expected, s, {}, nullptr));
  FS_CUDA_OK(cudaDeviceSynchronize());
  expect_matches(data, expected, describe(s));
}

// Checks independent of the composed path: output fully written, canaries intact.
void expect_written_and_canaries(const KdaTestData& data, const Expected& expected, const std::string& what) {
  const std::vector<uint16_t> out = data.download_output();
  const int dim = data.dim();
  for (int64_t r = 0; r < data.rows(); ++r) {
    for (int i = 0; i < dim; ++i) {
      const uint16_t v = out[size_t(r * data.output_stride + i)];
      ASSERT_NE(v, 0xffff) << what << ": output row " << r << " element " << i << " not written";
      if (data.request_padding[size_t(r)]) {
        ASSERT_EQ(v, 0) << what << ": padding row " << r << " element " << i << " not zero";
      }
    }
  }
  std::set<int64_t> active;
  for (int b = 0; b < data.config().batch; ++b) {
    if (!data.request_padding[size_t(b)]) active.insert(data.slots[size_t(b)]);
  }
  const int64_t state_elem = data.state_element_bytes();
  const int64_t head_bytes = int64_t(data.config().heads) * kKdaHeadDim * kKdaHeadDim * state_elem;
  for (int64_t s = 0; s < data.state_slots; ++s) {
    const int64_t begin = s * data.state_slot_stride * state_elem;
    const int64_t from = active.count(s) ? begin + head_bytes : begin;  // gap after the heads
    const int64_t end = (s + 1) * data.state_slot_stride * state_elem;
    const int64_t diff = device_first_difference(reinterpret_cast<const uint8_t*>(data.d_state.get()) + from,
                                                 reinterpret_cast<const uint8_t*>(expected.initial_state.get()) + from,
                                                 size_t(end - from));
    ASSERT_EQ(diff, -1) << what << ": state slot " << s << (active.count(s) ? " (gap)" : " (not in the batch)")
                        << " changed at byte " << diff;
  }
  const int64_t elem = data.config().conv_state_dtype == DType::kBf16 ? 2 : 4;
  for (int64_t s = 0; s < data.conv_state_slots; ++s) {
    if (active.count(s)) continue;
    const int64_t begin = s * data.conv_state_slot_stride * elem;
    const int64_t end = std::min<int64_t>((s + 1) * data.conv_state_slot_stride * elem,
                                          int64_t(expected.initial_conv_state.size()));
    const int64_t diff = device_first_difference(data.d_conv_state.get() + begin,
                                                 expected.initial_conv_state.get() + begin, size_t(end - begin));
    ASSERT_EQ(diff, -1) << what << ": conv slot " << s << " (not in the batch) changed at byte " << diff;
  }
}

struct GateCase {
  const char* name;
  KdaGateMode mode;
  bool raw_gate;
};
constexpr GateCase kGateCases[] = {{"F_B one chain", KdaGateMode::kOneChain, false},
                                   {"F_B four chains", KdaGateMode::kFourChains, false},
                                   {"F_B FMA tree", KdaGateMode::kFmaTree, false},
                                   {"raw_gate given", KdaGateMode::kOneChain, true}};

// A case of `heads` x `batch` with gate source `gate`; conv dtypes, layouts and the
// bias rotate with `combo` so that a run of cases covers their combinations.
KdaCaseConfig rotating_config(int heads, int batch, const GateCase& gate, int combo) {
  KdaCaseConfig config;
  config.heads = heads;
  config.batch = batch;
  config.gate_mode = gate.mode;
  config.raw_gate = gate.raw_gate;
  config.conv_state_dtype = combo % 2 ? DType::kFp32 : DType::kBf16;
  config.conv_bias = (combo / 2) % 2 == 1;
  config.conv_weight_dtype = (combo / 4) % 2 ? DType::kBf16 : DType::kFp32;
  config.conv_weight_channel_major = (combo / 3) % 2 == 0;
  config.conv_state_tap_major = (combo / 5) % 2 == 1;
  config.norm_weight_dtype = (combo / 7) % 2 ? DType::kBf16 : DType::kFp32;
  config.state_dtype = (combo + combo / 4) % 2 ? DType::kBf16 : DType::kFp32;
  return config;
}

// Fused == composed bit for bit for every schedule and gate source, over head counts,
// batch sizes with padding requests, both state and conv-state dtypes, bias or none,
// both conv layouts, strided slots; all schedules hence give the same bits.
TEST(KdaFused, MatchesComposedBitwiseForEveryScheduleAndGateMode) {
  FS_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  const std::vector<KdaSchedule> schedules = all_schedules();
  int combo = 0;
  for (int heads : {3, 6, 12, 24}) {
    for (int batch : {1, 2, 3, 17, 64, 257}) {
      // Large cases: one gate source each (rotating) and a rotating third of the
      // schedules keep the run short; small cases every gate source and every schedule.
      const bool large = int64_t(batch) * heads > 24 * 17;
      for (int g = 0; g < 4; ++g) {
        if (large && g != combo % 4) continue;
        const GateCase& gate = kGateCases[g];
        const KdaCaseConfig config = rotating_config(heads, batch, gate, combo++);
        KdaTestData data(config, rng());
        data.upload();
        Expected expected;
        run_composed(data, &expected);
        const std::string base = "heads " + std::to_string(heads) + ", batch " + std::to_string(batch) + ", " +
                                 gate.name + (config.conv_bias ? ", bias" : "") +
                                 (config.conv_state_dtype == DType::kFp32 ? ", FP32 conv" : ", BF16 conv") +
                                 (config.state_dtype == DType::kFp32 ? ", FP32 state" : ", BF16 state");
        std::vector<KdaSchedule> run;
        for (const KdaSchedule& s : schedules) {
          if (accepted(data, s)) run.push_back(s);
        }
        int ran = 0;
        for (size_t i = 0; i < run.size(); ++i) {
          if (large && (i + combo) % 3 != 0) continue;  // large cases: a rotating third
          ++ran;
          const std::string what = base + ", " + describe(run[i]);
          FS_EXPECT_OK(launch_fused(data, expected, run[i], {}, nullptr));
          FS_CUDA_OK(cudaDeviceSynchronize());
          expect_matches(data, expected, what);
          if (ran == 1) expect_written_and_canaries(data, expected, what);
          if (::testing::Test::HasFailure()) return;
        }
        // Every built configuration the gate allows (the FMA tree: 4+ CTAs, early <= 1).
        EXPECT_GE(ran, large ? 2 : 6) << base << ": too few schedules accepted";
        // The defaults too.
        FS_EXPECT_OK(launch_fused(data, expected, KdaSchedule{}, {}, nullptr));
        FS_CUDA_OK(cudaDeviceSynchronize());
        expect_matches(data, expected, base + ", default schedule");
        if (::testing::Test::HasFailure()) return;
      }
    }
  }
}

// A small case over every cluster size and staging kind (the sanitizer's case):
// fused == composed bit for bit.
// compute-sanitizer's synccheck misreports mbarriers at ranks >= 8 of 16-CTA clusters
// (tests/tools/synccheck_cluster_probe.cu reproduces it on a minimal correct
// protocol), and its first report poisons the context for the rest of the binary. So
// gpu-check's synccheck run sets FUSEDSTEP_TEST_MAX_CLUSTER=8 to check every other
// schedule; every other run (ctest, memcheck) covers all five sizes.
int max_cluster_under_test() {
  const char* env = std::getenv("FUSEDSTEP_TEST_MAX_CLUSTER");
  return env != nullptr && std::atoi(env) > 0 ? std::atoi(env) : 16;
}

TEST(KdaFused, SmallCaseEveryClusterSize) {
  FS_REQUIRE_GPU();
  const int max_cluster = max_cluster_under_test();
  if (max_cluster < 16) {
    std::printf("[ note     ] clusters > %d left out (FUSEDSTEP_TEST_MAX_CLUSTER)\n", max_cluster);
  }
  for (DType state_dtype : {DType::kFp32, DType::kBf16}) {
    KdaCaseConfig config;
    config.heads = 3;
    config.batch = 3;
    config.gate_mode = KdaGateMode::kFourChains;
    config.state_dtype = state_dtype;
    KdaTestData data(config, fresh_seed());
    data.upload();
    Expected expected;
    run_composed(data, &expected);
    for (int cluster : {1, 2, 4, 8, 16}) {
      if (cluster > max_cluster) continue;
      for (int early : {0, 1, 2, 3}) {
        KdaSchedule s;
        s.cluster = cluster;
        s.lanes_per_row = early % 2 ? 8 : 16;
        s.early = early;
        if (!accepted(data, s)) continue;
        run_schedule_and_compare(data, expected, s);
        if (HasFatalFailure()) return;
      }
    }
  }
}

// Five launches covering C = 1 (local stores, staged state with the F_B rows in the last
// copy chunk, evict-first) and DSMEM clusters of every built size, small enough for
// compute-sanitizer (gpu-check.sh runs it there, a Small case): fused == composed bit for bit.
TEST(KdaFused, SmallScheduleSmoke) {
  FS_REQUIRE_GPU();
  KdaCaseConfig config;
  config.heads = 3;
  config.batch = 3;
  KdaTestData data(config, fresh_seed());
  data.upload();
  Expected expected;
  run_composed(data, &expected);
  // {cluster, lanes, early, evict-first}
  const int cases[5][4] = {{1, 16, 3, 0}, {1, 16, 2, 1}, {2, 8, 1, 0}, {4, 16, 1, 0}, {8, 16, 0, 0}};
  for (const auto& c : cases) {
    if (c[0] > max_cluster_under_test()) continue;  // racecheck / synccheck runs (see above)
    KdaSchedule s;
    s.cluster = c[0];
    s.lanes_per_row = c[1];
    s.early = c[2];
    s.evict_first = c[3] != 0;
    run_schedule_and_compare(data, expected, s);
    if (HasFatalFailure()) return;
  }
}

// The smallest q = 1 cases (KdaFusedSmall.*; scripts/gpu-check.sh runs them under the
// sanitizers): 2 heads, one request, one launch each of a default schedule, a test per
// kernel so that the sanitizer log's "[       OK ]" lines say which kernels finished:
// fused == composed bit for bit.
void expect_small_decode_matches(const KdaSchedule& schedule, DType state_dtype = DType::kFp32) {
  KdaCaseConfig config;
  config.heads = 2;
  config.batch = 1;
  config.state_dtype = state_dtype;
  KdaTestData data(config, fresh_seed());
  data.upload();
  Expected expected;
  run_composed(data, &expected);
  if (::testing::Test::HasFatalFailure()) return;
  ASSERT_TRUE(accepted(data, schedule)) << describe(schedule);
  run_schedule_and_compare(data, expected, schedule);
}

KdaSchedule decode_schedule(int cluster, int early, bool evict_first) {
  KdaSchedule s;
  s.cluster = cluster;
  s.lanes_per_row = 16;
  s.early = early;
  s.evict_first = evict_first;
  return s;
}

// C = 2, state rows in registers before the PDL wait (the default for 12-16 12-head requests).
TEST(KdaFusedSmall, DecodeClusterTwoMatchesComposed) {
  FS_REQUIRE_GPU();
  expect_small_decode_matches(decode_schedule(2, 1, false));
}

// C = 1, state staged in shared memory after the activations, evict-first (the default
// from 30 12-head requests).
TEST(KdaFusedSmall, DecodeClusterOneMatchesComposed) {
  FS_REQUIRE_GPU();
  expect_small_decode_matches(decode_schedule(1, 1, true));
}

// C = 1, state staged before the PDL wait, evict-first (the default for 17-29 12-head requests).
TEST(KdaFusedSmall, DecodeClusterOneEarlyStagingMatchesComposed) {
  FS_REQUIRE_GPU();
  expect_small_decode_matches(decode_schedule(1, 2, true));
}

// BF16 state: C = 1 staged (F_B in the last copy chunk) and C = 4 in registers.
TEST(KdaFusedSmall, DecodeBf16StateMatchesComposed) {
  FS_REQUIRE_GPU();
  expect_small_decode_matches(decode_schedule(1, 2, true), DType::kBf16);
  expect_small_decode_matches(decode_schedule(4, 1, false), DType::kBf16);
}

// BF16 state, 12 heads x 40: the plan's C = 1 four-CTA build (480 CTAs, one wave of four
// an SM against two of three), the sanitizers' case of that build.
TEST(KdaFusedSmall, DecodeBf16FourCtasPerSmMatchesComposed) {
  FS_REQUIRE_GPU();
  DeviceInfo device;
  FS_EXPECT_OK(get_device_info(0, &device));
  KdaCaseConfig config;
  config.heads = 12;
  config.batch = 40;
  config.state_dtype = DType::kBf16;
  KdaTestData data(config, fresh_seed());
  data.upload();
  KdaDecodePlan plan_out;
  FS_EXPECT_OK(plan(data.params(), device, &plan_out));
  EXPECT_EQ(plan_out.waves, (480 + 4 * device.sm_count - 1) / (4 * device.sm_count)) << "four CTAs per SM";
  Expected expected;
  run_composed(data, &expected);
  FS_EXPECT_OK(launch_fused(data, expected, KdaSchedule{}, {}, nullptr));
  FS_CUDA_OK(cudaDeviceSynchronize());
  expect_matches(data, expected, "12 heads x 40, BF16 state, default schedule");
  expect_written_and_canaries(data, expected, "12 heads x 40, BF16 state, default schedule");
}

// BF16 state where the plan runs C = 1 on the four-CTA build (plan.cc): the default
// schedule and C = 1 at early 0 and 2, every gate source but the FMA tree (C >= 4), with
// and without PDL, batches with padding requests.
TEST(KdaFused, Bf16FourCtasPerSmMatchComposed) {
  FS_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  DeviceInfo device;
  FS_EXPECT_OK(get_device_info(0, &device));
  int combo = 0;
  for (const auto& [heads, batch] : {std::pair{12, 40}, std::pair{24, 64}, std::pair{12, 257}}) {
    for (const GateCase& gate : kGateCases) {
      if (gate.mode == KdaGateMode::kFmaTree && !gate.raw_gate) continue;  // C >= 4 (check())
      KdaCaseConfig config = rotating_config(heads, batch, gate, combo++);
      config.state_dtype = DType::kBf16;
      KdaTestData data(config, rng());
      data.upload();
      Expected expected;
      run_composed(data, &expected);
      for (const KdaSchedule& schedule : {KdaSchedule{}, decode_schedule(1, 0, false), decode_schedule(1, 2, true)}) {
        KdaDecodePlan plan_out;
        KdaDecodeParams params = data.params();
        params.schedule = schedule;
        FS_EXPECT_OK(plan(params, device, &plan_out));
        const int64_t ctas = int64_t(heads) * batch;
        EXPECT_EQ(plan_out.waves, (ctas + 4 * device.sm_count - 1) / (4 * device.sm_count)) << "four CTAs per SM";
        const std::string what = "heads " + std::to_string(heads) + ", batch " + std::to_string(batch) + ", " +
                                 gate.name + ", " + describe(schedule);
        for (const bool pdl : {false, true}) {
          LaunchOptions options;
          options.pdl = pdl;
          FS_EXPECT_OK(launch_fused(data, expected, schedule, options, nullptr));
          FS_CUDA_OK(cudaDeviceSynchronize());
          expect_matches(data, expected, what + (pdl ? ", PDL" : ""));
          if (!pdl) expect_written_and_canaries(data, expected, what);
          if (::testing::Test::HasFailure()) return;
        }
      }
    }
  }
}

// Run to run: the same inputs give the same bits (default schedule, 5 runs).
TEST(KdaFused, DeterministicAcrossRuns) {
  FS_REQUIRE_GPU();
  KdaCaseConfig config;
  config.heads = 12;
  config.batch = 33;
  KdaTestData data(config, fresh_seed());
  data.upload();
  Expected first;
  // The first fused run is the reference here.
  copy_device(first.initial_state, data.d_state);
  copy_device(first.initial_conv_state, data.d_conv_state);
  FS_EXPECT_OK(launch_fused(data, first, KdaSchedule{}, {}, nullptr));
  FS_CUDA_OK(cudaDeviceSynchronize());
  copy_device(first.output, data.d_output);
  copy_device(first.state, data.d_state);
  copy_device(first.conv_state, data.d_conv_state);
  for (int run = 0; run < 5; ++run) {
    FS_EXPECT_OK(launch_fused(data, first, KdaSchedule{}, {}, nullptr));
    FS_CUDA_OK(cudaDeviceSynchronize());
    expect_matches(data, first, "run " + std::to_string(run));
  }
}

// A captured CUDA graph (with PDL) replays to the composed bits, replay after replay.
TEST(KdaFused, GraphCaptureAndReplayMatchComposed) {
  FS_REQUIRE_GPU();
  for (int batch : {1, 8, 64}) {
    KdaCaseConfig config;
    config.heads = 12;
    config.batch = batch;
    KdaTestData data(config, fresh_seed());
    data.upload();
    Expected expected;
    run_composed(data, &expected);
    capture_and_replay(data, expected, [&](int replay) {
      expect_matches(data, expected, "batch " + std::to_string(batch) + ", replay " + std::to_string(replay));
    });
  }
}

// Two launches chained with PDL: (a) two layers with their own caches (early loads
// allowed); (b) two steps of one layer on the same slots with early = 0 (the second
// must see the first's state): both equal the composed path run twice.
TEST(KdaFused, PdlChainedLaunchesMatchComposed) {
  FS_REQUIRE_GPU();
  cudaStream_t stream;
  FS_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  LaunchOptions options;
  options.pdl = true;
  {
    KdaCaseConfig config;
    config.heads = 12;
    config.batch = 4;
    expect_pdl_chain_matches<Expected>(config, KdaSchedule{}, stream, "PDL chain", run_composed, expect_matches);
  }
  {
    KdaCaseConfig config;
    config.heads = 12;
    config.batch = 1;
    KdaTestData data(config, fresh_seed());
    data.upload();
    Expected step1, step2;
    run_composed(data, &step1);  // leaves step 1's caches in data
    run_composed(data, &step2);  // step 2 from them
    reset_caches(data, step1);
    FS_CUDA_OK(cudaDeviceSynchronize());
    KdaDecodeParams params = data.params();
    params.schedule.early = 0;
    FS_EXPECT_OK(launch(params, options, stream));
    FS_EXPECT_OK(launch(params, options, stream));
    FS_CUDA_OK(cudaStreamSynchronize(stream));
    expect_matches(data, step2, "PDL chain, same slots, early 0");
  }
  cudaStreamDestroy(stream);
}

bool same_or_both_nan(uint16_t a, uint16_t b) {
  const bool nan_a = (a & 0x7f80) == 0x7f80 && (a & 0x7f) != 0;
  const bool nan_b = (b & 0x7f80) == 0x7f80 && (b & 0x7f) != 0;
  return a == b || (nan_a && nan_b);
}

// NaN / Inf in activations, weights and state never hang a cluster and never leave an
// output element unwritten; results agree with the composed path (any NaN = any NaN).
TEST(KdaFused, NonFiniteInputsDoNotHang) {
  FS_REQUIRE_GPU();
  KdaCaseConfig config;
  config.heads = 6;
  config.batch = 9;
  KdaTestData data(config, fresh_seed());
  const uint16_t nan_bf16 = 0x7fc0, inf_bf16 = 0x7f80;
  data.x[5] = nan_bf16;
  data.x[size_t(data.x_stride) + 3 * 128 + 7] = inf_bf16;
  data.f_a[size_t(2 * data.f_a_stride) + 9] = nan_bf16;
  data.raw_beta[size_t(3 * data.raw_beta_stride)] = inf_bf16;
  data.output_gate[size_t(4 * data.output_gate_stride) + 100] = nan_bf16;
  data.state[size_t(data.slots[0]) * size_t(data.state_slot_stride) + 1000] = INFINITY;
  data.state[size_t(data.slots[0]) * size_t(data.state_slot_stride) + 20000] = NAN;
  data.upload();
  Expected expected;
  run_composed(data, &expected);
  const std::vector<uint16_t> want = expected.output.download();
  for (const KdaSchedule& s : all_schedules()) {
    if (s.evict_first || s.lanes_per_row == 8 || !accepted(data, s)) continue;
    FS_EXPECT_OK(launch_fused(data, expected, s, {}, nullptr));
    FS_CUDA_OK(cudaDeviceSynchronize());  // returns: no hang
    const std::vector<uint16_t> got = data.download_output();
    for (int64_t r = 0; r < data.rows(); ++r) {
      for (int i = 0; i < data.dim(); ++i) {
        const size_t at = size_t(r * data.output_stride + i);
        ASSERT_NE(got[at], 0xffff) << describe(s) << ": row " << r << " element " << i << " not written";
        ASSERT_TRUE(same_or_both_nan(got[at], want[at]))
            << describe(s) << ": row " << r << " element " << i << " " << got[at] << " vs " << want[at];
      }
    }
  }
}

// batch 0 is a valid, empty call: nothing launches.
TEST(KdaFused, EmptyBatchIsANoOp) {
  FS_REQUIRE_GPU();
  KdaCaseConfig config;
  config.heads = 12;
  config.batch = 1;
  KdaTestData data(config, fresh_seed());
  data.upload();
  KdaDecodeParams params = data.params();
  params.batch = 0;
  FS_EXPECT_OK(launch(params, {}, nullptr));
  FS_CUDA_OK(cudaDeviceSynchronize());
}

// The norm weight in BF16 (as Kimi K3's module holds it) gives the bits of the same
// values in FP32, q = 1 and verify (records too), fused and composed: each fused call on
// BF16 weights equals the composed path on FP32 ones, every default schedule size.
TEST(KdaFused, Bf16NormWeightGivesTheFp32Bits) {
  FS_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  int ran = 0;
  for (int q : {1, 3}) {
    for (int batch : {1, 8, 40}) {
      KdaCaseConfig config;
      config.heads = 12;
      config.batch = batch;
      config.tokens = q;
      config.records = q > 1 && batch == 8;
      KdaTestData fp32(config, seed + batch + 100 * q);
      fp32.upload();
      VerifyExpected expected;
      run_composed_verify(fp32, &expected);
      config.norm_weight_dtype = DType::kBf16;
      KdaTestData bf16(config, seed + batch + 100 * q);  // the same values
      bf16.upload();
      const std::string what = "q " + std::to_string(q) + ", batch " + std::to_string(batch) + ", BF16 norm weight";
      FS_EXPECT_OK(launch_fused_verify(bf16, expected, KdaSchedule{}, {}, nullptr));
      FS_CUDA_OK(cudaDeviceSynchronize());
      expect_verify_matches(bf16, expected, what + ", fused");
      reset_caches(bf16, expected);  // the initial caches again, the output poisoned
      if (config.records) {
        bf16.d_record_correction.fill_bytes(0xff);
        bf16.d_record_key_gate.fill_bytes(0xff);
      }
      VerifyExpected composed_bf16;
      run_composed_verify(bf16, &composed_bf16);
      expect_verify_matches(bf16, expected, what + ", composed");
      ++ran;
      if (::testing::Test::HasFailure()) return;
    }
  }
  EXPECT_EQ(ran, 6);
}

}  // namespace
}  // namespace fusedstep::testing
