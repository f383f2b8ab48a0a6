// SPDX-License-Identifier: Apache-2.0
// The CPU reference's BF16 recurrent state (docs/numerics.md, "KDA decode", "State
// dtype"): the state is read exactly and the FP32 recurrence runs unchanged, so with
// the same (BF16-representable) input values a BF16-state call gives the FP32-state
// call's outputs, conv state and records bit for bit, and every state it stores is the
// FP32-state call's stored state rounded to BF16 once (round to nearest even): after
// the step at q = 1, after each stored verify token (the recurrence carries the
// unrounded state), the commit's result. float64 mode rounds the double directly to
// BF16. Untouched slots and slot padding keep their bits; float64 and float32 modes
// agree within the stated tolerance.
#include "fusedstep_reference/kda_decode.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "reference/kda_reference_test_util.h"

namespace fusedstep::reference {
namespace {

// Round to nearest even to BF16 straight from the double's bits (BF16-normal
// magnitudes only, which the tests' states stay in): drop 45 of the 52 fraction bits.
double bf16_direct(double v) {
  if (v == 0.0) return v;
  uint64_t u;
  std::memcpy(&u, &v, sizeof u);
  const int exponent = int((u >> 52) & 0x7ff) - 1023;
  if (exponent < -126 || exponent > 126) {
    ADD_FAILURE() << v << " is outside the BF16-normal range this helper covers";
    return v;
  }
  u += (uint64_t(1) << 44) - 1 + ((u >> 45) & 1);
  u &= ~((uint64_t(1) << 45) - 1);
  std::memcpy(&v, &u, sizeof v);
  return v;
}

// The BF16 store of a state value in precision p, computed independently of the
// reference: float32 results hold floats, rounded by cvt.rn.bf16.f32's bit rule.
double store_bf16(double v, Precision p) {
  if (p == kF64) return bf16_direct(v);
  if (static_cast<double>(static_cast<float>(v)) != v) ADD_FAILURE() << v << " is not a float in float32 mode";
  return bits::round_bf16(static_cast<float>(v));
}

std::vector<double> stored_bf16(const std::vector<double>& fp32_state, Precision p) {
  std::vector<double> out(fp32_state.size());
  for (size_t i = 0; i < out.size(); ++i) out[i] = store_bf16(fp32_state[i], p);
  return out;
}

bool is_bf16_value(double v) {
  const float f = static_cast<float>(v);
  return static_cast<double>(f) == v && (bits::f32_to_u32(f) & 0xffffu) == 0;
}

// Everything but the state is the FP32-state call's, bit for bit.
void expect_same_non_state(const KdaResult& bf, const KdaResult& fp, const std::string& what) {
  EXPECT_SAME_BITS(bf.output, fp.output, what << " output");
  EXPECT_SAME_BITS(bf.raw_g, fp.raw_g, what << " raw_g");
  EXPECT_SAME_BITS(bf.conv_out, fp.conv_out, what << " conv_out");
  EXPECT_SAME_BITS(bf.conv_state, fp.conv_state, what << " conv state");
  EXPECT_SAME_BITS(bf.record_correction, fp.record_correction, what << " record correction");
  EXPECT_SAME_BITS(bf.record_key_gate, fp.record_key_gate, what << " record key_gate");
}

// Elements of the state buffer where two results differ.
int64_t count_differences(const std::vector<double>& a, const std::vector<double>& b) {
  int64_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += std::memcmp(&a[i], &b[i], sizeof(double)) != 0;
  return n;
}

// ---------------------------------------------------------------------------------
// The rounding rule

// kda_state_bf16: round to nearest even with BF16's range in both modes; float64 rounds the double once (not through float).
TEST(KdaReferenceBf16State, RoundingRule) {
  const double inf = std::numeric_limits<double>::infinity();
  for (Precision p : {kF64, kF32}) {
    SCOPED_TRACE(p == kF64 ? "float64" : "float32");
    EXPECT_EQ(kda_state_bf16(1.0 + 0x1p-8, p), 1.0);                      // tie to even (down)
    EXPECT_EQ(kda_state_bf16(1.0 + 3 * 0x1p-8, p), 1.0 + 0x1p-6);         // tie to even (up)
    EXPECT_EQ(kda_state_bf16(-(1.0 + 0x1p-8 + 0x1p-20), p), -(1.0 + 0x1p-7));  // above the tie
    EXPECT_EQ(kda_state_bf16(0.3, p), 0.30078125);                        // 0x3e9a
    EXPECT_EQ(kda_state_bf16(3 * 0x1p-134, p), 0x1p-132);                 // BF16 subnormal tie to even
    EXPECT_EQ(kda_state_bf16(0x1p-133, p), 0x1p-133);                     // smallest BF16 subnormal kept
    EXPECT_EQ(kda_state_bf16(0x1p-135, p), 0.0);                          // below half of it: zero
    EXPECT_TRUE(std::signbit(kda_state_bf16(-0x1p-140, p)));              // ... with its sign
    EXPECT_TRUE(std::signbit(kda_state_bf16(-0.0, p)));
    EXPECT_EQ(kda_state_bf16((2 - 0x1p-7) * 0x1p127, p), (2 - 0x1p-7) * 0x1p127);  // largest BF16
    EXPECT_EQ(kda_state_bf16((2 - 0x1p-8) * 0x1p127, p), inf);            // its tie rounds up: +Inf
    EXPECT_EQ(kda_state_bf16(-inf, p), -inf);
    EXPECT_TRUE(std::isnan(kda_state_bf16(std::numeric_limits<double>::quiet_NaN(), p)));
  }
  // Direct vs through float: 1 + 2^-8 + 2^-30 is above the BF16 tie; as a float it is the tie.
  EXPECT_EQ(kda_state_bf16(1.0 + 0x1p-8 + 0x1p-30, kF64), 1.0 + 0x1p-7);
  EXPECT_EQ(kda_state_bf16(1.0 + 0x1p-8 + 0x1p-30, kF32), 1.0);
  EXPECT_EQ(kda_state_bf16(0x1p200, kF64), inf);

  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed);
  // On floats (any bit pattern but NaN) both modes are cvt.rn.bf16.f32.
  for (int i = 0; i < 200000; ++i) {
    const float f = bits::u32_to_f32(static_cast<uint32_t>(rng()));
    if (std::isnan(f)) continue;
    const double want = bits::round_bf16(f);
    ASSERT_EQ(kda_state_bf16(f, kF64), want) << std::hexfloat << f;
    ASSERT_EQ(kda_state_bf16(f, kF32), want) << std::hexfloat << f;
  }
  // On doubles of BF16-normal magnitude, float64 equals the bit-level direct rounding,
  // near ties too (a BF16 tie plus or minus a few double ulps).
  std::uniform_int_distribution<int> exponent(-120, 120);
  for (int i = 0; i < 200000; ++i) {
    double v = std::ldexp(std::uniform_real_distribution<double>(1.0, 2.0)(rng), exponent(rng));
    if (rng() & 1) v = -v;
    if (i % 2 == 0) {
      uint64_t u;
      std::memcpy(&u, &v, sizeof u);
      u = (u & ~((uint64_t(1) << 45) - 1)) | (uint64_t(1) << 44);  // the tie above v's BF16 truncation
      u += static_cast<uint64_t>(int64_t(rng() % 7) - 3);            // +-3 double ulps
      std::memcpy(&v, &u, sizeof v);
    }
    ASSERT_EQ(kda_state_bf16(v, kF64), bf16_direct(v)) << std::hexfloat << v;
  }
}

// ---------------------------------------------------------------------------------
// q = 1 and the verify

// q = 1: the stored state is bf16 of the FP32-state step's state (whole buffer), output, conv state and the rest bitwise the FP32-state step's; both precisions.
TEST(KdaReferenceBf16State, SingleStepStoresTheRoundedFp32State) {
  const uint64_t seed = fresh_seed();
  int index = 0;
  for (int heads : {1, 2, 3})
    for (KdaGateMode mode : {KdaGateMode::kOneChain, KdaGateMode::kFourChains, KdaGateMode::kFmaTree}) {
      CaseOptions o;
      o.batch = 2 + index % 4;
      o.heads = heads;
      o.tokens = 1;
      o.gate_mode = mode;
      o.conv_tap_major = index % 2 == 1;
      o.packed = index % 3 == 2;
      o.bf16_state_values = true;
      KdaCase c = make_case(o, seed + index++);
      const std::string what = "heads " + std::to_string(heads) + " mode " + std::to_string(int(mode)) + " batch " +
                               std::to_string(o.batch);
      for (Precision p : {kF64, kF32}) {
        c.o.state_bf16 = false;
        const KdaResult fp = kda_decode(c.problem(), p);
        c.o.state_bf16 = true;
        const KdaResult bf = kda_decode(c.problem(), p);
        expect_same_non_state(bf, fp, what);
        // Unwritten elements hold BF16 inputs, which the rounding keeps: the whole buffer compares.
        EXPECT_SAME_BITS(bf.state, stored_bf16(fp.state, p), what << " state = bf16(FP32-state step)");
        for (int b = 0; b < o.batch; ++b) {
          const std::vector<double> written = state_slot(c, bf.state, c.slot(b, 0));
          EXPECT_TRUE(std::all_of(written.begin(), written.end(), is_bf16_value)) << what << " slot of " << b;
          EXPECT_GT(count_differences(written, state_slot(c, fp.state, c.slot(b, 0))), int64_t(written.size()) / 2)
              << what << ": the stored state is rounded";
        }
      }
    }
}

// Verify (q = 2..8, accepted A, token counts n): the copy stored to slots[b, t] is bf16 of the FP32 running state after token t (the FP32-state verify's and the FP32 chained single steps'), the recurrence carries the unrounded state (it is not the chain of BF16 q = 1 steps); outputs and conv state bitwise the FP32-state verify's.
TEST(KdaReferenceBf16State, VerifyStoresEachTokensRoundedRunningState) {
  const uint64_t seed = fresh_seed();
  for (int q = 2; q <= 8; ++q) {
    CaseOptions o;
    o.batch = 2 + q % 2;
    o.heads = q % 3 == 0 ? 2 : 1;
    o.tokens = q;
    o.token_counts = true;
    o.gate_mode = KdaGateMode(q % 3);
    o.conv_tap_major = q % 2 == 0;
    o.bf16_state_values = true;
    KdaCase c = make_case(o, seed + q);
    c.accepted[0] = 1;  // one request runs all q tokens
    c.token_counts[0] = q;
    for (Precision p : {kF64, kF32}) {
      const std::string what = "q " + std::to_string(q) + (p == kF64 ? " float64" : " float32");
      c.o.state_bf16 = false;
      const KdaResult fp = kda_decode(c.problem(), p);
      c.o.state_bf16 = true;
      const KdaResult bf = kda_decode(c.problem(), p);
      expect_same_non_state(bf, fp, what);
      EXPECT_SAME_BITS(bf.state, stored_bf16(fp.state, p), what << " state = bf16(FP32-state verify)");
      if (p != kF32) continue;
      for (int b = 0; b < o.batch; ++b) {
        const int a = c.accepted[b], n = c.token_counts[b];
        SCOPED_TRACE(what + " b " + std::to_string(b) + " A " + std::to_string(a) + " n " + std::to_string(n));
        const SequentialSteps fp32_chain = run_sequential(c, b, a, n);
        const SequentialSteps bf16_chain = run_sequential(c, b, a, n, /*bf16_state=*/true);
        for (int t = 0; t < n; ++t) {
          const std::vector<double> stored = state_slot(c, bf.state, c.slot(b, t));
          EXPECT_SAME_BITS(stored, stored_bf16(fp32_chain.state[t], p), "token " << t << ": bf16(FP32 running state)");
          if (t == 0) {
            EXPECT_SAME_BITS(stored, bf16_chain.state[t], "token 0: one rounding either way");
          } else {
            EXPECT_GT(count_differences(stored, bf16_chain.state[t]), 0) << "token " << t << ": no rounding carried";
          }
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------
// float64 vs float32

// With a BF16 state, float32 mode's stored states stay within docs/numerics.md's BF16-state line of float64's (both rounded to BF16): heads 3 and 12, batch 1-5, q 1-4.
TEST(KdaReferenceBf16State, Float32WithinToleranceOfFloat64) {
  const uint64_t seed = fresh_seed();
  double worst_state = 0, worst_fp32 = 0;
  int index = 0;
  for (int heads : {3, 12})
    for (int q = 1; q <= 4; ++q) {
      CaseOptions o;
      o.heads = heads;
      o.tokens = q;
      o.batch = heads == 3 ? 5 : 1 + (q % 3);
      o.token_counts = q > 1;
      o.gate_mode = KdaGateMode(index % 3);
      o.state_bf16 = true;
      KdaCase c = make_case(o, seed + index++);
      const KdaResult r32 = kda_decode(c.problem(), kF32);
      const KdaResult r64 = kda_decode(c.problem(), kF64);
      c.o.state_bf16 = false;
      const KdaResult f32 = kda_decode(c.problem(), kF32);
      const KdaResult f64 = kda_decode(c.problem(), kF64);
      const int64_t head = kD * kD;
      for (int64_t s = 1; s < c.state_slots; ++s) {
        worst_state = std::max(worst_state, block_error(state_slot(c, r32.state, s), state_slot(c, r64.state, s), heads, head, head));
        worst_fp32 = std::max(worst_fp32, block_error(state_slot(c, f32.state, s), state_slot(c, f64.state, s), heads, head, head));
      }
      // The float64 store is the direct rounding of the float64 FP32-state run.
      EXPECT_SAME_BITS(r64.state, stored_bf16(f64.state, kF64), "float64 heads " << heads << " q " << q);
    }
  std::printf("[ tol      ] worst state error, BF16 state %.3e (FP32 state, same inputs: %.3e)\n", worst_state, worst_fp32);
  // The FP32-state line (1.5e-2) plus at most a half BF16 ulp (<= 2^-8 relative) on each side.
  EXPECT_LE(worst_state, 1.5e-2 + 0x1p-7);
  EXPECT_GT(worst_state, 0.0);
}

// ---------------------------------------------------------------------------------
// Records and the commit

// RecoverSSM with a BF16 checkpoint: the record verify writes no state and the FP32-state records; commit(n) equals bf16 of the FP32 commit of the same checkpoint and the BF16 non-record verify's state at slots[b, n-1]; both precisions.
TEST(KdaReferenceBf16State, CommitRoundsTheFoldedCheckpointOnce) {
  const uint64_t seed = fresh_seed();
  for (int q : {2, 4, 8}) {
    CaseOptions o;
    o.batch = q == 4 ? 2 : 3;
    o.heads = q == 2 ? 2 : 1;
    o.tokens = q;
    o.deferred_rows = q != 2;
    o.gate_mode = q == 8 ? KdaGateMode::kFmaTree : KdaGateMode::kOneChain;
    o.bf16_state_values = true;
    KdaCase c = make_case(o, seed + q);
    std::fill(c.accepted.begin(), c.accepted.end(), 1);
    const std::vector<double> state_in(c.state.begin(), c.state.end());
    for (Precision p : {kF64, kF32}) {
      const std::string what = "q " + std::to_string(q) + (p == kF64 ? " float64" : " float32");
      c.o.records = false;
      c.o.state_bf16 = true;
      const KdaResult plain_bf = kda_decode(c.problem(), p);
      c.o.records = true;
      c.o.state_bf16 = false;
      const KdaResult verify_fp = kda_decode(c.problem(), p);
      c.o.state_bf16 = true;
      const KdaResult verify_bf = kda_decode(c.problem(), p);
      expect_same_non_state(verify_bf, verify_fp, what + " records");
      EXPECT_SAME_BITS(verify_bf.state, state_in, what << ": the record verify writes no state");
      for (int n = 0; n <= q + 1; ++n) {
        std::vector<int32_t> commit_accepted(o.batch, n);
        commit_accepted[1] = std::max(0, n - 1);
        c.o.state_bf16 = false;
        const std::vector<double> fp = kda_commit(c.problem(), verify_bf, p, commit_accepted.data());
        c.o.state_bf16 = true;
        const std::vector<double> bf = kda_commit(c.problem(), verify_bf, p, commit_accepted.data());
        EXPECT_SAME_BITS(bf, stored_bf16(fp, p), what << " n " << n << ": bf16(FP32 commit)");
        for (int b = 0; b < o.batch; ++b) {
          const int folded = std::clamp(commit_accepted[b], 0, q);
          const std::vector<double> want =
              folded == 0 ? input_state_slot(c, c.slot(b, 0)) : state_slot(c, plain_bf.state, c.slot(b, folded - 1));
          EXPECT_SAME_BITS(state_slot(c, bf, c.slot(b, 0)), want, what << " b " << b << " n " << folded << " vs BF16 verify");
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------
// Untouched state

// Fills every element of slot s (and, with gaps, the slot-stride padding of every slot) with BF16 specials and random values.
void poison(KdaCase& c, int64_t s, std::mt19937_64& rng) {
  static const uint16_t kSpecial[] = {0x8000, 0x0000, 0x7f80, 0xff80, 0x7fc1, 0xffd5, 0x0001, 0x807f, 0x7f7f, 0x0080};
  for (int64_t i = 0; i < c.state_slot_stride; ++i) {
    uint16_t b = kSpecial[rng() % 10];
    if (rng() % 4 == 0) b = bits::bf16_rne(static_cast<float>(std::normal_distribution<double>(0.0, 1.0)(rng)));
    c.state_b[s * c.state_slot_stride + i] = b;
    c.state[s * c.state_slot_stride + i] = bits::bf16_to_f32(b);
  }
}

// Each untouched element of the result, narrowed to float, has exactly the input's BF16 bits above 16 zero bits.
void expect_bits_kept(const KdaCase& c, const std::vector<double>& result, int64_t begin, int64_t count, const std::string& what) {
  for (int64_t i = begin; i < begin + count; ++i) {
    const uint32_t u = bits::f32_to_u32(static_cast<float>(result[i]));
    ASSERT_EQ(u, uint32_t(c.state_b[i]) << 16) << what << " element " << i;
    if (!std::isnan(result[i])) {
      ASSERT_EQ(static_cast<double>(static_cast<float>(result[i])), result[i]) << what;
    }
  }
}

// Padding requests of every kind (q = 1, verify, records), slots the verify may not write, slot-stride gaps and skipped commits keep their BF16 bits (specials: -0, +-Inf, NaN payloads, subnormals); inputs are never modified; both precisions.
TEST(KdaReferenceBf16State, UntouchedSlotsKeepTheirBits) {
  const uint64_t seed = fresh_seed();
  std::mt19937_64 rng(seed ^ 0x5bd1e995u);
  struct Setup { int q; bool records; int variant; };
  for (const Setup& setup : {Setup{1, false, 0}, Setup{3, false, 0}, Setup{3, false, 1}, Setup{4, true, 0}, Setup{4, true, 1}}) {
    const int q = setup.q;
    const std::string what = "q " + std::to_string(q) + " records " + std::to_string(setup.records) + " variant " +
                             std::to_string(setup.variant);
    CaseOptions o;
    o.batch = 8;
    o.heads = 1 + setup.variant;
    o.tokens = q;
    o.records = setup.records;
    o.deferred_rows = setup.records;
    o.token_counts = q > 1;
    o.state_bf16 = true;
    KdaCase c = make_case(o, seed + 10 * q + 2 * setup.records + setup.variant);
    auto slot_ref = [&](int b, int t) -> int32_t& { return c.slots[q == 1 ? b : b * c.slots_stride + t]; };
    for (int b = 0; b < o.batch; ++b) {
      c.accepted[b] = 1;
      c.token_counts[b] = q;
      for (int t = 0; t < q; ++t) slot_ref(b, t) = 1 + b * q + t;
    }
    const int32_t bad = int32_t(c.state_slots);
    if (q == 1) {
      slot_ref(1, 0) = 0, slot_ref(2, 0) = -1, slot_ref(3, 0) = bad, slot_ref(4, 0) = bad + 5;
      slot_ref(6, 0) = -7, slot_ref(7, 0) = 0;
    } else if (setup.variant == 0) {
      slot_ref(1, 0) = 0;                            // conv slot 0
      c.accepted[2] = 0;
      c.accepted[3] = q + 1;
      c.token_counts[4] = 0;
      c.accepted[6] = 2, slot_ref(6, 1) = bad;       // read slot out of range
      c.token_counts[7] = q + 1;
    } else {
      c.accepted[1] = 2, slot_ref(1, 1) = -3;
      c.token_counts[2] = q + 2;
      c.accepted[3] = q, slot_ref(3, q - 1) = 0;
      if (setup.records) c.record_rows[4] = int32_t(c.record_slots), c.record_rows[6] = -1;
      else c.accepted[4] = 0, c.accepted[6] = -1;
      c.token_counts[7] = -1;
    }
    // Valid requests 0 and 5; request 0 runs q - 1 tokens with an unwritable second slot.
    if (q > 1 && !setup.records) c.token_counts[0] = q - 1, slot_ref(0, 1) = -2;
    std::vector<bool> written(c.state_slots, false);
    if (!setup.records)
      for (int b : {0, 5})
        for (int t = 0; t < (q == 1 ? 1 : c.token_counts[b]); ++t)
          if (slot_ref(b, t) > 0) written[slot_ref(b, t)] = true;
    for (int64_t s = 0; s < c.state_slots; ++s)
      if (!written[s] && s != c.slot(0, 0) && s != c.slot(5, 0)) poison(c, s, rng);
    const int64_t head_elems = int64_t(o.heads) * kD * kD;
    for (int64_t s = 0; s < c.state_slots; ++s)  // the slot-stride gap of every slot
      for (int64_t i = head_elems; i < c.state_slot_stride; ++i) {
        c.state_b[s * c.state_slot_stride + i] = 0x7fc1 + uint16_t(rng() % 16);
        c.state[s * c.state_slot_stride + i] = bits::bf16_to_f32(c.state_b[s * c.state_slot_stride + i]);
      }
    const KdaCase before = c;
    for (Precision p : {kF64, kF32}) {
      SCOPED_TRACE(what + (p == kF64 ? " float64" : " float32"));
      const KdaResult r = kda_decode(c.problem(), p);
      for (int64_t s = 0; s < c.state_slots; ++s) {
        expect_bits_kept(c, r.state, s * c.state_slot_stride + head_elems, c.state_slot_stride - head_elems, "gap of slot " + std::to_string(s));
        if (written[s]) {
          const std::vector<double> v = state_slot(c, r.state, s);
          EXPECT_TRUE(std::all_of(v.begin(), v.end(), is_bf16_value)) << "written slot " << s;
          EXPECT_GT(count_differences(v, input_state_slot(c, s)), 0) << "written slot " << s;
        } else {
          expect_bits_kept(c, r.state, s * c.state_slot_stride, head_elems, "slot " + std::to_string(s));
        }
      }
      for (int b : {0, 5}) {
        double sum = 0;
        for (int64_t k = 0; k < c.dim; ++k) sum += std::fabs(r.output[int64_t(b) * q * c.dim + k]);
        EXPECT_GT(sum, 0.0) << "valid request " << b << " ran";
      }
      for (int b = 0; b < o.batch; ++b) {
        if (b == 0 || b == 5) continue;
        for (int64_t i = 0; i < q * c.dim; ++i) ASSERT_EQ(r.output[int64_t(b) * q * c.dim + i], 0.0) << "padding " << b;
      }
      if (setup.records) {
        // Commit every request's checkpoint: the padding ones are skipped (bad slot or record row) or,
        // when only the verify skipped them (accepted or token counts), fold stale NaN records.
        std::vector<int32_t> n(o.batch, q);
        const std::vector<double> committed = kda_commit(c.problem(), r, p, n.data());
        for (int64_t s = 0; s < c.state_slots; ++s) {
          expect_bits_kept(c, committed, s * c.state_slot_stride + head_elems, c.state_slot_stride - head_elems,
                           "commit: gap of slot " + std::to_string(s));
          bool checkpoint = false;
          for (int b = 0; b < o.batch; ++b) {
            const int64_t row = c.record_rows[b];
            checkpoint |= c.slot(b, 0) == s && row >= 0 && row < c.record_slots;
          }
          if (!checkpoint) expect_bits_kept(c, committed, s * c.state_slot_stride, head_elems, "commit: slot " + std::to_string(s));
        }
        for (int b : {0, 5}) {
          const std::vector<double> v = state_slot(c, committed, c.slot(b, 0));
          EXPECT_TRUE(std::all_of(v.begin(), v.end(), is_bf16_value)) << "committed slot of " << b;
        }
      }
    }
    EXPECT_EQ(c.state_b, before.state_b) << "the BF16 state buffer is an input";
  }
}

}  // namespace
}  // namespace fusedstep::reference
