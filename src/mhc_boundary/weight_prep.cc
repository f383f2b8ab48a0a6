// SPDX-License-Identifier: Apache-2.0
// mHC boundary: host weight preparation (fn -> BF16 MMA A-fragments, layout.h).
#include <cstdint>

#include "common/internal.h"
#include "fusedstep/mhc_boundary.h"
#include "mhc_boundary/weight_prep.h"

namespace fusedstep {

// 0 for a hidden size or rounding the kernel does not support.
int64_t mhc_boundary_weight_words(int64_t hidden, WeightRounding rounding) noexcept {
  if (!mhc::hidden_supported(hidden) || !mhc::rounding_valid(rounding)) return 0;
  return mhc::weight_words(hidden, rounding);
}

namespace mhc {

// Shared by the host and the device entry: the arguments both need.
Result check_weight_prep(const void* fn, int64_t hidden, WeightRounding rounding, const void* out,
                         const char* op) noexcept {
  if (fn == nullptr) return Result::error(Status::kNullPointer, "%s: fn = null must be a pointer", op);
  if (out == nullptr) {
    return Result::error(Status::kNullPointer, "%s: out = null must be a pointer", op);
  }
  if (!hidden_supported(hidden)) {
    return Result::error(Status::kInvalidShape,
                         "%s: hidden = %lld must be a positive multiple of 512 whose k16 steps "
                         "split over 8 MMA warps",
                         op, static_cast<long long>(hidden));
  }
  if (!rounding_valid(rounding)) {
    return Result::error(Status::kInvalidValue,
                         "%s: rounding = %d must be a WeightRounding (0, 1 or 2)", op,
                         static_cast<int>(rounding));
  }
  return Result::success();
}

}  // namespace mhc

Result prepare_mhc_boundary_weight(const float* fn, int64_t hidden, WeightRounding rounding,
                                   uint32_t* out) noexcept {
  FS_TRY(mhc::check_weight_prep(fn, hidden, rounding, out, "prepare_mhc_boundary_weight"));
  const int64_t words = mhc::weight_words(hidden, rounding);
  for (int64_t i = 0; i < words; ++i) out[i] = mhc::prepared_weight_word(fn, hidden, rounding, i);
  return Result::success();
}

}  // namespace fusedstep
