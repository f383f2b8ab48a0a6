// SPDX-License-Identifier: Apache-2.0
// Development phase trace: a build with -DFUSEDSTEP_TRACE (a separate build directory,
// docs/design.md "Development trace") records %globaltimer and clock64 at a kernel's
// phase boundaries, per CTA, for the last launch; fusedstep-bench prints them.
// Production builds compile none of it (FS_TRACE expands to nothing).
#pragma once

#if defined(FUSEDSTEP_TRACE)
#include <algorithm>

#include "common/ptx.cuh"
#include "trace_layout.h"

namespace fusedstep::trace {

__device__ __forceinline__ int linear_cta() {
  return static_cast<int>(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z));
}

__device__ __forceinline__ void record(unsigned long long* buffer, int event) {
  const int cta = linear_cta();
  if (cta < kCtas && event < kEvents - 1) {
    buffer[cta * kEvents + event] = ptx::globaltimer();
    buffer[(kCtas + cta) * kEvents + event] = clock64();
    if (event == 0) buffer[cta * kEvents + kEvents - 1] = ptx::smid();
  }
}

// Host: copy a kernel's trace buffer (a __device__ array of kWords words) to `host`;
// the words copied, 0 on failure.
inline int read_buffer(const unsigned long long (&buffer)[kWords], unsigned long long* host, int max_words) {
  const int n = std::min(max_words, kWords);
  if (cudaMemcpyFromSymbol(host, buffer, n * sizeof(unsigned long long)) != cudaSuccess) return 0;
  return n;
}

}  // namespace fusedstep::trace
// Event `event` when thread `thread` of the CTA gets here.
#define FS_TRACE(buffer, event, thread)                                       \
  do {                                                                        \
    if (static_cast<int>(threadIdx.x) == (thread)) ::fusedstep::trace::record(buffer, event); \
  } while (0)
#else
#define FS_TRACE(buffer, event, thread) \
  do {                                  \
  } while (0)
#endif
