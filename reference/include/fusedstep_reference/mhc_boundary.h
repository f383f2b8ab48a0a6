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
};

MhcBoundaryResult mhc_boundary(const MhcBoundaryProblem& problem, Precision precision);

// ---- stages, exposed for unit tests (one token; float32 versions follow the contract)
// Softmax rows + eps, a column pass, then iters - 1 (row, column) passes on a 4x4
// row-major matrix of logits a[8..23].
void sinkhorn_f64(const double logits[16], int iters, double eps, double out[16]);
void sinkhorn_f32(const float logits[16], int iters, float eps, float out[16]);

}  // namespace fusedstep::reference
