// SPDX-License-Identifier: Apache-2.0
// fusedstep: what this build of the library is (version, commit, CUDA toolkit, the GPU
// architectures it holds code for) and whether a GPU can run it.
#pragma once

namespace fusedstep {

struct BuildInfo {
  const char* version;        // the project's version, e.g. "0.1.0"
  const char* commit;         // git commit of the sources when built ("unknown" outside git,
                              //   "-dirty" appended for uncommitted changes)
  const char* cuda_version;   // the CUDA toolkit the kernels were compiled with, e.g. "13.0.88"
  const char* architectures;  // CMAKE_CUDA_ARCHITECTURES of the build, ';'-separated: "90a;100a"
  const char* cuda_runtime;   // how libcudart is linked: "static" (default) or "shared"
};

// The facts of this build (static storage; never null fields).
const BuildInfo& build_info() noexcept;

// Whether this build holds code a GPU of compute capability cc_major.cc_minor runs:
// "90a" / "100a" (architecture-specific) run on exactly 9.0 / 10.0, "100f" (family) on
// 10.x, "90-real" (SASS) on 9.x, "90" and "90-virtual" (with PTX) on >= 9.0 too.
// get_device_info() returns kDeviceUnsupported, naming the device's compute capability
// and the built architectures, for a GPU this is false for.
bool has_code_for(int cc_major, int cc_minor) noexcept;

}  // namespace fusedstep
