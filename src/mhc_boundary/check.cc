// SPDX-License-Identifier: Apache-2.0
// mHC boundary: host-side validation. Every rejection names the field and its value:
// "mhc_boundary: <field> = <value> <what was expected>".
#include "mhc_boundary/check.h"

#include <cmath>
#include <cstdint>

#include "common/internal.h"
#include "mhc_boundary/layout.h"

namespace fusedstep {
namespace mhc {
namespace {

constexpr uintptr_t kVectorBytes = 16;  // the kernels move 16-byte vectors

Result check_pointer(const void* p, const char* name, bool required) {
  if (p == nullptr) {
    if (!required) return Result::success();
    return Result::error(Status::kNullPointer, "mhc_boundary: %s = null must be a device pointer",
                         name);
  }
  if (reinterpret_cast<uintptr_t>(p) % kVectorBytes != 0) {
    return Result::error(Status::kMisaligned, "mhc_boundary: %s = %p must be 16-byte aligned",
                         name, p);
  }
  return Result::success();
}

// 0 = contiguous; else at least `minimum` elements and whole 16-byte rows.
Result check_stride(int64_t stride, int64_t minimum, const char* name, const char* minimum_name) {
  if (stride == 0) return Result::success();
  if (stride < minimum || stride % 8 != 0) {
    return Result::error(Status::kInvalidStride,
                         "mhc_boundary: %s = %lld must be 0 (contiguous) or >= %s (%lld) and a "
                         "multiple of 8 elements",
                         name, static_cast<long long>(stride), minimum_name,
                         static_cast<long long>(minimum));
  }
  return Result::success();
}

Result check_eps(float value, const char* name) {
  if (!std::isfinite(value) || value < 0.0f) {
    return Result::error(Status::kInvalidValue, "mhc_boundary: %s = %g must be finite and >= 0",
                         name, static_cast<double>(value));
  }
  return Result::success();
}

}  // namespace

Result check_params(const MhcBoundaryParams& p) noexcept {
  // ---- shapes
  if (p.hc_mult != kMhcStreams) {
    return Result::error(Status::kInvalidShape, "mhc_boundary: hc_mult = %d must be %d", p.hc_mult,
                         kMhcStreams);
  }
  if (!hidden_supported(p.hidden)) {
    return Result::error(Status::kInvalidShape,
                         "mhc_boundary: hidden = %lld must be a positive multiple of 512 whose "
                         "4 * hidden / 256 k16 steps per slice split over 8 MMA warps",
                         static_cast<long long>(p.hidden));
  }
  if (p.tokens < 0 || p.tokens > kMhcMaxTokens) {
    return Result::error(Status::kInvalidShape, "mhc_boundary: tokens = %lld must be in [0, %lld]",
                         static_cast<long long>(p.tokens), static_cast<long long>(kMhcMaxTokens));
  }
  // ---- scalars
  const int rounding = static_cast<int>(p.rounding);
  if (rounding < 0 || rounding > static_cast<int>(WeightRounding::kFp32)) {
    return Result::error(Status::kInvalidValue,
                         "mhc_boundary: rounding = %d must be a WeightRounding (0, 1 or 2)",
                         rounding);
  }
  FS_TRY(check_eps(p.rms_eps, "rms_eps"));
  FS_TRY(check_eps(p.hc_pre_eps, "hc_pre_eps"));
  FS_TRY(check_eps(p.sinkhorn_eps, "sinkhorn_eps"));
  FS_TRY(check_eps(p.norm_eps, "norm_eps"));
  if (!std::isfinite(p.post_mult)) {
    return Result::error(Status::kInvalidValue, "mhc_boundary: post_mult = %g must be finite",
                         static_cast<double>(p.post_mult));
  }
  if (p.tile != 0 && p.tile != 8 && p.tile != 16 && p.tile != 24 && p.tile != 32) {
    return Result::error(Status::kInvalidValue, "mhc_boundary: tile = %d must be 0 (plan's choice), 8, 16, 24 or 32",
                         p.tile);
  }
  if (p.sinkhorn_iters < 1 || p.sinkhorn_iters > 1000) {
    return Result::error(Status::kInvalidValue,
                         "mhc_boundary: sinkhorn_iters = %d must be in [1, 1000]",
                         p.sinkhorn_iters);
  }
  // ---- pointers: present and 16-byte aligned. An empty call (tokens == 0) may pass
  // null for the per-token tensors, as empty framework tensors do.
  const bool per_token = p.tokens > 0;
  FS_TRY(check_pointer(p.x, "x", per_token));
  FS_TRY(check_pointer(p.residual, "residual", per_token));
  FS_TRY(check_pointer(p.post, "post", per_token));
  FS_TRY(check_pointer(p.comb, "comb", per_token));
  FS_TRY(check_pointer(p.pre_lag, "pre_lag", per_token));
  FS_TRY(check_pointer(p.weight, "weight", true));
  FS_TRY(check_pointer(p.scale, "scale", true));
  FS_TRY(check_pointer(p.base, "base", true));
  FS_TRY(check_pointer(p.norm_weight, "norm_weight", true));
  FS_TRY(check_pointer(p.residual_out, "residual_out", per_token));
  FS_TRY(check_pointer(p.layer_input, "layer_input", per_token));
  FS_TRY(check_pointer(p.pre_out, "pre_out", per_token));
  FS_TRY(check_pointer(p.post_out, "post_out", per_token));
  FS_TRY(check_pointer(p.comb_out, "comb_out", per_token));
  // ---- strides (elements)
  const int64_t streams_hidden = kMhcStreams * p.hidden;
  FS_TRY(check_stride(p.x_stride, p.hidden, "x_stride", "hidden"));
  FS_TRY(check_stride(p.residual_stride, streams_hidden, "residual_stride", "4 * hidden"));
  FS_TRY(check_stride(p.residual_out_stride, streams_hidden, "residual_out_stride", "4 * hidden"));
  FS_TRY(check_stride(p.layer_input_stride, p.hidden, "layer_input_stride", "hidden"));
  return Result::success();
}

}  // namespace mhc

Result check(const MhcBoundaryParams& params, const DeviceInfo& device) noexcept {
  FS_TRY(mhc::check_params(params));
  if (device.cc_major < 9) {
    return Result::error(Status::kDeviceUnsupported,
                         "mhc_boundary: device.cc_major = %d (compute capability %d.%d) must be "
                         ">= 9 (Hopper or newer)",
                         device.cc_major, device.cc_major, device.cc_minor);
  }
  if (!device.cluster_launch) {
    return Result::error(Status::kDeviceUnsupported,
                         "mhc_boundary: device.cluster_launch = false must be true (the kernel "
                         "runs 16-CTA clusters)");
  }
  if (device.mhc_clusters_per_wave < 1) {
    return Result::error(Status::kDeviceUnsupported,
                         "mhc_boundary: device.mhc_clusters_per_wave = %d must be >= 1 (no "
                         "16-CTA cluster of the kernel fits on device %d)",
                         device.mhc_clusters_per_wave, device.device);
  }
  return Result::success();
}

}  // namespace fusedstep
