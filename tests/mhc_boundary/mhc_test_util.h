// SPDX-License-Identifier: Apache-2.0
// Test data of the mHC boundary GPU suites (composed_test.cu, fused_test.cu): random
// realistic inputs from a seed, device buffers with optional row padding, the params
// and the CPU-reference problem of one case, poison and "every element written" checks.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "common/gpu_test_util.h"
#include "float_bits.h"
#include "fusedstep/mhc_boundary.h"
#include "fusedstep_reference/mhc_boundary.h"

namespace fusedstep::testing {

// Every weight rounding mode, and its name for test traces.
inline constexpr WeightRounding kModes[] = {WeightRounding::kTf32Rna, WeightRounding::kTf32Rne,
                                            WeightRounding::kFp32};
inline const char* mode_name(WeightRounding r) {
  return r == WeightRounding::kTf32Rna ? "tf32_rna" : (r == WeightRounding::kTf32Rne ? "tf32_rne" : "fp32");
}

// Host inputs of one call, contiguous; BF16 values as their 16-bit patterns.
struct MhcHostInputs {
  int64_t tokens = 0;
  int64_t hidden = 0;
  std::vector<uint16_t> x;            // [tokens, hidden]
  std::vector<uint16_t> residual;     // [tokens, 4, hidden]
  std::vector<float> post;            // [tokens, 4]
  std::vector<float> comb;            // [tokens, 4, 4]
  std::vector<float> pre_lag;         // [tokens, 4]
  std::vector<float> fn;              // [24, 4 * hidden]
  std::vector<float> scale;           // [3]
  std::vector<float> base;            // [24]
  std::vector<uint16_t> norm_weight;  // [hidden]
};

// DeepSeek-V4.1's realistic distributions: x, residual ~ N(0, 1) (BF16); post ~ U(0.5, 2);
// comb ~ U(0, 0.5); pre_lag ~ U(0.2, 1); fn ~ N(0, 0.02); scale ~ U(0.5, 2);
// base ~ N(0, 0.5); norm_weight ~ U(0.5, 1.5) (BF16).
inline MhcHostInputs random_mhc_inputs(int64_t tokens, int64_t hidden, uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto normal = [&](double sigma) { return std::normal_distribution<double>(0.0, sigma)(rng); };
  auto uniform = [&](double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng); };
  auto bf16 = [](double v) { return bits::bf16_rne(static_cast<float>(v)); };
  MhcHostInputs in;
  in.tokens = tokens;
  in.hidden = hidden;
  in.x.resize(tokens * hidden);
  for (auto& v : in.x) v = bf16(normal(1.0));
  in.residual.resize(tokens * 4 * hidden);
  for (auto& v : in.residual) v = bf16(normal(1.0));
  in.post.resize(tokens * 4);
  for (auto& v : in.post) v = static_cast<float>(uniform(0.5, 2.0));
  in.comb.resize(tokens * 16);
  for (auto& v : in.comb) v = static_cast<float>(uniform(0.0, 0.5));
  in.pre_lag.resize(tokens * 4);
  for (auto& v : in.pre_lag) v = static_cast<float>(uniform(0.2, 1.0));
  in.fn.resize(24 * 4 * hidden);
  for (auto& v : in.fn) v = static_cast<float>(normal(0.02));
  in.scale.resize(3);
  for (auto& v : in.scale) v = static_cast<float>(uniform(0.5, 2.0));
  in.base.resize(24);
  for (auto& v : in.base) v = static_cast<float>(normal(0.5));
  in.norm_weight.resize(hidden);
  for (auto& v : in.norm_weight) v = bf16(uniform(0.5, 1.5));
  return in;
}

// Extra elements after each row of the strided tensors (multiples of 8; 0 = contiguous).
struct MhcPadding {
  int64_t x = 0;
  int64_t residual = 0;
  int64_t residual_out = 0;
  int64_t layer_input = 0;
};

// Outputs copied back to the host, contiguous (row padding dropped).
struct MhcOutputs {
  std::vector<uint16_t> residual_out;  // [tokens, 4, hidden]
  std::vector<uint16_t> layer_input;   // [tokens, hidden]
  std::vector<float> pre;              // [tokens, 4]
  std::vector<float> post;             // [tokens, 4]
  std::vector<float> comb;             // [tokens, 4, 4]
};

// One case: host inputs, the host-prepared weight, device buffers and the scalars.
// Construct, then make_params(); outputs are poisoned by the constructor.
class MhcCase {
 public:
  MhcCase(int64_t tokens, int64_t hidden, WeightRounding rounding, uint64_t seed,
          MhcPadding padding = {})
      : host(random_mhc_inputs(tokens, hidden, seed)), rounding(rounding), padding(padding) {
    weight_host.resize(mhc_boundary_weight_words(hidden, rounding));
    const Result prepared = prepare_mhc_boundary_weight(host.fn.data(), hidden, rounding,
                                                        weight_host.data());
    EXPECT_TRUE(prepared.ok()) << prepared.detail();
    x.resize(rows_bytes(x_stride()) / 2);
    residual.resize(rows_bytes(residual_stride()) / 2);
    residual_out.resize(rows_bytes(residual_out_stride()) / 2);
    layer_input.resize(rows_bytes(layer_input_stride()) / 2);
    upload_rows(x, host.x, hidden, x_stride());
    upload_rows(residual, host.residual, 4 * hidden, residual_stride());
    upload(post, host.post);
    upload(comb, host.comb);
    upload(pre_lag, host.pre_lag);
    upload(fn, host.fn);
    upload(weight, weight_host);
    upload(scale, host.scale);
    upload(base, host.base);
    upload(norm_weight, host.norm_weight);
    pre_out.resize(tokens * 4);
    post_out.resize(tokens * 4);
    comb_out.resize(tokens * 16);
    poison_outputs();
  }

  int64_t tokens() const { return host.tokens; }
  int64_t hidden() const { return host.hidden; }
  int64_t x_stride() const { return hidden() + padding.x; }
  int64_t residual_stride() const { return 4 * hidden() + padding.residual; }
  int64_t residual_out_stride() const { return 4 * hidden() + padding.residual_out; }
  int64_t layer_input_stride() const { return hidden() + padding.layer_input; }

  // Params for the device buffers; strides stay 0 ("contiguous") without padding.
  MhcBoundaryParams make_params() const {
    MhcBoundaryParams p;
    p.x = reinterpret_cast<const __nv_bfloat16*>(x.get());
    p.residual = reinterpret_cast<const __nv_bfloat16*>(residual.get());
    p.post = post.get();
    p.comb = comb.get();
    p.pre_lag = pre_lag.get();
    p.weight = weight.get();
    p.scale = scale.get();
    p.base = base.get();
    p.norm_weight = reinterpret_cast<const __nv_bfloat16*>(norm_weight.get());
    p.residual_out = reinterpret_cast<__nv_bfloat16*>(residual_out.get());
    p.layer_input = reinterpret_cast<__nv_bfloat16*>(layer_input.get());
    p.pre_out = pre_out.get();
    p.post_out = post_out.get();
    p.comb_out = comb_out.get();
    p.tokens = tokens();
    p.hidden = hidden();
    p.x_stride = padding.x ? x_stride() : 0;
    p.residual_stride = padding.residual ? residual_stride() : 0;
    p.residual_out_stride = padding.residual_out ? residual_out_stride() : 0;
    p.layer_input_stride = padding.layer_input ? layer_input_stride() : 0;
    p.rounding = rounding;
    p.rms_eps = rms_eps;
    p.hc_pre_eps = hc_pre_eps;
    p.sinkhorn_eps = sinkhorn_eps;
    p.post_mult = post_mult;
    p.norm_eps = norm_eps;
    p.sinkhorn_iters = sinkhorn_iters;
    p.tile = tile;
    return p;
  }

  // The same call for the CPU reference.
  reference::MhcBoundaryProblem problem() const {
    reference::MhcBoundaryProblem p;
    p.tokens = tokens();
    p.hidden = hidden();
    p.x = host.x.data();
    p.residual = host.residual.data();
    p.post = host.post.data();
    p.comb = host.comb.data();
    p.pre_lag = host.pre_lag.data();
    p.fn = host.fn.data();
    p.scale = host.scale.data();
    p.base = host.base.data();
    p.norm_weight = host.norm_weight.data();
    p.rounding = rounding;
    p.rms_eps = rms_eps;
    p.hc_pre_eps = hc_pre_eps;
    p.sinkhorn_eps = sinkhorn_eps;
    p.post_mult = post_mult;
    p.norm_eps = norm_eps;
    p.sinkhorn_iters = sinkhorn_iters;
    return p;
  }

  // Every output byte, row padding included, set to `byte` (0xFF: BF16 and FP32 NaN).
  void poison_outputs(int byte = 0xFF) {
    residual_out.fill_bytes(byte);
    layer_input.fill_bytes(byte);
    pre_out.fill_bytes(byte);
    post_out.fill_bytes(byte);
    comb_out.fill_bytes(byte);
    cudaDeviceSynchronize();
  }

  MhcOutputs download_outputs() const {
    MhcOutputs out;
    out.residual_out = download_rows(residual_out, 4 * hidden(), residual_out_stride());
    out.layer_input = download_rows(layer_input, hidden(), layer_input_stride());
    out.pre = pre_out.download();
    out.post = post_out.download();
    out.comb = comb_out.download();
    return out;
  }

  // Elements of the strided outputs' row padding that lost the poison `byte` (the
  // kernels must not write past a row).
  int64_t padding_bytes_written(int byte = 0xFF) const {
    int64_t written = 0;
    auto scan = [&](const DeviceBuffer<uint16_t>& buffer, int64_t row, int64_t stride) {
      const std::vector<uint16_t> all = buffer.download();
      const uint16_t poison = static_cast<uint16_t>(byte * 0x0101);
      for (int64_t t = 0; t < tokens(); ++t) {
        for (int64_t i = row; i < stride; ++i) written += all[t * stride + i] != poison;
      }
    };
    scan(residual_out, 4 * hidden(), residual_out_stride());
    scan(layer_input, hidden(), layer_input_stride());
    return written;
  }

  MhcHostInputs host;
  WeightRounding rounding;
  MhcPadding padding;
  std::vector<uint32_t> weight_host;  // prepare_mhc_boundary_weight(host.fn)
  float rms_eps = 1e-6f;
  float hc_pre_eps = 1e-6f;
  float sinkhorn_eps = 1e-6f;
  float post_mult = 2.0f;
  float norm_eps = 1e-6f;
  int sinkhorn_iters = 20;
  int tile = 0;

  DeviceBuffer<uint16_t> x, residual, norm_weight, residual_out, layer_input;
  DeviceBuffer<float> post, comb, pre_lag, fn, scale, base, pre_out, post_out, comb_out;
  DeviceBuffer<uint32_t> weight;

 private:
  int64_t rows_bytes(int64_t stride) const { return tokens() * stride * 2; }
  template <class T>
  static void upload(DeviceBuffer<T>& buffer, const std::vector<T>& values) {
    buffer.resize(values.size());
    buffer.upload(values);
  }
  static void upload_rows(DeviceBuffer<uint16_t>& buffer, const std::vector<uint16_t>& values,
                          int64_t row, int64_t stride) {
    if (values.empty()) return;
    cudaMemcpy2D(buffer.get(), stride * 2, values.data(), row * 2, row * 2, values.size() / row,
                 cudaMemcpyHostToDevice);
  }
  std::vector<uint16_t> download_rows(const DeviceBuffer<uint16_t>& buffer, int64_t row,
                                      int64_t stride) const {
    std::vector<uint16_t> values(tokens() * row);
    if (values.empty()) return values;
    cudaMemcpy2D(values.data(), row * 2, buffer.get(), stride * 2, row * 2, tokens(),
                 cudaMemcpyDeviceToHost);
    return values;
  }
};

// Elements still holding the 0xFF poison (BF16 0xFFFF, FP32 0xFFFFFFFF) in every output:
// zero when the call wrote every element (no valid output is that NaN pattern).
inline int64_t poisoned_elements(const MhcOutputs& out) {
  int64_t count = 0;
  for (uint16_t v : out.residual_out) count += v == 0xFFFFu;
  for (uint16_t v : out.layer_input) count += v == 0xFFFFu;
  auto scan = [&](const std::vector<float>& values) {
    for (float v : values) {
      uint32_t u;
      std::memcpy(&u, &v, 4);
      count += u == 0xFFFFFFFFu;
    }
  };
  scan(out.pre);
  scan(out.post);
  scan(out.comb);
  return count;
}

}  // namespace fusedstep::testing
