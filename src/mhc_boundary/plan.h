// SPDX-License-Identifier: Apache-2.0
// mHC boundary: the configuration of the fused kernel that runs a plan (plan.cc). Pure
// host code.
#pragma once

#include "fusedstep/mhc_boundary.h"
#include "mhc_boundary/config.h"

namespace fusedstep::mhc {

ConfigKey select_config(const MhcBoundaryParams& params, const MhcBoundaryPlan& plan) noexcept;

}  // namespace fusedstep::mhc
