// SPDX-License-Identifier: Apache-2.0
// What this build is (include/fusedstep/build_info.h) and which GPUs it runs on.
#include "common/build_info.h"

#include <cstdlib>

#include "fusedstep/build_info.h"
#include "fusedstep_build_config.h"  // generated from cmake/fusedstep_build_config.h.in

namespace fusedstep {
namespace detail {
namespace {

bool separator(char c) { return c == ';' || c == ',' || c == ' ' || c == '\t' || c == '\n'; }

bool same_prefix(const char* s, const char* end, const char* word) {
  for (; s < end && *word; ++s, ++word) {
    if (*s != *word) return false;
  }
  return s == end && *word == '\0';
}

// One entry [s, end): 1 = code for cc, 0 = no code for cc, -1 = not an entry we can read.
int entry_runs_on(const char* s, const char* end, int cc_major, int cc_minor) {
  int number = 0, digits = 0;
  while (s < end && *s >= '0' && *s <= '9' && digits < 4) {
    number = number * 10 + (*s - '0');
    ++s;
    ++digits;
  }
  if (digits < 2) return -1;
  const int major = number / 10, minor = number % 10;
  char kind = '\0';  // 'a': architecture-specific, 'f': family-specific, '\0': portable
  if (s < end && (*s == 'a' || *s == 'f')) kind = *s++;
  bool sass = true, ptx = true;  // CMake: "90" = SASS + PTX, "-real" SASS only, "-virtual" PTX only
  if (s < end) {
    if (same_prefix(s, end, "-real")) {
      ptx = false;
    } else if (same_prefix(s, end, "-virtual")) {
      sass = false;
    } else {
      return -1;
    }
  }
  if (kind == 'a') return cc_major == major && cc_minor == minor;  // SASS and PTX alike
  if (kind == 'f') return cc_major == major && cc_minor >= minor;  // the family
  const bool by_sass = sass && cc_major == major && cc_minor >= minor;
  const bool by_ptx = ptx && (cc_major > major || (cc_major == major && cc_minor >= minor));
  return by_sass || by_ptx;
}

}  // namespace

bool architectures_run_on(const char* architectures, int cc_major, int cc_minor) noexcept {
  if (architectures == nullptr) return true;
  const char* s = architectures;
  bool any_entry = false;
  while (*s) {
    while (*s && separator(*s)) ++s;
    const char* begin = s;
    while (*s && !separator(*s)) ++s;
    if (s == begin) break;
    any_entry = true;
    const int r = entry_runs_on(begin, s, cc_major, cc_minor);
    if (r != 0) return true;  // code for it, or an entry ("all", "native") we cannot judge
  }
  return !any_entry;
}

Result unsupported_architecture(int device, const char* name, int cc_major, int cc_minor,
                                const char* architectures) noexcept {
  const bool too_old = cc_major < 9;
  return Result::error(
      Status::kDeviceUnsupported,
      "get_device_info: device %d (%.48s) has compute capability %d.%d, and this build of "
      "fusedstep has no code for it: it was compiled for CUDA architectures %.40s%s",
      device, name ? name : "?", cc_major, cc_minor, architectures ? architectures : "?",
      too_old ? " (the kernels need compute capability 9.0 or newer)"
              : " (build it with CMAKE_CUDA_ARCHITECTURES naming this GPU's architecture)");
}

}  // namespace detail

const BuildInfo& build_info() noexcept {
  static const BuildInfo info{FUSEDSTEP_VERSION, detail::kBuildCommit, FUSEDSTEP_CUDA_VERSION,
                              FUSEDSTEP_CUDA_ARCHITECTURES, FUSEDSTEP_CUDA_RUNTIME};
  return info;
}

bool has_code_for(int cc_major, int cc_minor) noexcept {
  return detail::architectures_run_on(FUSEDSTEP_CUDA_ARCHITECTURES, cc_major, cc_minor);
}

}  // namespace fusedstep
