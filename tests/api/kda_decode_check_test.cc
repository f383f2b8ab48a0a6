// SPDX-License-Identifier: Apache-2.0
// Host-only tests of check(KdaDecodeParams) and check(KdaCommitParams): a valid call
// passes, and every rejection path returns its Status with a message naming the field
// and its value. Pointers are fake, 16-byte aligned addresses (check never reads them).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>

#include "fusedstep/kda_decode.h"

namespace fusedstep {
namespace {

template <class T>
T* fake(uintptr_t index) {
  return reinterpret_cast<T*>(uintptr_t(0x10000) * (index + 1));
}
template <class T>
T* misaligned(T* p, uintptr_t bytes) {
  return reinterpret_cast<T*>(reinterpret_cast<uintptr_t>(p) + bytes);
}

KdaDecodeParams valid_decode(int tokens = 1, bool records = false) {
  KdaDecodeParams p;
  p.batch = 7;
  p.heads = 12;
  p.tokens = tokens;
  const int64_t dim = p.heads * 128;
  p.x = fake<const __nv_bfloat16>(1);
  p.x_stride = 3 * dim + 8;
  p.f_a = fake<const __nv_bfloat16>(2);
  p.f_a_stride = 136;
  p.f_b_weight = fake<const __nv_bfloat16>(3);
  p.raw_beta = fake<const __nv_bfloat16>(4);
  p.raw_beta_stride = p.heads;
  p.output_gate = fake<const __nv_bfloat16>(5);
  p.output_gate_stride = dim;
  p.conv_weight = fake<const void>(6);
  p.conv_weight_channel_stride = 4;
  p.conv_weight_tap_stride = 1;
  p.a_log = fake<const float>(7);
  p.dt_bias = fake<const float>(8);
  p.norm_weight = fake<const float>(9);
  p.conv_state = fake<void>(10);
  p.conv_state_channel_stride = tokens + 2;
  p.conv_state_tap_stride = 1;
  p.conv_state_slot_stride = 3 * dim * (tokens + 2);
  p.conv_state_slots = 9;
  p.state = fake<float>(11);
  p.state_slot_stride = p.heads * 128 * 128;
  p.state_slots = 9;
  p.slots = fake<const int32_t>(12);
  p.output = fake<__nv_bfloat16>(13);
  p.output_stride = dim;
  if (tokens > 1) {
    p.slots_stride = tokens;
    p.accepted = fake<const int32_t>(14);
  }
  if (records) {
    p.record_correction = fake<float>(15);
    p.record_key_gate = fake<__nv_bfloat16>(16);
    p.record_slots = 7;
  }
  return p;
}

KdaCommitParams valid_commit() {
  KdaCommitParams p;
  p.batch = 5;
  p.heads = 3;
  p.tokens = 4;
  p.state = fake<float>(1);
  p.state_slot_stride = 3 * 128 * 128 + 4;
  p.state_slots = 6;
  p.slots = fake<const int32_t>(2);
  p.accepted = fake<const int32_t>(3);
  p.record_correction = fake<const float>(4);
  p.record_key_gate = fake<const __nv_bfloat16>(5);
  p.record_slots = 5;
  p.a_log = fake<const float>(6);
  p.dt_bias = fake<const float>(7);
  return p;
}

// Expects `result` to fail with `status` and a detail containing every fragment.
void expect_rejected(const Result& result, Status status, std::initializer_list<std::string> fragments) {
  ASSERT_FALSE(result.ok()) << "expected " << status_name(status) << ", the call passed";
  EXPECT_EQ(result.status(), status) << result.detail();
  for (const std::string& fragment : fragments) {
    EXPECT_NE(std::string(result.detail()).find(fragment), std::string::npos)
        << "detail \"" << result.detail() << "\" lacks \"" << fragment << "\"";
  }
}

void decode_rejects(const std::function<void(KdaDecodeParams&)>& change, Status status,
                    std::initializer_list<std::string> fragments, int tokens = 1,
                    bool records = false) {
  KdaDecodeParams p = valid_decode(tokens, records);
  change(p);
  expect_rejected(check(p, hopper_device_info_for_tests()), status, fragments);
}

void commit_rejects(const std::function<void(KdaCommitParams&)>& change, Status status,
                    std::initializer_list<std::string> fragments) {
  KdaCommitParams p = valid_commit();
  change(p);
  expect_rejected(check(p, hopper_device_info_for_tests()), status, fragments);
}

// Valid calls of every kind pass: decode, verify, records (direct and deferred),
// raw_gate instead of f_a, both conv layouts, the empty batch, every schedule knob.
TEST(KdaDecodeCheck, ValidCallsPass) {
  const DeviceInfo device = hopper_device_info_for_tests();
  for (int tokens = 1; tokens <= kKdaMaxTokens; ++tokens) {
    EXPECT_TRUE(check(valid_decode(tokens), device).ok()) << check(valid_decode(tokens), device).detail();
  }
  for (int tokens : {1, 5}) {  // BF16 state, slot stride a multiple of 8 elements
    KdaDecodeParams bf16 = valid_decode(tokens);
    bf16.state_dtype = DType::kBf16;
    bf16.state_slot_stride = 12 * 128 * 128 + 8;
    EXPECT_TRUE(check(bf16, device).ok()) << check(bf16, device).detail();
  }
  KdaDecodeParams p = valid_decode(4, true);
  EXPECT_TRUE(check(p, device).ok()) << check(p, device).detail();
  p.record_rows = fake<const int32_t>(20);
  p.token_counts = fake<const int32_t>(21);
  EXPECT_TRUE(check(p, device).ok()) << check(p, device).detail();

  p = valid_decode();
  p.f_a = nullptr;
  p.f_b_weight = nullptr;
  p.raw_gate = fake<const __nv_bfloat16>(22);
  p.raw_gate_stride = 12 * 128 + 16;
  EXPECT_TRUE(check(p, device).ok()) << check(p, device).detail();

  p = valid_decode(3);
  p.conv_state_channel_stride = 1;  // [slot, tap, channel]
  p.conv_state_tap_stride = 3 * 12 * 128;
  p.conv_state_slot_stride = 5 * 3 * 12 * 128;
  p.conv_weight_channel_stride = 1;  // [4, 3 dim]
  p.conv_weight_tap_stride = 3 * 12 * 128;
  p.conv_weight_dtype = DType::kBf16;
  p.conv_state_dtype = DType::kFp32;
  EXPECT_TRUE(check(p, device).ok()) << check(p, device).detail();

  p = valid_decode();
  p.batch = 0;
  EXPECT_TRUE(check(p, device).ok()) << check(p, device).detail();

  p = valid_decode();
  p.gate_mode = KdaGateMode::kFmaTree;
  p.schedule = KdaSchedule{4, 16, 1, false};
  EXPECT_TRUE(check(p, device).ok()) << check(p, device).detail();
  p.gate_mode = KdaGateMode::kFourChains;
  p.schedule = KdaSchedule{2, 8, 3, true};
  EXPECT_TRUE(check(p, device).ok()) << check(p, device).detail();
  p.schedule = KdaSchedule{16, 0, 2, false};
  EXPECT_TRUE(check(p, device).ok()) << check(p, device).detail();

  p = valid_decode(4);  // verify with staged state (early 2), any cluster size up to 8
  p.schedule = KdaSchedule{2, 16, 2, false};
  EXPECT_TRUE(check(p, device).ok()) << check(p, device).detail();
  p.schedule = KdaSchedule{8, 8, 2, false};
  EXPECT_TRUE(check(p, device).ok()) << check(p, device).detail();
}

// Sizes out of range are kInvalidShape with the value.
TEST(KdaDecodeCheck, RejectsSizes) {
  decode_rejects([](auto& p) { p.batch = -1; }, Status::kInvalidShape, {"batch = -1"});
  decode_rejects([](auto& p) { p.batch = kKdaMaxBatch + 1; }, Status::kInvalidShape, {"batch = 65536"});
  decode_rejects([](auto& p) { p.heads = 0; }, Status::kInvalidShape, {"heads = 0"});
  decode_rejects([](auto& p) { p.heads = 257; }, Status::kInvalidShape, {"heads = 257"});
  decode_rejects([](auto& p) { p.tokens = 0; }, Status::kInvalidShape, {"tokens = 0"});
  decode_rejects([](auto& p) { p.tokens = 9; }, Status::kInvalidShape, {"tokens = 9"});
  decode_rejects([](auto& p) { p.conv_state_slots = 0; }, Status::kInvalidShape,
                 {"conv_state_slots = 0"});
  decode_rejects([](auto& p) { p.state_slots = 0; }, Status::kInvalidShape, {"state_slots = 0"});
  decode_rejects([](auto& p) { p.record_slots = 0; }, Status::kInvalidShape, {"record_slots = 0"},
                 4, true);
}

// Every required pointer, by name.
TEST(KdaDecodeCheck, RejectsNullPointers) {
  decode_rejects([](auto& p) { p.x = nullptr; }, Status::kNullPointer, {"x is null"});
  decode_rejects([](auto& p) { p.raw_beta = nullptr; }, Status::kNullPointer, {"raw_beta is null"});
  decode_rejects([](auto& p) { p.output_gate = nullptr; }, Status::kNullPointer, {"output_gate is null"});
  decode_rejects([](auto& p) { p.conv_weight = nullptr; }, Status::kNullPointer, {"conv_weight is null"});
  decode_rejects([](auto& p) { p.conv_state = nullptr; }, Status::kNullPointer, {"conv_state is null"});
  decode_rejects([](auto& p) { p.a_log = nullptr; }, Status::kNullPointer, {"a_log is null"});
  decode_rejects([](auto& p) { p.dt_bias = nullptr; }, Status::kNullPointer, {"dt_bias is null"});
  decode_rejects([](auto& p) { p.norm_weight = nullptr; }, Status::kNullPointer, {"norm_weight is null"});
  decode_rejects([](auto& p) { p.state = nullptr; }, Status::kNullPointer, {"state is null"});
  decode_rejects([](auto& p) { p.slots = nullptr; }, Status::kNullPointer, {"slots is null"});
  decode_rejects([](auto& p) { p.output = nullptr; }, Status::kNullPointer, {"output is null"});
  decode_rejects([](auto& p) { p.f_a = nullptr; }, Status::kNullPointer, {"f_a and raw_gate"});
  decode_rejects([](auto& p) { p.f_b_weight = nullptr; }, Status::kNullPointer, {"f_b_weight is null"});
  decode_rejects([](auto& p) { p.accepted = nullptr; }, Status::kNullPointer,
                 {"accepted is null", "tokens = 3"}, 3);
  decode_rejects([](auto& p) { p.record_correction = nullptr; }, Status::kNullPointer,
                 {"record_correction is null"}, 4, true);
  decode_rejects([](auto& p) { p.record_key_gate = nullptr; }, Status::kNullPointer,
                 {"record_key_gate is null"}, 4, true);
}

// Inconsistent optional inputs: both gate inputs, verify-only tensors at q = 1,
// records at q = 1, record_rows without records.
TEST(KdaDecodeCheck, RejectsInconsistentOptions) {
  decode_rejects([](auto& p) { p.raw_gate = fake<const __nv_bfloat16>(30); p.raw_gate_stride = 1536; },
                 Status::kInvalidValue, {"f_a = 0x", "raw_gate = 0x", "both given"});
  decode_rejects([](auto& p) { p.accepted = fake<const int32_t>(31); }, Status::kInvalidValue,
                 {"accepted = 0x", "tokens = 1"});
  decode_rejects([](auto& p) { p.token_counts = fake<const int32_t>(32); }, Status::kInvalidValue,
                 {"token_counts = 0x", "tokens = 1"});
  decode_rejects(
      [](auto& p) {
        p.record_correction = fake<float>(33);
        p.record_key_gate = fake<__nv_bfloat16>(34);
        p.record_slots = 4;
      },
      Status::kInvalidValue, {"records need tokens > 1", "tokens = 1"});
  decode_rejects([](auto& p) { p.record_rows = fake<const int32_t>(35); }, Status::kInvalidValue,
                 {"record_rows = 0x", "without record tensors"}, 4);
}

// The conv weight's section stride: K3's [3, 4, dim] decode layout and an explicit
// [3 * dim, 4] pass; a negative or overlapping one is rejected.
TEST(KdaDecodeCheck, ConvWeightSectionStride) {
  const DeviceInfo device = hopper_device_info_for_tests();
  KdaDecodeParams p = valid_decode();
  p.conv_weight_section_stride = 4 * 1536;  // [3, 4, dim]
  p.conv_weight_channel_stride = 1;
  p.conv_weight_tap_stride = 1536;
  EXPECT_TRUE(check(p, device).ok()) << check(p, device).detail();
  p.conv_weight_channel_stride = 4;  // [3 * dim, 4], section stride explicit
  p.conv_weight_tap_stride = 1;
  EXPECT_TRUE(check(p, device).ok()) << check(p, device).detail();
  KdaDecodeParams bad = p;
  bad.conv_weight_section_stride = -4;
  expect_rejected(check(bad, device), Status::kInvalidStride, {"conv_weight_section_stride = -4"});
  bad.conv_weight_section_stride = 4 * 1536 - 1;
  expect_rejected(check(bad, device), Status::kInvalidStride,
                  {"conv_weight_section_stride = 6143", "overlap"});
}

// Row strides: too small, or not 16-byte rows where the kernels read vectors.
TEST(KdaDecodeCheck, RejectsStrides) {
  decode_rejects([](auto& p) { p.x_stride = 130; }, Status::kInvalidStride, {"x_stride = 130", ">= 4608"});
  decode_rejects([](auto& p) { p.x_stride = 4612; }, Status::kInvalidStride,
                 {"x_stride = 4612", "multiple of 8"});
  decode_rejects([](auto& p) { p.f_a_stride = 120; }, Status::kInvalidStride, {"f_a_stride = 120"});
  decode_rejects([](auto& p) { p.f_a_stride = 129; }, Status::kInvalidStride,
                 {"f_a_stride = 129", "multiple of 8"});
  decode_rejects(
      [](auto& p) {
        p.f_a = nullptr;
        p.raw_gate = fake<const __nv_bfloat16>(40);
        p.raw_gate_stride = 1537;
      },
      Status::kInvalidStride, {"raw_gate_stride = 1537"});
  decode_rejects([](auto& p) { p.raw_beta_stride = 11; }, Status::kInvalidStride,
                 {"raw_beta_stride = 11", "heads = 12"});
  decode_rejects([](auto& p) { p.output_gate_stride = 1540; }, Status::kInvalidStride,
                 {"output_gate_stride = 1540"});
  decode_rejects([](auto& p) { p.output_stride = 1000; }, Status::kInvalidStride, {"output_stride = 1000"});
  decode_rejects([](auto& p) { p.conv_weight_channel_stride = 0; }, Status::kInvalidStride,
                 {"conv_weight_channel_stride = 0"});
  decode_rejects([](auto& p) { p.conv_weight_tap_stride = -1; }, Status::kInvalidStride,
                 {"conv_weight_tap_stride = -1"});
  // [3, 4, dim] strides without the section stride alias channels: rejected.
  decode_rejects(
      [](auto& p) {
        p.conv_weight_channel_stride = 1;
        p.conv_weight_tap_stride = 1536;
      },
      Status::kInvalidStride, {"conv_weight_channel_stride = 1", "conv_weight_tap_stride = 1536", "overlap"});

  decode_rejects([](auto& p) { p.conv_state_channel_stride = 0; }, Status::kInvalidStride,
                 {"conv_state_channel_stride = 0"});
  decode_rejects([](auto& p) { p.conv_state_tap_stride = 0; }, Status::kInvalidStride,
                 {"conv_state_tap_stride = 0"});
  decode_rejects([](auto& p) { p.conv_state_channel_stride = 4; }, Status::kInvalidStride,
                 {"conv_state_channel_stride = 4", "conv_state_tap_stride = 1", "overlap"}, 3);
  decode_rejects([](auto& p) { p.conv_state_slot_stride -= 1; }, Status::kInvalidStride,
                 {"conv_state_slot_stride = 13823", ">= 13824"});
  decode_rejects([](auto& p) { p.state_slot_stride = 12 * 128 * 128 - 4; }, Status::kInvalidStride,
                 {"state_slot_stride = 196604"});
  decode_rejects([](auto& p) { p.state_slot_stride = 12 * 128 * 128 + 2; }, Status::kInvalidStride,
                 {"state_slot_stride = 196610", "multiple of 4"});
  decode_rejects([](auto& p) { p.state_dtype = DType::kBf16; p.state_slot_stride = 12 * 128 * 128 + 4; },
                 Status::kInvalidStride, {"state_slot_stride = 196612", "multiple of 8", "BF16"});
  decode_rejects([](auto& p) { p.slots_stride = 3; }, Status::kInvalidStride,
                 {"slots_stride = 3", "tokens = 5"}, 5);
}

// 16-byte alignment of every pointer read or written with vectors.
TEST(KdaDecodeCheck, RejectsMisalignedPointers) {
  decode_rejects([](auto& p) { p.x = misaligned(p.x, 8); }, Status::kMisaligned, {"x = 0x", "16-byte"});
  decode_rejects([](auto& p) { p.f_a = misaligned(p.f_a, 2); }, Status::kMisaligned, {"f_a = 0x"});
  decode_rejects([](auto& p) { p.f_b_weight = misaligned(p.f_b_weight, 4); }, Status::kMisaligned,
                 {"f_b_weight = 0x"});
  decode_rejects(
      [](auto& p) {
        p.f_a = nullptr;
        p.raw_gate = misaligned(fake<const __nv_bfloat16>(41), 8);
        p.raw_gate_stride = 1536;
      },
      Status::kMisaligned, {"raw_gate = 0x"});
  decode_rejects([](auto& p) { p.output_gate = misaligned(p.output_gate, 2); }, Status::kMisaligned,
                 {"output_gate = 0x"});
  decode_rejects([](auto& p) { p.output = misaligned(p.output, 8); }, Status::kMisaligned, {"output = 0x"});
  decode_rejects([](auto& p) { p.state = misaligned(p.state, 4); }, Status::kMisaligned, {"state = 0x"});
  decode_rejects([](auto& p) { p.norm_weight = misaligned(p.norm_weight, 4); }, Status::kMisaligned,
                 {"norm_weight = 0x"});
  decode_rejects([](auto& p) { p.dt_bias = misaligned(p.dt_bias, 8); }, Status::kMisaligned,
                 {"dt_bias = 0x"});
  decode_rejects([](auto& p) { p.record_correction = misaligned(p.record_correction, 4); },
                 Status::kMisaligned, {"record_correction = 0x"}, 2, true);
  decode_rejects([](auto& p) { p.record_key_gate = misaligned(p.record_key_gate, 2); },
                 Status::kMisaligned, {"record_key_gate = 0x"}, 2, true);
}

// Scalars and enums out of range.
TEST(KdaDecodeCheck, RejectsScalars) {
  decode_rejects([](auto& p) { p.lower_bound = 0.0f; }, Status::kInvalidValue, {"lower_bound = 0"});
  decode_rejects([](auto& p) { p.lower_bound = 2.5f; }, Status::kInvalidValue, {"lower_bound = 2.5"});
  decode_rejects([](auto& p) { p.lower_bound = -std::numeric_limits<float>::infinity(); },
                 Status::kInvalidValue, {"lower_bound = -inf"});
  decode_rejects([](auto& p) { p.lower_bound = std::nanf(""); }, Status::kInvalidValue, {"lower_bound = nan"});
  decode_rejects([](auto& p) { p.q_scale = 0.0f; }, Status::kInvalidValue, {"q_scale = 0"});
  decode_rejects([](auto& p) { p.q_scale = std::numeric_limits<float>::infinity(); },
                 Status::kInvalidValue, {"q_scale = inf"});
  decode_rejects([](auto& p) { p.norm_eps = -1e-5f; }, Status::kInvalidValue, {"norm_eps = -1e-05"});
  decode_rejects([](auto& p) { p.gate_mode = static_cast<KdaGateMode>(3); }, Status::kInvalidValue,
                 {"gate_mode = 3"});
  decode_rejects([](auto& p) { p.conv_weight_dtype = static_cast<DType>(2); }, Status::kInvalidValue,
                 {"conv_weight_dtype = 2"});
  decode_rejects([](auto& p) { p.conv_state_dtype = static_cast<DType>(-1); }, Status::kInvalidValue,
                 {"conv_state_dtype = -1"});
  decode_rejects([](auto& p) { p.state_dtype = static_cast<DType>(7); }, Status::kInvalidValue,
                 {"state_dtype = 7"});
}

// Schedule knobs and their combinations with the gate mode and the token count.
TEST(KdaDecodeCheck, RejectsSchedules) {
  decode_rejects([](auto& p) { p.schedule.cluster = 3; }, Status::kInvalidValue, {"schedule.cluster = 3"});
  decode_rejects([](auto& p) { p.schedule.cluster = 32; }, Status::kInvalidValue, {"schedule.cluster = 32"});
  decode_rejects([](auto& p) { p.schedule.lanes_per_row = 4; }, Status::kInvalidValue,
                 {"schedule.lanes_per_row = 4"});
  decode_rejects([](auto& p) { p.schedule.early = 4; }, Status::kInvalidValue, {"schedule.early = 4"});
  decode_rejects([](auto& p) { p.schedule.early = -2; }, Status::kInvalidValue, {"schedule.early = -2"});
  decode_rejects([](auto& p) { p.schedule.evict_first = true; p.schedule.early = 1; },
                 Status::kInvalidValue, {"schedule.evict_first", "early = 1"});
  decode_rejects([](auto& p) { p.schedule.early = 3; }, Status::kInvalidValue,
                 {"schedule.early = 3", "have 0"});
  decode_rejects([](auto& p) { p.schedule.early = 3; p.schedule.cluster = 4; }, Status::kInvalidValue,
                 {"schedule.early = 3", "have 4"});
  decode_rejects([](auto& p) { p.gate_mode = KdaGateMode::kFmaTree; }, Status::kInvalidValue,
                 {"gate_mode = 2", "tokens = 2"}, 2);
  decode_rejects([](auto& p) { p.gate_mode = KdaGateMode::kFmaTree; p.schedule.cluster = 2; },
                 Status::kInvalidValue, {"gate_mode = 2", "schedule.cluster", "have 2"});
  decode_rejects([](auto& p) { p.gate_mode = KdaGateMode::kFmaTree; p.schedule.early = 2; },
                 Status::kInvalidValue, {"gate_mode = 2", "schedule.early <= 1, have 2"});
  decode_rejects([](auto& p) { p.schedule.early = 3; p.schedule.cluster = 2; }, Status::kInvalidValue,
                 {"tokens = 4", "schedule.early <= 2", "have 3"}, 4);
  decode_rejects([](auto& p) { p.schedule.early = 2; p.schedule.evict_first = true; }, Status::kInvalidValue,
                 {"tokens = 4", "schedule.evict_first"}, 4);
  decode_rejects([](auto& p) { p.schedule.cluster = 16; }, Status::kInvalidValue,
                 {"tokens = 8", "schedule.cluster = 16"}, 8);
}

// The device must be Hopper or newer with cluster launch.
TEST(KdaDecodeCheck, RejectsDevices) {
  DeviceInfo ampere = hopper_device_info_for_tests();
  ampere.cc_major = 8;
  expect_rejected(check(valid_decode(), ampere), Status::kDeviceUnsupported, {"8.0", ">= 9.0"});
  DeviceInfo no_clusters = hopper_device_info_for_tests();
  no_clusters.cluster_launch = false;
  expect_rejected(check(valid_decode(), no_clusters), Status::kDeviceUnsupported, {"cluster launch"});
  // The commit needs no clusters, but Hopper or newer.
  EXPECT_TRUE(check(valid_commit(), no_clusters).ok());
  expect_rejected(check(valid_commit(), ampere), Status::kDeviceUnsupported, {"kda_commit", "8.0"});
}

// The commit: a valid call passes; every rejection path names its field and value.
TEST(KdaCommitCheck, ValidAndRejected) {
  const DeviceInfo device = hopper_device_info_for_tests();
  EXPECT_TRUE(check(valid_commit(), device).ok()) << check(valid_commit(), device).detail();
  KdaCommitParams p = valid_commit();
  p.batch = 0;
  p.record_rows = fake<const int32_t>(9);
  EXPECT_TRUE(check(p, device).ok()) << check(p, device).detail();

  commit_rejects([](auto& p) { p.batch = -2; }, Status::kInvalidShape, {"kda_commit", "batch = -2"});
  commit_rejects([](auto& p) { p.batch = kKdaMaxBatch + 1; }, Status::kInvalidShape, {"kda_commit", "batch = 65536"});
  commit_rejects([](auto& p) { p.heads = 300; }, Status::kInvalidShape, {"heads = 300"});
  commit_rejects([](auto& p) { p.tokens = 1; }, Status::kInvalidShape, {"tokens = 1"});
  commit_rejects([](auto& p) { p.tokens = 9; }, Status::kInvalidShape, {"tokens = 9"});
  commit_rejects([](auto& p) { p.state = nullptr; }, Status::kNullPointer, {"state is null"});
  commit_rejects([](auto& p) { p.slots = nullptr; }, Status::kNullPointer, {"slots is null"});
  commit_rejects([](auto& p) { p.accepted = nullptr; }, Status::kNullPointer, {"accepted is null"});
  commit_rejects([](auto& p) { p.record_correction = nullptr; }, Status::kNullPointer,
                 {"record_correction is null"});
  commit_rejects([](auto& p) { p.record_key_gate = nullptr; }, Status::kNullPointer,
                 {"record_key_gate is null"});
  commit_rejects([](auto& p) { p.a_log = nullptr; }, Status::kNullPointer, {"a_log is null"});
  commit_rejects([](auto& p) { p.dt_bias = nullptr; }, Status::kNullPointer, {"dt_bias is null"});
  commit_rejects([](auto& p) { p.state_slot_stride = 100; }, Status::kInvalidStride,
                 {"state_slot_stride = 100"});
  commit_rejects([](auto& p) { p.state_slot_stride = 3 * 128 * 128 + 1; }, Status::kInvalidStride,
                 {"state_slot_stride = 49153", "multiple of 4"});
  commit_rejects([](auto& p) { p.state_dtype = static_cast<DType>(2); }, Status::kInvalidValue,
                 {"state_dtype = 2"});
  commit_rejects([](auto& p) { p.state_slots = 0; }, Status::kInvalidShape, {"state_slots = 0"});
  commit_rejects([](auto& p) { p.record_slots = -1; }, Status::kInvalidShape, {"record_slots = -1"});
  commit_rejects([](auto& p) { p.state = misaligned(p.state, 4); }, Status::kMisaligned, {"state = 0x"});
  commit_rejects([](auto& p) { p.record_correction = misaligned(p.record_correction, 8); },
                 Status::kMisaligned, {"record_correction = 0x"});
  commit_rejects([](auto& p) { p.record_key_gate = misaligned(p.record_key_gate, 2); },
                 Status::kMisaligned, {"record_key_gate = 0x"});
  commit_rejects([](auto& p) { p.dt_bias = misaligned(p.dt_bias, 4); }, Status::kMisaligned,
                 {"dt_bias = 0x"});
  commit_rejects([](auto& p) { p.lower_bound = 0.5f; }, Status::kInvalidValue, {"lower_bound = 0.5"});
}

}  // namespace
}  // namespace fusedstep
