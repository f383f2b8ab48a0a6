// SPDX-License-Identifier: Apache-2.0
// fusedstep: the Kimi K3 KDA (Kimi Delta Attention) decode / verify step, one launch
// per layer and step, and the RecoverSSM commit.
//
// Per request b, head h (128 keys, 128 values; dim = heads * 128), token t (the
// contract, instruction by instruction, is docs/numerics.md section "KDA decode"):
//   q|k|v  = bf16(silu(causal_conv4(x, conv_state, conv_weight, conv_bias)))
//   q_n    = (q / |q|) * q_scale,  k_n = k / |k|        (|.| = sqrt(sum^2 + 1e-6))
//   raw_g  = bf16(f_b_weight . f_a)   (or the caller's raw_gate)
//   decay  = exp(lower_bound * sigmoid(exp(a_log[h]) * (raw_g + dt_bias)))   per key
//   beta   = sigmoid(raw_beta)
//   S[v][k] *= decay[k];  v_new = (v - S.k_n) * beta;  S += k_n v_new^T;  o = bf16(S.q_n)
//   out    = bf16(((o * rstd(o)) * norm_weight) * sigmoid(output_gate))
// State S is [slot, head, value, key], FP32 or BF16 (state_dtype): a BF16 state is
// converted exactly to FP32 when loaded, the step runs in FP32, and each stored state is
// rounded to BF16 (nearest even). A slot <= 0 (or >= the slot count) is padding: its
// output rows are zero and no state of any kind is read or written.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "fusedstep/device.h"
#include "fusedstep/status.h"

namespace fusedstep {

inline constexpr int kKdaHeadDim = 128;   // keys = values = 128 per head
inline constexpr int kKdaConvWidth = 4;   // taps of the causal convolution
inline constexpr int kKdaRank = 128;      // rank of the low-rank gate (f_a width)
inline constexpr int kKdaMaxTokens = 8;   // tokens per request in one verify
inline constexpr int kKdaMaxBatch = 65535; // requests per launch

enum class DType : int32_t { kBf16 = 0, kFp32 = 1 };

// Accumulation order of the F_B gate projection (raw_g), see docs/numerics.md.
enum class KdaGateMode : int32_t {
  kOneChain = 0,    // one chain of eight m16n8k16 MMAs
  kFourChains = 1,  // four chains of two MMAs, 0 + (((c0 + c1) + c2) + c3)
  kFmaTree = 2,     // sixteen 8-FMA partials summed in a butterfly (q = 1 only)
};

// The kernel's schedule. 0 (or -1 for `early`) = the default for the batch and heads
// (plan() resolves it). Every schedule produces the same bits. The library builds the
// (cluster, lanes_per_row, staged) configurations the defaults select; plan() rejects
// an explicit schedule that names another, listing the built ones.
struct KdaSchedule {
  int cluster = 0;          // CTAs per head: 1, 2, 4 or 8 built (128 / cluster state rows each)
  int lanes_per_row = 0;    // lanes sharing one state row: 8 or 16
  int early = -1;           // 0-3: loads issued before the PDL wait (2: state staged in
                            //   shared memory; 3: also the gate warp's F_B rows; cluster
                            //   1 always stages, at 1 after the wait). With
                            //   LaunchOptions::pdl, what is read early must not be written
                            //   by the preceding kernel: q = 1 at >= 1 reads slots, the
                            //   conv-state taps and state rows (registers at 1, shared
                            //   memory at >= 2), conv and gate weights, dt_bias, a_log;
                            //   verify at >= 1 reads its request plan (slots row,
                            //   accepted, token_counts, record_rows), conv-state taps and
                            //   (registers) state rows early (docs/integration.md); its
                            //   early 2 stages the state rows in chunks (before the wait
                            //   at cluster >= 4, after it at 1 and 2), early 3 is
                            //   rejected.
  bool evict_first = false; // staged state traffic marked L2 evict-first (early >= 2
                            //   or cluster 1)
};

struct KdaDecodeParams {
  // ---- sizes
  int batch = 0;    // requests B, 0..kKdaMaxBatch (0 is a valid, empty call)
  int heads = 0;    // local heads; dim = heads * 128
  int tokens = 1;   // q: tokens per request, 1-8; rows = batch * tokens, row = b * q + t

  // ---- activations (device pointers; row-strided views into the input projection)
  const __nv_bfloat16* x = nullptr;            // [rows, 3 * dim] packed q | k | v
  int64_t x_stride = 0;                        // elements; >= 3 * dim, multiple of 8
  const __nv_bfloat16* f_a = nullptr;          // [rows, 128] low-rank gate input, or null
  int64_t f_a_stride = 0;                      //   when raw_gate is given
  const __nv_bfloat16* raw_gate = nullptr;     // [rows, dim] precomputed raw_g (F_B applied)
  int64_t raw_gate_stride = 0;                 //   or null when f_a is given
  const __nv_bfloat16* raw_beta = nullptr;     // [rows, heads]
  int64_t raw_beta_stride = 0;                 // >= heads
  const __nv_bfloat16* output_gate = nullptr;  // [rows, dim] g of the gated RMSNorm
  int64_t output_gate_stride = 0;              // >= dim, multiple of 8

  // ---- weights
  const void* conv_weight = nullptr;           // 3 sections (q, k, v) x dim channels x 4 taps,
  DType conv_weight_dtype = DType::kFp32;      //   FP32 or BF16; element of channel c = s * dim + i,
  int64_t conv_weight_channel_stride = 0;      //   tap j: s * section_stride + i * channel_stride
  int64_t conv_weight_tap_stride = 0;          //   + j * tap_stride.
  int64_t conv_weight_section_stride = 0;      //   [3, 4, dim]: section 4 dim, channel 1, tap dim;
                                               //   [3 * dim, 4]: section 4 dim, channel 4, tap 1;
                                               //   0 = dim * channel_stride (the [3 * dim, 4] family)
  const float* conv_bias = nullptr;            // [3 * dim] or null (K3 has none)
  const __nv_bfloat16* f_b_weight = nullptr;   // [dim, 128] row-major (out x in); with f_a
  const float* a_log = nullptr;                // [heads]
  const float* dt_bias = nullptr;              // [dim]
  const void* norm_weight = nullptr;           // [128], shared by the heads, FP32 or BF16
  DType norm_weight_dtype = DType::kFp32;      //   (K3's module holds it in BF16; same bits)

  // ---- caches (device pointers, updated in place)
  void* conv_state = nullptr;                  // [slots, 3 * dim, tokens + 2 taps], BF16 or FP32
  DType conv_state_dtype = DType::kBf16;
  int64_t conv_state_slot_stride = 0;          // elements; arbitrary strides, both layouts:
  int64_t conv_state_channel_stride = 0;       //   [slot, channel, tap] (disaggregation)
  int64_t conv_state_tap_stride = 0;           //   [slot, tap, channel] (vLLM's default)
  int64_t conv_state_slots = 0;                // slot indices >= this are padding
  void* state = nullptr;                       // [slots, heads, 128 value, 128 key], 16-byte aligned
  DType state_dtype = DType::kFp32;            //   FP32 or BF16
  int64_t state_slot_stride = 0;               // elements; >= heads * 128 * 128, 16 bytes' multiple
  int64_t state_slots = 0;                     // slot indices >= this are padding

  // ---- slots
  const int32_t* slots = nullptr;              // q = 1: [batch]; q > 1: [batch, >= tokens]
  int64_t slots_stride = 0;                    // row stride of the q > 1 table (>= tokens)
  const int32_t* accepted = nullptr;           // [batch], q > 1 only: state read from
                                               //   slots[b, accepted[b] - 1]
  const int32_t* token_counts = nullptr;       // [batch] optional, q > 1: rows t >= count are padding

  // ---- output
  __nv_bfloat16* output = nullptr;             // [rows, dim]
  int64_t output_stride = 0;                   // >= dim, multiple of 8

  // ---- RecoverSSM records (q > 1 only; all null = off). With records the read slot is
  // a checkpoint the verify leaves unchanged and no state slot is written.
  float* record_correction = nullptr;          // [record_slots, heads, tokens, 128] FP32
  __nv_bfloat16* record_key_gate = nullptr;    // [record_slots, heads, tokens, 256] BF16: k | raw_g
  const int32_t* record_rows = nullptr;        // [batch] deferred RecoverSSM: record row of b
  int64_t record_slots = 0;                    // rows of the record tensors

  // ---- scalars and options
  float lower_bound = -5.0f;                   // < 0
  float q_scale = 0.08838834764831845f;        // 128^-0.5
  float norm_eps = 1e-5f;                      // eps of the gated RMSNorm
  KdaGateMode gate_mode = KdaGateMode::kOneChain;
  KdaSchedule schedule;
};

// RecoverSSM commit: fold the first n = clamp(accepted[b], 0, tokens) tokens' records
// into request b's checkpoint state in place (docs/numerics.md states its order and
// how its rounding differs from the sequential recurrence).
struct KdaCommitParams {
  int batch = 0;
  int heads = 0;
  int tokens = 0;                              // q of the verify that wrote the records
  void* state = nullptr;                       // [slots, heads, 128, 128], FP32 or BF16 (the
  DType state_dtype = DType::kFp32;            //   checkpoint of the verify that wrote the records)
  int64_t state_slot_stride = 0;
  int64_t state_slots = 0;
  const int32_t* slots = nullptr;              // [batch]: checkpoint slot of b (<= 0: skip)
  const int32_t* accepted = nullptr;           // [batch]
  const float* record_correction = nullptr;    // as in KdaDecodeParams
  const __nv_bfloat16* record_key_gate = nullptr;
  const int32_t* record_rows = nullptr;        // [batch] or null (row = b)
  int64_t record_slots = 0;
  const float* a_log = nullptr;                // [heads]
  const float* dt_bias = nullptr;              // [dim]
  float lower_bound = -5.0f;
};

// What the launch will run (pure host; resolves the schedule's defaults).
struct KdaDecodePlan {
  KdaSchedule schedule;  // with every default resolved
  int64_t ctas = 0;
  int waves = 0;         // estimate (CTAs per SM from shared memory and registers)
};

Result check(const KdaDecodeParams& params, const DeviceInfo& device) noexcept;
Result plan(const KdaDecodeParams& params, const DeviceInfo& device, KdaDecodePlan* out) noexcept;
Result launch(const KdaDecodeParams& params, const LaunchOptions& options,
              cudaStream_t stream) noexcept;

Result check(const KdaCommitParams& params, const DeviceInfo& device) noexcept;
Result launch(const KdaCommitParams& params, const LaunchOptions& options,
              cudaStream_t stream) noexcept;

namespace composed {
// The composed reference path of the decode / verify step: one simple kernel per stage
// (F_B GEMM per gate mode, conv update, recurrence, gated norm) with the fused
// kernel's instructions and reduction trees.
int64_t workspace_bytes(const KdaDecodeParams& params) noexcept;
Result launch(const KdaDecodeParams& params, void* workspace, cudaStream_t stream) noexcept;
}  // namespace composed

}  // namespace fusedstep
