// mHC boundary: host side of the persistent pipelined kernel (persistent.cu), for the
// dispatch in fused.cu.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "fusedstep/weight_rounding.h"

namespace fusedstep::mhc {
namespace parts {
struct KernelArgs;
}

// Threads and dynamic shared memory of one CTA (one CTA per SM).
inline constexpr int kPersistentThreads = 9 * 32;  // 8 work warps + the coefficient warp
inline constexpr int kPersistentSmemBytes = 227 * 1024;

// Whether the kernel runs sub-tile `tile` at `hidden` with this rounding: a TF32 rounding
// whose whole weight slice fits kPersistentSmemBytes beside the sub-tile's buffers
// (hidden 4096 and 5120 at tile 8; not hidden 7168, not the FP32 rounding).
bool persistent_tile_fits(int tile, int64_t hidden, WeightRounding rounding);

// The kernel's attributes (once per device, the device current) and its co-resident
// 16-CTA clusters.
cudaError_t persistent_set_attributes();
cudaError_t persistent_max_active_clusters(int* clusters);

// `clusters` 16-CTA clusters; args.tile is the sub-tile.
cudaError_t launch_persistent(const parts::KernelArgs& args, int64_t clusters, bool pdl, cudaStream_t stream);

}  // namespace fusedstep::mhc
