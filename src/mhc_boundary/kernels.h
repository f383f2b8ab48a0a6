// SPDX-License-Identifier: Apache-2.0
// mHC boundary: the compiled kernels as the host sees them, one per configuration of
// config.h's BoundaryConfigs, defined by instantiations/*.cu.
#pragma once

#include "common/kernel_variant.h"
#include "mhc_boundary/config.h"

namespace fusedstep::mhc {

template <class Cfg>
detail::KernelVariant<KernelArgs> boundary_variant();

}  // namespace fusedstep::mhc
