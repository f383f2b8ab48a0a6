// SPDX-License-Identifier: Apache-2.0
// KDA decode: derived facts of KdaDecodeParams shared by check(), the composed path and
// the fused kernel's host code (one definition, so the three agree).
#pragma once

#include <cstdint>

#include "float_bits.h"  // FS_HD
#include "fusedstep/kda_decode.h"

namespace fusedstep::kda {

// Element stride between the q, k and v sections of the conv weight; the header's 0
// means the [3 * dim, 4] family (dim channels per section).
FS_HD int64_t conv_weight_section_stride(const KdaDecodeParams& p) {
  return p.conv_weight_section_stride != 0
             ? p.conv_weight_section_stride
             : int64_t(p.heads) * kKdaHeadDim * p.conv_weight_channel_stride;
}

// The schedule stages its state rows in shared memory: early >= 2, or one CTA per head
// (128 rows do not fit in registers; at early 1 it copies them after the PDL wait).
// evict_first needs it.
FS_HD bool is_staged(const KdaSchedule& s) { return s.early >= 2 || s.cluster == 1; }

}  // namespace fusedstep::kda
