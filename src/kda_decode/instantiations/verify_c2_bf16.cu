// SPDX-License-Identifier: Apache-2.0
// The verify kernel's configurations with 2 CTAs per head, BF16 state (config.h: VerifyConfigs).
#include "kda_decode/verify_kernel.cuh"

namespace fusedstep::kda {
template detail::KernelVariant<VerifyArgs> verify_variant<VerifyConfig<2, 8, true, kMaxTokens, __nv_bfloat16>>();
template detail::KernelVariant<VerifyArgs> verify_variant<VerifyConfig<2, 8, true, kCompactTokens, __nv_bfloat16>>();
template detail::KernelVariant<VerifyArgs> verify_variant<VerifyConfig<2, 16, false, kMaxTokens, __nv_bfloat16>>();
}  // namespace fusedstep::kda
