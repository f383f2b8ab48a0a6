// SPDX-License-Identifier: Apache-2.0
// Bit-level float helpers shared by the host library, the device kernels and the
// CPU reference: BF16 round-to-nearest-even, TF32 rounding and the exact BF16
// split of a prepared mixer weight. Plain C++ (no CUDA headers needed); every
// function is constexpr-friendly and usable in device code.
#pragma once

#include <cstdint>
#include <cstring>

#include "fusedstep/weight_rounding.h"

#if defined(__CUDACC__)
#define FS_HD __host__ __device__ __forceinline__
#else
#define FS_HD inline
#endif

namespace fusedstep::bits {

FS_HD uint32_t f32_to_u32(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

FS_HD float u32_to_f32(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

FS_HD bool is_nan_bits(uint32_t u) { return (u & 0x7fffffffu) > 0x7f800000u; }

// BF16 bits of f, round to nearest even (cvt.rn.bf16.f32); NaN stays a quiet NaN.
FS_HD uint16_t bf16_rne(float f) {
  const uint32_t u = f32_to_u32(f);
  if (is_nan_bits(u)) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  const uint32_t rounded = u + 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(rounded >> 16);
}

FS_HD float bf16_to_f32(uint16_t b) { return u32_to_f32(static_cast<uint32_t>(b) << 16); }

// f rounded to BF16 and widened back.
FS_HD float round_bf16(float f) { return bf16_to_f32(bf16_rne(f)); }

using fusedstep::WeightRounding;

// Magnitudes below this prepare as signed zero in every mode, so that every BF16
// part of a prepared weight is a normal number and the split is exact.
inline constexpr uint32_t kWeightFlushBelowBits = 0x0d800000u;  // 2^-100

// The weight as the mixer multiplies it (a float holding the rounded value).
FS_HD float round_weight(float w, WeightRounding mode) {
  uint32_t u = f32_to_u32(w);
  if (is_nan_bits(u)) return u32_to_f32(u | 0x00400000u);
  if ((u & 0x7fffffffu) < kWeightFlushBelowBits) return u32_to_f32(u & 0x80000000u);
  if ((u & 0x7fffffffu) == 0x7f800000u) return w;  // +-Inf
  switch (mode) {
    case WeightRounding::kTf32Rna: u = (u + 0x1000u) & ~0x1fffu; break;
    case WeightRounding::kTf32Rne: u = (u + 0xfffu + ((u >> 13) & 1u)) & ~0x1fffu; break;
    case WeightRounding::kFp32: break;
  }
  return u32_to_f32(u);
}

// Number of BF16 parts the prepared weight is split into.
FS_HD int weight_parts(WeightRounding mode) { return mode == WeightRounding::kFp32 ? 3 : 2; }

// Exact split of a rounded weight into BF16 parts, most significant first. Each
// part is the BF16 truncation of what the previous parts left, so parts never
// overflow and their sum (in any order, in FP32) equals `rounded` exactly:
// TF32 has 11 significant bits (8 + 3), FP32 24 (8 + 8 + 8). Non-finite weights
// put everything in the first part.
FS_HD void split_weight(float rounded, int parts, uint16_t out[3]) {
  out[0] = out[1] = out[2] = 0;
  const uint32_t u = f32_to_u32(rounded);
  if ((u & 0x7f800000u) == 0x7f800000u) {
    out[0] = static_cast<uint16_t>(u >> 16);
    if (is_nan_bits(u)) out[0] |= 0x0040u;
    return;
  }
  float rest = rounded;
  for (int p = 0; p < parts; ++p) {
    const uint16_t part = static_cast<uint16_t>(f32_to_u32(rest) >> 16);
    out[p] = part;
    rest = rest - bf16_to_f32(part);  // exact: removes the leading 8 significant bits
  }
}

}  // namespace fusedstep::bits
