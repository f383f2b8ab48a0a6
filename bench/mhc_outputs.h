// SPDX-License-Identifier: Apache-2.0
// fusedstep-bench: the outputs of one mHC boundary call, as the back-to-back mode
// (mhc_bench.cc) and the layer context (layer_mhc.cc) carve, poison and compare them.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "fusedstep/mhc_boundary.h"
#include "report.h"

namespace fusedstep::bench {

struct MhcOutputs {
  __nv_bfloat16* residual_out = nullptr;  // [T, 4, hidden]
  __nv_bfloat16* layer_input = nullptr;   // [T, hidden]
  float* pre_out = nullptr;               // [T, 4]
  float* post_out = nullptr;              // [T, 4]
  float* comb_out = nullptr;              // [T, 4, 4]
};

// From an arena with `template <class T> T* take(int64_t count)` (DeviceArena, or a sizer).
template <class Arena>
MhcOutputs take_mhc_outputs(Arena& a, int64_t hidden, int64_t tokens) {
  MhcOutputs o;
  o.residual_out = a.template take<__nv_bfloat16>(tokens * 4 * hidden);
  o.layer_input = a.template take<__nv_bfloat16>(tokens * hidden);
  o.pre_out = a.template take<float>(tokens * 4);
  o.post_out = a.template take<float>(tokens * 4);
  o.comb_out = a.template take<float>(tokens * 16);
  return o;
}

inline void set_mhc_outputs(MhcBoundaryParams* p, const MhcOutputs& o) {
  p->residual_out = o.residual_out;
  p->layer_input = o.layer_input;
  p->pre_out = o.pre_out;
  p->post_out = o.post_out;
  p->comb_out = o.comb_out;
}

inline void poison_mhc_outputs(const MhcOutputs& o, int64_t hidden, int64_t tokens, int byte, cudaStream_t s) {
  cudaMemsetAsync(o.residual_out, byte, tokens * 4 * hidden * 2, s);
  cudaMemsetAsync(o.layer_input, byte, tokens * hidden * 2, s);
  cudaMemsetAsync(o.pre_out, byte, tokens * 4 * 4, s);
  cudaMemsetAsync(o.post_out, byte, tokens * 4 * 4, s);
  cudaMemsetAsync(o.comb_out, byte, tokens * 16 * 4, s);
}

// Whether every output of `a` equals `b` byte for byte (same_bytes on each, differences
// named in `note`; *cuda_fine cleared when a download fails).
inline bool same_mhc_outputs(const MhcOutputs& a, const MhcOutputs& b, int64_t hidden, int64_t tokens,
                             std::string* note, bool* cuda_fine) {
  bool same = true;
  same &= same_bytes("residual_out", a.residual_out, b.residual_out, tokens * 4 * hidden * 2, 2, note, cuda_fine);
  same &= same_bytes("layer_input", a.layer_input, b.layer_input, tokens * hidden * 2, 2, note, cuda_fine);
  same &= same_bytes("pre_out", a.pre_out, b.pre_out, tokens * 4 * 4, 4, note, cuda_fine);
  same &= same_bytes("post_out", a.post_out, b.post_out, tokens * 4 * 4, 4, note, cuda_fine);
  same &= same_bytes("comb_out", a.comb_out, b.comb_out, tokens * 16 * 4, 4, note, cuda_fine);
  return same;
}

}  // namespace fusedstep::bench
