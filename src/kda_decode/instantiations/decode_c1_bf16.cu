// SPDX-License-Identifier: Apache-2.0
// The q = 1 kernel's configurations with 1 CTA per head, BF16 state: three and four CTAs
// per SM (config.h: DecodeConfigs).
#include "kda_decode/decode_kernel.cuh"

namespace fusedstep::kda {
template detail::KernelVariant<FusedArgs> decode_variant<DecodeConfig<1, 16, true, __nv_bfloat16>>();
template detail::KernelVariant<FusedArgs> decode_variant<DecodeConfig<1, 16, true, __nv_bfloat16, true>>();
}  // namespace fusedstep::kda
