// SPDX-License-Identifier: Apache-2.0
// The CPU reference's KDA decode / verify step, cache and padding contract: padding
// requests touch nothing; a verify equals chained single-token steps and a single
// step a one-token verify; the conv window follows the accepted and token counts;
// records direct and deferred; layouts and dtypes give the same bits.
#include "fusedstep_reference/kda_decode.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "reference/kda_reference_test_util.h"

namespace fusedstep::reference {
namespace {

// Logical [slot][channel][tap] view of a conv buffer in the case's layout.
std::vector<double> conv_logical(const KdaCase& c, const std::vector<double>& buffer) {
  std::vector<double> v;
  v.reserve(c.conv_state_slots * c.channels * c.taps);
  for (int64_t s = 0; s < c.conv_state_slots; ++s)
    for (int64_t ch = 0; ch < c.channels; ++ch)
      for (int64_t t = 0; t < c.taps; ++t) v.push_back(buffer[c.conv_index(s, ch, t)]);
  return v;
}

std::vector<double> conv_buffer_input(const KdaCase& c) {
  std::vector<double> v(c.conv_state_b.size());
  for (size_t i = 0; i < v.size(); ++i) v[i] = c.o.conv_state_fp32 ? c.conv_state_f[i] : from_bf16(c.conv_state_b[i]);
  return v;
}

// ---------------------------------------------------------------------------------
// Invariants

// A padding request (bad slot, accepted count, token count or record row) writes zero rows and leaves every cache byte and record untouched.
TEST(KdaReferenceInvariants, PaddingRequestsTouchNothing) {
  const uint64_t seed = fresh_seed();
  struct Setup { int q; bool records; int variant; };
  for (const Setup& setup : {Setup{1, false, 0}, Setup{3, false, 0}, Setup{3, false, 1}, Setup{3, true, 0}, Setup{3, true, 1}}) {
    const int q = setup.q;
    SCOPED_TRACE("q " + std::to_string(q) + " records " + std::to_string(setup.records) + " variant " + std::to_string(setup.variant));
    CaseOptions o;
    o.batch = 8;
    o.heads = 1;
    o.tokens = q;
    o.records = setup.records;
    o.deferred_rows = setup.records;
    o.token_counts = q > 1;
    KdaCase c = make_case(o, seed + 10 * q + 2 * setup.records + setup.variant);
    // Distinct slots 1 .. rows; slots rows + 1, rows + 2 are valid state slots but conv padding.
    c.conv_state_slots = c.rows + 1;
    auto slot_ref = [&](int b, int t) -> int32_t& { return c.slots[q == 1 ? b : b * c.slots_stride + t]; };
    for (int b = 0; b < o.batch; ++b) {
      c.accepted[b] = 1;
      c.token_counts[b] = q;
      for (int t = 0; t < q; ++t) slot_ref(b, t) = 1 + b * q + t;
    }
    const int32_t bad_state = int32_t(c.state_slots), conv_only_bad = int32_t(c.conv_state_slots);
    if (setup.variant == 0) {
      slot_ref(1, 0) = 0;
      slot_ref(2, 0) = -1;
      slot_ref(3, 0) = bad_state;
      slot_ref(4, 0) = conv_only_bad;  // the state slot exists, the conv slot does not
      if (q == 1) {
        slot_ref(6, 0) = bad_state + 7;
        slot_ref(7, 0) = -5;
      } else {
        c.accepted[6] = 0;
        c.accepted[7] = q + 1;
      }
    } else {
      c.accepted[1] = 2, slot_ref(1, 1) = 0;          // read slot 0, conv slot fine
      c.accepted[2] = 3, slot_ref(2, 2) = bad_state;  // read slot out of range
      c.token_counts[3] = 0;
      c.token_counts[4] = q + 1;
      if (setup.records) {
        c.record_rows[6] = int32_t(c.record_slots);
        c.record_rows[7] = -1;
      } else {
        c.accepted[6] = 2, slot_ref(6, 1) = -3;
        c.accepted[7] = 2, slot_ref(7, 0) = -2;       // conv slot bad, read slot fine
      }
    }
    const std::vector<int> valid = {0, 5};
    const std::vector<int> padding = {1, 2, 3, 4, 6, 7};
    const std::vector<double> conv_in = conv_buffer_input(c);
    for (Precision p : {kF64, kF32}) {
      const KdaResult r = kda_decode(c.problem(), p);
      for (int b : padding)
        for (int t = 0; t < q; ++t) {
          const int64_t row = int64_t(b) * q + t;
          for (int64_t k = 0; k < c.dim; ++k) {
            ASSERT_EQ(r.output[row * c.dim + k], 0.0) << "padding request " << b;
            ASSERT_EQ(r.raw_g[row * c.dim + k], 0.0) << "padding request " << b;
          }
        }
      // Every slot that no valid request names (the padding requests' slots among them) is byte-identical.
      for (int64_t s = 0; s < c.state_slots; ++s) {
        bool named_by_valid = false;
        for (int b : valid)
          for (int t = 0; t < q; ++t) named_by_valid |= c.slot(b, t) == s;
        if (named_by_valid) continue;
        EXPECT_SAME_BITS(state_slot(c, r.state, s), input_state_slot(c, s), "state slot " << s);
        if (s < c.conv_state_slots)
          EXPECT_SAME_BITS(slice(r.conv_state, s * c.conv_slot_stride, c.conv_slot_stride),
                           slice(conv_in, s * c.conv_slot_stride, c.conv_slot_stride), "conv slot " << s);
      }
      if (setup.records) {
        EXPECT_SAME_BITS(r.state, std::vector<double>(c.state.begin(), c.state.end()), "record mode writes no state");
        for (int64_t row = 0; row < c.record_slots; ++row) {
          const bool written = row == c.record_rows[0] || row == c.record_rows[5];
          for (int64_t i = 0; i < int64_t(o.heads) * q * kD; ++i)
            ASSERT_EQ(std::isnan(r.record_correction[row * o.heads * q * kD + i]), !written) << "record row " << row;
        }
      }
      for (int b : valid) {
        double sum = 0;
        for (int64_t k = 0; k < c.dim; ++k) sum += std::fabs(r.output[int64_t(b) * q * c.dim + k]);
        EXPECT_GT(sum, 0.0) << "valid request " << b << " ran";
      }
    }
  }
}

// A verify (q = 2..8, any accepted count A and token count n) equals n chained single-token steps from slot slots[b, A-1], bitwise in float32.
TEST(KdaReferenceInvariants, VerifyEqualsSequentialSingleSteps) {
  const uint64_t seed = fresh_seed();
  for (int q = 2; q <= 8; ++q) {
    CaseOptions o;
    o.batch = 2;
    o.heads = 2;
    o.tokens = q;
    o.token_counts = true;
    o.gate_mode = KdaGateMode(q % 3);
    o.conv_tap_major = q % 2 == 0;
    KdaCase c = make_case(o, seed + q);
    c.accepted[0] = 1;  // A = 1, every token accepted
    c.token_counts[0] = q;
    const KdaResult r = kda_decode(c.problem(), kF32);
    for (int b = 0; b < o.batch; ++b) {
      const int a = c.accepted[b], n = c.token_counts[b];
      SCOPED_TRACE("q " + std::to_string(q) + " A " + std::to_string(a) + " n " + std::to_string(n));
      const SequentialSteps seq = run_sequential(c, b, a, n);
      for (int t = 0; t < n; ++t) {
        const int64_t row = int64_t(b) * q + t;
        EXPECT_SAME_BITS(slice(r.output, row * c.dim, c.dim), seq.output[t], "output row t=" << t);
        EXPECT_SAME_BITS(slice(r.raw_g, row * c.dim, c.dim), seq.raw_g[t], "raw_g t=" << t);
        EXPECT_SAME_BITS(slice(r.conv_out, row * c.channels, c.channels), seq.conv_out[t], "conv_out t=" << t);
        EXPECT_SAME_BITS(state_slot(c, r.state, c.slot(b, t)), seq.state[t], "state after token " << t);
      }
      // The verify's taps n-1 .. n+1 are the last single step's window.
      for (int64_t ch = 0; ch < c.channels; ++ch)
        for (int j = 0; j < 3; ++j)
          ASSERT_EQ(r.conv_state[c.conv_index(c.slot(b, 0), ch, n - 1 + j)], seq.conv_window[ch * 3 + j]) << ch << " " << j;
    }
  }
}

// q = 1 equals a verify with one token (token_counts = 1, A = 1) on the same inputs, in both precisions.
TEST(KdaReferenceInvariants, SingleStepEqualsVerifyWithOneToken) {
  const uint64_t seed = fresh_seed();
  CaseOptions o;
  o.batch = 3;
  o.heads = 2;
  o.tokens = 4;
  o.token_counts = true;
  KdaCase c = make_case(o, seed);
  for (int b = 0; b < o.batch; ++b) c.accepted[b] = 1, c.token_counts[b] = 1;
  // The q = 1 problem: rows b * 4, slots[b, 0], the conv slot's first three taps.
  KdaProblem single = c.problem();
  single.tokens = 1;
  single.x_stride = 4 * c.x_stride;
  single.f_a_stride = 4 * c.f_a_stride;
  single.raw_beta_stride = 4 * c.raw_beta_stride;
  single.output_gate_stride = 4 * c.output_gate_stride;
  std::vector<int32_t> slots1(o.batch);
  for (int b = 0; b < o.batch; ++b) slots1[b] = c.slot(b, 0);
  single.slots = slots1.data();
  single.accepted = nullptr;
  single.token_counts = nullptr;
  for (Precision p : {kF64, kF32}) {
    const KdaResult verify = kda_decode(c.problem(), p);
    const KdaResult step = kda_decode(single, p);
    for (int b = 0; b < o.batch; ++b) {
      EXPECT_SAME_BITS(slice(verify.output, int64_t(b) * 4 * c.dim, c.dim), slice(step.output, b * c.dim, c.dim), "output " << b);
      for (int t = 1; t < 4; ++t)
        for (int64_t k = 0; k < c.dim; ++k) ASSERT_EQ(verify.output[(int64_t(b) * 4 + t) * c.dim + k], 0.0) << "row t >= n";
    }
    EXPECT_SAME_BITS(verify.state, step.state, "state buffer");
    EXPECT_SAME_BITS(verify.conv_state, step.conv_state, "conv buffer (taps 3-5 untouched by both)");
  }
}

// Taps 0..n+1 of the conv slot become [c_A, c_{A+1}, x_0..x_{n-1}], later taps stay; rows t >= n are zero and write no state.
TEST(KdaReferenceInvariants, ConvWindowRewriteFollowsTokenCounts) {
  const uint64_t seed = fresh_seed();
  CaseOptions o;
  o.batch = 4;
  o.heads = 1;
  o.tokens = 4;
  o.token_counts = true;
  for (bool tap_major : {false, true}) {
    o.conv_tap_major = tap_major;
    KdaCase c = make_case(o, seed + tap_major);
    c.accepted = {1, 2, 3, 4};
    c.token_counts = {2, 4, 1, 3};
    const std::vector<double> conv_in = conv_buffer_input(c);
    for (Precision p : {kF64, kF32}) {
      const KdaResult r = kda_decode(c.problem(), p);
      for (int b = 0; b < o.batch; ++b) {
        const int a = c.accepted[b], n = c.token_counts[b];
        const int64_t s = c.slot(b, 0);
        for (int64_t ch = 0; ch < c.channels; ++ch) {
          for (int j = 0; j < c.taps; ++j) {
            double want;
            if (j < 2) want = c.conv_input(s, ch, a + j);
            else if (j < n + 2) want = from_bf16(c.x[(int64_t(b) * o.tokens + j - 2) * c.x_stride + ch]);
            else want = conv_in[c.conv_index(s, ch, j)];
            ASSERT_EQ(r.conv_state[c.conv_index(s, ch, j)], want) << "b " << b << " channel " << ch << " tap " << j;
          }
        }
        for (int t = 0; t < o.tokens; ++t) {
          const int64_t row = int64_t(b) * o.tokens + t;
          double sum = 0;
          for (int64_t k = 0; k < c.dim; ++k) sum += std::fabs(r.output[row * c.dim + k]);
          const int32_t ws = c.slot(b, t);
          if (t < n) {
            EXPECT_GT(sum, 0.0);
            EXPECT_NE(first_difference(state_slot(c, r.state, ws), input_state_slot(c, ws)), -1) << "token " << t << " written";
          } else {
            EXPECT_EQ(sum, 0.0) << "row t >= n";
            EXPECT_SAME_BITS(state_slot(c, r.state, ws), input_state_slot(c, ws), "slot of padding row " << t);
          }
        }
      }
    }
  }
}

// Records: deferred rows (record_rows) hold exactly the direct rows; k is the post-conv k, raw_g the gate; no state slot is written; output and conv state match the non-record verify.
TEST(KdaReferenceInvariants, RecordsDirectAndDeferred) {
  const uint64_t seed = fresh_seed();
  CaseOptions o;
  o.batch = 3;
  o.heads = 2;
  o.tokens = 3;
  o.token_counts = true;
  KdaCase c = make_case(o, seed);
  c.token_counts = {3, 1, 2};
  for (Precision p : {kF64, kF32}) {
    c.o.records = false;
    const KdaResult plain = kda_decode(c.problem(), p);
    c.o.records = true;
    c.o.deferred_rows = false;
    const KdaResult direct = kda_decode(c.problem(), p);
    c.o.deferred_rows = true;
    const KdaResult deferred = kda_decode(c.problem(), p);
    const std::vector<double> state_in(c.state.begin(), c.state.end());
    for (const KdaResult* r : {&direct, &deferred}) {
      EXPECT_SAME_BITS(r->state, state_in, "record mode writes no state");
      EXPECT_SAME_BITS(r->output, plain.output, "output");
      EXPECT_SAME_BITS(r->conv_state, plain.conv_state, "conv state");
    }
    const int64_t per_token = kD, heads = o.heads, q = o.tokens;
    std::vector<bool> used(c.record_slots, false);
    for (int b = 0; b < o.batch; ++b) {
      const int64_t row_deferred = c.record_rows[b];
      used[row_deferred] = true;
      for (int h = 0; h < o.heads; ++h)
        for (int t = 0; t < q; ++t) {
          const int64_t dc = ((int64_t(b) * heads + h) * q + t) * per_token;
          const int64_t fc = ((row_deferred * heads + h) * q + t) * per_token;
          const bool ran = t < c.token_counts[b];
          for (int i = 0; i < kD; ++i) {
            ASSERT_EQ(std::isnan(direct.record_correction[dc + i]), !ran);
            ASSERT_EQ(std::isnan(deferred.record_correction[fc + i]), !ran);
            ASSERT_EQ(std::isnan(deferred.record_key_gate[2 * fc + i]), !ran);
            ASSERT_EQ(std::isnan(deferred.record_key_gate[2 * fc + kD + i]), !ran);
          }
          if (!ran) continue;
          EXPECT_SAME_BITS(slice(deferred.record_correction, fc, kD), slice(direct.record_correction, dc, kD), "correction");
          EXPECT_SAME_BITS(slice(deferred.record_key_gate, 2 * fc, 2 * kD), slice(direct.record_key_gate, 2 * dc, 2 * kD), "key_gate");
          const int64_t row = int64_t(b) * q + t;
          EXPECT_SAME_BITS(slice(direct.record_key_gate, 2 * dc, kD), slice(plain.conv_out, row * c.channels + c.dim + h * kD, kD), "k");
          EXPECT_SAME_BITS(slice(direct.record_key_gate, 2 * dc + kD, kD), slice(plain.raw_g, row * c.dim + h * kD, kD), "raw_g");
        }
    }
    for (int64_t row = 0; row < c.record_slots; ++row) {
      if (used[row]) continue;
      for (int64_t i = 0; i < heads * q * kD; ++i) ASSERT_TRUE(std::isnan(deferred.record_correction[row * heads * q * kD + i]));
    }
  }
}

// Conv-state layout and dtype, conv-weight layout and dtype, row strides and a given raw gate (equal to the computed one) do not change any result bit.
TEST(KdaReferenceInvariants, LayoutsAndDtypesGiveIdenticalResults) {
  const uint64_t seed = fresh_seed();
  for (int q : {1, 3}) {
    CaseOptions base;
    base.batch = 3;
    base.heads = 2;
    base.tokens = q;
    base.token_counts = q > 1;
    std::vector<CaseOptions> variants;
    auto add = [&](auto change) { CaseOptions v = base; change(v); variants.push_back(v); };
    add([](CaseOptions& v) { v.conv_tap_major = true; });
    add([](CaseOptions& v) { v.conv_state_fp32 = true; });
    add([](CaseOptions& v) { v.conv_weight_tap_major = true; });
    add([](CaseOptions& v) { v.conv_weight_bf16 = true; });
    add([](CaseOptions& v) { v.packed = true; });
    add([](CaseOptions& v) { v.conv_tap_major = true, v.conv_state_fp32 = true, v.conv_weight_tap_major = true, v.conv_weight_bf16 = true; });
    for (Precision p : {kF64, kF32}) {
      const KdaCase ref_case = make_case(base, seed + q);
      const KdaResult ref = kda_decode(ref_case.problem(), p);
      for (const CaseOptions& v : variants) {
        const KdaCase vc = make_case(v, seed + q);
        const KdaResult r = kda_decode(vc.problem(), p);
        const std::string what = "q " + std::to_string(q) + " tap_major " + std::to_string(v.conv_tap_major) + " fp32 state " +
                                 std::to_string(v.conv_state_fp32) + " tap-major weight " + std::to_string(v.conv_weight_tap_major) +
                                 " bf16 weight " + std::to_string(v.conv_weight_bf16) + " packed " + std::to_string(v.packed);
        EXPECT_SAME_BITS(r.output, ref.output, what << " output");
        EXPECT_SAME_BITS(r.raw_g, ref.raw_g, what << " raw_g");
        EXPECT_SAME_BITS(conv_logical(vc, r.conv_state), conv_logical(ref_case, ref.conv_state), what << " conv state");
        for (int64_t s = 0; s < ref_case.state_slots; ++s)
          EXPECT_SAME_BITS(state_slot(vc, r.state, s), state_slot(ref_case, ref.state, s), what << " state slot " << s);
      }
      // A given raw gate equal to the projection's BF16 output (float32) gives the same bits.
      if (p == kF32) {
        KdaCase given = make_case(base, seed + q);
        given.o.given_raw_gate = true;
        for (int64_t row = 0; row < given.rows; ++row)
          for (int64_t k = 0; k < given.dim; ++k) given.raw_gate[row * given.raw_gate_stride + k] = bf16(ref.raw_g[row * given.dim + k]);
        // Padding rows (t >= n) have raw_g 0 in the result; they are not run either way.
        const KdaResult r = kda_decode(given.problem(), p);
        EXPECT_SAME_BITS(r.output, ref.output, "given raw gate output");
        EXPECT_SAME_BITS(r.state, ref.state, "given raw gate state");
      }
    }
  }
}

}  // namespace
}  // namespace fusedstep::reference
