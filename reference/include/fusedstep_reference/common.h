// SPDX-License-Identifier: Apache-2.0
// CPU reference: shared types. Plain C++20, no CUDA.
#pragma once

#include <cstdint>

namespace fusedstep::reference {

// float64: the mathematical truth (no intermediate rounding; exp, sqrt, division
// exact to double). float32: the GPU's rounding points and orders wherever they are
// IEEE-defined (approximate GPU instructions are replaced by correctly rounded ones,
// tensor-core chains by sequential FP32 sums in the same chain structure).
enum class Precision { kFloat64, kFloat32 };

}  // namespace fusedstep::reference
