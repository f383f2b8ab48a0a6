// SPDX-License-Identifier: Apache-2.0
// mhc_boundary check(): every rejection path returns its Status and a message naming
// the field and its value; valid parameters (tokens == 0 included) pass. Host only.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "fusedstep/mhc_boundary.h"

namespace fusedstep {
namespace {

// Fake, 256-byte aligned device addresses: check() never dereferences them.
template <class T>
T* fake_pointer(uintptr_t slot) {
  return reinterpret_cast<T*>(uintptr_t(0x7f0000000000) + slot * 0x100000);
}

MhcBoundaryParams valid_params() {
  MhcBoundaryParams p;
  p.x = fake_pointer<const __nv_bfloat16>(1);
  p.residual = fake_pointer<const __nv_bfloat16>(2);
  p.post = fake_pointer<const float>(3);
  p.comb = fake_pointer<const float>(4);
  p.pre_lag = fake_pointer<const float>(5);
  p.weight = fake_pointer<const uint32_t>(6);
  p.scale = fake_pointer<const float>(7);
  p.base = fake_pointer<const float>(8);
  p.norm_weight = fake_pointer<const __nv_bfloat16>(9);
  p.residual_out = fake_pointer<__nv_bfloat16>(10);
  p.layer_input = fake_pointer<__nv_bfloat16>(11);
  p.pre_out = fake_pointer<float>(12);
  p.post_out = fake_pointer<float>(13);
  p.comb_out = fake_pointer<float>(14);
  p.tokens = 37;
  p.hidden = 7168;
  return p;
}

template <class T>
T* offset_bytes(T* p, int bytes) {
  return reinterpret_cast<T*>(reinterpret_cast<uintptr_t>(p) + bytes);
}

// Expects `params` to be rejected with `status` and a message containing every needle.
void expect_rejected(const MhcBoundaryParams& params, Status status,
                     std::initializer_list<std::string> needles,
                     const DeviceInfo& device = hopper_device_info_for_tests()) {
  const Result r = check(params, device);
  ASSERT_FALSE(r.ok()) << "accepted; expected " << status_name(status);
  EXPECT_EQ(r.status(), status) << r.detail();
  const std::string detail = r.detail();
  EXPECT_EQ(detail.rfind("mhc_boundary: ", 0), 0u) << detail;
  for (const std::string& needle : needles) {
    EXPECT_NE(detail.find(needle), std::string::npos) << "\"" << needle << "\" not in: " << detail;
  }
}

// Valid parameters pass for every supported hidden size, rounding and stride form.
TEST(MhcBoundaryCheck, AcceptsValidParams) {
  const DeviceInfo device = hopper_device_info_for_tests();
  for (int64_t hidden : {512, 4096, 5120, 7168, 8192}) {
    for (WeightRounding rounding :
         {WeightRounding::kTf32Rna, WeightRounding::kTf32Rne, WeightRounding::kFp32}) {
      MhcBoundaryParams p = valid_params();
      p.hidden = hidden;
      p.rounding = rounding;
      const Result r = check(p, device);
      EXPECT_TRUE(r.ok()) << hidden << ": " << r.detail();
      p.x_stride = hidden + 8;
      p.residual_stride = 4 * hidden + 64;
      p.residual_out_stride = 4 * hidden;
      p.layer_input_stride = 2 * hidden;
      const Result strided = check(p, device);
      EXPECT_TRUE(strided.ok()) << hidden << ": " << strided.detail();
    }
  }
  MhcBoundaryParams p = valid_params();
  p.tokens = kMhcMaxTokens;
  p.sinkhorn_iters = 1;
  p.rms_eps = p.hc_pre_eps = p.sinkhorn_eps = p.norm_eps = 0.0f;
  p.post_mult = -3.0f;
  EXPECT_TRUE(check(p, device).ok()) << check(p, device).detail();
  p.sinkhorn_iters = 1000;
  EXPECT_TRUE(check(p, device).ok()) << check(p, device).detail();
}

// tokens == 0 is an empty call: the per-token tensors may be null, the per-layer
// ones may not.
TEST(MhcBoundaryCheck, EmptyCallAllowsNullPerTokenTensors) {
  MhcBoundaryParams p = valid_params();
  p.tokens = 0;
  p.x = nullptr;
  p.residual = nullptr;
  p.post = p.comb = p.pre_lag = nullptr;
  p.residual_out = p.layer_input = nullptr;
  p.pre_out = p.post_out = p.comb_out = nullptr;
  const Result r = check(p, hopper_device_info_for_tests());
  EXPECT_TRUE(r.ok()) << r.detail();
  p.weight = nullptr;
  expect_rejected(p, Status::kNullPointer, {"weight = null"});
}

// Shapes: hc_mult, hidden and tokens out of range name their value.
TEST(MhcBoundaryCheck, RejectsBadShapes) {
  for (int hc : {0, 1, 3, 5, 8, -4}) {
    MhcBoundaryParams p = valid_params();
    p.hc_mult = hc;
    expect_rejected(p, Status::kInvalidShape, {"hc_mult = " + std::to_string(hc)});
  }
  for (int64_t hidden : {int64_t(0), int64_t(-512), int64_t(256), int64_t(4000), int64_t(7169),
                         int64_t(1000)}) {
    MhcBoundaryParams p = valid_params();
    p.hidden = hidden;
    expect_rejected(p, Status::kInvalidShape, {"hidden = " + std::to_string(hidden)});
  }
  for (int64_t tokens : {int64_t(-1), kMhcMaxTokens + 1, int64_t(1) << 40}) {
    MhcBoundaryParams p = valid_params();
    p.tokens = tokens;
    expect_rejected(p, Status::kInvalidShape, {"tokens = " + std::to_string(tokens)});
  }
}

// Scalars: rounding enum, the four eps, post_mult and sinkhorn_iters.
TEST(MhcBoundaryCheck, RejectsBadScalars) {
  for (int rounding : {-1, 3, 77}) {
    MhcBoundaryParams p = valid_params();
    p.rounding = static_cast<WeightRounding>(rounding);
    expect_rejected(p, Status::kInvalidValue, {"rounding = " + std::to_string(rounding)});
  }
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  struct Eps {
    const char* name;
    float MhcBoundaryParams::*field;
  };
  for (const Eps& eps : {Eps{"rms_eps", &MhcBoundaryParams::rms_eps},
                         Eps{"hc_pre_eps", &MhcBoundaryParams::hc_pre_eps},
                         Eps{"sinkhorn_eps", &MhcBoundaryParams::sinkhorn_eps},
                         Eps{"norm_eps", &MhcBoundaryParams::norm_eps}}) {
    for (float bad : {-1e-6f, -inf, inf, nan}) {
      MhcBoundaryParams p = valid_params();
      p.*eps.field = bad;
      char value[64];
      std::snprintf(value, sizeof value, "%s = %g", eps.name, static_cast<double>(bad));
      expect_rejected(p, Status::kInvalidValue, {value});
    }
  }
  for (float bad : {inf, -inf, nan}) {
    MhcBoundaryParams p = valid_params();
    p.post_mult = bad;
    char value[64];
    std::snprintf(value, sizeof value, "post_mult = %g", static_cast<double>(bad));
    expect_rejected(p, Status::kInvalidValue, {value});
  }
  for (int iters : {0, -1, 1001, 1 << 30}) {
    MhcBoundaryParams p = valid_params();
    p.sinkhorn_iters = iters;
    expect_rejected(p, Status::kInvalidValue, {"sinkhorn_iters = " + std::to_string(iters)});
  }
}

// The pointer fields, by name, for the null and misalignment sweeps.
struct PointerField {
  const char* name;
  std::function<void(MhcBoundaryParams&, int)> set;  // set(p, kind): 0 = null, else offset bytes
};

template <class T>
void set_pointer(T*& field, int offset) {
  field = offset == 0 ? nullptr : offset_bytes(field, offset);
}

std::vector<PointerField> pointer_fields() {
  return {
      {"x", [](MhcBoundaryParams& p, int o) { set_pointer(p.x, o); }},
      {"residual", [](MhcBoundaryParams& p, int o) { set_pointer(p.residual, o); }},
      {"post", [](MhcBoundaryParams& p, int o) { set_pointer(p.post, o); }},
      {"comb", [](MhcBoundaryParams& p, int o) { set_pointer(p.comb, o); }},
      {"pre_lag", [](MhcBoundaryParams& p, int o) { set_pointer(p.pre_lag, o); }},
      {"weight", [](MhcBoundaryParams& p, int o) { set_pointer(p.weight, o); }},
      {"scale", [](MhcBoundaryParams& p, int o) { set_pointer(p.scale, o); }},
      {"base", [](MhcBoundaryParams& p, int o) { set_pointer(p.base, o); }},
      {"norm_weight", [](MhcBoundaryParams& p, int o) { set_pointer(p.norm_weight, o); }},
      {"residual_out", [](MhcBoundaryParams& p, int o) { set_pointer(p.residual_out, o); }},
      {"layer_input", [](MhcBoundaryParams& p, int o) { set_pointer(p.layer_input, o); }},
      {"pre_out", [](MhcBoundaryParams& p, int o) { set_pointer(p.pre_out, o); }},
      {"post_out", [](MhcBoundaryParams& p, int o) { set_pointer(p.post_out, o); }},
      {"comb_out", [](MhcBoundaryParams& p, int o) { set_pointer(p.comb_out, o); }},
  };
}

// Every required pointer: null is kNullPointer naming it.
TEST(MhcBoundaryCheck, RejectsNullPointers) {
  for (const PointerField& f : pointer_fields()) {
    MhcBoundaryParams p = valid_params();
    f.set(p, 0);
    expect_rejected(p, Status::kNullPointer, {std::string(f.name) + " = null"});
  }
}

// Every pointer must be 16-byte aligned (the kernels move 16-byte vectors).
TEST(MhcBoundaryCheck, RejectsMisalignedPointers) {
  for (const PointerField& f : pointer_fields()) {
    for (int offset : {4, 8, 2, 12}) {
      MhcBoundaryParams p = valid_params();
      f.set(p, offset);
      const Result r = check(p, hopper_device_info_for_tests());
      ASSERT_FALSE(r.ok()) << f.name << " + " << offset;
      EXPECT_EQ(r.status(), Status::kMisaligned) << r.detail();
      const std::string detail = r.detail();
      EXPECT_NE(detail.find(std::string(f.name) + " = 0x"), std::string::npos) << detail;
      EXPECT_NE(detail.find("16-byte aligned"), std::string::npos) << detail;
    }
  }
}

// Strides: 0 or >= the row and a multiple of 8 elements; the message names the value.
TEST(MhcBoundaryCheck, RejectsBadStrides) {
  struct StrideField {
    const char* name;
    int64_t MhcBoundaryParams::*field;
    int64_t row;  // minimum, in units of hidden
  };
  const int64_t H = valid_params().hidden;
  for (const StrideField& f :
       {StrideField{"x_stride", &MhcBoundaryParams::x_stride, 1},
        StrideField{"residual_stride", &MhcBoundaryParams::residual_stride, 4},
        StrideField{"residual_out_stride", &MhcBoundaryParams::residual_out_stride, 4},
        StrideField{"layer_input_stride", &MhcBoundaryParams::layer_input_stride, 1}}) {
    for (int64_t bad : {f.row * H - 8, f.row * H + 4, f.row * H + 1, int64_t(-8), int64_t(8)}) {
      MhcBoundaryParams p = valid_params();
      p.*f.field = bad;
      expect_rejected(p, Status::kInvalidStride,
                      {std::string(f.name) + " = " + std::to_string(bad)});
    }
  }
}

// Device facts: compute capability, cluster launch and co-resident clusters.
TEST(MhcBoundaryCheck, RejectsUnsupportedDevice) {
  const MhcBoundaryParams p = valid_params();
  DeviceInfo ampere = hopper_device_info_for_tests();
  ampere.cc_major = 8;
  ampere.cc_minor = 6;
  expect_rejected(p, Status::kDeviceUnsupported, {"device.cc_major = 8", "8.6"}, ampere);
  DeviceInfo no_clusters = hopper_device_info_for_tests();
  no_clusters.cluster_launch = false;
  expect_rejected(p, Status::kDeviceUnsupported, {"device.cluster_launch = false"}, no_clusters);
  DeviceInfo none_fit = hopper_device_info_for_tests();
  none_fit.mhc_clusters_per_wave = 0;
  expect_rejected(p, Status::kDeviceUnsupported, {"device.mhc_clusters_per_wave = 0"}, none_fit);
  // Blackwell (cc 10.0) is accepted.
  DeviceInfo blackwell = hopper_device_info_for_tests();
  blackwell.cc_major = 10;
  EXPECT_TRUE(check(p, blackwell).ok());
}

}  // namespace
}  // namespace fusedstep
