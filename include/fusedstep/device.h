// SPDX-License-Identifier: Apache-2.0
// fusedstep: facts about a GPU that the checks and launches need, and per-call
// launch options.
#pragma once

#include <cstddef>
#include <cstdint>

#include "fusedstep/status.h"

namespace fusedstep {

// Facts about one device, queried once (get_device_info caches them per device).
// check() functions take this by reference and never touch the GPU, so tests can
// pass a hand-made DeviceInfo to exercise every rejection path without a GPU.
struct DeviceInfo {
  int device = -1;
  int cc_major = 0;
  int cc_minor = 0;
  int sm_count = 0;
  int64_t l2_bytes = 0;
  int max_smem_per_block_optin = 0;  // bytes
  bool cluster_launch = false;
  // Co-resident 16-CTA clusters of the fused mHC boundary kernel
  // (cudaOccupancyMaxActiveClusters at its launch configuration); 0 = none fit.
  int mhc_clusters_per_wave = 0;
  // The same for its small-batch configuration (one CTA of 227 KB shared memory per
  // SM); 0 = that configuration does not run on this device (plan() never picks it).
  int mhc_one_cta_clusters_per_wave = 0;
};

// Cached facts of `device` (queried on first use, thread-safe). Not for the hot
// path of a graph capture's first call: call it once at initialization. The first call
// for a device also sets the fused kernels' attributes there (one-time setup); a CUDA
// failure of that setup is returned as kCudaError with the runtime's error name and
// text, and none of its errors is left pending. It calls cudaGetLastError only when no
// error was pending on entry, but it cannot keep an error the caller left pending: the
// runtime's cudaFuncSetAttribute, which the setup needs, resets the last-error slot
// (measured on the H200, CUDA 13.0). Check your own errors before the first call.
Result get_device_info(int device, DeviceInfo* info) noexcept;

// A DeviceInfo describing a Hopper H200-like GPU, for host-only tests of check().
DeviceInfo hopper_device_info_for_tests() noexcept;

// Per-call launch options. No process-global knobs.
struct LaunchOptions {
  // Launch with programmatic dependent launch: the kernel may start while its
  // predecessor on the stream finishes; it reads only weights and states of earlier
  // steps before griddepcontrol.wait (see each operation's header).
  bool pdl = false;
  // Facts of the device the stream belongs to; null = the cached info of the
  // current device.
  const DeviceInfo* device = nullptr;
};

}  // namespace fusedstep
