// SPDX-License-Identifier: Apache-2.0
// mHC boundary weight preparation (host): word count, every word decoded back through
// layout.h equals the split of the rounded weight, parts sum exactly on every bit-pattern
// class, and bad arguments are rejected by name.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/seed.h"
#include "float_bits.h"
#include "fusedstep/mhc_boundary.h"
#include "mhc_boundary/layout.h"

namespace fusedstep {
namespace {

constexpr WeightRounding kModes[] = {WeightRounding::kTf32Rna, WeightRounding::kTf32Rne,
                                     WeightRounding::kFp32};

const char* mode_name(WeightRounding r) {
  switch (r) {
    case WeightRounding::kTf32Rna: return "tf32_rna";
    case WeightRounding::kTf32Rne: return "tf32_rne";
    case WeightRounding::kFp32: return "fp32";
  }
  return "?";
}

using fusedstep::testing::fresh_seed;

float from_bits(uint32_t u) { return bits::u32_to_f32(u); }
uint32_t to_bits(float f) { return bits::f32_to_u32(f); }

// BF16 parts of every (part, mix, column) decoded from the prepared words through
// layout.h, with how often each was written (must be exactly once).
struct Decoded {
  int parts = 0;
  int64_t K = 0;
  std::vector<uint16_t> value;  // [part][24][4H]
  std::vector<uint8_t> hits;
  int64_t nonzero_padding = 0;  // words of padding rows that are not zero
  uint16_t at(int part, int n, int64_t col) const { return value[(part * 24 + n) * K + col]; }
};

Decoded decode(const std::vector<uint32_t>& words, int64_t hidden, WeightRounding mode) {
  Decoded d;
  d.parts = bits::weight_parts(mode);
  d.K = 4 * hidden;
  d.value.assign(size_t(d.parts) * 24 * d.K, 0);
  d.hits.assign(d.value.size(), 0);
  const int64_t S = mhc::slice_of(hidden);
  for (int slice = 0; slice < 16; ++slice) {
    for (int64_t step = 0; step < mhc::k_steps(hidden); ++step) {
      for (int mt = 0; mt < mhc::m_tiles(mode); ++mt) {
        for (int lane = 0; lane < 32; ++lane) {
          for (int reg = 0; reg < 4; ++reg) {
            const uint32_t word =
                words[mhc::weight_word_index(hidden, mode, slice, step, mt, lane, reg)];
            const int row = mhc::a_row(mt, lane, reg);
            const int part = row / 24, n = row % 24;
            if (part >= d.parts) {
              d.nonzero_padding += word != 0;
              continue;
            }
            for (int half = 0; half < 2; ++half) {
              const mhc::KCoord kc = mhc::k_coord(step, mhc::a_k(lane, reg) + half);
              const int64_t col = kc.stream * hidden + slice * S + kc.hidden_in_slice;
              const size_t i = (size_t(part) * 24 + n) * d.K + col;
              d.value[i] = static_cast<uint16_t>(word >> (16 * half));
              d.hits[i] += 1;
            }
          }
        }
      }
    }
  }
  return d;
}

std::vector<uint32_t> prepare(const std::vector<float>& fn, int64_t hidden, WeightRounding mode) {
  std::vector<uint32_t> words(mhc_boundary_weight_words(hidden, mode), 0xdeadbeefu);
  const Result r = prepare_mhc_boundary_weight(fn.data(), hidden, mode, words.data());
  EXPECT_TRUE(r.ok()) << r.detail();
  return words;
}

// The word count is the stacked, tile-padded rows times 4 * hidden BF16 values:
// 48 rows (3 m tiles) for the TF32 modes, 80 (5 tiles; 72 used) for FP32.
TEST(MhcWeightPrep, WordCount) {
  for (int64_t hidden : {512, 4096, 5120, 7168, 8192}) {
    EXPECT_EQ(mhc_boundary_weight_words(hidden, WeightRounding::kTf32Rna), 48 * 4 * hidden / 2);
    EXPECT_EQ(mhc_boundary_weight_words(hidden, WeightRounding::kTf32Rne), 48 * 4 * hidden / 2);
    EXPECT_EQ(mhc_boundary_weight_words(hidden, WeightRounding::kFp32), 80 * 4 * hidden / 2);
  }
  for (int64_t bad : {int64_t(0), int64_t(-4096), int64_t(256), int64_t(4000), int64_t(7169)}) {
    EXPECT_EQ(mhc_boundary_weight_words(bad, WeightRounding::kTf32Rna), 0) << bad;
  }
  EXPECT_EQ(mhc_boundary_weight_words(4096, static_cast<WeightRounding>(3)), 0);
}

// layout.h against the m16n8k16 fragment description (PTX ISA 9.7.14.5.8): A register
// i of lane (g = lane / 4, q = lane % 4) holds row g (+8 for odd i), k = 2q (+8 for
// i >= 2); and k_coord against the seed's map: k-index 2q + e holds hidden
// 32c + 8q + 4 * (kb % 2) + e, k-index 2q + 8 + e holds that + 2, stream kb / 2.
TEST(MhcWeightPrep, LayoutMatchesFragmentDescription) {
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, q = lane % 4;
    const int rows[4] = {g, g + 8, g, g + 8};
    const int ks[4] = {2 * q, 2 * q, 2 * q + 8, 2 * q + 8};
    for (int reg = 0; reg < 4; ++reg) {
      for (int mt = 0; mt < 5; ++mt) EXPECT_EQ(mhc::a_row(mt, lane, reg), 16 * mt + rows[reg]);
      EXPECT_EQ(mhc::a_k(lane, reg), ks[reg]);
    }
  }
  for (int64_t step = 0; step < 64; ++step) {
    const int64_t c = step / 8;
    const int kb = static_cast<int>(step % 8);
    for (int q = 0; q < 4; ++q) {
      for (int e = 0; e < 2; ++e) {
        const mhc::KCoord low = mhc::k_coord(step, 2 * q + e);
        const mhc::KCoord high = mhc::k_coord(step, 2 * q + 8 + e);
        EXPECT_EQ(low.stream, kb / 2);
        EXPECT_EQ(high.stream, kb / 2);
        EXPECT_EQ(low.hidden_in_slice, 32 * c + 8 * q + 4 * (kb % 2) + e);
        EXPECT_EQ(high.hidden_in_slice, 32 * c + 8 * q + 4 * (kb % 2) + 2 + e);
      }
    }
  }
}

// Every word of the prepared weight, decoded through layout.h, is the split part of
// round_weight(fn[n][k]); every (part, n, k) appears exactly once; padding rows are 0.
TEST(MhcWeightPrep, EveryWordDecodesToItsSplitPart) {
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  for (int64_t hidden : {512, 4096, 5120, 7168}) {
    std::vector<float> fn(24 * 4 * hidden);
    std::normal_distribution<float> normal(0.0f, 0.02f);
    for (float& v : fn) v = normal(rng);
    for (WeightRounding mode : kModes) {
      SCOPED_TRACE(std::string(mode_name(mode)) + " hidden " + std::to_string(hidden));
      const Decoded d = decode(prepare(fn, hidden, mode), hidden, mode);
      EXPECT_EQ(d.nonzero_padding, 0);
      int64_t wrong = 0, missed = 0;
      for (int n = 0; n < 24; ++n) {
        for (int64_t k = 0; k < d.K; ++k) {
          uint16_t expected[3];
          bits::split_weight(bits::round_weight(fn[n * d.K + k], mode), d.parts, expected);
          for (int part = 0; part < d.parts; ++part) {
            missed += d.hits[(part * 24 + n) * d.K + k] != 1;
            if (d.at(part, n, k) != expected[part] && wrong++ < 5) {
              ADD_FAILURE() << "fn[" << n << "][" << k << "] part " << part << ": got 0x"
                            << std::hex << d.at(part, n, k) << ", expected 0x" << expected[part];
            }
          }
        }
      }
      EXPECT_EQ(wrong, 0);
      EXPECT_EQ(missed, 0) << "(part, n, k) not written exactly once";
    }
  }
}

// Bit-pattern classes, each placed at many positions of fn and read back from the
// prepared words: finite weights split into zero-or-normal BF16 parts whose sum (in
// FP32, and exactly) is the rounded weight; |w| < 2^-100 prepares as signed zero;
// Inf and NaN land in part 0. Plus the TF32 tie cases of each rounding mode.
TEST(MhcWeightPrep, PartsSumExactlyOnEveryBitPatternClass) {
  const uint32_t classes[] = {
      0x00000000u, 0x80000000u,                            // signed zeros
      0x00000001u, 0x807fffffu, 0x00400000u,              // subnormals
      0x0d7fffffu, 0x8d7fffffu, 0x0d800000u, 0x8d801234u,  // around the 2^-100 flush
      0x00800000u, 0x80800000u,                            // smallest normals
      0x3f800000u, 0xbf800000u,                            // +-1
      0x3f801000u, 0x3f803000u, 0xbf801000u, 0x3f800fffu,  // TF32 ties and near-ties
      0x3f801001u, 0x3fffffffu, 0x3c23d70au, 0xbca3d70au,  // carry into the exponent, 0.01
      0x7f7fffffu, 0xff7fffffu, 0x7f7fefffu,              // largest finite (TF32 overflows)
      0x7f800000u, 0xff800000u,                            // infinities
      0x7fc00000u, 0x7f800001u, 0xffffffffu,              // NaNs (quiet, signalling, negative)
  };
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  const int64_t hidden = 512;
  std::vector<float> fn(24 * 4 * hidden);
  const size_t num_classes = sizeof classes / sizeof classes[0];
  for (size_t i = 0; i < fn.size(); ++i) {
    // Alternate the classes with uniformly random bit patterns (every exponent).
    fn[i] = from_bits(i % 2 == 0 ? classes[(i / 2) % num_classes] : static_cast<uint32_t>(rng()));
  }
  for (WeightRounding mode : kModes) {
    SCOPED_TRACE(mode_name(mode));
    const Decoded d = decode(prepare(fn, hidden, mode), hidden, mode);
    int64_t failures = 0;
    for (int n = 0; n < 24; ++n) {
      for (int64_t k = 0; k < d.K; ++k) {
        const uint32_t w = to_bits(fn[n * d.K + k]);
        const float rounded = bits::round_weight(fn[n * d.K + k], mode);
        const uint32_t rb = to_bits(rounded);
        float part[3] = {0.0f, 0.0f, 0.0f};
        bool ok = true;
        for (int p = 0; p < d.parts; ++p) part[p] = bits::bf16_to_f32(d.at(p, n, k));
        if (bits::is_nan_bits(w)) {
          ok = bits::is_nan_bits(to_bits(part[0])) && to_bits(part[1]) == 0 && to_bits(part[2]) == 0;
        } else if ((rb & 0x7fffffffu) == 0x7f800000u) {
          ok = to_bits(part[0]) == rb && to_bits(part[1]) == 0 && to_bits(part[2]) == 0;
        } else {
          const float sum = d.parts == 2 ? part[0] + part[1] : (part[0] + part[1]) + part[2];
          const double exact = double(part[0]) + double(part[1]) + double(part[2]);
          ok = sum == rounded && exact == double(rounded);
          for (int p = 0; p < d.parts; ++p) {  // each part zero or a normal BF16
            const uint32_t pb = to_bits(part[p]);
            ok = ok && ((pb & 0x7fffffffu) == 0 || (pb & 0x7f800000u) != 0);
          }
          if ((w & 0x7fffffffu) < bits::kWeightFlushBelowBits) {
            ok = ok && to_bits(part[0]) == (w & 0x80000000u) && part[1] == 0.0f && part[2] == 0.0f;
          }
          // The mode's rounding: TF32 keeps 10 mantissa bits, FP32 all of them.
          if (mode == WeightRounding::kFp32 && (w & 0x7fffffffu) >= bits::kWeightFlushBelowBits) {
            ok = ok && rb == w;
          } else if (mode != WeightRounding::kFp32) {
            ok = ok && (rb & 0x1fffu) == 0;
          }
        }
        if (!ok && failures++ < 5) {
          ADD_FAILURE() << "fn[" << n << "][" << k << "] = 0x" << std::hex << w << " rounded 0x"
                        << rb << " parts 0x" << d.at(0, n, k) << " 0x" << d.at(1, n, k)
                        << (d.parts == 3 ? " 0x" : "") << (d.parts == 3 ? d.at(2, n, k) : 0);
        }
      }
    }
    EXPECT_EQ(failures, 0);
  }
  // The tie rules themselves (numerics.md 8).
  EXPECT_EQ(to_bits(bits::round_weight(from_bits(0x3f801000u), WeightRounding::kTf32Rna)), 0x3f802000u);
  EXPECT_EQ(to_bits(bits::round_weight(from_bits(0x3f801000u), WeightRounding::kTf32Rne)), 0x3f800000u);
  EXPECT_EQ(to_bits(bits::round_weight(from_bits(0x3f803000u), WeightRounding::kTf32Rne)), 0x3f804000u);
  EXPECT_EQ(to_bits(bits::round_weight(from_bits(0xbf801000u), WeightRounding::kTf32Rna)), 0xbf802000u);
  EXPECT_EQ(to_bits(bits::round_weight(from_bits(0x3f800fffu), WeightRounding::kTf32Rna)), 0x3f800000u);
  EXPECT_EQ(to_bits(bits::round_weight(from_bits(0x3f801000u), WeightRounding::kFp32)), 0x3f801000u);
}

// Bad arguments: null pointers, unsupported hidden, invalid rounding; the message names
// the field and value, and `out` is left untouched.
TEST(MhcWeightPrep, RejectsBadArguments) {
  std::vector<float> fn(24 * 4 * 512, 0.5f);
  std::vector<uint32_t> out(mhc_boundary_weight_words(512, WeightRounding::kFp32), 0xabababab);
  const std::vector<uint32_t> untouched = out;
  auto expect = [&](Result r, Status status, const std::string& needle) {
    EXPECT_EQ(r.status(), status) << r.detail();
    EXPECT_NE(std::string(r.detail()).find(needle), std::string::npos) << r.detail();
    EXPECT_NE(std::string(r.detail()).find("prepare_mhc_boundary_weight"), std::string::npos);
  };
  expect(prepare_mhc_boundary_weight(nullptr, 512, WeightRounding::kTf32Rna, out.data()),
         Status::kNullPointer, "fn = null");
  expect(prepare_mhc_boundary_weight(fn.data(), 512, WeightRounding::kTf32Rna, nullptr),
         Status::kNullPointer, "out = null");
  for (int64_t hidden : {int64_t(0), int64_t(-512), int64_t(256), int64_t(4000), int64_t(7169)}) {
    expect(prepare_mhc_boundary_weight(fn.data(), hidden, WeightRounding::kTf32Rna, out.data()),
           Status::kInvalidShape, "hidden = " + std::to_string(hidden));
  }
  for (int rounding : {-1, 3}) {
    expect(prepare_mhc_boundary_weight(fn.data(), 512, static_cast<WeightRounding>(rounding),
                                       out.data()),
           Status::kInvalidValue, "rounding = " + std::to_string(rounding));
  }
  EXPECT_EQ(out, untouched);
  // The device entry validates the same way before touching the GPU.
  expect(prepare_mhc_boundary_weight_device(nullptr, 512, WeightRounding::kFp32, nullptr, nullptr),
         Status::kNullPointer, "fn = null");
  expect(prepare_mhc_boundary_weight_device(fn.data(), 1000, WeightRounding::kFp32, out.data(),
                                            nullptr),
         Status::kInvalidShape, "hidden = 1000");
}

}  // namespace
}  // namespace fusedstep
