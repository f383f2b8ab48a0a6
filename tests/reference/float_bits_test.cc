// SPDX-License-Identifier: Apache-2.0
// Contract: float_bits.h's BF16 rounding, TF32 weight rounding and exact BF16 weight split (docs/numerics.md, mHC step 8).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "common/seed.h"
#include "float_bits.h"

namespace {

using fusedstep::WeightRounding;
namespace bits = fusedstep::bits;

constexpr WeightRounding kModes[] = {WeightRounding::kTf32Rna, WeightRounding::kTf32Rne,
                                     WeightRounding::kFp32};

using fusedstep::testing::fresh_seed;

// Value of a float bit pattern with an 8-bit exponent and `mantissa_bits` stored bits
// (BF16: 7, FP32: 23) decoded independently of the hardware; an all-ones exponent
// reads as 2^128 (the overflow candidate of round-to-nearest).
double decode(uint32_t pattern, int mantissa_bits) {
  const bool negative = (pattern >> (8 + mantissa_bits)) & 1u;
  const int exponent = int((pattern >> mantissa_bits) & 0xffu);
  const uint32_t mantissa = pattern & ((1u << mantissa_bits) - 1u);
  double magnitude;
  if (exponent == 0xff) {
    magnitude = std::ldexp(1.0, 128);
  } else if (exponent == 0) {
    magnitude = std::ldexp(double(mantissa), -126 - mantissa_bits);
  } else {
    magnitude = std::ldexp(double(mantissa | (1u << mantissa_bits)), exponent - 127 - mantissa_bits);
  }
  return negative ? -magnitude : magnitude;
}

// Independent BF16 round-to-nearest-even: pick the nearer of the two BF16 neighbours
// (truncation and the next pattern away from zero) by exact double distances.
uint16_t bf16_reference(uint32_t u) {
  const uint32_t exponent = (u >> 23) & 0xffu, mantissa = u & 0x7fffffu;
  if (exponent == 0xff && mantissa != 0) return uint16_t((u >> 16) | 0x40u);  // quiet NaN
  if (exponent == 0xff) return uint16_t(u >> 16);                             // +-Inf
  const uint16_t down = uint16_t(u >> 16);
  const uint16_t up = uint16_t(down + 1);  // magnitude up; 0x7f7f + 1 = Inf
  const double v = std::fabs(decode(u, 23));
  const double dist_down = v - std::fabs(decode(down, 7));
  const double dist_up = std::fabs(decode(up, 7)) - v;
  if (dist_down < dist_up) return down;
  if (dist_up < dist_down) return up;
  return (down & 1u) ? up : down;
}

// Independent TF32 rounding (10 stored bits) of a normal float through double
// arithmetic: RNA = std::round (half away from zero), RNE = std::nearbyint (ties to
// even in the default mode); a result of 2^128 or more is Inf.
float tf32_reference(float w, WeightRounding mode) {
  const uint32_t u = bits::f32_to_u32(w);
  if ((u & 0x7fffffffu) < bits::kWeightFlushBelowBits) return std::copysign(0.0f, w);
  if (std::isnan(w) || std::isinf(w) || mode == WeightRounding::kFp32) return w;
  int exponent;
  std::frexp(double(w), &exponent);                     // w = m * 2^exponent, |m| in [0.5, 1)
  const double ulp = std::ldexp(1.0, exponent - 11);     // 11 significant bits
  const double q = double(w) / ulp;
  const double rounded = (mode == WeightRounding::kTf32Rna ? std::round(q) : std::nearbyint(q)) * ulp;
  if (std::fabs(rounded) >= std::ldexp(1.0, 128)) return std::copysign(INFINITY, w);
  return float(rounded);
}

uint32_t bits_of(float f) { return bits::f32_to_u32(f); }
float from_bits(uint32_t u) { return bits::u32_to_f32(u); }

// A weight's parts: normal BF16 or zero, finite for a finite weight, and summing to
// it exactly in double and, in part order, in float.
void expect_exact_split(uint32_t w_bits, WeightRounding mode) {
  const float rounded = bits::round_weight(from_bits(w_bits), mode);
  const int parts = bits::weight_parts(mode);
  uint16_t split[3];
  bits::split_weight(rounded, parts, split);
  const auto where = [&] {
    char buf[96];
    std::snprintf(buf, sizeof buf, "w = 0x%08x, mode %d, rounded = 0x%08x", w_bits, int(mode),
                  bits_of(rounded));
    return std::string(buf);
  };
  if (std::isnan(rounded)) {
    ASSERT_TRUE(std::isnan(bits::bf16_to_f32(split[0]))) << where();
    ASSERT_TRUE(split[0] & 0x40u) << where() << ": NaN part must be quiet";
    return;
  }
  if (std::isinf(rounded)) {
    ASSERT_EQ(split[0], uint16_t(bits_of(rounded) >> 16)) << where();
    ASSERT_EQ(split[1], 0) << where();
    ASSERT_EQ(split[2], 0) << where();
    return;
  }
  double sum_double = 0.0;
  float sum_float = 0.0f;
  for (int p = 0; p < 3; ++p) {
    if (p >= parts) {
      ASSERT_EQ(split[p], 0) << where() << ": unused part " << p;
      continue;
    }
    const uint32_t exponent = (split[p] >> 7) & 0xffu;
    ASSERT_TRUE((split[p] & 0x7fffu) == 0 || (exponent != 0 && exponent != 0xff))
        << where() << ": part " << p << " = 0x" << std::hex << split[p] << " not normal or zero";
    const float value = bits::bf16_to_f32(split[p]);
    sum_double += double(value);
    sum_float = p == 0 ? value : sum_float + value;
  }
  ASSERT_EQ(sum_double, double(rounded)) << where();
  ASSERT_EQ(sum_float, rounded) << where();  // value equality: -0 may come back as +0
  if (rounded != 0.0f) {
    ASSERT_EQ(bits_of(sum_float), bits_of(rounded)) << where();
  }
}

// Edge patterns of every class, both signs.
std::vector<uint32_t> edge_patterns() {
  std::vector<uint32_t> out;
  const uint32_t magnitudes[] = {
      0x00000000u, 0x00000001u, 0x00400000u, 0x007fffffu,               // zero, subnormals
      0x00800000u, 0x00800001u, 0x3f800000u, 0x3f801000u, 0x3f803000u,  // normals, TF32 ties
      0x3f800fffu, 0x3f801001u, 0x3f802fffu, 0x3f803001u, 0x3f807fffu,  // tie neighbours, BF16 carry
      0x3f808000u, 0x3f818000u, 0x3fffffffu, 0x3f7fffffu,
      0x0d7fffffu, 0x0d800000u, 0x0d800001u, 0x0d801000u, 0x0d7ff000u,  // the 2^-100 flush line
      0x0d000000u, 0x0dffffffu, 0x0e000000u,
      0x7f7fffffu, 0x7f7ff000u, 0x7f7fefffu, 0x7f7fe000u, 0x7f7f8000u,  // max exponent
      0x7f000000u, 0x7effffffu, 0x7f7f7fffu,
      0x7f800000u, 0x7f800001u, 0x7fc00000u, 0x7fffffffu, 0x7fa00000u};  // Inf, NaNs
  for (uint32_t m : magnitudes) {
    out.push_back(m);
    out.push_back(m | 0x80000000u);
  }
  return out;
}

// bf16_rne agrees with an independent nearest-even rounding for every upper-16-bit
// pattern with edge low halves, and over random patterns.
TEST(Bf16Rne, MatchesIndependentRoundingOnEveryClass) {
  const uint32_t lows[] = {0x0000u, 0x0001u, 0x3fffu, 0x7fffu, 0x8000u, 0x8001u, 0xbfffu, 0xffffu};
  for (uint32_t high = 0; high < 0x10000u; ++high) {
    for (uint32_t low : lows) {
      const uint32_t u = (high << 16) | low;
      ASSERT_EQ(bits::bf16_rne(from_bits(u)), bf16_reference(u)) << std::hex << "u = 0x" << u;
    }
  }
  std::mt19937_64 rng(fresh_seed());
  for (int i = 0; i < 4000000; ++i) {
    const uint32_t u = uint32_t(rng());
    ASSERT_EQ(bits::bf16_rne(from_bits(u)), bf16_reference(u)) << std::hex << "u = 0x" << u;
  }
}

// Named cases: ties go to even, NaN stays a quiet NaN of its sign, Inf stays Inf,
// values past the BF16 maximum's rounding midpoint overflow to Inf, subnormals round.
TEST(Bf16Rne, NamedCases) {
  EXPECT_EQ(bits::bf16_rne(from_bits(0x3f808000u)), 0x3f80);  // tie, even below
  EXPECT_EQ(bits::bf16_rne(from_bits(0x3f818000u)), 0x3f82);  // tie, even above
  EXPECT_EQ(bits::bf16_rne(from_bits(0x3f808001u)), 0x3f81);
  EXPECT_EQ(bits::bf16_rne(from_bits(0x7f800001u)), 0x7fc0);  // signalling NaN -> quiet
  EXPECT_EQ(bits::bf16_rne(from_bits(0xffc00000u)), 0xffc0);
  EXPECT_EQ(bits::bf16_rne(INFINITY), 0x7f80);
  EXPECT_EQ(bits::bf16_rne(-INFINITY), 0xff80);
  EXPECT_EQ(bits::bf16_rne(from_bits(0x7f7f7fffu)), 0x7f7f);  // below the midpoint: max
  EXPECT_EQ(bits::bf16_rne(from_bits(0x7f7f8000u)), 0x7f80);  // midpoint, odd max -> Inf
  EXPECT_EQ(bits::bf16_rne(from_bits(0xff7fffffu)), 0xff80);
  EXPECT_EQ(bits::bf16_rne(from_bits(0x00008000u)), 0x0000);  // subnormal tie -> even 0
  EXPECT_EQ(bits::bf16_rne(from_bits(0x00018000u)), 0x0002);
  EXPECT_EQ(bits::bf16_rne(from_bits(0x007fffffu)), 0x0080);  // largest subnormal -> min normal
  EXPECT_EQ(bits::bf16_rne(-0.0f), 0x8000);
}

// round_weight: RNA rounds an exact tie (low 13 bits 0x1000) away from zero, RNE to
// the even neighbour; both match an independent double-arithmetic rounding on edge and
// random patterns; FP32 keeps the weight; |w| < 2^-100 becomes signed zero.
TEST(RoundWeight, TiesAndEveryClass) {
  // 1 + 2^-11 (even TF32 neighbour below) and 1 + 3 * 2^-11 (even neighbour above).
  EXPECT_EQ(bits_of(bits::round_weight(from_bits(0x3f801000u), WeightRounding::kTf32Rna)), 0x3f802000u);
  EXPECT_EQ(bits_of(bits::round_weight(from_bits(0x3f801000u), WeightRounding::kTf32Rne)), 0x3f800000u);
  EXPECT_EQ(bits_of(bits::round_weight(from_bits(0x3f803000u), WeightRounding::kTf32Rna)), 0x3f804000u);
  EXPECT_EQ(bits_of(bits::round_weight(from_bits(0x3f803000u), WeightRounding::kTf32Rne)), 0x3f804000u);
  EXPECT_EQ(bits_of(bits::round_weight(from_bits(0xbf801000u), WeightRounding::kTf32Rna)), 0xbf802000u);
  EXPECT_EQ(bits_of(bits::round_weight(from_bits(0xbf801000u), WeightRounding::kTf32Rne)), 0xbf800000u);
  EXPECT_EQ(bits_of(bits::round_weight(from_bits(0x3f801000u), WeightRounding::kFp32)), 0x3f801000u);
  // Overflow of the largest finite weight, the flush line, specials.
  for (WeightRounding mode : {WeightRounding::kTf32Rna, WeightRounding::kTf32Rne}) {
    EXPECT_EQ(bits_of(bits::round_weight(from_bits(0x7f7fffffu), mode)), 0x7f800000u);
    EXPECT_EQ(bits_of(bits::round_weight(from_bits(0xff7fffffu), mode)), 0xff800000u);
    EXPECT_EQ(bits_of(bits::round_weight(from_bits(0x7f7fefffu), mode)), 0x7f7fe000u);
  }
  for (WeightRounding mode : kModes) {
    EXPECT_EQ(bits_of(bits::round_weight(from_bits(0x0d7fffffu), mode)), 0x00000000u);
    EXPECT_EQ(bits_of(bits::round_weight(from_bits(0x8d7fffffu), mode)), 0x80000000u);
    EXPECT_EQ(bits_of(bits::round_weight(from_bits(0x00000001u), mode)), 0x00000000u);
    EXPECT_EQ(bits_of(bits::round_weight(from_bits(0x0d800000u), mode)), 0x0d800000u);
    EXPECT_EQ(bits_of(bits::round_weight(INFINITY, mode)), 0x7f800000u);
    EXPECT_TRUE(std::isnan(bits::round_weight(from_bits(0x7f800001u), mode)));
    EXPECT_TRUE(bits_of(bits::round_weight(from_bits(0x7f800001u), mode)) & 0x00400000u);
  }
  const auto check = [](uint32_t u) {
    for (WeightRounding mode : kModes) {
      const float got = bits::round_weight(from_bits(u), mode);
      const float want = tf32_reference(from_bits(u), mode);
      if (std::isnan(want)) {
        ASSERT_TRUE(std::isnan(got)) << std::hex << "u = 0x" << u;
      } else {
        ASSERT_EQ(bits_of(got), bits_of(want)) << std::hex << "u = 0x" << u << " mode " << int(mode);
      }
    }
  };
  for (uint32_t u : edge_patterns()) check(u);
  std::mt19937_64 rng(fresh_seed());
  for (int i = 0; i < 300000; ++i) {
    const uint32_t u = uint32_t(rng());
    check(u);
    check((u & ~0x1fffu) | 0x1000u);  // the same pattern made an exact tie
  }
}

// split_weight: for every mode the parts are normal BF16 or zero, never overflow and
// sum exactly to round_weight(w), over edge classes and ~3 million random patterns.
TEST(SplitWeight, PartsSumExactlyToTheRoundedWeight) {
  for (uint32_t u : edge_patterns()) {
    for (WeightRounding mode : kModes) expect_exact_split(u, mode);
  }
  // Every exponent with tie, neighbour and extreme mantissas.
  const uint32_t mantissas[] = {0x000000u, 0x000fffu, 0x001000u, 0x001001u, 0x002fffu, 0x003000u,
                                0x7fefffu, 0x7ff000u, 0x7fffffu, 0x00ffffu, 0x010000u, 0x555555u};
  for (uint32_t sign : {0u, 0x80000000u}) {
    for (uint32_t exponent = 0; exponent < 256; ++exponent) {
      for (uint32_t m : mantissas) {
        for (WeightRounding mode : kModes) expect_exact_split(sign | (exponent << 23) | m, mode);
      }
    }
  }
  std::mt19937_64 rng(fresh_seed());
  for (int i = 0; i < 1000000; ++i) {
    const uint32_t u = uint32_t(rng());
    // Random bits, the same as a tie, and a random magnitude near the flush line.
    const uint32_t near_flush = (u & 0x807fffffu) | ((0x19u + (u >> 23) % 4u) << 23);
    for (uint32_t w : {u, (u & ~0x1fffu) | 0x1000u, near_flush}) {
      for (WeightRounding mode : kModes) expect_exact_split(w, mode);
    }
  }
}

}  // namespace
