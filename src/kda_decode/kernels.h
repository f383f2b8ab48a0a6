// SPDX-License-Identifier: Apache-2.0
// KDA decode / verify: the compiled kernels as the host sees them, one per configuration
// of config.h's lists, defined by instantiations/*.cu.
#pragma once

#include "common/kernel_variant.h"
#include "kda_decode/args.h"

namespace fusedstep::kda {

template <class Cfg>
detail::KernelVariant<FusedArgs> decode_variant();
template <class Cfg>
detail::KernelVariant<VerifyArgs> verify_variant();

}  // namespace fusedstep::kda
