// SPDX-License-Identifier: Apache-2.0
#include <cstdio>

#include "fusedstep/status.h"

namespace fusedstep {

const char* status_name(Status status) noexcept {
  switch (status) {
    case Status::kSuccess: return "kSuccess";
    case Status::kNullPointer: return "kNullPointer";
    case Status::kMisaligned: return "kMisaligned";
    case Status::kInvalidShape: return "kInvalidShape";
    case Status::kInvalidStride: return "kInvalidStride";
    case Status::kInvalidValue: return "kInvalidValue";
    case Status::kUnsupported: return "kUnsupported";
    case Status::kDeviceUnsupported: return "kDeviceUnsupported";
    case Status::kCudaError: return "kCudaError";
  }
  return "kUnknown";
}

Result Result::error(Status status, const char* format, ...) noexcept {
  Result r;
  r.status_ = status;
  va_list args;
  va_start(args, format);
  std::vsnprintf(r.detail_, sizeof r.detail_, format, args);
  va_end(args);
  return r;
}

}  // namespace fusedstep
