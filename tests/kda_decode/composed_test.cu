// SPDX-License-Identifier: Apache-2.0
// GPU tests of the KDA composed reference path and the RecoverSSM commit:
//  - composed vs the float64 CPU reference within the tolerances of docs/numerics.md
//    (output, state, records; conv state exact), FP32 and BF16 state, every output element written,
//    untouched slots, records and row padding byte-identical, bitwise run to run;
//  - verify(records) -> commit(m) equals the non-record verify's state after token
//    m - 1 BITWISE;
//  - a q-token verify equals q sequential q = 1 steps BITWISE (outputs and states),
//    and so does verify(records) -> commit(m) after m steps (FP32 state: with a BF16
//    state the steps round between tokens, the verify does not).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "kda_decode/kda_test_util.h"

namespace fusedstep::testing {
namespace {

using reference::Precision;

constexpr int kD = kKdaHeadDim;
constexpr int64_t kHeadState = int64_t(kD) * kD;

// Tolerances against the float64 reference (docs/numerics.md, "KDA decode" tolerances).
constexpr double kOutputTolerance = 0.15;       // |d| / max(rms of the (row, head), 0.1)
constexpr double kStateTolerance = 0.05;        // |d| / max |S| of the (slot, head)
constexpr double kCorrectionTolerance = 0.02;   // |d| / max |v_new| of the (record, head, token)
constexpr double kKeyGateRelative = 1.0 / 128;  // |d| <= 2^-7 |ref| + 1e-3: one BF16 rounding
constexpr double kKeyGateAbsolute = 1e-3;
// Against the float32 reference (the GPU's rounding points, exact instructions): the
// share of output elements bitwise equal. Approximate ex2/rcp/sqrt and the tensor core
// flip a BF16 rounding now and then; a semantic error flips most of them.
constexpr double kMinFloat32Equal = 0.98;

float bf16f(uint16_t b) { return bits::bf16_to_f32(b); }

::testing::AssertionResult synced(const Result& r) {
  if (!r.ok()) return ::testing::AssertionFailure() << status_name(r.status()) << ": " << r.detail();
  const cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) return ::testing::AssertionFailure() << "CUDA: " << cudaGetErrorString(e);
  return ::testing::AssertionSuccess();
}

// Runs the composed path on the default stream with a fresh workspace and waits.
::testing::AssertionResult run_composed(const KdaDecodeParams& p) {
  DeviceBuffer<uint8_t> workspace(size_t(std::max<int64_t>(composed::workspace_bytes(p), 256)));
  return synced(composed::launch(p, workspace.get(), nullptr));
}

::testing::AssertionResult run_commit(const KdaCommitParams& p) {
  return synced(launch(p, LaunchOptions{}, nullptr));
}

KdaDecodeParams without_records(KdaDecodeParams p) {
  p.record_correction = nullptr;
  p.record_key_gate = nullptr;
  p.record_rows = nullptr;
  p.record_slots = 0;
  return p;
}

// Everything a step leaves on the device.
struct StepResult {
  std::vector<uint16_t> output;
  std::vector<float> state;
  std::vector<uint8_t> conv_state;
  std::vector<float> correction;
  std::vector<uint16_t> key_gate;
};

StepResult download(const KdaTestData& d) {
  StepResult r;
  r.output = d.download_output();
  r.state = d.download_state();
  r.conv_state = d.download_conv_state();
  if (d.config().records) {
    r.correction = d.download_record_correction();
    r.key_gate = d.download_record_key_gate();
  }
  return r;
}

bool same_bytes(const float* a, const float* b, int64_t count) {
  return std::memcmp(a, b, size_t(count) * sizeof(float)) == 0;
}

struct Worst {
  double output = 0, state = 0, correction = 0;
  int64_t f32_equal = 0, f32_total = 0;  // outputs bitwise equal to the float32 reference (info)
};

// Checks one composed step against the float64 reference, element by element.
void expect_matches_reference(const KdaTestData& d, const StepResult& gpu, Worst* worst) {
  const KdaCaseConfig& c = d.config();
  const int q = c.tokens, heads = c.heads, dim = d.dim();
  const reference::KdaResult ref = reference::kda_decode(d.problem(), Precision::kFloat64);
  const reference::KdaResult ref32 = reference::kda_decode(d.problem(), Precision::kFloat32);

  // ---- output: every element of the view written; padding rows zero; row padding untouched.
  int failures = 0;
  for (int64_t row = 0; row < d.rows(); ++row) {
    const auto facts = d.request(int(row / q), c.records);
    const bool padding = !facts.active || row % q >= facts.count;
    for (int h = 0; h < heads; ++h) {
      double sum = 0;
      for (int v = 0; v < kD; ++v) sum += ref.output[row * dim + h * kD + v] * ref.output[row * dim + h * kD + v];
      const double scale = std::max(std::sqrt(sum / kD), 0.1);
      for (int v = 0; v < kD; ++v) {
        const uint16_t bits16 = gpu.output[row * d.output_stride + h * kD + v];
        const double got = bf16f(bits16), want = ref.output[row * dim + h * kD + v];
        bool bad = false;
        if (padding) {
          bad = bits16 != 0;
        } else {
          const double e = std::fabs(got - want) / scale;
          bad = !(e <= kOutputTolerance);  // NaN (unwritten poison) fails too
          if (!std::isnan(e)) worst->output = std::max(worst->output, e);
          worst->f32_total++;
          worst->f32_equal += bits::bf16_rne(float(ref32.output[row * dim + h * kD + v])) == bits16;
        }
        if (bad && failures++ < 5) {
          ADD_FAILURE() << "output row " << row << " head " << h << " value " << v << (padding ? " (padding)" : "")
                        << ": gpu " << got << " (0x" << std::hex << bits16 << std::dec << ") reference " << want;
        }
      }
    }
    for (int64_t col = dim; col < d.output_stride; ++col) {
      if (gpu.output[row * d.output_stride + col] != 0xffff && failures++ < 5) {
        ADD_FAILURE() << "output row " << row << " column " << col << " beyond the view was written";
      }
    }
  }

  // ---- state: written slots within tolerance; every other byte unchanged.
  const std::vector<bool> written = d.written_state_slots(c.records);
  for (int64_t s = 0; s < d.state_slots; ++s) {
    const int64_t base = s * d.state_slot_stride;
    if (!written[size_t(s)]) {
      EXPECT_TRUE(same_bytes(gpu.state.data() + base, d.state.data() + base, d.state_slot_stride))
          << "state slot " << s << " must be untouched";
      for (int64_t i = 0; i < d.state_slot_stride; ++i) {  // the reference agrees on the write set
        if (ref.state[base + i] != double(d.state[base + i])) {
          ADD_FAILURE() << "reference changed slot " << s << " that the semantics leave untouched";
          break;
        }
      }
      continue;
    }
    for (int h = 0; h < heads; ++h) {
      double peak = 0, err = 0;
      for (int64_t i = 0; i < kHeadState; ++i) {
        const int64_t at = base + h * kHeadState + i;
        peak = std::max(peak, std::fabs(ref.state[at]));
        const double e = std::fabs(double(gpu.state[at]) - ref.state[at]);
        err = std::isnan(e) ? INFINITY : std::max(err, e);
      }
      const double rel = err / peak;
      worst->state = std::max(worst->state, rel);
      EXPECT_LE(rel, kStateTolerance) << "state slot " << s << " head " << h;
    }
    const int64_t tail = heads * kHeadState;
    EXPECT_TRUE(same_bytes(gpu.state.data() + base + tail, d.state.data() + base + tail, d.state_slot_stride - tail))
        << "state slot " << s << ": bytes past the heads were written";
  }

  // ---- conv state: every element exact (taps are copies of BF16 values).
  failures = 0;
  for (int64_t i = 0; i < d.conv_state_elements(); ++i) {
    const double got = d.conv_state_value(gpu.conv_state, i);
    if (got != ref.conv_state[i] && failures++ < 5) {
      ADD_FAILURE() << "conv state element " << i << ": gpu " << got << " reference " << ref.conv_state[i]
                    << " initial " << d.conv_state_value(d.conv_state, i);
    }
  }

  // ---- records: written blocks within tolerance, untouched ones still poison.
  if (!c.records) return;
  failures = 0;
  const int64_t blocks = d.record_slots * heads * q;
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const bool untouched = std::isnan(ref.record_correction[blk * kD]);
    double peak = 0, err = 0;
    for (int v = 0; v < kD; ++v) {
      const float got = gpu.correction[blk * kD + v];
      if (untouched) {
        uint32_t u;
        std::memcpy(&u, &got, 4);
        if (u != 0xffffffffu && failures++ < 5) ADD_FAILURE() << "correction block " << blk << " written";
        continue;
      }
      peak = std::max(peak, std::fabs(ref.record_correction[blk * kD + v]));
      const double e = std::fabs(double(got) - ref.record_correction[blk * kD + v]);
      err = std::isnan(e) ? INFINITY : std::max(err, e);
    }
    if (!untouched) {
      worst->correction = std::max(worst->correction, err / peak);
      EXPECT_LE(err / peak, kCorrectionTolerance) << "correction block " << blk;
    }
    for (int i = 0; i < 2 * kD; ++i) {
      const uint16_t got = gpu.key_gate[blk * 2 * kD + i];
      const double want = ref.record_key_gate[blk * 2 * kD + i];
      const bool bad = untouched ? got != 0xffff
                                 : !(std::fabs(bf16f(got) - want) <= kKeyGateRelative * std::fabs(want) + kKeyGateAbsolute);
      if (bad && failures++ < 5) {
        ADD_FAILURE() << "key_gate block " << blk << " element " << i << ": gpu " << bf16f(got) << " reference "
                      << want;
      }
    }
  }
}

struct NamedCase {
  const char* name;
  KdaCaseConfig config;
};

std::vector<NamedCase> reference_cases() {
  std::vector<NamedCase> cases;
  auto add = [&](const char* name, auto&& change) {
    KdaCaseConfig c;
    change(c);
    cases.push_back({name, c});
  };
  // q = 1: gate modes, raw_gate, bias, both weight and conv-state layouts and dtypes.
  add("q1 h3 one-chain", [](KdaCaseConfig& c) { c.batch = 9; c.heads = 3; });
  add("q1 h12 four-chains bias bf16-weight tap-major fp32-conv", [](KdaCaseConfig& c) {
    c.batch = 5; c.heads = 12; c.gate_mode = KdaGateMode::kFourChains; c.conv_bias = true;
    c.conv_weight_dtype = DType::kBf16; c.conv_weight_channel_major = false;
    c.conv_state_dtype = DType::kFp32; c.conv_state_tap_major = true;
  });
  add("q1 h3 fma-tree tap-major k3-weight", [](KdaCaseConfig& c) {
    c.batch = 7; c.heads = 3; c.gate_mode = KdaGateMode::kFmaTree; c.conv_state_tap_major = true;
    c.conv_weight_k3_layout = true;
  });
  add("q1 h12 raw-gate bias fp32-conv", [](KdaCaseConfig& c) {
    c.batch = 4; c.heads = 12; c.raw_gate = true; c.conv_bias = true; c.conv_state_dtype = DType::kFp32;
  });
  // q > 1: accepted counts, token counts, skipped write slots, records direct / deferred.
  add("q2 h3 one-chain", [](KdaCaseConfig& c) { c.batch = 8; c.heads = 3; c.tokens = 2; });
  add("q3 h12 bf16-weight bias deferred-records", [](KdaCaseConfig& c) {
    c.batch = 4; c.heads = 12; c.tokens = 3; c.conv_weight_dtype = DType::kBf16; c.conv_bias = true;
    c.records = true; c.deferred_records = true;
  });
  add("q4 h12 four-chains counts records", [](KdaCaseConfig& c) {
    c.batch = 5; c.heads = 12; c.tokens = 4; c.gate_mode = KdaGateMode::kFourChains;
    c.token_counts = true; c.records = true;
  });
  add("q5 h3 four-chains tap-major k3-weight", [](KdaCaseConfig& c) {
    c.batch = 6; c.heads = 3; c.tokens = 5; c.gate_mode = KdaGateMode::kFourChains; c.conv_state_tap_major = true;
    c.conv_weight_k3_layout = true;
  });
  add("q6 h12 raw-gate records", [](KdaCaseConfig& c) {
    c.batch = 3; c.heads = 12; c.tokens = 6; c.raw_gate = true; c.records = true;
  });
  add("q7 h3 counts tap-major fp32-conv", [](KdaCaseConfig& c) {
    c.batch = 8; c.heads = 3; c.tokens = 7; c.token_counts = true; c.conv_state_tap_major = true;
    c.conv_state_dtype = DType::kFp32;
  });
  add("q8 h3 raw-gate counts deferred-records tap-major fp32-conv", [](KdaCaseConfig& c) {
    c.batch = 9; c.heads = 3; c.tokens = 8; c.raw_gate = true; c.token_counts = true; c.records = true;
    c.deferred_records = true; c.conv_state_tap_major = true; c.conv_state_dtype = DType::kFp32;
  });
  add("q8 h12 one-chain bias", [](KdaCaseConfig& c) {
    c.batch = 3; c.heads = 12; c.tokens = 8; c.conv_bias = true;
  });
  // BF16 state: q = 1, a verify with per-token writes, records.
  add("q1 h12 four-chains bf16-state", [](KdaCaseConfig& c) {
    c.batch = 6; c.heads = 12; c.gate_mode = KdaGateMode::kFourChains; c.state_dtype = DType::kBf16;
  });
  add("q4 h3 counts bf16-state", [](KdaCaseConfig& c) {
    c.batch = 7; c.heads = 3; c.tokens = 4; c.token_counts = true; c.state_dtype = DType::kBf16;
  });
  add("q6 h12 deferred-records bf16-state", [](KdaCaseConfig& c) {
    c.batch = 3; c.heads = 12; c.tokens = 6; c.records = true; c.deferred_records = true;
    c.state_dtype = DType::kBf16;
  });
  return cases;
}

// Composed path vs the float64 reference for every case; poisoned outputs all written;
// untouched state slots, records and row padding byte-identical; two runs bitwise equal.
TEST(KdaComposed, MatchesFloat64Reference) {
  FS_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  Worst worst;
  int index = 0;
  for (const NamedCase& nc : reference_cases()) {
    SCOPED_TRACE(std::string(nc.name) + ", seed " + std::to_string(seed + index));
    KdaTestData d(nc.config, seed + index++);
    d.upload();
    ASSERT_TRUE(run_composed(d.params()));
    const StepResult first = download(d);
    Worst w;
    expect_matches_reference(d, first, &w);
    const double f32_equal = w.f32_total ? double(w.f32_equal) / double(w.f32_total) : 1.0;
    std::printf("[ kda      ] %-58s output %.3e state %.3e correction %.3e f32-equal %.4f\n", nc.name, w.output,
                w.state, w.correction, f32_equal);
    EXPECT_GE(f32_equal, kMinFloat32Equal) << "outputs bitwise equal to the float32 reference";
    worst.output = std::max(worst.output, w.output);
    worst.state = std::max(worst.state, w.state);
    worst.correction = std::max(worst.correction, w.correction);

    d.upload();  // the same inputs again: bitwise the same results
    ASSERT_TRUE(run_composed(d.params()));
    const StepResult second = download(d);
    EXPECT_EQ(first_difference(first.output, second.output), -1) << "output differs run to run";
    EXPECT_EQ(first_difference(first.state, second.state), -1) << "state differs run to run";
    EXPECT_EQ(first_difference(first.conv_state, second.conv_state), -1) << "conv state differs run to run";
    EXPECT_EQ(first_difference(first.correction, second.correction), -1) << "records differ run to run";
    EXPECT_EQ(first_difference(first.key_gate, second.key_gate), -1) << "records differ run to run";
    if (HasFatalFailure()) return;
  }
  std::printf("[ kda      ] worst: output %.3e (tol %.2f) state %.3e (tol %.3f) correction %.3e (tol %.3f)\n",
              worst.output, kOutputTolerance, worst.state, kStateTolerance, worst.correction, kCorrectionTolerance);
}

// State of head h in slot s of a downloaded state buffer.
const float* head_state(const KdaTestData& d, const std::vector<float>& state, int64_t slot, int h) {
  return state.data() + slot * d.state_slot_stride + h * kHeadState;
}

// verify(records) -> commit(m) leaves in the checkpoint slot exactly (bitwise) the state the
// non-record verify writes after token m - 1 (m = 0: unchanged); nothing else changes; the
// record verify's outputs and conv state equal the non-record verify's; the committed state
// is within the state tolerance of the float64 reference commit.
struct CommitShape {
  int tokens, heads, batch;
  bool deferred, counts, raw_gate;
  KdaGateMode mode;
  bool bf16_state = false;
};

void expect_commit_equals_non_record_verify(std::initializer_list<CommitShape> shapes) {
  const uint64_t seed = fresh_seed();
  int index = 0;
  for (const CommitShape& s : shapes) {
    KdaCaseConfig c;
    c.tokens = s.tokens; c.heads = s.heads; c.batch = s.batch; c.records = true;
    c.deferred_records = s.deferred; c.token_counts = s.counts; c.raw_gate = s.raw_gate; c.gate_mode = s.mode;
    c.skip_some_writes = false;
    c.state_dtype = s.bf16_state ? DType::kBf16 : DType::kFp32;
    SCOPED_TRACE("q " + std::to_string(s.tokens) + " heads " + std::to_string(s.heads) +
                 (s.bf16_state ? ", BF16 state" : "") + ", seed " + std::to_string(seed + index));
    KdaTestData d(c, seed + index++);
    const int q = c.tokens;

    d.upload();
    ASSERT_TRUE(run_composed(without_records(d.params())));
    const StepResult plain = download(d);

    d.upload();
    ASSERT_TRUE(run_composed(d.params()));
    const StepResult recorded = download(d);
    ASSERT_TRUE(run_commit(d.commit_params()));
    const std::vector<float> committed = d.download_state();

    bool same_activity = true;
    std::vector<bool> checkpoint(size_t(d.state_slots), false);
    for (int b = 0; b < c.batch; ++b) {
      const auto with = d.request(b, true), without = d.request(b, false);
      same_activity &= with.active == without.active;
      if (!with.active) continue;
      for (int64_t i = 0; i < int64_t(q) * d.output_stride; ++i) {  // this request's output rows
        const int64_t at = int64_t(b) * q * d.output_stride + i;
        if (plain.output[at] != recorded.output[at]) {
          ADD_FAILURE() << "request " << b << ": record verify output differs at element " << i;
          break;
        }
      }
      const int m = std::clamp(d.commit_accepted[b], 0, q);
      const int32_t slot = d.commit_slots[b];
      EXPECT_EQ(slot, with.read_slot);
      checkpoint[size_t(slot)] = true;
      for (int h = 0; h < c.heads; ++h) {
        const float* want = m == 0 ? head_state(d, d.state, slot, h) : head_state(d, plain.state, d.slot(b, m - 1), h);
        EXPECT_TRUE(same_bytes(head_state(d, committed, slot, h), want, kHeadState))
            << "request " << b << " head " << h << ": commit of " << m << " tokens (n = " << with.count
            << ") differs from the verify's state after token " << m - 1;
      }
    }
    if (same_activity) {
      EXPECT_EQ(first_difference(plain.conv_state, recorded.conv_state), -1) << "conv state differs with records";
    }
    for (int64_t s = 0; s < d.state_slots; ++s) {
      if (checkpoint[size_t(s)]) continue;
      EXPECT_TRUE(same_bytes(committed.data() + s * d.state_slot_stride, d.state.data() + s * d.state_slot_stride,
                             d.state_slot_stride))
          << "slot " << s << " is not a checkpoint and must be untouched by the record verify and the commit";
    }

    // Against the float64 reference commit (of the float64 reference's records).
    const reference::KdaResult ref_verify = reference::kda_decode(d.problem(), Precision::kFloat64);
    const std::vector<double> ref_commit = reference::kda_commit(d.commit_problem(ref_verify), Precision::kFloat64);
    for (int64_t s = 0; s < d.state_slots; ++s) {
      if (!checkpoint[size_t(s)]) continue;
      for (int h = 0; h < c.heads; ++h) {
        const int64_t base = s * d.state_slot_stride + h * kHeadState;
        double peak = 0, err = 0;
        for (int64_t i = 0; i < kHeadState; ++i) {
          peak = std::max(peak, std::fabs(ref_commit[base + i]));
          err = std::max(err, std::fabs(double(committed[base + i]) - ref_commit[base + i]));
        }
        EXPECT_LE(err / peak, kStateTolerance) << "committed slot " << s << " head " << h;
      }
    }
    if (::testing::Test::HasFatalFailure()) return;
  }
}

TEST(KdaCommit, EqualsNonRecordVerifyBitwise) {
  FS_REQUIRE_GPU();
  expect_commit_equals_non_record_verify({{2, 3, 6, true, false, false, KdaGateMode::kOneChain},
                                          {4, 12, 4, false, true, false, KdaGateMode::kFourChains},
                                          {8, 3, 7, true, true, true, KdaGateMode::kOneChain},
                                          {5, 12, 3, false, false, false, KdaGateMode::kOneChain},
                                          {4, 12, 5, true, true, false, KdaGateMode::kFourChains, true},
                                          {8, 3, 4, false, false, true, KdaGateMode::kOneChain, true}});
}

// One small verify -> commit, for compute-sanitizer (the commit kernel is a production op).
TEST(KdaCommit, SmallEqualsNonRecordVerifyBitwise) {
  FS_REQUIRE_GPU();
  expect_commit_equals_non_record_verify({{3, 3, 3, true, true, false, KdaGateMode::kOneChain},
                                          {2, 3, 2, false, true, false, KdaGateMode::kOneChain, true}});
}

// q = 1 parameters that run token t of a verify's data as one decode step: row b of the
// step is row b * q + t of the verify (strides times q), slot = slots[b, 0] (A = 1).
KdaDecodeParams single_step(const KdaTestData& d, const DeviceBuffer<int32_t>& step_slots, int t) {
  KdaDecodeParams p = without_records(d.params());
  const int q = d.tokens();
  auto advance = [&](auto* ptr, int64_t& stride) {
    if (ptr == nullptr) return ptr;
    auto* moved = ptr + t * stride;
    stride *= q;
    return moved;
  };
  p.tokens = 1;
  p.x = advance(p.x, p.x_stride);
  p.f_a = advance(p.f_a, p.f_a_stride);
  p.raw_gate = advance(p.raw_gate, p.raw_gate_stride);
  p.raw_beta = advance(p.raw_beta, p.raw_beta_stride);
  p.output_gate = advance(p.output_gate, p.output_gate_stride);
  p.output = advance(p.output, p.output_stride);
  p.slots = step_slots.get();
  p.slots_stride = 0;
  p.accepted = nullptr;
  p.token_counts = nullptr;
  return p;
}

// A q-token verify (accepted = 1) equals q sequential q = 1 steps bitwise: every output row,
// and the state after token t in slots[b, t] equals the step's state after step t (the MMA
// column of a token does not change raw_g). verify(records) -> commit(m) equals m steps.
TEST(KdaCommit, VerifyEqualsSequentialStepsBitwise) {
  FS_REQUIRE_GPU();
  const uint64_t seed = fresh_seed();
  struct Shape { int tokens, heads, batch; bool raw_gate; KdaGateMode mode; bool tap_major; };
  const Shape shapes[] = {{4, 3, 5, false, KdaGateMode::kOneChain, false},
                          {8, 12, 3, false, KdaGateMode::kFourChains, true},
                          {3, 3, 4, true, KdaGateMode::kOneChain, true}};
  int index = 0;
  for (const Shape& s : shapes) {
    KdaCaseConfig c;
    c.tokens = s.tokens; c.heads = s.heads; c.batch = s.batch; c.raw_gate = s.raw_gate; c.gate_mode = s.mode;
    c.conv_state_tap_major = s.tap_major; c.records = true; c.padding_requests = false;
    c.skip_some_writes = false; c.fixed_accepted = 1;
    SCOPED_TRACE("q " + std::to_string(s.tokens) + " heads " + std::to_string(s.heads) + ", seed " +
                 std::to_string(seed + index));
    KdaTestData d(c, seed + index++);
    const int q = c.tokens;
    std::vector<int32_t> first_slots(c.batch);
    for (int b = 0; b < c.batch; ++b) first_slots[b] = d.slot(b, 0);
    DeviceBuffer<int32_t> step_slots(first_slots.size());
    step_slots.upload(first_slots);

    d.upload();
    ASSERT_TRUE(run_composed(without_records(d.params())));
    const StepResult verify = download(d);

    d.upload();
    std::vector<std::vector<float>> after_step;
    for (int t = 0; t < q; ++t) {
      ASSERT_TRUE(run_composed(single_step(d, step_slots, t)));
      after_step.push_back(d.download_state());
    }
    const std::vector<uint16_t> step_output = d.download_output();
    const int64_t diff = first_difference(verify.output, step_output);
    EXPECT_EQ(diff, -1) << "output element " << diff << " (row " << (diff < 0 ? 0 : diff / d.output_stride)
                        << "): verify " << bf16f(verify.output[std::max<int64_t>(diff, 0)]) << " steps "
                        << bf16f(step_output[std::max<int64_t>(diff, 0)]);
    for (int b = 0; b < c.batch; ++b) {
      for (int t = 0; t < q; ++t) {
        for (int h = 0; h < c.heads; ++h) {
          EXPECT_TRUE(same_bytes(head_state(d, verify.state, d.slot(b, t), h),
                                 head_state(d, after_step[t], first_slots[b], h), kHeadState))
              << "request " << b << " head " << h << ": verify state after token " << t << " != state after step " << t;
        }
      }
    }

    d.upload();
    ASSERT_TRUE(run_composed(d.params()));
    ASSERT_TRUE(run_commit(d.commit_params()));
    const std::vector<float> committed = d.download_state();
    for (int b = 0; b < c.batch; ++b) {
      const int m = std::clamp(d.commit_accepted[b], 0, q);
      for (int h = 0; h < c.heads; ++h) {
        const float* want = m == 0 ? head_state(d, d.state, first_slots[b], h)
                                   : head_state(d, after_step[m - 1], first_slots[b], h);
        EXPECT_TRUE(same_bytes(head_state(d, committed, first_slots[b], h), want, kHeadState))
            << "request " << b << " head " << h << ": commit of " << m << " tokens != " << m << " sequential steps";
      }
    }
    if (HasFatalFailure()) return;
  }
}

// Bad calls fail with a clear Status before any kernel runs; an empty batch is a no-op.
TEST(KdaComposed, RejectsBadCalls) {
  FS_REQUIRE_GPU();
  KdaCaseConfig c;
  c.batch = 2;
  KdaTestData d(c, fresh_seed());
  d.upload();
  KdaDecodeParams p = d.params();
  Result r = composed::launch(p, nullptr, nullptr);
  EXPECT_EQ(r.status(), Status::kNullPointer) << r.detail();
  EXPECT_NE(std::string(r.detail()).find("workspace"), std::string::npos) << r.detail();
  p.lower_bound = 0.0f;
  DeviceBuffer<uint8_t> workspace(size_t(composed::workspace_bytes(p)));
  r = composed::launch(p, workspace.get(), nullptr);
  EXPECT_EQ(r.status(), Status::kInvalidValue) << r.detail();
  EXPECT_NE(std::string(r.detail()).find("lower_bound = 0"), std::string::npos) << r.detail();
  p = d.params();
  p.batch = 0;
  EXPECT_TRUE(composed::launch(p, nullptr, nullptr).ok());
  EXPECT_EQ(composed::workspace_bytes(p), 0);
  KdaCommitParams cp;
  r = launch(cp, LaunchOptions{}, nullptr);
  EXPECT_FALSE(r.ok());
}

// Graph capture: the composed path and the commit (with PDL) captured into CUDA graphs and
// replayed give bitwise the results of direct launches.
TEST(KdaCommit, GraphCaptureWithPdlMatchesDirectLaunch) {
  FS_REQUIRE_GPU();
  KdaCaseConfig c;
  c.batch = 6; c.heads = 3; c.tokens = 4; c.records = true; c.token_counts = true;
  KdaTestData d(c, fresh_seed());
  d.upload();
  ASSERT_TRUE(run_composed(d.params()));
  ASSERT_TRUE(run_commit(d.commit_params()));
  const StepResult direct = download(d);

  d.upload();
  cudaStream_t stream;
  FS_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  DeviceBuffer<uint8_t> workspace(size_t(composed::workspace_bytes(d.params())));
  LaunchOptions pdl;
  pdl.pdl = true;
  CapturedGraph graph;
  ASSERT_TRUE(graph.capture(
      stream,
      [&] {
        const Result verify = composed::launch(d.params(), workspace.get(), stream);
        return verify.ok() ? launch(d.commit_params(), pdl, stream) : verify;
      },
      cudaStreamCaptureModeGlobal));
  FS_CUDA_OK(graph.replay(stream));
  FS_CUDA_OK(cudaStreamSynchronize(stream));
  const StepResult replayed = download(d);
  EXPECT_EQ(first_difference(direct.output, replayed.output), -1);
  EXPECT_EQ(first_difference(direct.state, replayed.state), -1);
  EXPECT_EQ(first_difference(direct.conv_state, replayed.conv_state), -1);
  EXPECT_EQ(first_difference(direct.correction, replayed.correction), -1);
  EXPECT_EQ(first_difference(direct.key_gate, replayed.key_gate), -1);
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace fusedstep::testing
