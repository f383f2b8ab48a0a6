// SPDX-License-Identifier: Apache-2.0
// KDA: the recurrent state's element type at its loads and stores. The recurrence runs in
// FP32 for both types: a BF16 state converts exactly when loaded, and every stored state
// is rounded to BF16 (nearest even). Four consecutive keys travel together: 16 bytes of
// FP32, 8 of BF16.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "common/device_math.cuh"

namespace fusedstep::kda {

// Four state elements as loaded, before the conversion (the verify and the commit hold
// them as bits until their first use: a conversion next to its load makes ptxas wait
// for that load there).
template <class State>
struct StateQuad;
template <>
struct StateQuad<float> {
  using Bits = float4;
};
template <>
struct StateQuad<__nv_bfloat16> {
  using Bits = uint2;
};
template <class State>
using StateBits = typename StateQuad<State>::Bits;

__device__ __forceinline__ float4 load_state_bits(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ uint2 load_state_bits(const __nv_bfloat16* p) {
  return *reinterpret_cast<const uint2*>(p);
}
__device__ __forceinline__ float4 state_to_float4(float4 v) { return v; }
__device__ __forceinline__ float4 state_to_float4(uint2 v) {
  return make_float4(dmath::bf16_lo(v.x), dmath::bf16_hi(v.x), dmath::bf16_lo(v.y), dmath::bf16_hi(v.y));
}
template <class State>
__device__ __forceinline__ float4 load_state4(const State* p) {
  return state_to_float4(load_state_bits(p));
}

// Four state elements stored: one 16- (FP32) or 8-byte (BF16) store, streaming (L2
// evict-first) or write-back. A plain `*p =` compiles to four 4-byte stores.
__device__ __forceinline__ void store_state4(float* p, float4 v, bool streaming) {
  if (streaming) {
    __stcs(reinterpret_cast<float4*>(p), v);
  } else {
    __stwb(reinterpret_cast<float4*>(p), v);
  }
}
__device__ __forceinline__ void store_state4(__nv_bfloat16* p, float4 v, bool streaming) {
  const uint2 bits = make_uint2(dmath::pack_bf16x2(v.x, v.y), dmath::pack_bf16x2(v.z, v.w));
  if (streaming) {
    __stcs(reinterpret_cast<uint2*>(p), bits);
  } else {
    __stwb(reinterpret_cast<uint2*>(p), bits);
  }
}

}  // namespace fusedstep::kda
