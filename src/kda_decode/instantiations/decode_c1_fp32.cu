// SPDX-License-Identifier: Apache-2.0
// The q = 1 kernel's configurations with 1 CTA per head, FP32 state (config.h: DecodeConfigs).
#include "kda_decode/decode_kernel.cuh"

namespace fusedstep::kda {
template detail::KernelVariant<FusedArgs> decode_variant<DecodeConfig<1, 16, true, float>>();
}  // namespace fusedstep::kda
