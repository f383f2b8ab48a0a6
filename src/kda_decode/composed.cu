// SPDX-License-Identifier: Apache-2.0
// The composed reference path of the KDA decode / verify step: one plain kernel per
// stage with the fused kernel's formulas, instructions and reduction trees
// (docs/numerics.md, "KDA decode"), so the fused kernel must equal it bit for bit.
//
//   1. gate:       raw_g (F_B MMA chains / FMA tree / caller's raw_gate) and decay per key
//   2. conv:       causal conv + SiLU -> q, k, v (BF16 values) and the conv-window rewrite
//   3. recurrence: one CTA per (request, head): q/k norms, the delta rule token by
//                  token, o, state slots and records
//   4. norm:       gated RMSNorm -> output (padding rows zero)
//
// Workspace (caller-provided, FP32, each region 256-byte aligned; rows = batch * tokens):
//   qkv [rows, 3 dim] | raw_g [rows, dim] | decay [rows, dim] | o [rows, dim]
// Stages communicate only through the workspace and run in stream order; nothing is
// allocated and nothing synchronizes. Active requests must own distinct state and
// conv slots (as in vLLM); a slot shared by two active requests is a race.
#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <mutex>

#include "common/device_math.cuh"
#include "common/internal.h"
#include "common/ptx.cuh"
#include "fusedstep/kda_decode.h"
#include "kda_decode/params.h"
#include "kda_decode/stage_math.cuh"
#include "kda_decode/state_access.cuh"

namespace fusedstep {
namespace kda {
namespace {

constexpr int kThreads = 128;                                 // one per key / value row
constexpr int kStateFloats = kHeadDim * kHeadDim;             // one head's state
constexpr int kGateWarps = kHeadDim / 16;                     // MMA warps per head (16 keys each)
constexpr int kRecurrenceSmem = kStateFloats * 4;             // the head's state in shared memory

// What a request does in this step (docs/numerics.md, "KDA verify semantics").
struct RequestPlan {
  bool active = false;
  int accepted = 1;        // A: conv taps and read slot start at A - 1
  int count = 1;           // n: tokens computed (rows t >= n are padding rows)
  int32_t read_slot = 0;   // state read from here
  int32_t conv_slot = 0;
  int64_t record_row = -1;
};

__device__ RequestPlan plan_request(const KdaDecodeParams& p, int b) {
  RequestPlan r;
  if (p.tokens == 1) {
    const int32_t slot = p.slots[b];
    r.read_slot = r.conv_slot = slot;
    r.active = slot > 0 && slot < p.state_slots && slot < p.conv_state_slots;
    return r;
  }
  const int q = p.tokens;
  const int a = p.accepted[b];
  const int n = p.token_counts != nullptr ? p.token_counts[b] : q;
  if (a < 1 || a > q || n < 1 || n > q) return r;
  const int32_t* row = p.slots + int64_t(b) * p.slots_stride;
  r.accepted = a;
  r.count = n;
  r.read_slot = row[a - 1];
  r.conv_slot = row[0];
  if (r.read_slot <= 0 || r.read_slot >= p.state_slots) return r;
  if (r.conv_slot <= 0 || r.conv_slot >= p.conv_state_slots) return r;
  if (p.record_correction != nullptr) {
    const int64_t record = p.record_rows != nullptr ? p.record_rows[b] : b;
    if (record < 0 || record >= p.record_slots) return r;
    r.record_row = record;
  }
  r.active = true;
  return r;
}

struct Workspace {
  float* qkv;    // [rows, 3 dim]
  float* raw_g;  // [rows, dim]
  float* decay;  // [rows, dim]
  float* o;      // [rows, dim]
};

int64_t align256(int64_t bytes) { return (bytes + 255) / 256 * 256; }

Workspace carve(const KdaDecodeParams& p, void* base) {
  const int64_t rows = int64_t(p.batch) * p.tokens, dim = int64_t(p.heads) * kHeadDim;
  char* at = static_cast<char*>(base);
  Workspace w;
  w.qkv = reinterpret_cast<float*>(at);
  at += align256(rows * 3 * dim * 4);
  w.raw_g = reinterpret_cast<float*>(at);
  at += align256(rows * dim * 4);
  w.decay = reinterpret_cast<float*>(at);
  at += align256(rows * dim * 4);
  w.o = reinterpret_cast<float*>(at);
  return w;
}

__device__ __forceinline__ float load_bf16(const __nv_bfloat16* p) { return __bfloat162float(*p); }

__device__ __forceinline__ void store_decay(const KdaDecodeParams& p, const Workspace& w,
                                            int64_t row, int h, int key, float raw_g) {
  const int64_t dim = int64_t(p.heads) * kHeadDim;
  const int channel = h * kHeadDim + key;
  w.raw_g[row * dim + channel] = raw_g;
  w.decay[row * dim + channel] =
      decay(exp_a_log(p.a_log[h]), raw_g, p.dt_bias[channel], p.lower_bound);
}

// ---- 1. gate, modes 0 and 1: warp w of head h owns keys 16w .. 16w + 15; the MMA's
// N columns are the request's tokens (column t = token t; columns >= n hold zeros).
// Fragments follow the contract's column <-> k-index map: in chunk c, lane (g, j)
// (g = lane / 4, j = lane % 4) holds columns 16c + 4j + {0, 1} at k-indices 2j + {0, 1}
// and columns 16c + 4j + {2, 3} at k-indices 2j + 8 + {0, 1}: one 8-byte load each.
__global__ void __launch_bounds__(kGateWarps * 32)
    gate_mma_kernel(const KdaDecodeParams p, const Workspace w) {
  const int b = blockIdx.x, h = blockIdx.y;
  const RequestPlan r = plan_request(p, b);
  if (!r.active) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, j = lane % 4;
  const int key = warp * 16 + g;
  const __nv_bfloat16* fb0 = p.f_b_weight + int64_t(h * kHeadDim + key) * kKdaRank + 4 * j;
  const __nv_bfloat16* fb1 = fb0 + 8 * kKdaRank;  // key + 8
  const bool has_token = g < r.count;
  const __nv_bfloat16* fa =
      p.f_a + (int64_t(b) * p.tokens + (has_token ? g : 0)) * p.f_a_stride + 4 * j;

  auto fragments = [&](int c, uint32_t a[4], uint32_t bb[2]) {
    const uint2 lo = *reinterpret_cast<const uint2*>(fb0 + 16 * c);
    const uint2 hi = *reinterpret_cast<const uint2*>(fb1 + 16 * c);
    a[0] = lo.x; a[1] = hi.x; a[2] = lo.y; a[3] = hi.y;
    uint2 x = make_uint2(0u, 0u);
    if (has_token) x = *reinterpret_cast<const uint2*>(fa + 16 * c);
    bb[0] = x.x; bb[1] = x.y;
  };

  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (p.gate_mode == KdaGateMode::kOneChain) {
    for (int c = 0; c < kKdaRank / 16; ++c) {
      uint32_t a[4], bb[2];
      fragments(c, a, bb);
      ptx::mma_bf16_m16n8k16(acc, a, bb, acc);
    }
  } else {  // four chains of two chunks, then 0 + (((m0 + m1) + m2) + m3)
    float chain[4][4];
    for (int m = 0; m < 4; ++m) {
      for (int e = 0; e < 4; ++e) chain[m][e] = 0.0f;
      for (int c = 2 * m; c < 2 * m + 2; ++c) {
        uint32_t a[4], bb[2];
        fragments(c, a, bb);
        ptx::mma_bf16_m16n8k16(chain[m], a, bb, chain[m]);
      }
    }
    for (int e = 0; e < 4; ++e) {
      const float sum = __fadd_rn(__fadd_rn(__fadd_rn(chain[0][e], chain[1][e]), chain[2][e]), chain[3][e]);
      acc[e] = __fadd_rn(0.0f, sum);
    }
  }
  // D fragment: acc[0], acc[1] = (key, tokens 2j, 2j + 1); acc[2], acc[3] = key + 8.
  for (int e = 0; e < 4; ++e) {
    const int t = 2 * j + (e & 1);
    if (t >= r.count) continue;
    const int k = key + (e >= 2 ? 8 : 0);
    store_decay(p, w, int64_t(b) * p.tokens + t, h, k, dmath::round_bf16(acc[e]));
  }
}

// ---- 1. gate, mode 2 (FMA tree) and the caller's raw_gate: thread = key.
__global__ void __launch_bounds__(kThreads) gate_fma_kernel(const KdaDecodeParams p, const Workspace w) {
  const int b = blockIdx.x, h = blockIdx.y, key = threadIdx.x;
  const RequestPlan r = plan_request(p, b);
  if (!r.active) return;
  const int64_t dim = int64_t(p.heads) * kHeadDim;
  for (int t = 0; t < r.count; ++t) {
    const int64_t row = int64_t(b) * p.tokens + t;
    float raw;
    if (p.raw_gate != nullptr) {
      raw = load_bf16(p.raw_gate + row * p.raw_gate_stride + h * kHeadDim + key);
    } else {
      // Sixteen partials of eight FMAs each, from +0; then p[i] += p[i + d], d = 8..1.
      const __nv_bfloat16* fb = p.f_b_weight + (h * kHeadDim + key) * int64_t(kKdaRank);
      const __nv_bfloat16* fa = p.f_a + row * p.f_a_stride;
      float part[16];
      for (int i = 0; i < 16; ++i) {
        float acc = 0.0f;
        for (int e = 0; e < 8; ++e) acc = __fmaf_rn(load_bf16(fb + 8 * i + e), load_bf16(fa + 8 * i + e), acc);
        part[i] = acc;
      }
      for (int d = 8; d >= 1; d /= 2) {
        for (int i = 0; i < d; ++i) part[i] = __fadd_rn(part[i], part[i + d]);
      }
      raw = dmath::round_bf16(part[0]);
    }
    (void)dim;
    store_decay(p, w, row, h, key, raw);
  }
}

// ---- 2. conv: thread = channel of the packed q|k|v input. The window of token t is
// w[t .. t + 3] of w = [c_{A-1}, c_A, c_{A+1}, x_0, ..., x_{q-1}]; afterwards taps
// 0 .. n + 1 become [c_A, c_{A+1}, x_0, ..., x_{n-1}] (the old taps are in registers).
template <class StateT>
__device__ __forceinline__ float load_tap(const StateT* p) {
  if constexpr (sizeof(StateT) == 2) {
    return __bfloat162float(*reinterpret_cast<const __nv_bfloat16*>(p));
  } else {
    return *p;
  }
}
template <class StateT>
__device__ __forceinline__ void store_tap(StateT* p, float v) {
  if constexpr (sizeof(StateT) == 2) {
    *reinterpret_cast<__nv_bfloat16*>(p) = __float2bfloat16_rn(v);  // exact: a BF16 value
  } else {
    *p = v;
  }
}

template <class StateT>
__device__ void conv_channel(const KdaDecodeParams& p, const Workspace& w, const RequestPlan& r,
                             int b, int channel) {
  const int64_t channels = 3 * int64_t(p.heads) * kHeadDim;
  const int64_t dim = int64_t(p.heads) * kHeadDim;
  const int64_t section_stride = kda::conv_weight_section_stride(p);
  const int64_t weight_base = (channel / dim) * section_stride + (channel % dim) * p.conv_weight_channel_stride;
  float weight[kKdaConvWidth];
  for (int i = 0; i < kKdaConvWidth; ++i) {
    const int64_t at = weight_base + i * p.conv_weight_tap_stride;
    weight[i] = p.conv_weight_dtype == DType::kFp32
                    ? static_cast<const float*>(p.conv_weight)[at]
                    : load_bf16(static_cast<const __nv_bfloat16*>(p.conv_weight) + at);
  }
  const float bias = p.conv_bias != nullptr ? p.conv_bias[channel] : 0.0f;
  StateT* taps = static_cast<StateT*>(p.conv_state) + r.conv_slot * p.conv_state_slot_stride +
                 channel * p.conv_state_channel_stride;
  float window[3 + kKdaMaxTokens];
  for (int i = 0; i < 3; ++i) window[i] = load_tap(taps + (r.accepted - 1 + i) * p.conv_state_tap_stride);
  const int64_t first_row = int64_t(b) * p.tokens;
  // Loops unrolled to the maximum token count keep `window` in registers.
#pragma unroll
  for (int t = 0; t < kKdaMaxTokens; ++t) {
    window[3 + t] = t < r.count ? load_bf16(p.x + (first_row + t) * p.x_stride + channel) : 0.0f;
  }
#pragma unroll
  for (int t = 0; t < kKdaMaxTokens; ++t) {
    if (t >= r.count) break;
    float acc = bias;
#pragma unroll
    for (int i = 0; i < kKdaConvWidth; ++i) acc = conv_tap(window[t + i], weight[i], acc);
    w.qkv[(first_row + t) * channels + channel] = silu_bf16(acc);
  }
#pragma unroll
  for (int i = 0; i < kKdaMaxTokens + 2; ++i) {
    if (i >= r.count + 2) break;
    store_tap(taps + i * p.conv_state_tap_stride, window[i + 1]);
  }
}

__global__ void __launch_bounds__(kThreads) conv_kernel(const KdaDecodeParams p, const Workspace w) {
  const int b = blockIdx.x;
  const int channel = blockIdx.y * kThreads + threadIdx.x;
  const RequestPlan r = plan_request(p, b);
  if (!r.active || channel >= 3 * p.heads * kHeadDim) return;
  if (p.conv_state_dtype == DType::kBf16) {
    conv_channel<uint16_t>(p, w, r, b, channel);
  } else {
    conv_channel<float>(p, w, r, b, channel);
  }
}

// ---- 3. recurrence: one CTA per (request, head); the head's state lives in shared
// memory. Row dots: eight lanes per state row, lane l holding key groups G_l, G_{l+8},
// G_{l+16}, G_{l+24}, reduced by the contract's tree (^16 and ^8 inside the lane,
// then ^4, ^2, ^1 across the eight lanes).
__device__ __forceinline__ float warp_sum(float v) {
  for (int d = 16; d >= 1; d /= 2) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, d));
  return v;
}

__device__ __forceinline__ float row_dot(const float4 s[4], const float* u, int lane8) {
  float d[4];
  for (int m = 0; m < 4; ++m) {
    d[m] = dot4(s[m], *reinterpret_cast<const float4*>(u + 4 * (lane8 + 8 * m)));
  }
  float v = __fadd_rn(__fadd_rn(d[0], d[2]), __fadd_rn(d[1], d[3]));  // ^16, then ^8
  for (int x = 4; x >= 1; x /= 2) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, x));
  return v;
}

__device__ __forceinline__ float4 scale4(float4 s, float4 d) {
  return make_float4(__fmul_rn(s.x, d.x), __fmul_rn(s.y, d.y), __fmul_rn(s.z, d.z), __fmul_rn(s.w, d.w));
}
__device__ __forceinline__ float4 rank1(float4 k, float v, float4 s) {
  return make_float4(__fmaf_rn(k.x, v, s.x), __fmaf_rn(k.y, v, s.y), __fmaf_rn(k.z, v, s.z),
                     __fmaf_rn(k.w, v, s.w));
}

// The head's state between global memory (FP32 or BF16) and shared memory (FP32): a
// BF16 state converts exactly when loaded and is rounded to BF16 when stored.
template <class State>
__device__ __forceinline__ void load_head_state(float4* dst, const State* src) {
  for (int i = threadIdx.x; i < kStateFloats / 4; i += kThreads) dst[i] = load_state4(src + 4 * i);
}
template <class State>
__device__ __forceinline__ void store_head_state(State* dst, const float4* src) {
  for (int i = threadIdx.x; i < kStateFloats / 4; i += kThreads) store_state4(dst + 4 * i, src[i], false);
}

template <class State>
__global__ void __launch_bounds__(kThreads) recurrence_kernel(const KdaDecodeParams p, const Workspace w) {
  extern __shared__ float4 shared_state4[];
  float* state = reinterpret_cast<float*>(shared_state4);
  __shared__ __align__(16) float q_n[kHeadDim], k_n[kHeadDim], decays[kHeadDim], values[kHeadDim];
  __shared__ float warp_sums[8];

  const int b = blockIdx.x, h = blockIdx.y;
  const RequestPlan r = plan_request(p, b);
  if (!r.active) return;
  const int i = threadIdx.x, warp = i / 32, lane = i % 32;
  const int64_t dim = int64_t(p.heads) * kHeadDim;
  const int channel = h * kHeadDim + i;
  const bool records = p.record_correction != nullptr;
  auto head_state = [&](int32_t slot) {
    return static_cast<State*>(p.state) + slot * p.state_slot_stride + int64_t(h) * kStateFloats;
  };
  load_head_state(shared_state4, head_state(r.read_slot));

  for (int t = 0; t < r.count; ++t) {
    const int64_t row = int64_t(b) * p.tokens + t;
    const float* qkv = w.qkv + row * 3 * dim;
    const float q = qkv[channel], k = qkv[dim + channel];
    values[i] = qkv[2 * dim + channel];
    decays[i] = w.decay[row * dim + channel];
    const float sq_q = warp_sum(__fmul_rn(q, q)), sq_k = warp_sum(__fmul_rn(k, k));
    if (lane == 0) {
      warp_sums[warp] = sq_q;
      warp_sums[4 + warp] = sq_k;
    }
    if (records) {
      __nv_bfloat16* kg = p.record_key_gate + ((r.record_row * p.heads + h) * p.tokens + t) * 2 * kHeadDim;
      kg[i] = __float2bfloat16_rn(k);                                       // post-conv k
      kg[kHeadDim + i] = __float2bfloat16_rn(w.raw_g[row * dim + channel]);  // raw_g
    }
    __syncthreads();
    q_n[i] = normalize_q(q, inverse_norm(warp_sums[0], warp_sums[1], warp_sums[2], warp_sums[3]), p.q_scale);
    k_n[i] = normalize_k(k, inverse_norm(warp_sums[4], warp_sums[5], warp_sums[6], warp_sums[7]));
    const float beta = sigmoid(load_bf16(p.raw_beta + row * p.raw_beta_stride + h));
    __syncthreads();

    // Warp `warp` owns rows 32 warp .. 32 warp + 31, four at a time (lane / 8).
    const int lane8 = lane % 8;
    for (int pass = 0; pass < 8; ++pass) {
      const int v = 32 * warp + 4 * pass + lane / 8;
      float4* srow = reinterpret_cast<float4*>(state + v * kHeadDim);
      float4 s[4];
      for (int m = 0; m < 4; ++m) {
        const int col4 = lane8 + 8 * m;
        s[m] = scale4(srow[col4], reinterpret_cast<const float4*>(decays)[col4]);
      }
      const float dk = row_dot(s, k_n, lane8);
      const float v_new = delta(values[v], dk, beta);
      for (int m = 0; m < 4; ++m) {
        const int col4 = lane8 + 8 * m;
        s[m] = rank1(reinterpret_cast<const float4*>(k_n)[col4], v_new, s[m]);
        srow[col4] = s[m];
      }
      const float o = row_dot(s, q_n, lane8);
      if (lane8 == 0) {
        w.o[row * dim + h * kHeadDim + v] = dmath::round_bf16(o);
        if (records) {
          p.record_correction[((r.record_row * p.heads + h) * p.tokens + t) * kHeadDim + v] = v_new;
        }
      }
    }
    __syncthreads();
    if (!records) {
      const int32_t slot = p.tokens == 1 ? r.read_slot : p.slots[int64_t(b) * p.slots_stride + t];
      if (slot > 0 && slot < p.state_slots) store_head_state(head_state(slot), shared_state4);
    }
    // The next token rewrites `values`, `decays`, q_n, k_n only after its first barrier,
    // and the state only after its second: the copy above has finished by then.
  }
}

// ---- 4. gated RMSNorm: one CTA per (row, head). Warp 0 sums the squares by the
// contract's tree (lane 8g + a holds s(a, g); butterfly over a; (G0 + G2) + (G1 + G3)).
__global__ void __launch_bounds__(kThreads) norm_kernel(const KdaDecodeParams p, const Workspace w) {
  __shared__ float sumsq_shared;
  const int64_t row = blockIdx.x;
  const int h = blockIdx.y, i = threadIdx.x;
  const int b = int(row / p.tokens), t = int(row % p.tokens);
  const RequestPlan r = plan_request(p, b);
  __nv_bfloat16* out = p.output + row * p.output_stride + h * kHeadDim;
  if (!r.active || t >= r.count) {
    out[i] = __float2bfloat16_rn(0.0f);
    return;
  }
  const int64_t dim = int64_t(p.heads) * kHeadDim;
  const float* o = w.o + row * dim + h * kHeadDim;
  if (i < 32) {
    const int g = i / 8, a = i % 8;
    auto sq = [&](int v) { return __fmul_rn(o[v], o[v]); };
    float s = __fadd_rn(__fadd_rn(sq(32 * g + a), sq(32 * g + 16 + a)),
                        __fadd_rn(sq(32 * g + 8 + a), sq(32 * g + 24 + a)));
    for (int x = 4; x >= 1; x /= 2) s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, x));
    const float g0 = __shfl_sync(0xffffffffu, s, 0), g1 = __shfl_sync(0xffffffffu, s, 8);
    const float g2 = __shfl_sync(0xffffffffu, s, 16), g3 = __shfl_sync(0xffffffffu, s, 24);
    if (i == 0) sumsq_shared = __fadd_rn(__fadd_rn(g0, g2), __fadd_rn(g1, g3));
  }
  __syncthreads();
  const float rstd = norm_rstd(sumsq_shared, p.norm_eps);
  const float gate = sigmoid(load_bf16(p.output_gate + row * p.output_gate_stride + h * kHeadDim + i));
  const float weight = p.norm_weight_dtype == DType::kBf16 ? load_bf16(static_cast<const __nv_bfloat16*>(p.norm_weight) + i)
                                                           : static_cast<const float*>(p.norm_weight)[i];
  out[i] = __float2bfloat16_rn(gated_output(o[i], rstd, weight, gate));
}

// The recurrence needs 64 KiB of dynamic shared memory: opt in once per device.
Result enable_recurrence_smem(int device) {
  constexpr int kMaxDevices = 64;
  static std::array<std::once_flag, kMaxDevices> once;
  static std::array<cudaError_t, kMaxDevices> status{};
  if (device < 0 || device >= kMaxDevices) {
    return Result::error(Status::kInvalidValue, "kda_decode composed: device = %d out of [0, %d)",
                         device, kMaxDevices);
  }
  std::call_once(once[device], [&] {
    detail::InitErrorScope errors;  // keeps a pending error of the caller's; leaves none of its own
    status[device] = cudaFuncSetAttribute(recurrence_kernel<float>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          kRecurrenceSmem);
    if (status[device] == cudaSuccess) {
      status[device] = cudaFuncSetAttribute(recurrence_kernel<__nv_bfloat16>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, kRecurrenceSmem);
    }
  });
  return detail::cuda_result(status[device], "kda_decode composed: cudaFuncSetAttribute(recurrence)");
}

}  // namespace
}  // namespace kda

namespace composed {

int64_t workspace_bytes(const KdaDecodeParams& p) noexcept {
  if (p.batch <= 0 || p.heads <= 0 || p.tokens <= 0) return 0;
  const int64_t rows = int64_t(p.batch) * p.tokens, dim = int64_t(p.heads) * kKdaHeadDim;
  return kda::align256(rows * 3 * dim * 4) + 2 * kda::align256(rows * dim * 4) + rows * dim * 4;
}

Result launch(const KdaDecodeParams& p, void* workspace, cudaStream_t stream) noexcept {
  const DeviceInfo* device = nullptr;
  FS_TRY(detail::resolve_device(LaunchOptions{}, &device));
  FS_TRY(check(p, *device));
  if (p.batch == 0) return Result::success();
  if (workspace == nullptr) {
    return Result::error(Status::kNullPointer, "kda_decode composed: workspace is null (needs %lld bytes)",
                         (long long)workspace_bytes(p));
  }
  if ((reinterpret_cast<uintptr_t>(workspace) & 255u) != 0) {
    return Result::error(Status::kMisaligned, "kda_decode composed: workspace = %p must be 256-byte aligned",
                         workspace);
  }
  FS_TRY(kda::enable_recurrence_smem(device->device));
  const kda::Workspace w = kda::carve(p, workspace);
  const int64_t rows = int64_t(p.batch) * p.tokens;
  const dim3 per_head(p.batch, p.heads);

  if (p.raw_gate == nullptr && p.gate_mode != KdaGateMode::kFmaTree) {
    kda::gate_mma_kernel<<<per_head, kda::kGateWarps * 32, 0, stream>>>(p, w);
  } else {
    kda::gate_fma_kernel<<<per_head, kda::kThreads, 0, stream>>>(p, w);
  }
  FS_TRY(detail::cuda_result(cudaGetLastError(), "kda_decode composed: gate kernel launch"));
  const int channel_blocks = 3 * p.heads;  // 3 dim / 128 channels per CTA
  kda::conv_kernel<<<dim3(p.batch, channel_blocks), kda::kThreads, 0, stream>>>(p, w);
  FS_TRY(detail::cuda_result(cudaGetLastError(), "kda_decode composed: conv kernel launch"));
  if (p.state_dtype == DType::kBf16) {
    kda::recurrence_kernel<__nv_bfloat16><<<per_head, kda::kThreads, kda::kRecurrenceSmem, stream>>>(p, w);
  } else {
    kda::recurrence_kernel<float><<<per_head, kda::kThreads, kda::kRecurrenceSmem, stream>>>(p, w);
  }
  FS_TRY(detail::cuda_result(cudaGetLastError(), "kda_decode composed: recurrence kernel launch"));
  kda::norm_kernel<<<dim3(unsigned(rows), p.heads), kda::kThreads, 0, stream>>>(p, w);
  FS_TRY(detail::cuda_result(cudaGetLastError(), "kda_decode composed: norm kernel launch"));
  return Result::success();
}

}  // namespace composed
}  // namespace fusedstep
