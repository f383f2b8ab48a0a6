// SPDX-License-Identifier: Apache-2.0
// mHC boundary: one word of the prepared mixer weight, shared by the host and the
// device preparation so both produce the same bits (layout.h, docs/numerics.md 8).
#pragma once

#include <cstdint>

#include "float_bits.h"
#include "fusedstep/status.h"
#include "fusedstep/weight_rounding.h"
#include "mhc_boundary/layout.h"

namespace fusedstep::mhc {

inline bool rounding_valid(WeightRounding r) {
  const int v = static_cast<int>(r);
  return v >= 0 && v <= static_cast<int>(WeightRounding::kFp32);
}

// Validates the arguments of both preparation entry points (`op` names the caller).
Result check_weight_prep(const void* fn, int64_t hidden, WeightRounding rounding, const void* out,
                         const char* op) noexcept;

// Word `index` of the prepared weight: the BF16 pair (k, k + 1) of the lane's
// A-fragment register, low half = k. fn is [24, 4 * hidden] row-major; rows past the
// stacked parts are zero.
FS_HD uint32_t prepared_weight_word(const float* fn, int64_t hidden, WeightRounding rounding,
                                    int64_t index) {
  const int tiles = m_tiles(rounding);
  const int reg = static_cast<int>(index % 4);
  const int lane = static_cast<int>((index / 4) % 32);
  const int mt = static_cast<int>((index / 128) % tiles);
  const int64_t step = (index / (128 * tiles)) % k_steps(hidden);
  const int slice = static_cast<int>(index / (128 * tiles * k_steps(hidden)));
  const int row = a_row(mt, lane, reg);
  const int part = row / kMixes;
  const int mix = row % kMixes;
  if (part >= parts_of(rounding)) return 0u;
  const int k = a_k(lane, reg);
  uint32_t word = 0;
  for (int half = 0; half < 2; ++half) {
    const KCoord kc = k_coord(step, k + half);
    const int64_t column = kc.stream * hidden + slice * slice_of(hidden) + kc.hidden_in_slice;
    uint16_t parts[3];
    bits::split_weight(bits::round_weight(fn[mix * kStreams * hidden + column], rounding),
                       parts_of(rounding), parts);
    // selects, not parts[part]: a dynamic index would put the array in local memory
    const uint16_t chosen = part == 0 ? parts[0] : (part == 1 ? parts[1] : parts[2]);
    word |= static_cast<uint32_t>(chosen) << (16 * half);
  }
  return word;
}

}  // namespace fusedstep::mhc
