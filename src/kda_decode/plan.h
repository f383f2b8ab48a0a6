// SPDX-License-Identifier: Apache-2.0
// KDA decode / verify: the one rule that turns params and device facts into the
// configuration and launch geometry that launch() runs (plan.cc). Pure host code.
#pragma once

#include <cstddef>
#include <cstdint>

#include "fusedstep/kda_decode.h"
#include "kda_decode/config.h"

namespace fusedstep::kda {

struct LaunchPlan {
  KdaSchedule schedule;  // every default resolved
  ConfigKey config;      // the compiled configuration that runs it
  bool stage_fb = false; // the gate warp stages its F_B fragments in shared memory
  size_t dynamic_smem = 0;
  int64_t ctas = 0;      // grid (cluster, heads, batch)
  int waves = 0;         // estimate
};

Result plan_launch(const KdaDecodeParams& params, const DeviceInfo& device, LaunchPlan* out) noexcept;

}  // namespace fusedstep::kda
