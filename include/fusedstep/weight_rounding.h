// SPDX-License-Identifier: Apache-2.0
// fusedstep: how the mHC mixer weight is rounded before it reaches the tensor cores.
#pragma once

namespace fusedstep {

enum class WeightRounding : int {
  kTf32Rna = 0,  // TF32, nearest, ties away from zero (TileKernels, the DSL design); 2 BF16 parts
  kTf32Rne = 1,  // TF32, nearest, ties to even (DeepGEMM's TMA path on sm_90); 2 BF16 parts
  kFp32 = 2,     // FP32, no rounding: 3 BF16 parts carry all 24 bits (1.5x the bytes)
};

}  // namespace fusedstep
