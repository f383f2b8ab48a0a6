// SPDX-License-Identifier: Apache-2.0
// Helpers of the fused KDA suites (decode_fused_test.cu, verify_fused_test.cu): the
// composed path's results kept on the device (records too), fused launches from the
// initial caches with the output and records poisoned, byte-for-byte comparisons on the
// device, CUDA graph capture and replay, PDL chains of two layers' calls.
// Internal linkage: each test file gets its own copies, the comparison kernel and its
// static device buffer included; inline, so that a file may use only some of them.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>

#include "common/gpu_test_util.h"
#include "fusedstep/fusedstep.h"
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
inline int64_t device_first_difference(const void* a, const void* b, size_t bytes) {
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

inline std::string describe(const KdaSchedule& s) {
  return "cluster " + std::to_string(s.cluster) + ", lanes " + std::to_string(s.lanes_per_row) + ", early " +
         std::to_string(s.early) + (s.evict_first ? ", evict_first" : "");
}

// The composed path's results of one case, kept on the device, and the inputs the
// fused runs restart from.
struct Expected {
  DeviceBuffer<uint16_t> output;
  DeviceBuffer<uint8_t> state;            // FP32 or BF16 bytes
  DeviceBuffer<uint8_t> conv_state;
  DeviceBuffer<uint8_t> initial_state;
  DeviceBuffer<uint8_t> initial_conv_state;
};

inline void run_composed(KdaTestData& data, Expected* expected) {
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
inline void reset_caches(KdaTestData& data, const Expected& expected) {
  copy_device(data.d_state, expected.initial_state);
  copy_device(data.d_conv_state, expected.initial_conv_state);
  data.d_output.fill_bytes(0xff);
}

// Restore the caches, poison the output, run the fused step (not synchronized).
inline Result launch_fused(KdaTestData& data, const Expected& expected, const KdaSchedule& schedule,
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
inline void capture_and_replay(KdaTestData& data, const Expected& expected, const std::function<void(int)>& check) {
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
inline bool accepted(const KdaTestData& data, const KdaSchedule& schedule) {
  KdaDecodeParams params = data.params();
  params.schedule = schedule;
  KdaDecodePlan unused;
  return plan(params, hopper_device_info_for_tests(), &unused).ok();
}

// Fused results equal the expected bits; every valid output element written; slots
// that no active request owns (and the gaps between heads) unchanged.
inline void expect_matches(const KdaTestData& data, const Expected& expected, const std::string& what) {
  const int64_t out_diff =
      device_first_difference(data.d_output.get(), expected.output.get(), expected.output.size() * 2);
  EXPECT_EQ(out_diff, -1) << what << ": output differs at element " << out_diff / 2;
  const int64_t elem = data.state_element_bytes();
  const int64_t state_diff = device_first_difference(data.d_state.get(), expected.state.get(), expected.state.size());
  EXPECT_EQ(state_diff, -1) << what << ": state differs at element " << state_diff / elem << " (slot "
                            << state_diff / elem / data.state_slot_stride << ")";
  const int64_t conv_diff =
      device_first_difference(data.d_conv_state.get(), expected.conv_state.get(), expected.conv_state.size());
  EXPECT_EQ(conv_diff, -1) << what << ": conv state differs at byte " << conv_diff;
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

// The composed verify's results (records too), kept on the device.
struct VerifyExpected : Expected {
  DeviceBuffer<float> record_correction;
  DeviceBuffer<uint16_t> record_key_gate;
};

inline void run_composed_verify(KdaTestData& data, VerifyExpected* expected) {
  run_composed(data, expected);
  if (data.config().records) {
    copy_device(expected->record_correction, data.d_record_correction);
    copy_device(expected->record_key_gate, data.d_record_key_gate);
  }
}

// Restore the caches, poison the output and the records, run the fused verify.
inline Result launch_fused_verify(KdaTestData& data, const VerifyExpected& expected, const KdaSchedule& schedule,
                                  const LaunchOptions& options, cudaStream_t stream) {
  if (data.config().records) {
    data.d_record_correction.fill_bytes(0xff);
    data.d_record_key_gate.fill_bytes(0xff);
  }
  return launch_fused(data, expected, schedule, options, stream);
}

// Fused == composed byte for byte: output, state, conv state and (poisoned) records,
// so record rows t >= n and padding requests' rows stay unwritten in both.
inline void expect_verify_matches(const KdaTestData& data, const VerifyExpected& expected, const std::string& what) {
  expect_matches(data, expected, what);
  if (!data.config().records) return;
  const int64_t corr_diff = device_first_difference(data.d_record_correction.get(), expected.record_correction.get(),
                                                    expected.record_correction.size() * 4);
  EXPECT_EQ(corr_diff, -1) << what << ": record_correction differs at element " << corr_diff / 4;
  const int64_t kg_diff = device_first_difference(data.d_record_key_gate.get(), expected.record_key_gate.get(),
                                                  expected.record_key_gate.size() * 2);
  EXPECT_EQ(kg_diff, -1) << what << ": record_key_gate differs at element " << kg_diff / 2;
}

}  // namespace
}  // namespace fusedstep::testing
