// SPDX-License-Identifier: Apache-2.0
// fusedstep: fused decode-step kernels for hybrid LLMs (umbrella header).
#pragma once

#include "fusedstep/build_info.h"
#include "fusedstep/device.h"
#include "fusedstep/kda_decode.h"
#include "fusedstep/mhc_boundary.h"
#include "fusedstep/status.h"
#include "fusedstep/weight_rounding.h"
