// SPDX-License-Identifier: Apache-2.0
// Internal: the architecture rule behind has_code_for() and the error get_device_info()
// returns for a GPU the build has no code for (host only, testable without a GPU).
#pragma once

#include "fusedstep/status.h"

namespace fusedstep::detail {

// Whether the CMake CUDA architecture list `architectures` (';'-, ','- or space-separated
// entries such as "90a", "100f", "90-real", "90-virtual", "90") holds code a GPU of
// compute capability cc_major.cc_minor runs. An entry it cannot read ("all", "native")
// counts as code for every GPU: the runtime's own error then names the problem.
bool architectures_run_on(const char* architectures, int cc_major, int cc_minor) noexcept;

// kDeviceUnsupported: device `device` (named `name`) of compute capability
// cc_major.cc_minor and the architectures this build holds code for.
Result unsupported_architecture(int device, const char* name, int cc_major, int cc_minor,
                                const char* architectures) noexcept;

// The git commit of the sources (generated at build time: <build>/generated/fusedstep_commit.cc).
extern const char kBuildCommit[];

}  // namespace fusedstep::detail
