// SPDX-License-Identifier: Apache-2.0
// fusedstep-bench: vLLM's CUDA fused_kda_decode (Kimi K3, q = 1: the kernel vLLM runs on
// Hopper) as a peer timed in the same run. Its code is not part of this repository and this
// repository builds none of it: `--kda-peer-lib PATH` loads, at run time (dlopen), the shared
// library the peer's own folder builds (its peer.py: build(so_path=...) compiles its
// launcher.cu, which includes vLLM's kernel file, into a .so exporting the extern "C"
// vkda_fused_kda_decode). Without the option, or when the library does not load, every peer
// field is absent.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

#include "bench.h"

extern "C" {
// The launcher's tensor descriptor, as its documented C interface declares it (checked at
// load time against the library's vkda_tensor_descriptor_size()): sizes and strides in
// elements, dtype a c10::ScalarType code.
struct VkdaTensor {
  void* data;
  int64_t sizes[8];
  int64_t strides[8];
  int32_t ndim;
  int32_t dtype;
};
}

namespace fusedstep::bench {

// The library's entry points, declared from its documented extern "C" interface: the
// arguments of vLLM's torch.ops._C.fused_kda_decode in its order, optional tensors null,
// the optional lower bound as (has_lower_bound, lower_bound); 0 = launched on `stream`, else
// the reason in `err`.
using VkdaFusedKdaDecodeFn = int (*)(const VkdaTensor* x, const VkdaTensor* weight, const VkdaTensor* bias,
                                     const VkdaTensor* conv_state, const VkdaTensor* raw_g,
                                     const VkdaTensor* raw_beta, const VkdaTensor* a_log, const VkdaTensor* dt_bias,
                                     const VkdaTensor* state_indices, const VkdaTensor* state, const VkdaTensor* out,
                                     int32_t has_lower_bound, double lower_bound, const VkdaTensor* output_gate,
                                     const VkdaTensor* norm_weight, double norm_eps, int32_t device_index,
                                     cudaStream_t stream, char* err, size_t err_len);
using VkdaDescriptorSizeFn = size_t (*)();

// Loads the peer library at `path` (dlopen, then dlsym of vkda_fused_kda_decode and
// vkda_tensor_descriptor_size, whose answer must equal sizeof(VkdaTensor)); false with the
// reason, naming the file, in `error` (nothing loaded).
bool load_kda_peer(const std::string& path, std::string* error);
bool kda_peer_loaded();

// Why vLLM's kernel cannot run `p` on `device`, "" when it can: the library loaded, sm_90
// (peer.py builds it for sm_90a), q = 1, 12 / 24 / 48 / 96 heads, an FP32 state (the only
// state it reads), a BF16 conv state of 3 taps in either layout, FP32 conv and norm
// weights, a contiguous output.
std::string kda_peer_unsupported(const KdaDecodeParams& p, const DeviceInfo& device);

// One call of vLLM's op on `p`'s tensors, its descriptors built once (as vLLM holds its
// tensors); launch() allocates nothing and never synchronizes (capturable). `raw_g`
// [batch, dim] contiguous BF16 is F_B's output (vLLM runs that GEMM beside the kernel),
// `conv_weight` [3, 4, dim] FP32 its layout of the conv weight (transpose_conv_weight), the
// two one-time weight copies vLLM makes at load being this one and norm_weight in FP32
// (the bench's norm weight already is). `state` is p's FP32 state pool.
class KdaPeerCall {
 public:
  KdaPeerCall(const KdaDecodeParams& p, void* state, const __nv_bfloat16* raw_g, const float* conv_weight);
  Result launch(cudaStream_t stream) const;

 private:
  enum { kX, kWeight, kConvState, kRawG, kRawBeta, kALog, kDtBias, kSlots, kState, kOut, kGate, kNorm, kCount };
  VkdaTensor t_[kCount] = {};
  float lower_bound_ = 0.0f;
  float norm_eps_ = 0.0f;
  int device_ = 0;
};

// The back-to-back KDA rows' peer fields, on the row's buffer sets (`sets`, one call each,
// as the fused path is timed): peer_us (vLLM's kernel alone, reading a raw_g computed once
// per set) and, where the gate comes from f_a, peer_with_fb_us (the cuBLAS F_B GEMM, then
// the kernel). Also prints them, with a loose check of the peer's output against the fused
// path's (the peer is not bit-compatible). Nothing when the peer is not loaded.
void add_kda_peer_fields(Context& ctx, const Options& options, const std::vector<KdaDecodeParams>& sets,
                         const std::string& shape, JsonObject* fields);

}  // namespace fusedstep::bench
