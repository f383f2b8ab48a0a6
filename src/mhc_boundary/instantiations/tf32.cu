// SPDX-License-Identifier: Apache-2.0
// The fused kernel's configurations for the TF32 roundings (3 m16 weight tiles) (config.h: BoundaryConfigs).
#include "mhc_boundary/kernel.cuh"

namespace fusedstep::mhc {
template detail::KernelVariant<KernelArgs> boundary_variant<BoundaryConfig<3, 2, false, false>>();
template detail::KernelVariant<KernelArgs> boundary_variant<BoundaryConfig<3, 2, true, false>>();
template detail::KernelVariant<KernelArgs> boundary_variant<BoundaryConfig<3, 2, true, true>>();
template detail::KernelVariant<KernelArgs> boundary_variant<BoundaryConfig<3, 2, false, true>>();
template detail::KernelVariant<KernelArgs> boundary_variant<BoundaryConfig<3, 1, false, false>>();
}  // namespace fusedstep::mhc
