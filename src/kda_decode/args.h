// SPDX-License-Identifier: Apache-2.0
// KDA decode / verify: the fused kernels' arguments (filled by launch.cc from the params)
// and their static shared memory. Host and device code.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kda_decode/config.h"

namespace fusedstep::kda {

// Where raw_g comes from (a runtime switch inside the gate warp).
enum GateSource : int { kGateMma = 0, kGateFma = 1, kGateGiven = 2 };

struct FusedArgs {
  const __nv_bfloat16* x;
  int64_t x_stride;
  const __nv_bfloat16* f_a;
  int64_t f_a_stride;
  const __nv_bfloat16* raw_gate;
  int64_t raw_gate_stride;
  const __nv_bfloat16* raw_beta;
  int64_t raw_beta_stride;
  const __nv_bfloat16* output_gate;
  int64_t output_gate_stride;
  const void* conv_weight;
  int64_t conv_weight_channel_stride;
  int64_t conv_weight_tap_stride;
  int64_t conv_weight_section_stride;  // resolved (never 0)
  const float* conv_bias;
  const __nv_bfloat16* f_b_weight;
  const float* a_log;
  const float* dt_bias;
  const void* norm_weight;
  void* conv_state;
  int64_t conv_state_slot_stride;
  int64_t conv_state_channel_stride;
  int64_t conv_state_tap_stride;
  int64_t conv_state_slots;
  void* state;          // FP32 or BF16: the configuration's State
  int64_t state_slot_stride;
  int64_t state_slots;
  const int32_t* slots;
  __nv_bfloat16* output;
  int64_t output_stride;
  float lower_bound;
  float q_scale;
  float norm_eps;
  int heads;
  int gate_source;      // GateSource
  int four_chains;      // kGateMma: KdaGateMode::kFourChains
  int early;            // 0-3 (the staging itself is the configuration's kStaged)
  int evict_first;      // staged state: L2 evict-first loads and streaming stores
  int trigger_at_entry; // release dependents at entry (q = 1, batch 1)
  int conv_weight_bf16;
  int conv_state_bf16;
  int norm_weight_bf16;
};

struct alignas(16) SharedCore {
  float q[kHead];           // post-conv q, k (BF16 values) of the head
  float k[kHead];
  float decay[kHead];       // per key; filled by the gate warps of the cluster
  float v[kHead];           // post-conv v of the CTA's rows
  float o[kHead];           // owner: BF16-rounded outputs pushed by the cluster
  float gate_local[kHead];  // gate warp: its decays before the multicast
  float sums[8];            // warp sums of q^2 (0-3) and k^2 (4-7)
  uint64_t gate_bar;        // 512 bytes of decays
  uint64_t out_bar;         // owner: 512 bytes of outputs
  uint64_t state_bar[4];    // staged state rows, per copy chunk
};

struct VerifyArgs {
  FusedArgs base;
  int tokens;                      // q
  int64_t slots_stride;
  const int32_t* accepted;
  const int32_t* token_counts;     // or null: n = q
  float* record_correction;        // null: no records (state slots written)
  __nv_bfloat16* record_key_gate;
  const int32_t* record_rows;      // or null: record row = b
  int64_t record_slots;
};

template <int kTokens>
struct alignas(16) SharedVerify {
  // The gate MMA's eight columns are eight tokens: a column t >= n stores its decays to
  // row kDumpRow, which no token < n reads (kTokens = 8: n <= 7 then).
  static constexpr int kGateRows = kTokens < 8 ? kTokens + 1 : kTokens;
  static constexpr int kDumpRow = kGateRows - 1;
  float q[kTokens][kHead];              // post-conv q, k (BF16 values) per token
  float k[kTokens][kHead];
  float v[kTokens][kHead];              // post-conv v of the CTA's rows per token
  float decay[kGateRows][kHead];        // per token and key; from the cluster's gate warps
  float o[kTokens][kHead];              // owner: BF16-rounded outputs per token
  float gate_local[kGateRows][kHead];   // gate warp: its decays before the multicast
  float sums[kTokens][8];               // per token: warp sums of q^2 (0-3), k^2 (4-7)
  float beta[kTokens];                  // per token: sigmoid(raw_beta)
  int32_t write_slot[kTokens];          // per token: slots[b, t] (the state write rule)
  float out_gate[kTokens][kHead];       // owner: sigmoid(output gate) per token
  float norm_w[kHead];                  // owner: the norm weight (not held in registers)
  float window[2][kTokens + 2][kHead];  // clusters: CTA 0's new q/k conv taps 0 .. n + 1
  float dt[kHead];                      // gate warp: dt_bias of the CTA's keys
  uint64_t gate_bar[kTokens];
  uint64_t out_bar[kTokens];
  uint64_t state_bar[2];                // staged state (C = 1, early 2): the two chunk buffers
};

}  // namespace fusedstep::kda
