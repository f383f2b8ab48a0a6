// SPDX-License-Identifier: Apache-2.0
// Device facts, queried once per device and cached (thread-safe).
#include <array>
#include <mutex>

#include "common/build_info.h"
#include "common/internal.h"
#include "fusedstep/build_info.h"
#include "fusedstep/device.h"

namespace fusedstep {
namespace {

constexpr int kMaxDevices = 64;

struct Cache {
  std::mutex mutex;
  std::array<bool, kMaxDevices> valid{};
  std::array<DeviceInfo, kMaxDevices> info{};
};

Cache& cache() {
  static Cache c;
  return c;
}

Result query(int device, DeviceInfo* info) {
  cudaDeviceProp prop{};
  FS_TRY(detail::cuda_result(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties"));
  // A GPU this build has no code for fails here, before any kernel is touched (the
  // attribute setup below would otherwise fail with cudaErrorNoKernelImageForDevice).
  if (!has_code_for(prop.major, prop.minor)) {
    return detail::unsupported_architecture(device, prop.name, prop.major, prop.minor,
                                            build_info().architectures);
  }
  info->device = device;
  info->cc_major = prop.major;
  info->cc_minor = prop.minor;
  info->sm_count = prop.multiProcessorCount;
  info->l2_bytes = prop.l2CacheSize;
  info->max_smem_per_block_optin = static_cast<int>(prop.sharedMemPerBlockOptin);
  int cluster = 0;
  FS_TRY(detail::cuda_result(cudaDeviceGetAttribute(&cluster, cudaDevAttrClusterLaunch, device),
                             "cudaDeviceGetAttribute(ClusterLaunch)"));
  info->cluster_launch = cluster != 0;
  info->mhc_clusters_per_wave = 0;
  info->mhc_one_cta_clusters_per_wave = 0;
  if (info->cluster_launch && info->cc_major >= 9) {
    FS_TRY(detail::mhc_query_clusters_per_wave(device, &info->mhc_clusters_per_wave,
                                               &info->mhc_one_cta_clusters_per_wave));
  }
  return Result::success();
}

}  // namespace

Result get_device_info(int device, DeviceInfo* info) noexcept {
  if (info == nullptr) return Result::error(Status::kNullPointer, "get_device_info: info is null");
  if (device < 0 || device >= kMaxDevices) {
    return Result::error(Status::kInvalidValue, "get_device_info: device = %d out of [0, %d)",
                         device, kMaxDevices);
  }
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  if (!c.valid[device]) {
    // The one-time setup of this device: its failures are returned, never left pending,
    // and an error the caller had pending survives it (common/internal.h).
    detail::InitErrorScope errors;
    DeviceInfo fresh;
    FS_TRY(query(device, &fresh));
    c.info[device] = fresh;
    c.valid[device] = true;
  }
  *info = c.info[device];
  return Result::success();
}

DeviceInfo hopper_device_info_for_tests() noexcept {
  DeviceInfo info;
  info.device = 0;
  info.cc_major = 9;
  info.cc_minor = 0;
  info.sm_count = 132;
  info.l2_bytes = 60 * 1024 * 1024;
  info.max_smem_per_block_optin = 227 * 1024;
  info.cluster_launch = true;
  info.mhc_clusters_per_wave = 14;
  info.mhc_one_cta_clusters_per_wave = 7;
  return info;
}

namespace detail {

Result resolve_device(const LaunchOptions& options, const DeviceInfo** out) noexcept {
  if (options.device != nullptr) {
    *out = options.device;
    return Result::success();
  }
  int device = 0;
  FS_TRY(cuda_result(cudaGetDevice(&device), "cudaGetDevice"));
  // After the first call this is a lookup; the pointer stays valid for the process.
  static thread_local DeviceInfo last;
  FS_TRY(get_device_info(device, &last));
  *out = &last;
  return Result::success();
}

}  // namespace detail
}  // namespace fusedstep
