// SPDX-License-Identifier: Apache-2.0
// CPU reference of the mHC shifted boundary (docs/numerics.md, "mHC shifted boundary").
#pragma once

#include <cstdint>
#include <vector>

#include "fusedstep/weight_rounding.h"
#include "fusedstep_reference/common.h"

namespace fusedstep::reference {

// Host inputs, contiguous: BF16 values as their 16-bit patterns.
struct MhcBoundaryProblem {
  int64_t tokens = 0;
  int64_t hidden = 0;
  const uint16_t* x = nullptr;            // [tokens, hidden]
  const uint16_t* residual = nullptr;     // [tokens, 4, hidden]
  const float* post = nullptr;            // [tokens, 4]
  const float* comb = nullptr;            // [tokens, 4, 4], [j source][s destination]
  const float* pre_lag = nullptr;         // [tokens, 4]
  const float* fn = nullptr;              // [24, 4 * hidden], column k = j * hidden + h
  const float* scale = nullptr;           // [3]
  const float* base = nullptr;            // [24]
  const uint16_t* norm_weight = nullptr;  // [hidden]
  WeightRounding rounding = WeightRounding::kTf32Rna;
  float rms_eps = 1e-6f;
  float hc_pre_eps = 1e-6f;
  float sinkhorn_eps = 1e-6f;
  float post_mult = 2.0f;
  float norm_eps = 1e-6f;
  int sinkhorn_iters = 20;
};

// Outputs as doubles (in float32 mode each holds the exact float / BF16 value the
// GPU stores). Intermediates are kept for stage tests.
struct MhcBoundaryResult {
  std::vector<double> residual_out;  // [tokens, 4, hidden]
  std::vector<double> layer_input;   // [tokens, hidden]
  std::vector<double> pre;           // [tokens, 4]
  std::vector<double> post;          // [tokens, 4]
  std::vector<double> comb;          // [tokens, 4, 4]
  std::vector<double> mix;           // [tokens, 24] projection before rstd
  std::vector<double> ssq;           // [tokens] sum of squares of residual_out
  std::vector<double> ssq_li;        // [tokens] sum of squares of li
  std::vector<double> li;            // [tokens, hidden] lagged collapse (BF16 value in float32 mode)
};

// Throws std::invalid_argument (naming the field) for tokens < 0, hidden <= 0,
// sinkhorn_iters < 1 or a missing input when tokens > 0. The float32 mode walks the
// kernel's slice / chunk / k-step decomposition and so also needs
// fusedstep::mhc::hidden_supported(hidden) (a multiple of 512); float64 takes any
// hidden. tokens == 0 returns empty vectors.
MhcBoundaryResult mhc_boundary(const MhcBoundaryProblem& problem, Precision precision);

// ---- stages, exposed for unit tests (one token; float32 versions follow the contract)
// Softmax rows + eps, a column pass, then iters - 1 (row, column) passes on a 4x4
// row-major matrix of logits a[8..23].
void sinkhorn_f64(const double logits[16], int iters, double eps, double out[16]);
void sinkhorn_f32(const float logits[16], int iters, float eps, float out[16]);

// Residual update of one element and destination stream before its BF16 rounding:
// float32 = mul.ftz then fma.ftz over j = 0..3 (subnormal inputs and results flushed
// to signed zero); float64 = the exact sum post_s * x + sum_j comb_js[j] * r[j].
float residual_update_f32(float post_s, float x, const float comb_js[4], const float r[4]);
double residual_update_f64(double post_s, double x, const double comb_js[4], const double r[4]);

// Lagged collapse before its BF16 rounding: IEEE FMA chain from +0 over j = 0..3.
float lagged_collapse_f32(const float pre[4], const float cur[4]);

// The contract's transcendental formulas with the approximate GPU instructions
// replaced by correctly rounded ones (up to a double rounding, ~2^-29 likely):
// exp(x) = ex2(x * log2(e) rounded to float); sigmoid(x) = 1 / min(1 + exp(-x), 2^126);
// rsqrt(x) = 1 / sqrt(x).
float exp_f32(float x);
float sigmoid_f32(float x);
float rsqrt_f32(float x);
double sigmoid_f64(double x);

// Pre / post / comb of one token from its 24 mixes and its sum of squares, with the
// problem's scale, base, eps values, post_mult and sinkhorn_iters.
void coefficients_f32(const float mix[24], float ssq, const MhcBoundaryProblem& problem,
                      float pre[4], float post[4], float comb[16]);
void coefficients_f64(const double mix[24], double ssq, const MhcBoundaryProblem& problem,
                      double pre[4], double post[4], double comb[16]);

}  // namespace fusedstep::reference
