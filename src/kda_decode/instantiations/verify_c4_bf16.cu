// SPDX-License-Identifier: Apache-2.0
// The verify kernel's configurations with 4 CTAs per head, BF16 state (config.h: VerifyConfigs).
#include "kda_decode/verify_kernel.cuh"

namespace fusedstep::kda {
template detail::KernelVariant<VerifyArgs> verify_variant<VerifyConfig<4, 8, false, kMaxTokens, __nv_bfloat16>>();
template detail::KernelVariant<VerifyArgs> verify_variant<VerifyConfig<4, 16, false, kMaxTokens, __nv_bfloat16>>();
template detail::KernelVariant<VerifyArgs> verify_variant<VerifyConfig<4, 16, true, kMaxTokens, __nv_bfloat16>>();
}  // namespace fusedstep::kda
