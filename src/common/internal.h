// SPDX-License-Identifier: Apache-2.0
// Internal hooks between src/common and the operations (not part of the public API).
#pragma once

#include <cuda_runtime_api.h>

#include "fusedstep/device.h"
#include "fusedstep/status.h"

namespace fusedstep::detail {

// Co-resident 16-CTA clusters of the fused mHC boundary kernel on `device`
// (cudaOccupancyMaxActiveClusters): `two_cta` for its two-CTA-per-SM configuration,
// `one_cta` for the one-CTA-per-SM one (0 where the device cannot run it: opt-in shared
// memory below its 227 KB, or no cluster fits). Sets the kernels' attributes on first
// call. Implemented in src/mhc_boundary/.
Result mhc_query_clusters_per_wave(int device, int* two_cta, int* one_cta) noexcept;

// The runtime's last-error slot around a one-time setup (attributes, occupancy
// queries). A failing runtime call records its error there for the caller's next
// cudaGetLastError; the setup returns its failures as Results instead, so it must not
// leave them behind, and it does not itself clear an error the caller had pending
// (cudaGetLastError would). (The runtime's cudaFuncSetAttribute resets the slot
// anyway, measured on the H200 with CUDA 13.0: see device.h.) Declare one at the start
// of the setup: if nothing was pending on entry, whatever the slot holds on exit is
// the setup's own failure (already returned) and is cleared; if an error was pending,
// the slot is left alone (it holds the caller's error, or, if a setup call failed
// too, that failure: the runtime keeps only the last one).
class InitErrorScope {
 public:
  InitErrorScope() noexcept : pending_on_entry_(cudaPeekAtLastError()) {}
  ~InitErrorScope() {
    if (pending_on_entry_ == cudaSuccess) (void)cudaGetLastError();
  }
  InitErrorScope(const InitErrorScope&) = delete;
  InitErrorScope& operator=(const InitErrorScope&) = delete;

 private:
  cudaError_t pending_on_entry_;
};

// Result of a CUDA runtime call as a fusedstep Result naming the call.
inline Result cuda_result(cudaError_t err, const char* what) noexcept {
  if (err == cudaSuccess) return Result::success();
  return Result::error(Status::kCudaError, "%s: %s (%s)", what, cudaGetErrorName(err),
                       cudaGetErrorString(err));
}

// The DeviceInfo a launch uses: the caller's, or the cached info of the current device.
Result resolve_device(const LaunchOptions& options, const DeviceInfo** out) noexcept;

}  // namespace fusedstep::detail

// Return early from a function returning Result when `expr` fails.
#define FS_TRY(expr)                       \
  do {                                     \
    ::fusedstep::Result fs_try_ = (expr);  \
    if (!fs_try_.ok()) return fs_try_;     \
  } while (0)
