// SPDX-License-Identifier: Apache-2.0
// fusedstep: status codes and the per-call result that names what went wrong.
#pragma once

#include <cstdarg>
#include <cstdint>

namespace fusedstep {

enum class Status : int32_t {
  kSuccess = 0,
  kNullPointer,        // a required pointer is null
  kMisaligned,         // a pointer or row is not aligned for the kernel's vector accesses
  kInvalidShape,       // a size is out of range or inconsistent with another
  kInvalidStride,      // a stride is too small, or breaks 16-byte vector access
  kInvalidValue,       // a scalar option is out of its valid range
  kUnsupported,        // a valid request this build does not implement (named in the detail)
  kDeviceUnsupported,  // the GPU lacks what the kernel needs (compute capability, clusters)
  kCudaError,          // the CUDA runtime reported an error (named in the detail)
};

// Stable name of a status, e.g. "kMisaligned".
const char* status_name(Status status) noexcept;

// Outcome of a check or launch: a Status and, on failure, a message that names the
// operation, the offending field and its value. Holds no heap memory.
class Result {
 public:
  Result() noexcept { detail_[0] = '\0'; }
  static Result success() noexcept { return Result(); }
  static Result error(Status status, const char* format, ...) noexcept
      __attribute__((format(printf, 2, 3)));

  bool ok() const noexcept { return status_ == Status::kSuccess; }
  explicit operator bool() const noexcept { return ok(); }
  Status status() const noexcept { return status_; }
  const char* detail() const noexcept { return detail_; }

 private:
  Status status_ = Status::kSuccess;
  char detail_[320];
};

}  // namespace fusedstep
