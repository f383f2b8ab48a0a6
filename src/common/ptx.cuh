// SPDX-License-Identifier: Apache-2.0
// The unavoidable inline PTX of fusedstep, in one place. Each wrapper names its
// instruction (PTX ISA, "Parallel Thread Execution ISA" 9.0, section in brackets).
// Everything CCCL's cuda::ptx or cooperative_groups expresses (mbarrier, st.async,
// bulk copies, cluster barriers, mapa) is used from there instead, not wrapped here.
#pragma once

#include <cstdint>

namespace fusedstep::ptx {

// ---- special-function unit (9.7.3 "Floating point instructions")
// ex2.approx.f32, non-FTZ (the Triton 3.6 lowering of exp on sm_90).
__device__ __forceinline__ float ex2_approx(float x) {
  float y;
  asm("ex2.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
// rcp.approx.ftz.f32
__device__ __forceinline__ float rcp_approx_ftz(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
// sqrt.approx.ftz.f32
__device__ __forceinline__ float sqrt_approx_ftz(float x) {
  float y;
  asm("sqrt.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
// rsqrt.approx.f32 (non-FTZ)
__device__ __forceinline__ float rsqrt_approx(float x) {
  float y;
  asm("rsqrt.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
// mul.rn.ftz.f32 / fma.rn.ftz.f32 (the mHC residual update's flush-to-zero chain)
__device__ __forceinline__ float mul_ftz(float a, float b) {
  float y;
  asm("mul.rn.ftz.f32 %0, %1, %2;" : "=f"(y) : "f"(a), "f"(b));
  return y;
}
__device__ __forceinline__ float fma_ftz(float a, float b, float c) {
  float y;
  asm("fma.rn.ftz.f32 %0, %1, %2, %3;" : "=f"(y) : "f"(a), "f"(b), "f"(c));
  return y;
}

// ---- tensor cores (9.7.14 "Warp Level Matrix Multiply-Accumulate Instructions")
// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32: d = a * b + c.
__device__ __forceinline__ void mma_bf16_m16n8k16(float d[4], const uint32_t a[4],
                                                  const uint32_t b[2], const float c[4]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]),
        "f"(c[1]), "f"(c[2]), "f"(c[3]));
}
// ldmatrix.sync.aligned.m8n8.x4.shared.b16 (9.7.14.5.15)
__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], uint32_t smem_addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr));
}

// ---- loads (9.7.9.9 "ld"): a 16-byte read-only global load the compiler may not
// sink below later code (a prefetch issued where it is written).
__device__ __forceinline__ uint4 ldg_nc_v4_ordered(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// ---- not an instruction: an empty asm that hides a value from the optimizer, so that
// address arithmetic derived from it stays where it is used instead of being hoisted
// out of a loop and kept live (register pressure) across the loop's heavy part.
__device__ __forceinline__ int64_t opaque(int64_t v) {
  asm volatile("" : "+l"(v));
  return v;
}
__device__ __forceinline__ int opaque(int v) {
  asm volatile("" : "+r"(v));
  return v;
}

// ---- programmatic dependent launch (9.7.13.13 "griddepcontrol")
__device__ __forceinline__ void griddep_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void griddep_launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

// ---- L2 cache policies and hinted bulk copies (9.7.9.16 "createpolicy",
// 9.7.9.25.4.1 "cp.async.bulk"): CCCL's cuda::ptx has no .L2::cache_hint form.
// A policy that marks every line it touches evict-first.
__device__ __forceinline__ uint64_t l2_policy_evict_first() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}
// cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint:
// `bytes` (a multiple of 16) from global `src` to the CTA's shared address `dst`,
// completing on the CTA's mbarrier at shared address `bar`.
__device__ __forceinline__ void bulk_copy_g2s_hinted(uint32_t dst, const void* src, uint32_t bytes,
                                                     uint32_t bar, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint "
      "[%0], [%1], %2, [%3], %4;" ::"r"(dst),
      "l"(src), "r"(bytes), "r"(bar), "l"(policy)
      : "memory");
}


// ---- named CTA barriers (9.7.13.1 "bar.sync"): `threads` (a multiple of 32) of the
// CTA meet at barrier `id` (1-15; 0 is __syncthreads).
__device__ __forceinline__ void named_barrier_sync(uint32_t id, uint32_t threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// ---- L2 prefetch (9.7.9.25.4.4 "cp.async.bulk.prefetch"): `bytes` (a multiple of 16)
// from global `src` into L2, without waiting and without registers (weights fetched
// ahead of a programmatic-dependent-launch wait).
__device__ __forceinline__ void prefetch_l2_bulk(const void* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"(bytes) : "memory");
}

}  // namespace fusedstep::ptx
