// SPDX-License-Identifier: Apache-2.0
// The verify kernel's configurations with 1 CTA per head, FP32 state (config.h: VerifyConfigs).
#include "kda_decode/verify_kernel.cuh"

namespace fusedstep::kda {
template detail::KernelVariant<VerifyArgs> verify_variant<VerifyConfig<1, 16, true, kMaxTokens, float>>();
}  // namespace fusedstep::kda
