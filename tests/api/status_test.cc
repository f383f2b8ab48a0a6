// SPDX-License-Identifier: Apache-2.0
// Contract: Status names are stable and Result carries the status and a formatted detail.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "fusedstep/device.h"
#include "fusedstep/status.h"

namespace fusedstep {
namespace {

TEST(Status, NamesAreStable) {
  EXPECT_STREQ(status_name(Status::kSuccess), "kSuccess");
  EXPECT_STREQ(status_name(Status::kNullPointer), "kNullPointer");
  EXPECT_STREQ(status_name(Status::kMisaligned), "kMisaligned");
  EXPECT_STREQ(status_name(Status::kInvalidShape), "kInvalidShape");
  EXPECT_STREQ(status_name(Status::kInvalidStride), "kInvalidStride");
  EXPECT_STREQ(status_name(Status::kInvalidValue), "kInvalidValue");
  EXPECT_STREQ(status_name(Status::kUnsupported), "kUnsupported");
  EXPECT_STREQ(status_name(Status::kDeviceUnsupported), "kDeviceUnsupported");
  EXPECT_STREQ(status_name(Status::kCudaError), "kCudaError");
  EXPECT_STREQ(status_name(static_cast<Status>(999)), "kUnknown");
}

TEST(Result, SuccessHasEmptyDetail) {
  const Result r = Result::success();
  EXPECT_TRUE(r.ok());
  EXPECT_TRUE(static_cast<bool>(r));
  EXPECT_EQ(r.status(), Status::kSuccess);
  EXPECT_STREQ(r.detail(), "");
}

TEST(Result, ErrorFormatsFieldAndValue) {
  const Result r = Result::error(Status::kInvalidStride, "op: %s = %lld must be >= %d", "x_stride",
                                 static_cast<long long>(130), 256);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.status(), Status::kInvalidStride);
  EXPECT_STREQ(r.detail(), "op: x_stride = 130 must be >= 256");
}

TEST(Result, LongDetailIsTruncatedNotOverflowed) {
  const std::string long_text(1000, 'a');
  const Result r = Result::error(Status::kInvalidValue, "%s", long_text.c_str());
  EXPECT_LT(std::strlen(r.detail()), 1000u);
  EXPECT_GT(std::strlen(r.detail()), 100u);
}

TEST(DeviceInfo, NullOutputIsRejected) {
  const Result r = get_device_info(0, nullptr);
  EXPECT_EQ(r.status(), Status::kNullPointer);
}

TEST(DeviceInfo, NegativeDeviceIsRejected) {
  DeviceInfo info;
  const Result r = get_device_info(-1, &info);
  EXPECT_EQ(r.status(), Status::kInvalidValue);
  EXPECT_NE(std::string(r.detail()).find("device = -1"), std::string::npos);
}

TEST(DeviceInfo, TestDescriptionIsHopper) {
  const DeviceInfo info = hopper_device_info_for_tests();
  EXPECT_EQ(info.cc_major, 9);
  EXPECT_TRUE(info.cluster_launch);
  EXPECT_GT(info.mhc_clusters_per_wave, 0);
  EXPECT_GT(info.mhc_one_cta_clusters_per_wave, 0);
  EXPECT_LE(info.mhc_one_cta_clusters_per_wave, info.mhc_clusters_per_wave);
}

// The first get_device_info of a device is the one-time setup (device properties, the
// fused kernels' attributes, occupancy queries). Its failures come back as a Result
// naming the call and the runtime's error, and it leaves no error of its own pending.
// (It cannot keep an error the caller left pending: on the H200 with CUDA 13.0 the
// runtime's cudaFuncSetAttribute resets the last-error slot, 2026-11-29; device.h says
// so. ctest runs every test case in a process of its own, so this call is the first.)
TEST(DeviceInfo, FirstQueryLeavesNoErrorOfItsOwn) {
  (void)cudaGetLastError();
  DeviceInfo info;
  const Result first = get_device_info(0, &info);
  if (!first.ok()) {
    // No usable GPU (CI: no driver): the failure is a Result naming the call.
    EXPECT_EQ(first.status(), Status::kCudaError) << first.detail();
    const std::string detail = first.detail();
    EXPECT_NE(detail.find("cudaGetDeviceProperties: cudaError"), std::string::npos) << detail;
    return;
  }
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "the one-time setup left an error pending";
  EXPECT_GE(info.mhc_clusters_per_wave, 1);
  EXPECT_TRUE(get_device_info(0, &info).ok());
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

}  // namespace
}  // namespace fusedstep
