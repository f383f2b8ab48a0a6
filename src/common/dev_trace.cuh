// Development phase trace: a build with -DFUSEDSTEP_TRACE (a separate build directory,
// docs/design.md "Development trace") records %globaltimer and clock64 at a kernel's
// phase boundaries, per CTA, for the last launch; fusedstep-bench prints them.
// Production builds compile none of it (FS_TRACE expands to nothing).
#pragma once

#if defined(FUSEDSTEP_TRACE)
#include "common/ptx.cuh"

namespace fusedstep::trace {

inline constexpr int kCtas = 1024;   // CTAs recorded (linear block index)
inline constexpr int kEvents = 24;   // per CTA; the last slot holds the SM id
// One buffer layout for every kernel: [globaltimer | clock64][kCtas][kEvents].
inline constexpr int kWords = 2 * kCtas * kEvents;

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
