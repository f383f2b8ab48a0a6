// SPDX-License-Identifier: Apache-2.0
// Argument checks of the KDA decode / verify step and the RecoverSSM commit. Pure
// host code: every rejection names the field and its value, so a bad call fails
// with a clear Status instead of hanging or writing wrong bits.
#include <cmath>
#include <cstdint>
#include <utility>

#include "common/internal.h"
#include "fusedstep/kda_decode.h"
#include "kda_decode/params.h"

namespace fusedstep {
namespace {

constexpr int kMaxHeads = 256;
constexpr int64_t kHeadState = int64_t(kKdaHeadDim) * kKdaHeadDim;  // floats per head and slot

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

#define KDA_FAIL(status, ...) return Result::error(Status::status, __VA_ARGS__)

// Row stride of a BF16 activation read with 16-byte vectors.
Result check_vector_rows(const char* op, const char* field, int64_t stride, int64_t width) {
  if (stride < width) {
    KDA_FAIL(kInvalidStride, "%s: %s = %lld must be >= %lld (the row width)", op, field,
             (long long)stride, (long long)width);
  }
  if (stride % 8 != 0) {
    KDA_FAIL(kInvalidStride, "%s: %s = %lld must be a multiple of 8 elements (16-byte rows)", op,
             field, (long long)stride);
  }
  return Result::success();
}

Result check_positive_stride(const char* op, const char* field, int64_t stride) {
  if (stride <= 0) {
    KDA_FAIL(kInvalidStride, "%s: %s = %lld must be > 0", op, field, (long long)stride);
  }
  return Result::success();
}

Result check_aligned(const char* op, const char* field, const void* p) {
  if (!aligned16(p)) {
    KDA_FAIL(kMisaligned, "%s: %s = %p must be 16-byte aligned", op, field, p);
  }
  return Result::success();
}

// Offsets sum_d index_d * stride_d (index_d < count_d, strides > 0) are distinct when,
// taken by increasing stride, each stride exceeds the span of the smaller ones: a nested
// layout in any dimension order.
template <int N>
bool nested(const int64_t (&stride)[N], const int64_t (&count)[N]) {
  int order[N];
  for (int d = 0; d < N; ++d) order[d] = d;
  for (int a = 0; a < N; ++a) {
    for (int b = a + 1; b < N; ++b) {
      if (stride[order[b]] < stride[order[a]]) std::swap(order[a], order[b]);
    }
  }
  int64_t span = 0;  // largest offset reachable with the smaller strides
  for (int d = 0; d < N; ++d) {
    const int64_t s = stride[order[d]], n = count[order[d]];
    if (n <= 1) continue;
    if (s <= span) return false;
    span += (n - 1) * s;
  }
  return true;
}

Result check_device(const char* op, const DeviceInfo& device, bool needs_clusters) {
  if (device.cc_major < 9) {
    KDA_FAIL(kDeviceUnsupported, "%s: device %d has compute capability %d.%d, needs >= 9.0", op,
             device.device, device.cc_major, device.cc_minor);
  }
  if (needs_clusters && !device.cluster_launch) {
    KDA_FAIL(kDeviceUnsupported, "%s: device %d does not support cluster launch", op,
             device.device);
  }
  return Result::success();
}

Result check_state(const char* op, int heads, const void* state, DType dtype, int64_t slot_stride,
                   int64_t slots) {
  if (dtype != DType::kBf16 && dtype != DType::kFp32) {
    KDA_FAIL(kInvalidValue, "%s: state_dtype = %d must be kBf16 (0) or kFp32 (1)", op, int(dtype));
  }
  if (state == nullptr) KDA_FAIL(kNullPointer, "%s: state is null", op);
  FS_TRY(check_aligned(op, "state", state));
  if (slot_stride < heads * kHeadState) {
    KDA_FAIL(kInvalidStride, "%s: state_slot_stride = %lld must be >= heads * 128 * 128 = %lld",
             op, (long long)slot_stride, (long long)(heads * kHeadState));
  }
  const int per_16_bytes = dtype == DType::kBf16 ? 8 : 4;
  if (slot_stride % per_16_bytes != 0) {
    KDA_FAIL(kInvalidStride,
             "%s: state_slot_stride = %lld must be a multiple of %d elements (16 bytes of %s)", op,
             (long long)slot_stride, per_16_bytes, dtype == DType::kBf16 ? "BF16" : "FP32");
  }
  if (slots < 1) KDA_FAIL(kInvalidShape, "%s: state_slots = %lld must be >= 1", op, (long long)slots);
  return Result::success();
}

Result check_lower_bound(const char* op, float lower_bound) {
  if (!std::isfinite(lower_bound) || !(lower_bound < 0.0f)) {
    KDA_FAIL(kInvalidValue, "%s: lower_bound = %g must be finite and < 0", op, double(lower_bound));
  }
  return Result::success();
}

Result check_sizes(const char* op, int batch, int heads) {
  // Requests run along the grid's z dimension (at most 65535 blocks).
  if (batch < 0 || batch > kKdaMaxBatch) {
    KDA_FAIL(kInvalidShape, "%s: batch = %d must be in [0, %d]", op, batch, kKdaMaxBatch);
  }
  if (heads < 1 || heads > kMaxHeads) {
    KDA_FAIL(kInvalidShape, "%s: heads = %d must be in [1, %d]", op, heads, kMaxHeads);
  }
  return Result::success();
}

Result check_schedule(const KdaDecodeParams& p) {
  constexpr const char* op = "kda_decode";
  const KdaSchedule& s = p.schedule;
  if (s.cluster != 0 && s.cluster != 1 && s.cluster != 2 && s.cluster != 4 && s.cluster != 8 &&
      s.cluster != 16) {
    KDA_FAIL(kInvalidValue, "%s: schedule.cluster = %d must be 0 (default), 1, 2, 4, 8 or 16", op,
             s.cluster);
  }
  if (s.lanes_per_row != 0 && s.lanes_per_row != 8 && s.lanes_per_row != 16) {
    KDA_FAIL(kInvalidValue, "%s: schedule.lanes_per_row = %d must be 0 (default), 8 or 16", op,
             s.lanes_per_row);
  }
  if (s.early < -1 || s.early > 3) {
    KDA_FAIL(kInvalidValue, "%s: schedule.early = %d must be -1 (default) or 0-3", op, s.early);
  }
  if (s.evict_first && !kda::is_staged(s)) {
    KDA_FAIL(kInvalidValue,
             "%s: schedule.evict_first = true needs staged state (schedule.early >= 2 or cluster 1), have "
             "early = %d, cluster = %d",
             op, s.early, s.cluster);
  }
  if (s.early == 3 && s.cluster != 1 && s.cluster != 2) {
    KDA_FAIL(kInvalidValue,
             "%s: schedule.early = 3 stages the gate rows of 64 or 128 state rows: needs an "
             "explicit schedule.cluster of 1 or 2, have %d",
             op, s.cluster);
  }
  if (p.gate_mode == KdaGateMode::kFmaTree) {
    if (p.tokens != 1) {
      KDA_FAIL(kInvalidValue, "%s: gate_mode = 2 (FMA tree) supports tokens = 1 only, have tokens = %d",
               op, p.tokens);
    }
    if (s.cluster != 0 && s.cluster < 4) {
      KDA_FAIL(kInvalidValue, "%s: gate_mode = 2 (FMA tree) needs schedule.cluster 0, 4, 8 or 16, have %d",
               op, s.cluster);
    }
    if (s.early > 1) {
      KDA_FAIL(kInvalidValue, "%s: gate_mode = 2 (FMA tree) needs schedule.early <= 1, have %d", op,
               s.early);
    }
  }
  if (p.tokens > 1) {
    if (s.early > 2) {
      KDA_FAIL(kInvalidValue,
               "%s: tokens = %d (verify) needs schedule.early <= 2 (it stages no F_B rows at 3), have %d", op,
               p.tokens, s.early);
    }
    if (s.evict_first) {
      KDA_FAIL(kInvalidValue, "%s: tokens = %d (verify) does not support schedule.evict_first", op, p.tokens);
    }
    if (s.cluster == 16) {
      KDA_FAIL(kInvalidValue, "%s: tokens = %d (verify) does not support schedule.cluster = 16", op,
               p.tokens);
    }
  }
  return Result::success();
}

}  // namespace

Result check(const KdaDecodeParams& p, const DeviceInfo& device) noexcept {
  constexpr const char* op = "kda_decode";
  FS_TRY(check_sizes(op, p.batch, p.heads));
  if (p.tokens < 1 || p.tokens > kKdaMaxTokens) {
    KDA_FAIL(kInvalidShape, "%s: tokens = %d must be in [1, %d]", op, p.tokens, kKdaMaxTokens);
  }
  const int64_t dim = int64_t(p.heads) * kKdaHeadDim;
  const int64_t channels = 3 * dim;
  const bool verify = p.tokens > 1;

  // ---- required pointers
  struct Required { const void* ptr; const char* name; };
  const Required required[] = {
      {p.x, "x"},           {p.raw_beta, "raw_beta"}, {p.output_gate, "output_gate"},
      {p.conv_weight, "conv_weight"}, {p.conv_state, "conv_state"}, {p.a_log, "a_log"},
      {p.dt_bias, "dt_bias"}, {p.norm_weight, "norm_weight"}, {p.state, "state"},
      {p.slots, "slots"},   {p.output, "output"}};
  for (const Required& r : required) {
    if (r.ptr == nullptr) KDA_FAIL(kNullPointer, "%s: %s is null", op, r.name);
  }
  if (p.f_a == nullptr && p.raw_gate == nullptr) {
    KDA_FAIL(kNullPointer, "%s: f_a and raw_gate are both null: give exactly one", op);
  }
  if (p.f_a != nullptr && p.raw_gate != nullptr) {
    KDA_FAIL(kInvalidValue, "%s: f_a = %p and raw_gate = %p are both given: give exactly one", op,
             (const void*)p.f_a, (const void*)p.raw_gate);
  }
  if (p.f_a != nullptr && p.f_b_weight == nullptr) {
    KDA_FAIL(kNullPointer, "%s: f_b_weight is null while f_a is given", op);
  }
  if (verify && p.accepted == nullptr) {
    KDA_FAIL(kNullPointer, "%s: accepted is null with tokens = %d (verify)", op, p.tokens);
  }
  if (!verify && p.accepted != nullptr) {
    KDA_FAIL(kInvalidValue, "%s: accepted = %p is given with tokens = 1 (it belongs to a verify)",
             op, (const void*)p.accepted);
  }
  if (!verify && p.token_counts != nullptr) {
    KDA_FAIL(kInvalidValue,
             "%s: token_counts = %p is given with tokens = 1 (it belongs to a verify)", op,
             (const void*)p.token_counts);
  }
  const bool records = p.record_correction != nullptr || p.record_key_gate != nullptr;
  if (records) {
    if (p.record_correction == nullptr) {
      KDA_FAIL(kNullPointer, "%s: record_correction is null while record_key_gate is given", op);
    }
    if (p.record_key_gate == nullptr) {
      KDA_FAIL(kNullPointer, "%s: record_key_gate is null while record_correction is given", op);
    }
    if (!verify) {
      KDA_FAIL(kInvalidValue, "%s: records need tokens > 1 (a verify), have tokens = %d", op,
               p.tokens);
    }
    if (p.record_slots < 1) {
      KDA_FAIL(kInvalidShape, "%s: record_slots = %lld must be >= 1 with records", op,
               (long long)p.record_slots);
    }
  } else if (p.record_rows != nullptr) {
    KDA_FAIL(kInvalidValue, "%s: record_rows = %p is given without record tensors", op,
             (const void*)p.record_rows);
  }

  // ---- strides of the activation views
  FS_TRY(check_vector_rows(op, "x_stride", p.x_stride, channels));
  if (p.f_a != nullptr) FS_TRY(check_vector_rows(op, "f_a_stride", p.f_a_stride, kKdaRank));
  if (p.raw_gate != nullptr) FS_TRY(check_vector_rows(op, "raw_gate_stride", p.raw_gate_stride, dim));
  if (p.raw_beta_stride < p.heads) {
    KDA_FAIL(kInvalidStride, "%s: raw_beta_stride = %lld must be >= heads = %d", op,
             (long long)p.raw_beta_stride, p.heads);
  }
  FS_TRY(check_vector_rows(op, "output_gate_stride", p.output_gate_stride, dim));
  FS_TRY(check_vector_rows(op, "output_stride", p.output_stride, dim));

  // ---- conv weight and state
  if (p.conv_weight_dtype != DType::kBf16 && p.conv_weight_dtype != DType::kFp32) {
    KDA_FAIL(kInvalidValue, "%s: conv_weight_dtype = %d must be kBf16 (0) or kFp32 (1)", op,
             int(p.conv_weight_dtype));
  }
  if (p.norm_weight_dtype != DType::kBf16 && p.norm_weight_dtype != DType::kFp32) {
    KDA_FAIL(kInvalidValue, "%s: norm_weight_dtype = %d must be kBf16 (0) or kFp32 (1)", op,
             int(p.norm_weight_dtype));
  }
  if (p.conv_state_dtype != DType::kBf16 && p.conv_state_dtype != DType::kFp32) {
    KDA_FAIL(kInvalidValue, "%s: conv_state_dtype = %d must be kBf16 (0) or kFp32 (1)", op,
             int(p.conv_state_dtype));
  }
  FS_TRY(check_positive_stride(op, "conv_weight_channel_stride", p.conv_weight_channel_stride));
  FS_TRY(check_positive_stride(op, "conv_weight_tap_stride", p.conv_weight_tap_stride));
  const int64_t given_section_stride = p.conv_weight_section_stride;
  if (given_section_stride < 0) {
    KDA_FAIL(kInvalidStride, "%s: conv_weight_section_stride = %lld must be >= 0 (0 = dim * channel_stride)",
             op, (long long)given_section_stride);
  }
  const int64_t section_stride = kda::conv_weight_section_stride(p);
  if (!nested({section_stride, p.conv_weight_channel_stride, p.conv_weight_tap_stride},
              {int64_t(3), dim, int64_t(kKdaConvWidth)})) {
    KDA_FAIL(kInvalidStride,
             "%s: conv_weight_section_stride = %lld (resolved %lld), conv_weight_channel_stride = "
             "%lld and conv_weight_tap_stride = %lld overlap: taken by increasing stride, each "
             "must exceed the span of the smaller ones (3 sections x %lld channels x 4 taps)",
             op, (long long)given_section_stride, (long long)section_stride,
             (long long)p.conv_weight_channel_stride, (long long)p.conv_weight_tap_stride,
             (long long)dim);
  }
  const int64_t taps = p.tokens + 2;
  FS_TRY(check_positive_stride(op, "conv_state_channel_stride", p.conv_state_channel_stride));
  FS_TRY(check_positive_stride(op, "conv_state_tap_stride", p.conv_state_tap_stride));
  if (!nested({p.conv_state_channel_stride, p.conv_state_tap_stride}, {channels, taps})) {
    KDA_FAIL(kInvalidStride,
             "%s: conv_state_channel_stride = %lld and conv_state_tap_stride = %lld overlap: "
             "need channel_stride >= (tokens + 2) * tap_stride (%lld) or tap_stride >= 3 * dim "
             "* channel_stride (%lld)",
             op, (long long)p.conv_state_channel_stride, (long long)p.conv_state_tap_stride,
             (long long)(taps * p.conv_state_tap_stride),
             (long long)(channels * p.conv_state_channel_stride));
  }
  const int64_t conv_span =
      (channels - 1) * p.conv_state_channel_stride + (taps - 1) * p.conv_state_tap_stride + 1;
  if (p.conv_state_slot_stride < conv_span) {
    KDA_FAIL(kInvalidStride,
             "%s: conv_state_slot_stride = %lld must be >= %lld (the span of one slot's %lld "
             "channels x %lld taps)",
             op, (long long)p.conv_state_slot_stride, (long long)conv_span, (long long)channels,
             (long long)taps);
  }
  if (p.conv_state_slots < 1) {
    KDA_FAIL(kInvalidShape, "%s: conv_state_slots = %lld must be >= 1", op,
             (long long)p.conv_state_slots);
  }

  // ---- recurrent state and slot table
  FS_TRY(check_state(op, p.heads, p.state, p.state_dtype, p.state_slot_stride, p.state_slots));
  if (verify && p.slots_stride < p.tokens) {
    KDA_FAIL(kInvalidStride, "%s: slots_stride = %lld must be >= tokens = %d", op,
             (long long)p.slots_stride, p.tokens);
  }

  // ---- alignment of the 16-byte vector accesses
  FS_TRY(check_aligned(op, "x", p.x));
  if (p.f_a != nullptr) {
    FS_TRY(check_aligned(op, "f_a", p.f_a));
    FS_TRY(check_aligned(op, "f_b_weight", p.f_b_weight));
  }
  if (p.raw_gate != nullptr) FS_TRY(check_aligned(op, "raw_gate", p.raw_gate));
  FS_TRY(check_aligned(op, "output_gate", p.output_gate));
  FS_TRY(check_aligned(op, "output", p.output));
  FS_TRY(check_aligned(op, "norm_weight", p.norm_weight));
  FS_TRY(check_aligned(op, "dt_bias", p.dt_bias));
  if (records) {
    FS_TRY(check_aligned(op, "record_correction", p.record_correction));
    FS_TRY(check_aligned(op, "record_key_gate", p.record_key_gate));
  }

  // ---- scalars and options
  FS_TRY(check_lower_bound(op, p.lower_bound));
  if (!std::isfinite(p.q_scale) || !(p.q_scale > 0.0f)) {
    KDA_FAIL(kInvalidValue, "%s: q_scale = %g must be finite and > 0", op, double(p.q_scale));
  }
  if (!std::isfinite(p.norm_eps) || !(p.norm_eps >= 0.0f)) {
    KDA_FAIL(kInvalidValue, "%s: norm_eps = %g must be finite and >= 0", op, double(p.norm_eps));
  }
  const int mode = int(p.gate_mode);
  if (mode < 0 || mode > 2) {
    KDA_FAIL(kInvalidValue, "%s: gate_mode = %d must be 0, 1 or 2", op, mode);
  }
  FS_TRY(check_schedule(p));
  return check_device(op, device, /*needs_clusters=*/true);
}

Result check(const KdaCommitParams& p, const DeviceInfo& device) noexcept {
  constexpr const char* op = "kda_commit";
  FS_TRY(check_sizes(op, p.batch, p.heads));
  if (p.tokens < 2 || p.tokens > kKdaMaxTokens) {
    KDA_FAIL(kInvalidShape,
             "%s: tokens = %d must be in [2, %d] (the q of the verify that wrote the records)", op,
             p.tokens, kKdaMaxTokens);
  }
  struct Required { const void* ptr; const char* name; };
  const Required required[] = {{p.slots, "slots"},
                               {p.accepted, "accepted"},
                               {p.record_correction, "record_correction"},
                               {p.record_key_gate, "record_key_gate"},
                               {p.a_log, "a_log"},
                               {p.dt_bias, "dt_bias"}};
  for (const Required& r : required) {
    if (r.ptr == nullptr) KDA_FAIL(kNullPointer, "%s: %s is null", op, r.name);
  }
  FS_TRY(check_state(op, p.heads, p.state, p.state_dtype, p.state_slot_stride, p.state_slots));
  if (p.record_slots < 1) {
    KDA_FAIL(kInvalidShape, "%s: record_slots = %lld must be >= 1", op, (long long)p.record_slots);
  }
  FS_TRY(check_aligned(op, "record_correction", p.record_correction));
  FS_TRY(check_aligned(op, "record_key_gate", p.record_key_gate));
  FS_TRY(check_aligned(op, "dt_bias", p.dt_bias));
  FS_TRY(check_lower_bound(op, p.lower_bound));
  return check_device(op, device, /*needs_clusters=*/false);
}

}  // namespace fusedstep
