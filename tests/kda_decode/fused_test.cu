// SPDX-License-Identifier: Apache-2.0
// Fused KDA decode (q = 1) and verify (q = 2..8, token counts, records) against the
// composed reference path, bit for bit: outputs, states, conv states and records, for
// every schedule, gate mode, head count and batch size;
// untouched slots byte-identical; every output element written; graphs, PDL chains,
// non-finite inputs.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/gpu_test_util.h"
#include "fusedstep/fusedstep.h"
#include "common/kda_built_configs.h"
#include "kda_decode/kda_test_util.h"

namespace fusedstep::testing {
namespace {

// ---- device-side comparison (the big states stay on the GPU)
__global__ void first_byte_difference_kernel(const uint8_t* a, const uint8_t* b, size_t bytes,
                                             unsigned long long* first) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < bytes; i += size_t(gridDim.x) * blockDim.x) {
    if (a[i] != b[i]) atomicMin(first, static_cast<unsigned long long>(i));
  }
}

// Offset of the first differing byte, or -1.
int64_t device_first_difference(const void* a, const void* b, size_t bytes) {
  static DeviceBuffer<unsigned long long> first(1);
  const unsigned long long none = ~0ull;
  cudaMemcpy(first.get(), &none, sizeof(none), cudaMemcpyHostToDevice);
  if (bytes > 0) {
    first_byte_difference_kernel<<<1024, 256>>>(static_cast<const uint8_t*>(a), static_cast<const uint8_t*>(b),
                                                bytes, first.get());
  }
  unsigned long long result = none;
  cudaMemcpy(&result, first.get(), sizeof(result), cudaMemcpyDeviceToHost);
  return result == none ? -1 : static_cast<int64_t>(result);
}

template <class T>
void copy_device(DeviceBuffer<T>& dst, const DeviceBuffer<T>& src) {
  if (dst.size() != src.size()) dst.resize(src.size());
  cudaMemcpy(dst.get(), src.get(), src.size() * sizeof(T), cudaMemcpyDeviceToDevice);
}

std::string describe(const KdaSchedule& s) {
  return "cluster " + std::to_string(s.cluster) + ", lanes " + std::to_string(s.lanes_per_row) + ", early " +
         std::to_string(s.early) + (s.evict_first ? ", evict_first" : "");
}


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

// The composed path's results of one case, kept on the device, and the inputs the
// fused runs restart from.
struct Expected {
  DeviceBuffer<uint16_t> output;
  DeviceBuffer<float> state;
  DeviceBuffer<uint8_t> conv_state;
  DeviceBuffer<float> initial_state;
  DeviceBuffer<uint8_t> initial_conv_state;
};

void run_composed(KdaTestData& data, Expected* expected) {
  copy_device(expected->initial_state, data.d_state);
  copy_device(expected->initial_conv_state, data.d_conv_state);
  const KdaDecodeParams params = data.params();
  DeviceBuffer<uint8_t> workspace(size_t(std::max<int64_t>(composed::workspace_bytes(params), 1)));
  FS_EXPECT_OK(composed::launch(params, workspace.get(), nullptr));
  FS_CUDA_OK(cudaDeviceSynchronize());
  copy_device(expected->output, data.d_output);
  copy_device(expected->state, data.d_state);
  copy_device(expected->conv_state, data.d_conv_state);
}

// The caches back to their initial bytes and the output poisoned (legacy-stream copies:
// synchronize before launching on another stream).
void reset_caches(KdaTestData& data, const Expected& expected) {
  copy_device(data.d_state, expected.initial_state);
  copy_device(data.d_conv_state, expected.initial_conv_state);
  data.d_output.fill_bytes(0xff);
}

// Restore the caches, poison the output, run the fused step (not synchronized).
Result launch_fused(KdaTestData& data, const Expected& expected, const KdaSchedule& schedule,
                    const LaunchOptions& options, cudaStream_t stream) {
  reset_caches(data, expected);
  cudaDeviceSynchronize();  // the legacy-stream copies before a launch on any stream
  KdaDecodeParams params = data.params();
  params.schedule = schedule;
  return launch(params, options, stream);
}

// The call of `data` with the default schedule captured in a CUDA graph (PDL on) after
// one call outside the capture (one-time attributes), then replayed three times, each
// from the initial caches with the output poisoned; `check(replay)` runs after each.
void capture_and_replay(KdaTestData& data, const Expected& expected, const std::function<void(int)>& check) {
  cudaStream_t stream;
  FS_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  LaunchOptions options;
  options.pdl = true;
  FS_EXPECT_OK(launch_fused(data, expected, KdaSchedule{}, options, stream));
  FS_CUDA_OK(cudaStreamSynchronize(stream));
  {
    testing::CapturedGraph graph;
    ASSERT_TRUE(graph.capture(stream, [&] { return launch(data.params(), options, stream); }));
    for (int replay = 0; replay < 3; ++replay) {
      reset_caches(data, expected);
      FS_CUDA_OK(cudaDeviceSynchronize());
      FS_CUDA_OK(graph.replay(stream));
      FS_CUDA_OK(cudaStreamSynchronize(stream));
      check(replay);
    }
  }
  cudaStreamDestroy(stream);
}

// Whether plan() accepts `schedule` for this case (check() owns the schedule rules, e.g.
// the FMA-tree gate only with 4+ CTAs; plan() adds that the configuration is built).
bool accepted(const KdaTestData& data, const KdaSchedule& schedule) {
  KdaDecodeParams params = data.params();
  params.schedule = schedule;
  KdaDecodePlan unused;
  return plan(params, hopper_device_info_for_tests(), &unused).ok();
}

// Fused results equal the expected bits; every valid output element written; slots
// that no active request owns (and the gaps between heads) unchanged.
void expect_matches(const KdaTestData& data, const Expected& expected, const std::string& what) {
  const int64_t out_diff =
      device_first_difference(data.d_output.get(), expected.output.get(), expected.output.size() * 2);
  EXPECT_EQ(out_diff, -1) << what << ": output differs at element " << out_diff / 2;
  const int64_t state_diff =
      device_first_difference(data.d_state.get(), expected.state.get(), expected.state.size() * 4);
  EXPECT_EQ(state_diff, -1) << what << ": state differs at element " << state_diff / 4 << " (slot "
                            << state_diff / 4 / data.state_slot_stride << ")";
  const int64_t conv_diff =
      device_first_difference(data.d_conv_state.get(), expected.conv_state.get(), expected.conv_state.size());
  EXPECT_EQ(conv_diff, -1) << what << ": conv state differs at byte " << conv_diff;
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
  const int64_t head_bytes = int64_t(data.config().heads) * kKdaHeadDim * kKdaHeadDim * 4;
  for (int64_t s = 0; s < data.state_slots; ++s) {
    const int64_t begin = s * data.state_slot_stride * 4;
    const int64_t from = active.count(s) ? begin + head_bytes : begin;  // gap after the heads
    const int64_t end = (s + 1) * data.state_slot_stride * 4;
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
  return config;
}

// Fused == composed bit for bit for every schedule and gate source, over head counts,
// batch sizes with padding requests, both conv-state dtypes, bias or none, both
// conv layouts, strided slots; all schedules hence give the same bits.
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
                                 (config.conv_state_dtype == DType::kFp32 ? ", FP32 conv" : ", BF16 conv");
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
// (scripts/probes/synccheck_cluster_probe.cu reproduces it on a minimal correct
// protocol), and its first report poisons the context for the rest of the binary. So
// gpu-check's synccheck run sets FUSEDSTEP_TEST_MAX_CLUSTER=8 to check every other
// schedule; every other run (ctest, memcheck, racecheck) covers all five sizes.
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
  KdaCaseConfig config;
  config.heads = 3;
  config.batch = 3;
  config.gate_mode = KdaGateMode::kFourChains;
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

// Five launches covering C = 1 (local stores, staged state with the F_B rows in the last
// copy chunk, evict-first) and DSMEM clusters of every built size, small enough for
// compute-sanitizer: fused == composed bit for bit.
TEST(KdaFused, SanitizerSmoke) {
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

// The q = 1 cases racecheck runs (scripts/gpu-check.sh: KdaFusedSmall.*): 2 heads, one
// request, one launch each of a default schedule, a test per kernel so that the
// sanitizer log's "[       OK ]" lines say which kernels finished: fused == composed
// bit for bit.
void expect_small_decode_matches(const KdaSchedule& schedule) {
  KdaCaseConfig config;
  config.heads = 2;
  config.batch = 1;
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

// Two layers' calls of `config` with `schedule`, chained with PDL on `stream` back to
// back (the second one's loads before its PDL wait overlap the first one's work), each
// byte for byte equal to its composed result: `compose(data, &expected)` and
// `match(data, expected, what)` are the q = 1 or the verify ones.
template <class ExpectedT, class Compose, class Match>
void expect_pdl_chain_matches(const KdaCaseConfig& config, const KdaSchedule& schedule, cudaStream_t stream,
                              const std::string& what, Compose compose, Match match) {
  LaunchOptions options;
  options.pdl = true;
  KdaTestData layer0(config, fresh_seed());
  KdaTestData layer1(config, fresh_seed());
  layer0.upload();
  layer1.upload();
  ExpectedT e0, e1;
  compose(layer0, &e0);
  compose(layer1, &e1);
  KdaDecodeParams p0 = layer0.params(), p1 = layer1.params();
  p0.schedule = p1.schedule = schedule;
  reset_caches(layer0, e0);
  reset_caches(layer1, e1);
  FS_CUDA_OK(cudaDeviceSynchronize());
  FS_EXPECT_OK(launch(p0, options, stream));
  FS_EXPECT_OK(launch(p1, options, stream));
  FS_CUDA_OK(cudaStreamSynchronize(stream));
  match(layer0, e0, what + ", layer 0");
  match(layer1, e1, what + ", layer 1");
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

// ---- speculative verify (q = 2..8), token counts, RecoverSSM records

// The verify schedules of the built configurations: early 0 / 1 in registers, early 2
// staged in chunks (C = 1 always stages: early 0 / 1).
std::vector<KdaSchedule> verify_schedules() {
  std::vector<KdaSchedule> out;
  for (const BuiltConfig& c : kBuiltVerify) {
    for (int early : {0, 1, 2}) {
      if (c.cluster == 1 ? early == 2 : c.staged != (early == 2)) continue;
      KdaSchedule s;
      s.cluster = c.cluster;
      s.lanes_per_row = c.lanes;
      s.early = early;
      out.push_back(s);
    }
  }
  return out;
}

// The composed verify's results (records too), kept on the device.
struct VerifyExpected : Expected {
  DeviceBuffer<float> record_correction;
  DeviceBuffer<uint16_t> record_key_gate;
};

void run_composed_verify(KdaTestData& data, VerifyExpected* expected) {
  run_composed(data, expected);
  if (data.config().records) {
    copy_device(expected->record_correction, data.d_record_correction);
    copy_device(expected->record_key_gate, data.d_record_key_gate);
  }
}

// Restore the caches, poison the output and the records, run the fused verify.
Result launch_fused_verify(KdaTestData& data, const VerifyExpected& expected, const KdaSchedule& schedule,
                           const LaunchOptions& options, cudaStream_t stream) {
  if (data.config().records) {
    data.d_record_correction.fill_bytes(0xff);
    data.d_record_key_gate.fill_bytes(0xff);
  }
  return launch_fused(data, expected, schedule, options, stream);
}

// Fused == composed byte for byte: output, state, conv state and (poisoned) records,
// so record rows t >= n and padding requests' rows stay unwritten in both.
void expect_verify_matches(const KdaTestData& data, const VerifyExpected& expected, const std::string& what) {
  expect_matches(data, expected, what);
  if (!data.config().records) return;
  const int64_t corr_diff = device_first_difference(data.d_record_correction.get(), expected.record_correction.get(),
                                                    expected.record_correction.size() * 4);
  EXPECT_EQ(corr_diff, -1) << what << ": record_correction differs at element " << corr_diff / 4;
  const int64_t kg_diff = device_first_difference(data.d_record_key_gate.get(), expected.record_key_gate.get(),
                                                  expected.record_key_gate.size() * 2);
  EXPECT_EQ(kg_diff, -1) << what << ": record_key_gate differs at element " << kg_diff / 2;
}

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
  const int64_t head_bytes = int64_t(data.config().heads) * kKdaHeadDim * kKdaHeadDim * 4;
  for (int64_t s = 0; s < data.state_slots; ++s) {
    const int64_t begin = s * data.state_slot_stride * 4;
    const int64_t from = written[size_t(s)] ? begin + head_bytes : begin;
    const int64_t end = (s + 1) * data.state_slot_stride * 4;
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

// Fused verify == composed byte for byte for q = 2..8 over every verify schedule (each
// cluster size, lanes value, early 0/1) and the defaults, with heads 3 and 12, random
// accepted counts, token counts, padding requests of every kind (out-of-range accepted
// and token counts included), skipped write slots, records direct and deferred, BF16
// and FP32 conv state in both layouts, every gate source q > 1 allows.
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
  for (bool records : {false, true}) {
    KdaCaseConfig config;
    config.tokens = 3;
    config.heads = 3;
    config.batch = 3;
    config.token_counts = true;
    config.records = records;
    config.deferred_records = records;
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
