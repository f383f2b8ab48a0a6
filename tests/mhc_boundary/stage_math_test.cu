// SPDX-License-Identifier: Apache-2.0
// mHC per-token stage math on the GPU: the fused kernel's half-warp coefficients
// (coefficients_half_warp, one Sinkhorn matrix element per lane) give the same bits as
// the one-lane coefficients() of the composed path, for every output (pre, post, comb),
// on random mixes over several magnitudes, random scalars and iteration counts, and on
// special values (zero and huge sums of squares, infinities, NaN). The fused-vs-composed
// suites check the same through the kernels; this isolates the formula.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "common/gpu_test_util.h"
#include "common/seed.h"
#include "mhc_boundary/stage_math.cuh"

namespace fusedstep {
namespace {

using testing::DeviceBuffer;

// Per token: 24 mixes, the residual sum of squares, the scalars' case index.
constexpr int kTokenFloats = mhc::kMixes + 1;
constexpr int kOutFloats = 24;  // pre 4 | post 4 | comb 16

struct ScalarCase {
  mhc::CoefficientScalars s;
  int64_t hidden;
};

// Two tokens per warp, one per half; the one-lane reference on lane 0 of each half.
__global__ void compare_kernel(const float* tokens, const float* hc, const ScalarCase* cases, int count,
                               float* half_warp_out, float* one_lane_out) {
  const int token = blockIdx.x * 2 + threadIdx.x / 16;
  const int e = threadIdx.x % 16;
  const int t = token < count ? token : count - 1;  // every lane takes part in the shuffles
  const float* mix = tokens + int64_t(t) * kTokenFloats;
  const ScalarCase c = cases[t];
  const mhc::HalfWarpCoefficients h =
      mhc::coefficients_half_warp(mix, mix[mhc::kMixes], c.hidden, hc, hc + 3, c.s);
  if (token >= count) return;
  float* out = half_warp_out + int64_t(token) * kOutFloats;
  out[8 + e] = h.comb;
  if (e < 8) out[e] = h.pre_post;
  if (e == 0) {
    float* ref = one_lane_out + int64_t(token) * kOutFloats;
    mhc::coefficients(mix, mix[mhc::kMixes], c.hidden, hc, hc + 3, c.s, ref, ref + 4, ref + 8);
  }
}

void run_and_compare(const std::vector<float>& tokens, const std::vector<float>& hc,
                     const std::vector<ScalarCase>& cases) {
  const int count = static_cast<int>(cases.size());
  DeviceBuffer<float> d_tokens(tokens.size()), d_hc(hc.size());
  DeviceBuffer<ScalarCase> d_cases(cases.size());
  DeviceBuffer<float> d_half(size_t(count) * kOutFloats), d_one(size_t(count) * kOutFloats);
  d_tokens.upload(tokens);
  d_hc.upload(hc);
  d_cases.upload(cases);
  d_half.fill_bytes(0xff);  // poison: every output element must be written
  d_one.fill_bytes(0x7f);
  compare_kernel<<<(count + 1) / 2, 32>>>(d_tokens.get(), d_hc.get(), d_cases.get(), count, d_half.get(),
                                          d_one.get());
  FS_CUDA_OK(cudaGetLastError());
  FS_CUDA_OK(cudaDeviceSynchronize());
  const std::vector<float> half = d_half.download(), one = d_one.download();
  int reported = 0, differing = 0;
  for (size_t i = 0; i < half.size(); ++i) {
    uint32_t a, b;
    std::memcpy(&a, &half[i], 4);
    std::memcpy(&b, &one[i], 4);
    if (a != b) {
      ++differing;
      if (reported++ < 5) {
        ADD_FAILURE() << "token " << i / kOutFloats << " output " << i % kOutFloats << ": half warp 0x" << std::hex
                      << a << ", one lane 0x" << b;
      }
    }
  }
  EXPECT_EQ(differing, 0) << "of " << half.size() << " outputs";
}

std::vector<float> random_hc(std::mt19937_64& rng) {
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  std::vector<float> hc(3 + mhc::kMixes);
  for (float& v : hc) v = u(rng);
  return hc;
}

void random_case(std::mt19937_64& rng, int tokens_count, bool small) {
  std::vector<float> tokens(size_t(tokens_count) * kTokenFloats);
  std::vector<ScalarCase> cases(tokens_count);
  const float scales[] = {0.05f, 1.0f, 30.0f, 3000.0f};
  const int64_t hiddens[] = {4096, 5120, 7168, 512};
  std::uniform_real_distribution<float> u(-1.0f, 1.0f), pos(0.0f, 1.0f);
  for (int t = 0; t < tokens_count; ++t) {
    const float scale = scales[t % 4];
    for (int n = 0; n < mhc::kMixes; ++n) tokens[size_t(t) * kTokenFloats + n] = scale * u(rng);
    tokens[size_t(t) * kTokenFloats + mhc::kMixes] = 2e4f * scale * pos(rng);
    ScalarCase& c = cases[t];
    c.hidden = hiddens[(t / 4) % 4];
    c.s.rms_eps = 1e-6f * (1.0f + pos(rng));
    c.s.hc_pre_eps = 1e-2f * pos(rng);
    c.s.sinkhorn_eps = t % 3 == 0 ? 1e-6f : 1e-3f * pos(rng);
    c.s.post_mult = 2.0f;
    // Mostly the models' 20; every count from 1 to 40 appears (small: up to 5).
    c.s.sinkhorn_iters = t % 2 == 0 ? 20 : 1 + t % (small ? 5 : 40);
  }
  run_and_compare(tokens, random_hc(rng), cases);
}

TEST(MhcStageMathSmall, HalfWarpCoefficientsMatchOneLane) {
  FS_REQUIRE_GPU();
  std::mt19937_64 rng(testing::fresh_seed());
  random_case(rng, 37, /*small=*/true);
}

TEST(MhcStageMath, HalfWarpCoefficientsMatchOneLaneRandom) {
  FS_REQUIRE_GPU();
  std::mt19937_64 rng(testing::fresh_seed());
  random_case(rng, 1 << 18, /*small=*/false);
}

TEST(MhcStageMath, HalfWarpCoefficientsMatchOneLaneSpecialValues) {
  FS_REQUIRE_GPU();
  std::mt19937_64 rng(testing::fresh_seed());
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float specials[] = {0.0f, -0.0f, inf, -inf, nan, 1e30f, -1e30f, 1e-40f, 88.0f, -104.0f};
  std::vector<float> tokens;
  std::vector<ScalarCase> cases;
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  for (float special : specials) {
    for (int where = 0; where < mhc::kMixes + 1; ++where) {
      for (int n = 0; n < mhc::kMixes; ++n) tokens.push_back(u(rng));
      tokens.push_back(100.0f);
      tokens[tokens.size() - kTokenFloats + where] = special;  // where == 24: the sum of squares
      cases.push_back({mhc::CoefficientScalars{1e-6f, 1e-6f, 1e-6f, 2.0f, 20}, 5120});
    }
  }
  run_and_compare(tokens, random_hc(rng), cases);
}

}  // namespace
}  // namespace fusedstep
