// SPDX-License-Identifier: Apache-2.0
// The CPU reference's RecoverSSM commit: from a record-mode verify it writes the
// non-record verify's state after token n - 1, bit for bit, to each request's
// checkpoint slot and nothing else, skipping out-of-range slots and record rows;
// neither the step nor the commit writes its inputs.
#include "fusedstep_reference/kda_decode.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "reference/kda_reference_test_util.h"

namespace fusedstep::reference {
namespace {

// Commit(n) of a record-mode verify equals the non-record verify's state after token n-1 bitwise (both precisions) and n single steps (float32).
TEST(KdaReferenceInvariants, CommitReplaysVerifyStateBitwise) {
  const uint64_t seed = fresh_seed();
  for (int q : {2, 4, 8}) {
    CaseOptions o;
    o.batch = 3;
    o.heads = 2;
    o.tokens = q;
    o.deferred_rows = q == 4;
    o.gate_mode = q == 8 ? KdaGateMode::kFourChains : KdaGateMode::kOneChain;
    KdaCase c = make_case(o, seed + q);
    c.accepted = {1, 1, 1};
    for (Precision p : {kF64, kF32}) {
      c.o.records = false;
      const KdaResult plain = kda_decode(c.problem(), p);
      c.o.records = true;
      const KdaResult verify = kda_decode(c.problem(), p);
      for (int n = 0; n <= q + 1; ++n) {
        std::vector<int32_t> commit_accepted(o.batch, n);
        commit_accepted[1] = std::max(0, n - 1);
        const std::vector<double> committed = kda_commit(c.problem(), verify, p, commit_accepted.data());
        for (int b = 0; b < o.batch; ++b) {
          const int folded = std::clamp(commit_accepted[b], 0, q);
          const int64_t checkpoint = c.slot(b, 0);
          const std::vector<double> want =
              folded == 0 ? input_state_slot(c, checkpoint) : state_slot(c, plain.state, c.slot(b, folded - 1));
          EXPECT_SAME_BITS(state_slot(c, committed, checkpoint), want, "q " << q << " b " << b << " n " << folded);
          if (p == kF32 && b == 0 && folded > 0 && n == folded) {
            const SequentialSteps seq = run_sequential(c, b, 1, folded);
            EXPECT_SAME_BITS(state_slot(c, committed, checkpoint), seq.state.back(), "vs single steps, n " << folded);
          }
        }
        // Nothing but the checkpoints changes.
        for (int64_t s = 0; s < c.state_slots; ++s)
          if (s != c.slot(0, 0) && s != c.slot(1, 0) && s != c.slot(2, 0))
            EXPECT_SAME_BITS(state_slot(c, committed, s), input_state_slot(c, s), "slot " << s);
      }
    }
  }
}

// The general commit with A > 1: the checkpoint is the verify's read slot slots[b, A-1]; out-of-range slots and record rows are skipped.
TEST(KdaReferenceInvariants, CommitFromLaterCheckpointAndSkips) {
  const uint64_t seed = fresh_seed();
  CaseOptions o;
  o.batch = 4;
  o.heads = 1;
  o.tokens = 4;
  o.deferred_rows = true;
  KdaCase c = make_case(o, seed);
  c.accepted = {2, 4, 3, 1};
  c.o.records = false;
  const KdaResult plain = kda_decode(c.problem(), kF32);
  c.o.records = true;
  const KdaResult verify = kda_decode(c.problem(), kF32);
  KdaCommitProblem commit;
  commit.batch = o.batch;
  commit.heads = o.heads;
  commit.tokens = o.tokens;
  commit.state = c.state.data();
  commit.state_slot_stride = c.state_slot_stride;
  commit.state_slots = c.state_slots;
  std::vector<int32_t> checkpoints(o.batch), n = {3, 2, 4, 1};
  for (int b = 0; b < o.batch; ++b) checkpoints[b] = c.slot(b, c.accepted[b] - 1);
  std::vector<int32_t> rows = c.record_rows;
  checkpoints[3] = 0;                  // skipped: slot 0
  rows[2] = int32_t(c.record_slots);   // skipped: record row out of range
  commit.slots = checkpoints.data();
  commit.accepted = n.data();
  commit.record_correction = verify.record_correction.data();
  commit.record_key_gate = verify.record_key_gate.data();
  commit.record_rows = rows.data();
  commit.record_slots = c.record_slots;
  commit.a_log = c.a_log.data();
  commit.dt_bias = c.dt_bias.data();
  commit.lower_bound = c.problem().lower_bound;
  const std::vector<double> committed = kda_commit(commit, kF32);
  for (int b = 0; b < 2; ++b)
    EXPECT_SAME_BITS(state_slot(c, committed, checkpoints[b]), state_slot(c, plain.state, c.slot(b, n[b] - 1)), "b " << b);
  const int32_t skipped = c.slot(2, c.accepted[2] - 1);
  EXPECT_SAME_BITS(state_slot(c, committed, skipped), input_state_slot(c, skipped), "skipped record row");
  EXPECT_SAME_BITS(state_slot(c, committed, c.slot(3, 0)), input_state_slot(c, c.slot(3, 0)), "skipped slot");
}

// The reference never writes its inputs.
TEST(KdaReferenceInvariants, InputsAreNeverModified) {
  const uint64_t seed = fresh_seed();
  CaseOptions o;
  o.batch = 2;
  o.heads = 1;
  o.tokens = 3;
  o.records = true;
  o.deferred_rows = true;
  o.token_counts = true;
  const KdaCase c = make_case(o, seed);
  const KdaCase before = c;
  for (Precision p : {kF64, kF32}) {
    const KdaResult r = kda_decode(c.problem(), p);
    (void)kda_commit(c.problem(), r, p);
  }
  EXPECT_EQ(c.x, before.x);
  EXPECT_EQ(c.f_a, before.f_a);
  EXPECT_EQ(c.raw_beta, before.raw_beta);
  EXPECT_EQ(c.output_gate, before.output_gate);
  EXPECT_EQ(c.conv_state_b, before.conv_state_b);
  EXPECT_EQ(0, std::memcmp(c.state.data(), before.state.data(), c.state.size() * sizeof(float)));
  EXPECT_EQ(c.slots, before.slots);
  EXPECT_EQ(c.accepted, before.accepted);
  EXPECT_EQ(c.token_counts, before.token_counts);
  EXPECT_EQ(c.record_rows, before.record_rows);
}

}  // namespace
}  // namespace fusedstep::reference
