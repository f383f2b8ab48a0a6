// SPDX-License-Identifier: Apache-2.0
// fusedstep-bench: vLLM's CUDA KDA decode kernel as a peer (kda_peer.h), from a shared
// library loaded at run time. The tensors are described as vLLM's op receives them (the
// mapping of the peer's peer.py), and its own host wrapper runs its argument checks and
// launches, exactly as inside vLLM.
#include "kda_peer.h"

#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <initializer_list>

#include "blas.h"
#include "device_util.h"
#include "layer_kernels.h"
#include "report.h"

namespace fusedstep::bench {
namespace {

// c10::ScalarType codes.
constexpr int32_t kInt32 = 3, kFloat32 = 6, kBFloat16 = 15;

VkdaTensor tensor(const void* data, int32_t dtype, std::initializer_list<int64_t> sizes,
                  std::initializer_list<int64_t> strides) {
  VkdaTensor t{};
  t.data = const_cast<void*>(data);
  t.dtype = dtype;
  t.ndim = static_cast<int32_t>(sizes.size());
  std::copy(sizes.begin(), sizes.end(), t.sizes);
  std::copy(strides.begin(), strides.end(), t.strides);
  return t;
}

// The loaded library's entry point (null: none loaded). The handle stays open until exit.
VkdaFusedKdaDecodeFn g_decode = nullptr;

// dlsym's object pointer as a function pointer (POSIX guarantees the two have one
// representation).
template <class Fn>
Fn symbol(void* handle, const char* name) {
  void* address = dlsym(handle, name);
  Fn fn = nullptr;
  static_assert(sizeof fn == sizeof address, "function and object pointers differ in size");
  std::memcpy(&fn, &address, sizeof fn);
  return fn;
}

}  // namespace

bool load_kda_peer(const std::string& path, std::string* error) {
  if (g_decode != nullptr) {
    *error = "a peer library is already loaded";
    return false;
  }
  // A path without a slash would be searched for on the library path: name this file.
  const std::string file = path.find('/') == std::string::npos ? "./" + path : path;
  dlerror();
  void* handle = dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    *error = why != nullptr ? why : "dlopen failed";
    return false;
  }
  const auto decode = symbol<VkdaFusedKdaDecodeFn>(handle, "vkda_fused_kda_decode");
  const auto descriptor_size = symbol<VkdaDescriptorSizeFn>(handle, "vkda_tensor_descriptor_size");
  if (decode == nullptr || descriptor_size == nullptr) {
    *error = path + ": no vkda_fused_kda_decode / vkda_tensor_descriptor_size in it";
  } else if (descriptor_size() != sizeof(VkdaTensor)) {
    *error = path + ": its VkdaTensor is " + std::to_string(descriptor_size()) + " bytes, kda_peer.h's " +
             std::to_string(sizeof(VkdaTensor));
  } else {
    g_decode = decode;
    return true;
  }
  dlclose(handle);
  return false;
}

bool kda_peer_loaded() { return g_decode != nullptr; }

std::string kda_peer_unsupported(const KdaDecodeParams& p, const DeviceInfo& device) {
  if (!kda_peer_loaded()) return "not loaded (--kda-peer-lib)";
  if (device.cc_major != 9) return "sm_90 only (peer.py builds it for sm_90a)";
  if (p.tokens != 1 || p.record_correction != nullptr) return "q = 1 decode only";
  if (p.state_dtype != DType::kFp32) return "an FP32 state only";
  if (p.heads != 12 && p.heads != 24 && p.heads != 48 && p.heads != 96) return "heads 12, 24, 48 or 96 only";
  const int64_t dim = int64_t{p.heads} * kKdaHeadDim;
  const bool sd = p.conv_state_channel_stride == 1 && p.conv_state_tap_stride == 3 * dim;
  const bool ds = p.conv_state_channel_stride == 3 && p.conv_state_tap_stride == 1;
  if (p.conv_state_dtype != DType::kBf16 || !(sd || ds) || p.conv_state_slot_stride < 9 * dim) {
    return "a BF16 conv state of 3 taps, [slot, tap, channel] or [slot, channel, tap]";
  }
  if (p.conv_weight_dtype != DType::kFp32 || p.norm_weight_dtype != DType::kFp32) return "FP32 conv and norm weights";
  if (p.output_stride != dim) return "a contiguous output";
  if (p.raw_gate != nullptr && p.raw_gate_stride != dim) return "a contiguous raw_g";
  if (p.conv_bias != nullptr) return "no conv bias (K3 has none)";
  return "";
}

KdaPeerCall::KdaPeerCall(const KdaDecodeParams& p, void* state, const __nv_bfloat16* raw_g,
                         const float* conv_weight) {
  const int64_t b = p.batch, h = p.heads, d = kKdaHeadDim, dim = h * d;
  t_[kX] = tensor(p.x, kBFloat16, {b, 3 * dim}, {p.x_stride, 1});
  t_[kWeight] = tensor(conv_weight, kFloat32, {3, 4, dim}, {4 * dim, dim, 1});
  t_[kConvState] = tensor(p.conv_state, kBFloat16, {p.conv_state_slots, 3 * dim, 3},
                          {p.conv_state_slot_stride, p.conv_state_channel_stride, p.conv_state_tap_stride});
  t_[kRawG] = tensor(raw_g, kBFloat16, {1, b, h, d}, {b * dim, dim, d, 1});
  t_[kRawBeta] = tensor(p.raw_beta, kBFloat16, {1, b, h}, {b * p.raw_beta_stride, p.raw_beta_stride, 1});
  t_[kALog] = tensor(p.a_log, kFloat32, {h}, {1});
  t_[kDtBias] = tensor(p.dt_bias, kFloat32, {dim}, {1});
  t_[kSlots] = tensor(p.slots, kInt32, {b}, {1});
  t_[kState] = tensor(state, kFloat32, {p.state_slots, h, d, d}, {p.state_slot_stride, d * d, d, 1});
  t_[kOut] = tensor(p.output, kBFloat16, {1, b, h, d}, {b * dim, dim, d, 1});
  t_[kGate] = tensor(p.output_gate, kBFloat16, {b, h, d}, {p.output_gate_stride, d, 1});
  t_[kNorm] = tensor(p.norm_weight, kFloat32, {d}, {1});
  lower_bound_ = p.lower_bound;
  norm_eps_ = p.norm_eps;
  cudaGetDevice(&device_);
}

Result KdaPeerCall::launch(cudaStream_t stream) const {
  if (g_decode == nullptr) return Result::error(Status::kUnsupported, "the vLLM peer is not loaded (--kda-peer-lib)");
  char err[512] = "";
  const int rc = g_decode(&t_[kX], &t_[kWeight], nullptr, &t_[kConvState], &t_[kRawG], &t_[kRawBeta], &t_[kALog],
                          &t_[kDtBias], &t_[kSlots], &t_[kState], &t_[kOut], 1, lower_bound_, &t_[kGate], &t_[kNorm],
                          norm_eps_, device_, stream, err, sizeof err);
  if (rc != 0) return Result::error(Status::kInvalidValue, "vLLM fused_kda_decode: %s", err);
  return Result::success();
}

namespace {

// Largest |a - b| over the RMS of `a`, for two BF16 tensors of `count` elements.
double max_diff_over_rms(const __nv_bfloat16* a, const __nv_bfloat16* b, int64_t count, bool* ok) {
  std::vector<uint16_t> ha(count), hb(count);
  *ok = cudaMemcpy(ha.data(), a, count * 2, cudaMemcpyDeviceToHost) == cudaSuccess &&
        cudaMemcpy(hb.data(), b, count * 2, cudaMemcpyDeviceToHost) == cudaSuccess;
  if (!*ok) return NAN;
  auto value = [](uint16_t bits) {
    const uint32_t word = uint32_t{bits} << 16;
    float f;
    std::memcpy(&f, &word, 4);
    return static_cast<double>(f);
  };
  double sum_sq = 0.0, worst = 0.0;
  for (int64_t i = 0; i < count; ++i) {
    const double x = value(ha[i]), y = value(hb[i]);
    sum_sq += x * x;
    worst = std::max(worst, std::isfinite(y) ? std::fabs(x - y) : INFINITY);
  }
  return worst / std::sqrt(sum_sq / std::max<int64_t>(count, 1));
}

}  // namespace

void add_kda_peer_fields(Context& ctx, const Options& options, const std::vector<KdaDecodeParams>& sets,
                         const std::string& shape, JsonObject* fields) {
  if (!kda_peer_loaded() || sets.empty() || ctx.cuda_broken) return;
  const KdaDecodeParams& p0 = sets[0];
  const std::string unsupported = kda_peer_unsupported(p0, ctx.device);
  if (!unsupported.empty()) {
    std::printf("  vllm_cuda_kda peer, %s: not run (%s)\n", shape.c_str(), unsupported.c_str());
    return;
  }
  const cudaStream_t s = ctx.stream;
  const bool with_fb = p0.f_a != nullptr;  // else the sets hold the caller's raw_g
  const int64_t rows = p0.batch, dim = int64_t{p0.heads} * kKdaHeadDim;
  // FP32 state: the only state the peer reads (kda_peer_unsupported).
  const int64_t state_bytes = p0.state_slots * p0.state_slot_stride * 4;
  const int64_t conv_bytes = p0.conv_state_slots * p0.conv_state_slot_stride * 2;
  auto r = DeviceArena::round_up;
  const int64_t per_set = r(3 * 4 * dim * 4) + (with_fb ? r(rows * dim * 2) : 0);
  const int64_t check = 2 * r(state_bytes) + 2 * r(conv_bytes) + 2 * r(rows * dim * 2);
  DeviceArena arena;
  std::string error;
  Blas* blas = with_fb ? shared_blas(&error) : nullptr;
  if ((with_fb && blas == nullptr) || !arena.allocate(check + per_set * static_cast<int64_t>(sets.size()), &error)) {
    std::printf("  vllm_cuda_kda peer, %s: not run (%s)\n", shape.c_str(), error.c_str());
    ++ctx.failures;
    return;
  }
  // vLLM's one-time layouts of the weights, and raw_g = F_B(f_a) of each set.
  std::vector<KdaPeerCall> calls;
  std::vector<const float*> conv_weights(sets.size());
  std::vector<__nv_bfloat16*> raw_g(sets.size(), nullptr);
  Result setup = Result::success();
  for (size_t i = 0; i < sets.size() && setup.ok(); ++i) {
    const KdaDecodeParams& p = sets[i];
    float* conv_weight = arena.take<float>(3 * 4 * dim);
    conv_weights[i] = conv_weight;
    const int64_t section = p.conv_weight_section_stride != 0 ? p.conv_weight_section_stride
                                                              : dim * p.conv_weight_channel_stride;
    if (transpose_conv_weight(static_cast<const float*>(p.conv_weight), section, p.conv_weight_channel_stride,
                              p.conv_weight_tap_stride, dim, conv_weight, s) != cudaSuccess) {
      setup = Result::error(Status::kCudaError, "conv weight layout copy failed");
    }
    if (with_fb) {
      raw_g[i] = arena.take<__nv_bfloat16>(rows * dim);
      if (setup.ok()) {
        setup = blas_gemm(blas, p.f_a, p.f_a_stride, p.f_b_weight, kKdaRank, raw_g[i], dim, p.batch, dim, kKdaRank, s);
      }
    }
    calls.emplace_back(p, p.state, with_fb ? raw_g[i] : p.raw_gate, conv_weight);
  }
  std::string note;
  if (!setup.ok() || !cuda_ok(ctx, cudaStreamSynchronize(s), "peer setup", &note)) {
    std::printf("  vllm_cuda_kda peer, %s: not run (%s%s)\n", shape.c_str(), setup.ok() ? "" : describe(setup).c_str(),
                note.c_str());
    if (!setup.ok()) ++ctx.failures;
    return;
  }

  // Loose check on set 0, both paths from identical copies of its caches: vLLM's kernel
  // computes in fast math without the BF16 roundings of q, k, v and o, so not the same bits.
  char* state_a = arena.take<char>(state_bytes);
  char* state_b = arena.take<char>(state_bytes);
  char* conv_a = arena.take<char>(conv_bytes);
  char* conv_b = arena.take<char>(conv_bytes);
  auto* out_a = arena.take<__nv_bfloat16>(rows * dim);
  auto* out_b = arena.take<__nv_bfloat16>(rows * dim);
  for (char* dst : {state_a, state_b}) cudaMemcpyAsync(dst, p0.state, state_bytes, cudaMemcpyDeviceToDevice, s);
  for (char* dst : {conv_a, conv_b}) cudaMemcpyAsync(dst, p0.conv_state, conv_bytes, cudaMemcpyDeviceToDevice, s);
  KdaDecodeParams fused = p0, peer = p0;
  fused.state = reinterpret_cast<float*>(state_a);
  fused.conv_state = conv_a;
  fused.output = out_a;
  peer.conv_state = conv_b;
  peer.output = out_b;
  LaunchOptions launch_options;
  launch_options.device = &ctx.device;
  Result ran = launch(fused, launch_options, s);
  if (ran.ok()) ran = KdaPeerCall(peer, state_b, with_fb ? raw_g[0] : p0.raw_gate, conv_weights[0]).launch(s);
  double diff = NAN;
  bool copied = false;
  if (ran.ok() && cuda_ok(ctx, cudaStreamSynchronize(s), "peer check", &note)) {
    diff = max_diff_over_rms(out_a, out_b, rows * dim, &copied);
    if (!copied) cuda_ok(ctx, cudaGetLastError(), "peer check download", &note);
  }
  if (!ran.ok() || !copied) {
    std::printf("  vllm_cuda_kda peer, %s: not run (%s%s)\n", shape.c_str(), ran.ok() ? "" : describe(ran).c_str(),
                note.c_str());
    ++ctx.failures;
    return;
  }

  const Timing alone = time_graph(s, static_cast<int>(sets.size()), options.iters,
                                  [&](int i) { return calls[i].launch(s); });
  Timing with_gemm;
  if (with_fb && alone.ok) {
    with_gemm = time_graph(s, static_cast<int>(sets.size()), options.iters, [&](int i) {
      const KdaDecodeParams& p = sets[i];
      const Result gemm = blas_gemm(blas, p.f_a, p.f_a_stride, p.f_b_weight, kKdaRank, raw_g[i], dim, p.batch, dim,
                                    kKdaRank, s);
      return gemm.ok() ? calls[i].launch(s) : gemm;
    });
  }
  if (!alone.ok || (with_fb && !with_gemm.ok)) {
    std::printf("  vllm_cuda_kda peer, %s: timing failed (%s)\n", shape.c_str(),
                (alone.ok ? with_gemm.error : alone.error).c_str());
    if (cuda_ok(ctx, cudaGetLastError(), "peer timing", nullptr)) ++ctx.failures;
    return;
  }
  fields->add("peer_us", alone.us_per_launch);
  if (with_fb) fields->add("peer_with_fb_us", with_gemm.us_per_launch);
  // Its output against the fused path's: the largest difference over the output's RMS.
  fields->add("peer_output_diff", diff);
  char fb[64] = "";
  if (with_fb) std::snprintf(fb, sizeof fb, ", with its F_B GEMM %.2f us", with_gemm.us_per_launch);
  std::printf("  vllm_cuda_kda peer, %s: %.2f us%s (output within %.3f of the fused path's RMS)\n", shape.c_str(),
              alone.us_per_launch, fb, diff);
  // Fast math and the missing roundings move outputs by a few percent of their RMS; a
  // miswired input moves them by about the RMS itself.
  if (!(diff < 0.25)) {
    std::printf("  WARNING: vllm_cuda_kda peer, %s: its output differs from the fused path's by %.3g of the RMS\n",
                shape.c_str(), diff);
  }
}

}  // namespace fusedstep::bench
