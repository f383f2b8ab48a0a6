// SPDX-License-Identifier: Apache-2.0
// mHC boundary params that plan() accepts without a GPU: every pointer a fake, aligned,
// non-null value (plan() checks pointers but never dereferences them).
#pragma once

#include <cstdint>

#include "fusedstep/mhc_boundary.h"

namespace fusedstep::testing {

inline MhcBoundaryParams mhc_plan_params(int64_t hidden, int64_t tokens) {
  MhcBoundaryParams p;
  auto fake = reinterpret_cast<void*>(uintptr_t{256});
  p.x = p.residual = p.norm_weight = static_cast<const __nv_bfloat16*>(fake);
  p.post = p.comb = p.pre_lag = p.scale = p.base = static_cast<const float*>(fake);
  p.weight = static_cast<const uint32_t*>(fake);
  p.residual_out = p.layer_input = static_cast<__nv_bfloat16*>(fake);
  p.pre_out = p.post_out = p.comb_out = static_cast<float*>(fake);
  p.hidden = hidden;
  p.tokens = tokens;
  return p;
}

}  // namespace fusedstep::testing
