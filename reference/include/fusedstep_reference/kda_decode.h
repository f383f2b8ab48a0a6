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
  const float* state = nullptr;           int64_t state_slot_stride = 0;
  int64_t state_slots = 0;
  const int32_t* slots = nullptr;         int64_t slots_stride = 0;        // [batch] or [batch, >= q]
  const int32_t* accepted = nullptr;                                       // [batch] (q > 1)
  const int32_t* token_counts = nullptr;                                   // [batch] or null
  bool records = false;                   // RecoverSSM record mode (q > 1)
  const int32_t* record_rows = nullptr;   int64_t record_slots = 0;
  float lower_bound = -5.0f, q_scale = 0.08838834764831845f, norm_eps = 1e-5f;
  KdaGateMode gate_mode = KdaGateMode::kOneChain;
};

struct KdaResult {
  std::vector<double> output;             // [rows, dim]; padding rows 0
  std::vector<double> state;              // whole state buffer after the step (slot stride kept)
  std::vector<double> conv_state;         // whole conv-state buffer after the step
  std::vector<double> record_correction;  // [record_slots, heads, q, 128] (records only; untouched = NaN)
  std::vector<double> record_key_gate;    // [record_slots, heads, q, 256] (records only; untouched = NaN)
  std::vector<double> raw_g;              // [rows, dim] gate projection (0 for padding)
};

KdaResult kda_decode(const KdaProblem& problem, Precision precision);

// RecoverSSM commit of the records `verify` produced: fold the first
// clamp(accepted[b], 0, q) tokens into each checkpoint state (problem's slots[b, 0]).
// Returns the whole state buffer after the commit.
std::vector<double> kda_commit(const KdaProblem& problem, const KdaResult& verify,
                               Precision precision);

}  // namespace fusedstep::reference
