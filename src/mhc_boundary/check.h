// SPDX-License-Identifier: Apache-2.0
// mHC boundary: the device-independent part of check(), shared by the fused launch
// and the composed reference path (which needs no clusters).
#pragma once

#include "fusedstep/mhc_boundary.h"

namespace fusedstep::mhc {

// Every field of `params` (shapes, scalars, pointers, alignment, strides); the
// device facts are check()'s. With tokens == 0 the per-token tensors may be null
// (empty tensors), the per-layer ones (weight, scale, base, norm_weight) may not.
Result check_params(const MhcBoundaryParams& params) noexcept;

// Strides with 0 ("contiguous") resolved.
inline int64_t x_stride_of(const MhcBoundaryParams& p) { return p.x_stride ? p.x_stride : p.hidden; }
inline int64_t residual_stride_of(const MhcBoundaryParams& p) {
  return p.residual_stride ? p.residual_stride : kMhcStreams * p.hidden;
}
inline int64_t residual_out_stride_of(const MhcBoundaryParams& p) {
  return p.residual_out_stride ? p.residual_out_stride : kMhcStreams * p.hidden;
}
inline int64_t layer_input_stride_of(const MhcBoundaryParams& p) {
  return p.layer_input_stride ? p.layer_input_stride : p.hidden;
}

}  // namespace fusedstep::mhc
