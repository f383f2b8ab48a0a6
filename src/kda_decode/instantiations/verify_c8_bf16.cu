// SPDX-License-Identifier: Apache-2.0
// The verify kernel's configurations with 8 CTAs per head, BF16 state (config.h: VerifyConfigs).
#include "kda_decode/verify_kernel.cuh"

namespace fusedstep::kda {
template detail::KernelVariant<VerifyArgs> verify_variant<VerifyConfig<8, 8, true, kMaxTokens, __nv_bfloat16>>();
}  // namespace fusedstep::kda
