// SPDX-License-Identifier: Apache-2.0
// The fused mHC boundary on the GPU against the composed reference path, bit for bit:
// every token count class (one to many waves), hidden size and weight rounding; batch
// invariance; determinism; every output written and nothing past a row; non-finite
// inputs; CUDA-graph capture and replay; a programmatic-dependent-launch chain.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "common/gpu_test_util.h"
#include "common/mhc_plan_params.h"
#include "fusedstep/mhc_boundary.h"
#include "mhc_boundary/mhc_test_util.h"

namespace fusedstep {
namespace {

using testing::DeviceBuffer;
using testing::MhcCase;
using testing::mhc_plan_params;
using testing::MhcOutputs;
using testing::MhcPadding;
using testing::kModes;
using testing::mode_name;

DeviceInfo device_info() {
  DeviceInfo info;
  const Result r = get_device_info(0, &info);
  EXPECT_TRUE(r.ok()) << r.detail();
  return info;
}

// Launch options whose device description has no room for the one-CTA-per-SM layout, so
// that plan() takes the two-CTA configuration at any batch.
struct TwoCtaLaunch {
  DeviceInfo info = device_info();
  LaunchOptions options;
  TwoCtaLaunch() {
    info.max_smem_per_block_optin = 200 * 1024;
    options.device = &info;
  }
  TwoCtaLaunch(const TwoCtaLaunch&) = delete;
  TwoCtaLaunch& operator=(const TwoCtaLaunch&) = delete;
};

// Tokens of one full wave of the largest tile at `hidden` on this device.
int64_t max_single_wave(int64_t hidden) {
  const DeviceInfo info = device_info();
  MhcBoundaryParams p = mhc_plan_params(hidden, kMhcMaxTokens);
  MhcBoundaryPlan plan_out;
  const Result r = plan(p, info, &plan_out);
  EXPECT_TRUE(r.ok()) << r.detail();
  return int64_t{plan_out.tile} * info.mhc_clusters_per_wave;
}

MhcOutputs run_composed(MhcCase& c) {
  const MhcBoundaryParams params = c.make_params();
  DeviceBuffer<uint8_t> workspace(std::max<int64_t>(composed::workspace_bytes(params), 1));
  c.poison_outputs(0xA5);
  const Result r = composed::launch(params, workspace.get(), nullptr);
  EXPECT_TRUE(r.ok()) << r.detail();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return c.download_outputs();
}

MhcOutputs run_fused(MhcCase& c, LaunchOptions options = {}) {
  c.poison_outputs(0xFF);
  const Result r = launch(c.make_params(), options, nullptr);
  EXPECT_TRUE(r.ok()) << r.detail();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return c.download_outputs();
}

// Bitwise equality of every output; names the output, token and element of the first
// difference.
template <class T>
void expect_identical(const std::vector<T>& got, const std::vector<T>& want, int64_t per_token,
                      const char* name, const std::string& where) {
  const int64_t i = testing::first_difference(got, want);
  EXPECT_EQ(i, -1) << where << ": " << name << " differs first at token " << i / per_token
                   << ", element " << i % per_token;
}
void expect_identical(const MhcOutputs& got, const MhcOutputs& want, int64_t hidden,
                      const std::string& where) {
  expect_identical(got.residual_out, want.residual_out, 4 * hidden, "residual_out", where);
  expect_identical(got.layer_input, want.layer_input, hidden, "layer_input", where);
  expect_identical(got.pre, want.pre, 4, "pre_out", where);
  expect_identical(got.post, want.post, 4, "post_out", where);
  expect_identical(got.comb, want.comb, 16, "comb_out", where);
}

// The outputs of token `t` of a batch, as a one-token MhcOutputs.
MhcOutputs token_outputs(const MhcOutputs& all, int64_t t, int64_t hidden) {
  MhcOutputs one;
  auto take = [t](const auto& v, int64_t n) {
    return std::vector<typename std::decay_t<decltype(v)>::value_type>(v.begin() + t * n, v.begin() + (t + 1) * n);
  };
  one.residual_out = take(all.residual_out, 4 * hidden);
  one.layer_input = take(all.layer_input, hidden);
  one.pre = take(all.pre, 4);
  one.post = take(all.post, 4);
  one.comb = take(all.comb, 16);
  return one;
}

void check_against_composed(int64_t tokens, int64_t hidden, WeightRounding mode, LaunchOptions options = {},
                            int tile = 0) {
  const std::string where = "T=" + std::to_string(tokens) + " hidden=" + std::to_string(hidden) + " " +
                            mode_name(mode) + " tile=" + std::to_string(tile);
  MhcCase c(tokens, hidden, mode, testing::fresh_seed());
  c.tile = tile;
  const std::vector<uint16_t> residual_before = c.residual.download();
  const MhcOutputs want = run_composed(c);
  const MhcOutputs got = run_fused(c, options);
  EXPECT_EQ(testing::poisoned_elements(got), 0) << where;
  expect_identical(got, want, hidden, where);
  EXPECT_TRUE(c.residual.download() == residual_before) << where << ": input residual changed";
}

// plan()'s choices (pure host) are tested in tests/api/mhc_boundary_plan_test.cc. Here:
// the device facts plan() takes them from. Where the device has the opt-in shared memory
// of the one-CTA-per-SM configuration, get_device_info reports its co-resident clusters
// (the occupancy query of the one-time setup), and plan() runs it for a small batch.
TEST(MhcFused, DeviceInfoDescribesBothConfigurations) {
  FS_REQUIRE_GPU();
  const DeviceInfo info = device_info();
  std::printf("[ note     ] co-resident 16-CTA clusters: %d (two CTAs per SM), %d (one CTA per SM); "
              "%d SMs, %d bytes opt-in shared memory\n",
              info.mhc_clusters_per_wave, info.mhc_one_cta_clusters_per_wave, info.sm_count,
              info.max_smem_per_block_optin);
  EXPECT_GE(info.mhc_clusters_per_wave, 1);
  EXPECT_LE(info.mhc_one_cta_clusters_per_wave, info.mhc_clusters_per_wave);
  if (info.max_smem_per_block_optin >= 227 * 1024) {
    EXPECT_GE(info.mhc_one_cta_clusters_per_wave, 1);
    MhcCase c(3, 4096, WeightRounding::kTf32Rna, testing::fresh_seed());
    MhcBoundaryPlan p;
    FS_EXPECT_OK(plan(c.make_params(), info, &p));
    EXPECT_EQ(p.ctas_per_sm, 1);
  } else {
    EXPECT_EQ(info.mhc_one_cta_clusters_per_wave, 0);
  }
}

// A small case for compute-sanitizer (memcheck, racecheck, synccheck): one and two
// clusters (the second partial) of the one-CTA-per-SM configuration, both fragment
// layouts (TF32 and FP32 tiles); at hidden 5120, T = 8 in two tiles of 6 (plan()'s tile
// of fewer than 8 tokens).
TEST(MhcFused, SmallBitwiseVsComposed) {
  FS_REQUIRE_GPU();
  const DeviceInfo info = device_info();
  struct Shape {
    int64_t hidden, tokens, clusters;  // clusters: what plan() picks on the H200
  };
  for (WeightRounding mode : {WeightRounding::kTf32Rna, WeightRounding::kFp32}) {
    for (const Shape shape : {Shape{4096, 3, 1}, Shape{4096, 11, 2}, Shape{5120, 8, 2}}) {
      MhcBoundaryParams params = testing::mhc_plan_params(shape.hidden, shape.tokens);
      params.rounding = mode;
      MhcBoundaryPlan p;
      FS_EXPECT_OK(plan(params, info, &p));
      if (info.mhc_one_cta_clusters_per_wave >= 4 && info.mhc_clusters_per_wave >= 8) {
        // what this case is for
        EXPECT_EQ(p.ctas_per_sm, 1) << shape.tokens << " tokens";
        EXPECT_EQ(p.clusters, shape.clusters) << shape.tokens << " tokens";
      }
      check_against_composed(shape.tokens, shape.hidden, mode);
    }
  }
}

// The same for the two-CTA-per-SM configuration: forced at 3 and 17 tokens (a device
// description without room for the one-CTA layout), and at 8 tokens of hidden 5120 (two
// tiles of 6, packed items); taken by plan() at 129 tokens (hidden 4096: seven clusters
// of 19) and at 64 (hidden 5120: seven clusters of 10, the packed-items variant).
TEST(MhcFused, SmallTwoCtaBitwiseVsComposed) {
  FS_REQUIRE_GPU();
  const TwoCtaLaunch two_cta;
  for (WeightRounding mode : {WeightRounding::kTf32Rna, WeightRounding::kFp32}) {
    for (int64_t tokens : {int64_t{3}, int64_t{17}}) check_against_composed(tokens, 4096, mode, two_cta.options);
  }
  check_against_composed(8, 5120, WeightRounding::kTf32Rna, two_cta.options);
  check_against_composed(129, 4096, WeightRounding::kTf32Rna);
  check_against_composed(64, 5120, WeightRounding::kTf32Rna);
}

// Fused == composed bitwise at hidden 5120 for every token-count class and rounding mode
// (plan()'s configuration and tile).
TEST(MhcFused, BitwiseVsComposedEveryTokenCount5120) {
  FS_REQUIRE_GPU();
  const int64_t wave = max_single_wave(5120);
  for (WeightRounding mode : kModes) {
    for (int64_t tokens : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{7}, int64_t{16}, int64_t{17},
                           int64_t{31}, int64_t{32}, int64_t{33}, int64_t{64}, int64_t{100},
                           int64_t{255}, wave, wave + 1, int64_t{2048}}) {
      check_against_composed(tokens, 5120, mode);
    }
  }
}

// Fused == composed bitwise at hidden 4096 and 7168: the token counts of the 5120 test
// above (the token-count classes), and those where plan() changes configuration at these
// sizes on the H200 (their own largest tiles; T = 32 is two CTAs per SM at 4096, four
// one-CTA clusters at 7168; T = 37 / 45 / 53 are five / six / seven one-CTA clusters at
// 7168, seven the most there; T = 5 and 12 are two and three one-CTA clusters of 4
// tokens at 7168; T = 57 is seven tiles of 9 at 7168, the packed-items variant).
TEST(MhcFused, BitwiseVsComposedOtherHiddens) {
  FS_REQUIRE_GPU();
  for (int64_t hidden : {int64_t{4096}, int64_t{7168}}) {
    const int64_t wave = max_single_wave(hidden);
    for (WeightRounding mode : kModes) {
      for (int64_t tokens :
           {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{5}, int64_t{7}, int64_t{12}, int64_t{16},
            int64_t{17}, int64_t{31}, int64_t{32}, int64_t{33}, int64_t{37}, int64_t{45}, int64_t{53},
            int64_t{57}, int64_t{64}, int64_t{100}, int64_t{255}, wave, wave + 1, int64_t{2048}}) {
        check_against_composed(tokens, hidden, mode);
      }
    }
  }
}

// Hidden sizes whose slice has an odd number of 32-wide chunks (1536: 3, 4608: 9): the
// elementwise pass then takes single chunks instead of pairs of one token. Both
// configurations, partial tiles, and the two-CTA one forced at a small batch.
TEST(MhcFused, BitwiseVsComposedOddChunkHiddens) {
  FS_REQUIRE_GPU();
  const TwoCtaLaunch two_cta;
  for (int64_t hidden : {int64_t{1536}, int64_t{4608}}) {
    for (int64_t tokens : {int64_t{1}, int64_t{11}, int64_t{24}, int64_t{41}, int64_t{129}}) {
      check_against_composed(tokens, hidden, WeightRounding::kTf32Rna);
    }
    check_against_composed(11, hidden, WeightRounding::kFp32);
    check_against_composed(11, hidden, WeightRounding::kTf32Rna, two_cta.options);
  }
}

// Strided views: padded rows are honored and the padding bytes stay untouched.
TEST(MhcFused, StridedViewsLeavePaddingUntouched) {
  FS_REQUIRE_GPU();
  MhcPadding padding;
  padding.x = 8;
  padding.residual = 64;
  padding.residual_out = 16;
  padding.layer_input = 24;
  MhcCase c(37, 5120, WeightRounding::kTf32Rna, testing::fresh_seed(), padding);
  const MhcOutputs want = run_composed(c);
  const MhcOutputs got = run_fused(c);
  EXPECT_EQ(testing::poisoned_elements(got), 0);
  EXPECT_EQ(c.padding_bytes_written(0xFF), 0);
  expect_identical(got, want, 5120, "strided T=37");
}

// A token's outputs do not depend on the batch size, the tile or its position.
TEST(MhcFused, BatchInvariance) {
  FS_REQUIRE_GPU();
  const int64_t hidden = 5120;
  const int64_t wave = max_single_wave(hidden);
  MhcCase alone(1, hidden, WeightRounding::kTf32Rna, testing::fresh_seed());
  const MhcOutputs want = run_fused(alone);
  for (int64_t batch : {int64_t{2}, int64_t{7}, int64_t{12}, int64_t{33}, int64_t{255}, wave + 1}) {
    MhcCase c(batch, hidden, WeightRounding::kTf32Rna, testing::fresh_seed());
    // the same layer: weights of the one-token case
    FS_CUDA_OK(cudaMemcpy(c.weight.get(), alone.weight.get(), c.weight.size() * 4, cudaMemcpyDeviceToDevice));
    FS_CUDA_OK(cudaMemcpy(c.scale.get(), alone.scale.get(), 3 * 4, cudaMemcpyDeviceToDevice));
    FS_CUDA_OK(cudaMemcpy(c.base.get(), alone.base.get(), 24 * 4, cudaMemcpyDeviceToDevice));
    FS_CUDA_OK(cudaMemcpy(c.norm_weight.get(), alone.norm_weight.get(), hidden * 2, cudaMemcpyDeviceToDevice));
    for (int64_t pos : {int64_t{0}, batch / 2, batch - 1}) {
      auto copy = [&](void* dst, const void* src, size_t bytes) {
        ASSERT_EQ(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice), cudaSuccess);
      };
      copy(c.x.get() + pos * hidden, alone.x.get(), hidden * 2);
      copy(c.residual.get() + pos * 4 * hidden, alone.residual.get(), 4 * hidden * 2);
      copy(c.post.get() + pos * 4, alone.post.get(), 16);
      copy(c.comb.get() + pos * 16, alone.comb.get(), 64);
      copy(c.pre_lag.get() + pos * 4, alone.pre_lag.get(), 16);
      const MhcOutputs got = run_fused(c);
      expect_identical(token_outputs(got, pos, hidden), want, hidden,
                       "batch " + std::to_string(batch) + " position " + std::to_string(pos));
    }
  }
}

// Run to run, the same inputs give the same bits (one wave and several waves).
TEST(MhcFused, Deterministic) {
  FS_REQUIRE_GPU();
  for (int64_t tokens : {int64_t{255}, max_single_wave(5120) * 3 + 5}) {
    MhcCase c(tokens, 5120, WeightRounding::kTf32Rne, testing::fresh_seed());
    const MhcOutputs first = run_fused(c);
    for (int run = 0; run < 3; ++run) {
      expect_identical(run_fused(c), first, 5120, "T=" + std::to_string(tokens) + " rerun " + std::to_string(run));
    }
  }
}

// NaN / Inf inputs finish (no hang in the cluster exchange) and leave the other tokens'
// outputs exactly as the composed path computes them.
TEST(MhcFused, NonFiniteInputsFinish) {
  FS_REQUIRE_GPU();
  const int64_t hidden = 5120, tokens = 40;
  MhcCase c(tokens, hidden, WeightRounding::kTf32Rna, testing::fresh_seed());
  const uint16_t nan_bf16 = 0x7FC0, inf_bf16 = 0x7F80;
  const float nan_f = __builtin_nanf("");
  FS_CUDA_OK(cudaMemcpy(c.x.get() + 3 * hidden + 17, &nan_bf16, 2, cudaMemcpyHostToDevice));
  FS_CUDA_OK(cudaMemcpy(c.residual.get() + 10 * 4 * hidden + 5000, &inf_bf16, 2, cudaMemcpyHostToDevice));
  FS_CUDA_OK(cudaMemcpy(c.post.get() + 20 * 4 + 1, &nan_f, 4, cudaMemcpyHostToDevice));
  FS_CUDA_OK(cudaMemcpy(c.comb.get() + 33 * 16 + 7, &nan_f, 4, cudaMemcpyHostToDevice));
  const MhcOutputs want = run_composed(c);
  c.poison_outputs(0xFF);
  FS_EXPECT_OK(launch(c.make_params(), {}, nullptr));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  cudaError_t state = cudaErrorNotReady;
  while ((state = cudaStreamQuery(nullptr)) == cudaErrorNotReady) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "fused launch did not finish (hang)";
  }
  ASSERT_EQ(state, cudaSuccess);
  const MhcOutputs got = c.download_outputs();
  EXPECT_EQ(testing::poisoned_elements(got), 0);
  for (int64_t t = 0; t < tokens; ++t) {
    expect_identical(token_outputs(got, t, hidden), token_outputs(want, t, hidden), hidden,
                     "token " + std::to_string(t));
  }
}

// Captured in a CUDA graph and replayed, with new inputs written between replays.
TEST(MhcFused, GraphCaptureAndReplay) {
  FS_REQUIRE_GPU();
  const int64_t hidden = 5120, tokens = 64;
  MhcCase c(tokens, hidden, WeightRounding::kTf32Rna, testing::fresh_seed());
  MhcCase other(tokens, hidden, WeightRounding::kTf32Rna, testing::fresh_seed());
  const DeviceInfo info = device_info();
  LaunchOptions options;
  options.device = &info;
  cudaStream_t stream;
  FS_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  testing::CapturedGraph graph;
  ASSERT_TRUE(graph.capture(stream, [&] { return launch(c.make_params(), options, stream); }));
  for (int replay = 0; replay < 2; ++replay) {
    if (replay == 1) {  // the next step's inputs, in the same buffers
      FS_CUDA_OK(cudaMemcpy(c.x.get(), other.x.get(), c.x.size() * 2, cudaMemcpyDeviceToDevice));
      FS_CUDA_OK(cudaMemcpy(c.residual.get(), other.residual.get(), c.residual.size() * 2, cudaMemcpyDeviceToDevice));
      FS_CUDA_OK(cudaMemcpy(c.comb.get(), other.comb.get(), c.comb.size() * 4, cudaMemcpyDeviceToDevice));
    }
    const MhcOutputs want = run_composed(c);
    c.poison_outputs(0xFF);
    FS_CUDA_OK(graph.replay(stream));
    FS_CUDA_OK(cudaStreamSynchronize(stream));
    const MhcOutputs got = c.download_outputs();
    EXPECT_EQ(testing::poisoned_elements(got), 0);
    expect_identical(got, want, hidden, "replay " + std::to_string(replay));
  }
  cudaStreamDestroy(stream);
}

// A chain of boundaries launched with PDL (each reads the residual the previous one
// wrote) equals the same chain on the composed path.
TEST(MhcFused, PdlChain) {
  FS_REQUIRE_GPU();
  const int64_t hidden = 5120, tokens = 48;
  constexpr int kSteps = 4;
  MhcCase c(tokens, hidden, WeightRounding::kTf32Rna, testing::fresh_seed());
  const size_t residual_elems = c.residual.size();
  // residual buffers r[0] (the case's input) .. r[kSteps], per path
  // paths: composed, fused
  std::vector<DeviceBuffer<uint16_t>> r_of[2] = {std::vector<DeviceBuffer<uint16_t>>(kSteps),
                                                  std::vector<DeviceBuffer<uint16_t>>(kSteps)};
  for (int path = 0; path < 2; ++path) {
    for (int i = 0; i < kSteps; ++i) {
      r_of[path][i].resize(residual_elems);
      r_of[path][i].fill_bytes(path == 0 ? 0xA5 : 0xFF);
    }
  }
  // The fills run on the legacy default stream, which the non-blocking stream below does
  // not wait for: without this a fill may land after the kernels and poison their output.
  FS_CUDA_OK(cudaDeviceSynchronize());
  const MhcBoundaryParams base = c.make_params();
  DeviceBuffer<uint8_t> workspace(std::max<int64_t>(composed::workspace_bytes(base), 1));
  cudaStream_t stream;
  FS_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  LaunchOptions pdl;
  pdl.pdl = true;
  for (int path = 0; path < 2; ++path) {
    auto& r = r_of[path];
    for (int i = 0; i < kSteps; ++i) {
      MhcBoundaryParams p = base;
      p.residual = reinterpret_cast<const __nv_bfloat16*>(i == 0 ? c.residual.get() : r[i - 1].get());
      p.residual_out = reinterpret_cast<__nv_bfloat16*>(r[i].get());
      if (path == 0) {
        FS_EXPECT_OK(composed::launch(p, workspace.get(), stream));
      } else {
        FS_EXPECT_OK(launch(p, pdl, stream));
      }
    }
    FS_CUDA_OK(cudaStreamSynchronize(stream));
  }
  for (int i = 0; i < kSteps; ++i) {
    const int64_t d = testing::first_difference(r_of[1][i].download(), r_of[0][i].download());
    EXPECT_EQ(d, -1) << "step " << i << ": residual_out differs first at element " << d;
  }
  cudaStreamDestroy(stream);
}

// ---- large token counts: inputs filled on the device (host generation of 16k tokens
// would dominate the suite's time), outputs compared on the device.
__device__ uint32_t mix_bits(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return static_cast<uint32_t>(x);
}
// BF16 values uniform in (-2, 2).
__global__ void fill_bf16(uint16_t* out, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const float u = (mix_bits(seed * 0x9e3779b97f4a7c15ull + i) >> 8) * 0x1p-24f;
    out[i] = __bfloat16_as_ushort(__float2bfloat16_rn(4.0f * u - 2.0f));
  }
}
__global__ void fill_f32(float* out, int64_t n, uint64_t seed, float lo, float hi) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const float u = (mix_bits(seed * 0x9e3779b97f4a7c15ull + i) >> 8) * 0x1p-24f;
    out[i] = lo + (hi - lo) * u;
  }
}
// Smallest index where the byte arrays differ (INT64_MAX if none).
__global__ void first_difference_kernel(const uint8_t* a, const uint8_t* b, int64_t n,
                                        unsigned long long* first) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    if (a[i] != b[i]) atomicMin(first, static_cast<unsigned long long>(i));
  }
}
int64_t device_first_difference(const void* a, const void* b, int64_t bytes) {
  DeviceBuffer<unsigned long long> first(1);
  first.fill_bytes(0xFF);
  first_difference_kernel<<<1024, 256>>>(static_cast<const uint8_t*>(a), static_cast<const uint8_t*>(b), bytes,
                                         first.get());
  const unsigned long long i = first.download()[0];
  return i == ~0ull ? -1 : static_cast<int64_t>(i);
}

// 16384 tokens (many waves): fused == composed bitwise, every output written.
TEST(MhcFused, ManyWaves16384Tokens) {
  FS_REQUIRE_GPU();
  const int64_t hidden = 5120, tokens = 16384;
  MhcCase layer(1, hidden, WeightRounding::kTf32Rna, testing::fresh_seed());  // weights
  const uint64_t seed = testing::fresh_seed();
  DeviceBuffer<uint16_t> x(tokens * hidden), residual(tokens * 4 * hidden);
  DeviceBuffer<float> post(tokens * 4), comb(tokens * 16), pre_lag(tokens * 4);
  fill_bf16<<<1024, 256>>>(x.get(), x.size(), seed);
  fill_bf16<<<1024, 256>>>(residual.get(), residual.size(), seed + 1);
  fill_f32<<<256, 256>>>(post.get(), post.size(), seed + 2, 0.5f, 2.0f);
  fill_f32<<<256, 256>>>(comb.get(), comb.size(), seed + 3, 0.0f, 0.5f);
  fill_f32<<<256, 256>>>(pre_lag.get(), pre_lag.size(), seed + 4, 0.2f, 1.0f);
  struct Out {
    DeviceBuffer<uint16_t> residual_out, layer_input;
    DeviceBuffer<float> pre, post, comb;
  } outs[2];
  MhcBoundaryParams p = layer.make_params();
  p.tokens = tokens;
  p.x = reinterpret_cast<const __nv_bfloat16*>(x.get());
  p.residual = reinterpret_cast<const __nv_bfloat16*>(residual.get());
  p.post = post.get();
  p.comb = comb.get();
  p.pre_lag = pre_lag.get();
  MhcBoundaryParams per_path[2];
  for (int i = 0; i < 2; ++i) {
    outs[i].residual_out.resize(tokens * 4 * hidden);
    outs[i].layer_input.resize(tokens * hidden);
    outs[i].pre.resize(tokens * 4);
    outs[i].post.resize(tokens * 4);
    outs[i].comb.resize(tokens * 16);
    for (auto* b : {&outs[i].residual_out, &outs[i].layer_input}) b->fill_bytes(i == 0 ? 0xA5 : 0xFF);
    for (auto* b : {&outs[i].pre, &outs[i].post, &outs[i].comb}) b->fill_bytes(i == 0 ? 0xA5 : 0xFF);
    per_path[i] = p;
    per_path[i].residual_out = reinterpret_cast<__nv_bfloat16*>(outs[i].residual_out.get());
    per_path[i].layer_input = reinterpret_cast<__nv_bfloat16*>(outs[i].layer_input.get());
    per_path[i].pre_out = outs[i].pre.get();
    per_path[i].post_out = outs[i].post.get();
    per_path[i].comb_out = outs[i].comb.get();
  }
  DeviceBuffer<uint8_t> workspace(std::max<int64_t>(composed::workspace_bytes(per_path[0]), 1));
  FS_EXPECT_OK(composed::launch(per_path[0], workspace.get(), nullptr));
  auto compare = [&](const void* a, const void* b, int64_t bytes, const char* name) {
    const int64_t d = device_first_difference(a, b, bytes);
    EXPECT_EQ(d, -1) << name << " differs first at byte " << d;
  };
  // The fused call into freshly poisoned outputs.
  {
    for (auto* b : {&outs[1].residual_out, &outs[1].layer_input}) b->fill_bytes(0xFF);
    for (auto* b : {&outs[1].pre, &outs[1].post, &outs[1].comb}) b->fill_bytes(0xFF);
    FS_EXPECT_OK(launch(per_path[1], {}, nullptr));
    FS_CUDA_OK(cudaDeviceSynchronize());
    compare(outs[0].residual_out.get(), outs[1].residual_out.get(), tokens * 4 * hidden * 2, "residual_out");
    compare(outs[0].layer_input.get(), outs[1].layer_input.get(), tokens * hidden * 2, "layer_input");
    compare(outs[0].pre.get(), outs[1].pre.get(), tokens * 16, "pre_out");
    compare(outs[0].post.get(), outs[1].post.get(), tokens * 16, "post_out");
    compare(outs[0].comb.get(), outs[1].comb.get(), tokens * 64, "comb_out");
  }
}

}  // namespace
}  // namespace fusedstep
