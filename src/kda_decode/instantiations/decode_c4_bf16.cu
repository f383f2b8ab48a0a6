// SPDX-License-Identifier: Apache-2.0
// The q = 1 kernel's configurations with 4 CTAs per head, BF16 state (config.h: DecodeConfigs).
#include "kda_decode/decode_kernel.cuh"

namespace fusedstep::kda {
template detail::KernelVariant<FusedArgs> decode_variant<DecodeConfig<4, 8, false, __nv_bfloat16>>();
template detail::KernelVariant<FusedArgs> decode_variant<DecodeConfig<4, 16, false, __nv_bfloat16>>();
}  // namespace fusedstep::kda
