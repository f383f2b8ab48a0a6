// SPDX-License-Identifier: Apache-2.0
// CPU reference of the KDA decode / verify step and the RecoverSSM commit
// (docs/numerics.md, "KDA decode"). Inputs are never modified: updated caches and
// records come back in the result.
#pragma once

#include <cstdint>
#include <vector>

#include "fusedstep_reference/common.h"

namespace fusedstep::reference {

enum class KdaGateMode { kOneChain = 0, kFourChains = 1, kFmaTree = 2 };

// Host inputs with the same layouts and strides as fusedstep::KdaDecodeParams
// (BF16 values as 16-bit patterns; strides in elements).
struct KdaProblem {
  int batch = 0, heads = 0, tokens = 1;
  const uint16_t* x = nullptr;            int64_t x_stride = 0;            // [rows, 3 dim]
  const uint16_t* f_a = nullptr;          int64_t f_a_stride = 0;          // [rows, 128] or null
  const uint16_t* raw_gate = nullptr;     int64_t raw_gate_stride = 0;     // [rows, dim] or null
  const uint16_t* raw_beta = nullptr;     int64_t raw_beta_stride = 0;     // [rows, heads]
  const uint16_t* output_gate = nullptr;  int64_t output_gate_stride = 0;  // [rows, dim]
  const void* conv_weight = nullptr;      bool conv_weight_bf16 = false;
  int64_t conv_weight_channel_stride = 0, conv_weight_tap_stride = 0;
  const float* conv_bias = nullptr;                                        // [3 dim] or null
  const uint16_t* f_b_weight = nullptr;                                    // [dim, 128]
  const float* a_log = nullptr;                                            // [heads]
  const float* dt_bias = nullptr;                                          // [dim]
  const float* norm_weight = nullptr;                                      // [128]
  const void* conv_state = nullptr;       bool conv_state_bf16 = true;
  int64_t conv_state_slot_stride = 0, conv_state_channel_stride = 0, conv_state_tap_stride = 0;
  int64_t conv_state_slots = 0;           // buffer holds conv_state_slots * slot stride elements
  const void* state = nullptr;            bool state_bf16 = false;         // FP32, or BF16 bit patterns
  int64_t state_slot_stride = 0;
  int64_t state_slots = 0;                // buffer holds state_slots * slot stride elements
  const int32_t* slots = nullptr;         int64_t slots_stride = 0;        // [batch] or [batch, >= q]
  const int32_t* accepted = nullptr;                                       // [batch] (q > 1)
  const int32_t* token_counts = nullptr;                                   // [batch] or null
  bool records = false;                   // RecoverSSM record mode
  const int32_t* record_rows = nullptr;   int64_t record_slots = 0;
  float lower_bound = -5.0f, q_scale = 0.08838834764831845f, norm_eps = 1e-5f;
  KdaGateMode gate_mode = KdaGateMode::kOneChain;
};

// A BF16 state (state_bf16) is read exactly (widened to the precision's type) and
// every state the call stores is rounded to BF16 once, round to nearest even
// (kda_state_bf16): after the step at q = 1, the copy written to slots[b, t] after each
// verify token (the recurrence carries the unrounded state to the next token), the
// commit's result. Everything else is as with an FP32 state.
//
// q = 1 is the verify with accepted = 1 and one token (slots[b], slots_stride,
// accepted and token_counts are not read). Records with q = 1 follow the same rules
// as with q > 1 (the GPU API accepts records for q > 1 only).
struct KdaResult {
  std::vector<double> output;             // [rows, dim]; padding rows 0
  std::vector<double> state;              // whole state buffer after the step (slot stride kept;
                                          //   BF16 state: BF16 values, unwritten elements exact)
  std::vector<double> conv_state;         // whole conv-state buffer after the step
  std::vector<double> record_correction;  // [record_slots, heads, q, 128] (records only; untouched = NaN)
  std::vector<double> record_key_gate;    // [record_slots, heads, q, 256] (records only; untouched = NaN)
  std::vector<double> raw_g;              // [rows, dim] gate projection (0 for padding)
  std::vector<double> conv_out;           // [rows, 3 dim] q|k|v after conv + SiLU (+ BF16 in
                                          //   float32 mode); 0 for padding rows
};

KdaResult kda_decode(const KdaProblem& problem, Precision precision);

// RecoverSSM commit (fusedstep::KdaCommitParams on the host). Records as the verify
// returned them (KdaResult::record_*; in float32 mode they hold FP32 / BF16 values).
struct KdaCommitProblem {
  int batch = 0, heads = 0, tokens = 0;   // tokens = q of the verify that wrote the records
  const void* state = nullptr;            bool state_bf16 = false;         // FP32, or BF16 bit patterns
  int64_t state_slot_stride = 0;
  int64_t state_slots = 0;
  const int32_t* slots = nullptr;         int64_t slots_stride = 1;        // checkpoint slot of b: slots[b * slots_stride]
  const int32_t* accepted = nullptr;                                       // [batch]
  const double* record_correction = nullptr;                               // [record_slots, heads, q, 128]
  const double* record_key_gate = nullptr;                                 // [record_slots, heads, q, 256]
  const int32_t* record_rows = nullptr;   int64_t record_slots = 0;        // row of b: record_rows[b] or b
  const float* a_log = nullptr;                                            // [heads]
  const float* dt_bias = nullptr;                                          // [dim]
  float lower_bound = -5.0f;
};

// Folds the first n = clamp(accepted[b], 0, q) recorded tokens into each checkpoint
// state; skips b when its slot is <= 0 or >= state_slots or its record row is out of
// range. Returns the whole state buffer after the commit (BF16 state: the checkpoint
// read exactly, the folded result rounded to BF16 once when stored).
std::vector<double> kda_commit(const KdaCommitProblem& commit, Precision precision);

// Convenience: the commit of `verify`'s records with the verify's own inputs: checkpoint
// slot slots[b, 0] (slots[b] when q = 1), n = clamp(commit_accepted[b], 0, q) with
// commit_accepted defaulting to problem.accepted, records and record_rows of `problem`.
std::vector<double> kda_commit(const KdaProblem& problem, const KdaResult& verify,
                               Precision precision, const int32_t* commit_accepted = nullptr);

// Single stages of the contract, for hand-computed checks. float32 rounds the inputs to
// float and evaluates with the contract's FP32 rounding points; float64 in double.
double kda_silu(double acc, Precision precision);      // div(acc, 1 + exp(-acc)), not BF16-rounded
double kda_sigmoid(double x, Precision precision);     // div(1, 1 + exp(-x))
double kda_decay(double a_log, double raw_g, double dt_bias, double lower_bound,
                 Precision precision);                 // exp(lb * sigmoid(exp(a_log) * (raw_g + dt_bias)))
// out[i] = (x[i] * recip(sqrt(sumsq + 1e-6))) * scale over 128 elements, the sum of
// squares reduced by the contract's warp tree.
void kda_l2_normalize(const double* x, double scale, double* out, Precision precision);
// The contract's 128-key dot product (fma groups of four, pairwise tree ^16..^1).
double kda_dot128(const double* s, const double* u, Precision precision);
// A stored BF16 state value, round to nearest even: float32 rounds v to float, then
// to BF16 (cvt.rn.bf16.f32); float64 rounds the double directly to BF16 in one
// rounding (never through float; overflow gives +-Inf, BF16 subnormals are kept).
double kda_state_bf16(double v, Precision precision);

}  // namespace fusedstep::reference
