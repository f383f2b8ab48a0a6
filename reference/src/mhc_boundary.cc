// SPDX-License-Identifier: Apache-2.0
// CPU reference of the mHC shifted boundary. The float32 mode follows the rounding
// points and orders of docs/numerics.md ("mHC shifted boundary") wherever they are
// IEEE-defined; the float64 mode is the mathematical truth of the same formulas.
// Built with -ffp-contract=off: every fused multiply-add is an explicit std::fma.
#include "fusedstep_reference/mhc_boundary.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "float_bits.h"
#include "mhc_boundary/layout.h"

namespace fusedstep::reference {
namespace {

constexpr int kStreams = mhc::kStreams;
constexpr int kMixes = mhc::kMixes;

// Signed zero for a subnormal, the value otherwise (the .ftz of mul/fma).
float flush_subnormal(float v) {
  return std::fpclassify(v) == FP_SUBNORMAL ? std::copysign(0.0f, v) : v;
}

float mul_ftz(float a, float b) { return flush_subnormal(flush_subnormal(a) * flush_subnormal(b)); }

float fma_ftz(float a, float b, float c) {
  return flush_subnormal(std::fma(flush_subnormal(a), flush_subnormal(b), flush_subnormal(c)));
}

float bf16_value(uint16_t bits) { return fusedstep::bits::bf16_to_f32(bits); }
float round_bf16(float v) { return fusedstep::bits::round_bf16(v); }

// The contract's sum of squares of one slice of `streams` rows of `hidden` floats
// (chunks of 8: an even and an odd FMA lane over pairs p, then streams j; chunk =
// e + o; chunks summed sequentially from +0).
float slice_sum_of_squares(const float* rows, int streams, int64_t hidden, int slice) {
  const int64_t S = mhc::slice_of(hidden);
  float slice_sum = 0.0f;
  for (int64_t c = 0; c < S / 8; ++c) {
    const int64_t h0 = slice * S + 8 * c;
    float e = 0.0f, o = 0.0f;
    for (int p = 0; p < 4; ++p) {
      for (int j = 0; j < streams; ++j) {
        const float ve = rows[j * hidden + h0 + 2 * p];
        const float vo = rows[j * hidden + h0 + 2 * p + 1];
        e = std::fma(ve, ve, e);
        o = std::fma(vo, vo, o);
      }
    }
    slice_sum = slice_sum + (e + o);
  }
  return slice_sum;
}

float sum_of_squares_f32(const float* rows, int streams, int64_t hidden) {
  float total = 0.0f;
  for (int r = 0; r < mhc::kCluster; ++r) total = total + slice_sum_of_squares(rows, streams, hidden, r);
  return total;
}

void require(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("reference::mhc_boundary: " + what);
}

void validate(const MhcBoundaryProblem& p, Precision precision) {
  require(p.tokens >= 0, "tokens = " + std::to_string(p.tokens) + " must be >= 0");
  require(p.hidden > 0, "hidden = " + std::to_string(p.hidden) + " must be > 0");
  require(p.sinkhorn_iters >= 1,
          "sinkhorn_iters = " + std::to_string(p.sinkhorn_iters) + " must be >= 1");
  if (precision == Precision::kFloat32) {
    require(mhc::hidden_supported(p.hidden),
            "hidden = " + std::to_string(p.hidden) +
                " must be a multiple of 512 in float32 mode (the kernel's slice decomposition)");
  }
  if (p.tokens == 0) return;
  const struct { const void* ptr; const char* name; } inputs[] = {
      {p.x, "x"},       {p.residual, "residual"}, {p.post, "post"}, {p.comb, "comb"},
      {p.pre_lag, "pre_lag"}, {p.fn, "fn"},       {p.scale, "scale"}, {p.base, "base"},
      {p.norm_weight, "norm_weight"}};
  for (const auto& in : inputs) require(in.ptr != nullptr, std::string(in.name) + " is null");
}

// The BF16 parts of every prepared weight as floats: parts[(p * 24 + n) * 4H + k].
std::vector<float> weight_parts_f32(const MhcBoundaryProblem& p) {
  const int P = fusedstep::bits::weight_parts(p.rounding);
  const int64_t K = kStreams * p.hidden;
  std::vector<float> parts(size_t(P) * kMixes * K);
  for (int n = 0; n < kMixes; ++n) {
    for (int64_t k = 0; k < K; ++k) {
      uint16_t split[3];
      fusedstep::bits::split_weight(fusedstep::bits::round_weight(p.fn[n * K + k], p.rounding), P,
                                    split);
      for (int q = 0; q < P; ++q) parts[(size_t(q) * kMixes + n) * K + k] = bf16_value(split[q]);
    }
  }
  return parts;
}

// Column k = stream * hidden + h of every k-index of one slice's k steps, in step
// order (the MMA chains' operand order; layout.h's k_coord).
std::vector<int64_t> slice_k_order(int64_t hidden, int slice) {
  const int64_t steps = mhc::k_steps(hidden);
  std::vector<int64_t> cols(size_t(steps) * 16);
  for (int64_t step = 0; step < steps; ++step) {
    for (int k = 0; k < 16; ++k) {
      const mhc::KCoord c = mhc::k_coord(step, k);
      cols[size_t(step) * 16 + k] = c.stream * hidden + slice * mhc::slice_of(hidden) + c.hidden_in_slice;
    }
  }
  return cols;
}

void token_f32(const MhcBoundaryProblem& p, int64_t t, const std::vector<float>& parts,
               const std::vector<std::vector<int64_t>>& k_order, MhcBoundaryResult& out) {
  const int64_t H = p.hidden, K = kStreams * H;
  const uint16_t* x = p.x + t * H;
  const uint16_t* res = p.residual + t * K;
  const float* post = p.post + t * kStreams;
  const float* comb = p.comb + t * kStreams * kStreams;
  const float* pre_lag = p.pre_lag + t * kStreams;

  // 1-2. Residual update and lagged collapse (only the BF16 values go on).
  std::vector<float> cur(K), li(H);
  for (int64_t h = 0; h < H; ++h) {
    float r[kStreams];
    for (int j = 0; j < kStreams; ++j) r[j] = bf16_value(res[j * H + h]);
    for (int s = 0; s < kStreams; ++s) {
      const float comb_js[kStreams] = {comb[0 * 4 + s], comb[1 * 4 + s], comb[2 * 4 + s],
                                       comb[3 * 4 + s]};
      cur[s * H + h] = round_bf16(residual_update_f32(post[s], bf16_value(x[h]), comb_js, r));
    }
    const float cur_h[kStreams] = {cur[h], cur[H + h], cur[2 * H + h], cur[3 * H + h]};
    li[h] = round_bf16(lagged_collapse_f32(pre_lag, cur_h));
  }

  // 3-4. Sums of squares and the layer input.
  const float ssq = sum_of_squares_f32(cur.data(), kStreams, H);
  const float ssq_li = sum_of_squares_f32(li.data(), 1, H);
  const float rstd_li = rsqrt_f32(ssq_li / static_cast<float>(H) + p.norm_eps);
  for (int64_t h = 0; h < H; ++h) {
    out.layer_input[t * H + h] = round_bf16((li[h] * rstd_li) * bf16_value(p.norm_weight[h]));
    out.li[t * H + h] = li[h];
  }
  for (int64_t k = 0; k < K; ++k) out.residual_out[t * K + k] = cur[k];

  // 5. Projection: per slice, eight warp chains per part in step order; the BF16 x
  // BF16 products are exact in FP32, the tensor core's internal sums are not
  // IEEE-specified, so this is the closest IEEE sequential walk of the same chains.
  const int P = fusedstep::bits::weight_parts(p.rounding);
  const int64_t spw = mhc::steps_per_warp(H);
  float mix[kMixes];
  for (int n = 0; n < kMixes; ++n) {
    float total = 0.0f;
    for (int r = 0; r < mhc::kCluster; ++r) {
      const std::vector<int64_t>& cols = k_order[r];
      float slice_sum = 0.0f;
      for (int w = 0; w < mhc::kMmaWarps; ++w) {
        float acc[3] = {0.0f, 0.0f, 0.0f};
        for (int64_t i = w * spw * 16; i < (w + 1) * spw * 16; ++i) {
          const int64_t k = cols[size_t(i)];
          for (int q = 0; q < P; ++q) acc[q] = acc[q] + parts[(size_t(q) * kMixes + n) * K + k] * cur[k];
        }
        const float warp = P == 2 ? acc[0] + acc[1] : (acc[0] + acc[1]) + acc[2];
        slice_sum = slice_sum + warp;
      }
      total = total + slice_sum;
    }
    mix[n] = total;
    out.mix[t * kMixes + n] = total;
  }
  out.ssq[t] = ssq;
  out.ssq_li[t] = ssq_li;

  // 6-7. Coefficients.
  float pre[4], post_out[4], comb_out[16];
  coefficients_f32(mix, ssq, p, pre, post_out, comb_out);
  for (int j = 0; j < 4; ++j) {
    out.pre[t * 4 + j] = pre[j];
    out.post[t * 4 + j] = post_out[j];
  }
  for (int i = 0; i < 16; ++i) out.comb[t * 16 + i] = comb_out[i];
}

void token_f64(const MhcBoundaryProblem& p, int64_t t, const std::vector<double>& weight,
               MhcBoundaryResult& out) {
  const int64_t H = p.hidden, K = kStreams * H;
  const uint16_t* x = p.x + t * H;
  const uint16_t* res = p.residual + t * K;
  const float* post = p.post + t * kStreams;
  const float* comb = p.comb + t * kStreams * kStreams;
  const float* pre_lag = p.pre_lag + t * kStreams;

  double* cur = out.residual_out.data() + t * K;
  double* li = out.li.data() + t * H;
  double ssq = 0.0, ssq_li = 0.0;
  for (int64_t h = 0; h < H; ++h) {
    double r[kStreams];
    for (int j = 0; j < kStreams; ++j) r[j] = bf16_value(res[j * H + h]);
    for (int s = 0; s < kStreams; ++s) {
      const double comb_js[kStreams] = {comb[0 * 4 + s], comb[1 * 4 + s], comb[2 * 4 + s],
                                        comb[3 * 4 + s]};
      cur[s * H + h] = residual_update_f64(post[s], bf16_value(x[h]), comb_js, r);
    }
    double acc = 0.0;
    for (int j = 0; j < kStreams; ++j) acc += double(pre_lag[j]) * cur[j * H + h];
    li[h] = acc;
    ssq_li += acc * acc;
  }
  for (int64_t k = 0; k < K; ++k) ssq += cur[k] * cur[k];
  const double rstd_li = 1.0 / std::sqrt(ssq_li / double(H) + double(p.norm_eps));
  for (int64_t h = 0; h < H; ++h) {
    out.layer_input[t * H + h] = li[h] * rstd_li * double(bf16_value(p.norm_weight[h]));
  }
  double mix[kMixes];
  for (int n = 0; n < kMixes; ++n) {
    double acc = 0.0;
    for (int64_t k = 0; k < K; ++k) acc += weight[size_t(n) * K + k] * cur[k];
    mix[n] = acc;
    out.mix[t * kMixes + n] = acc;
  }
  out.ssq[t] = ssq;
  out.ssq_li[t] = ssq_li;
  coefficients_f64(mix, ssq, p, out.pre.data() + t * 4, out.post.data() + t * 4,
                   out.comb.data() + t * 16);
}

}  // namespace

float residual_update_f32(float post_s, float x, const float comb_js[4], const float r[4]) {
  float nu = mul_ftz(post_s, x);
  for (int j = 0; j < kStreams; ++j) nu = fma_ftz(comb_js[j], r[j], nu);
  return nu;
}

double residual_update_f64(double post_s, double x, const double comb_js[4], const double r[4]) {
  double nu = post_s * x;
  for (int j = 0; j < kStreams; ++j) nu += comb_js[j] * r[j];
  return nu;
}

float lagged_collapse_f32(const float pre[4], const float cur[4]) {
  float acc = 0.0f;
  for (int j = 0; j < kStreams; ++j) acc = std::fma(pre[j], cur[j], acc);
  return acc;
}

float exp_f32(float x) {
  const float t = x * 1.4426950408889634f;  // the contract's RN multiply before ex2
  return static_cast<float>(std::exp2(static_cast<double>(t)));
}

float sigmoid_f32(float x) { return 1.0f / std::fmin(1.0f + exp_f32(-x), 0x1p126f); }

float rsqrt_f32(float x) { return static_cast<float>(1.0 / std::sqrt(static_cast<double>(x))); }

double sigmoid_f64(double x) { return 1.0 / (1.0 + std::exp(-x)); }

void sinkhorn_f32(const float logits[16], int iters, float eps, float out[16]) {
  float c[16];
  for (int i = 0; i < 4; ++i) {
    const float* row = logits + 4 * i;
    const float m = std::fmax(std::fmax(row[0], row[1]), std::fmax(row[2], row[3]));
    float e[4];
    for (int k = 0; k < 4; ++k) e[k] = exp_f32(row[k] - m);
    const float inv = 1.0f / (((e[0] + e[1]) + e[2]) + e[3]);
    for (int k = 0; k < 4; ++k) c[4 * i + k] = std::fma(e[k], inv, eps);
  }
  auto column_pass = [&] {
    for (int k = 0; k < 4; ++k) {
      const float inv = 1.0f / (((c[k] + c[4 + k]) + (c[8 + k] + c[12 + k])) + eps);
      for (int i = 0; i < 4; ++i) c[4 * i + k] = c[4 * i + k] * inv;
    }
  };
  column_pass();
  for (int it = 1; it < iters; ++it) {
    for (int i = 0; i < 4; ++i) {
      const float inv = 1.0f / ((((c[4 * i] + c[4 * i + 1]) + c[4 * i + 2]) + c[4 * i + 3]) + eps);
      for (int k = 0; k < 4; ++k) c[4 * i + k] = c[4 * i + k] * inv;
    }
    column_pass();
  }
  std::copy(c, c + 16, out);
}

void sinkhorn_f64(const double logits[16], int iters, double eps, double out[16]) {
  double c[16];
  for (int i = 0; i < 4; ++i) {
    const double* row = logits + 4 * i;
    const double m = std::max(std::max(row[0], row[1]), std::max(row[2], row[3]));
    double e[4], sum = 0.0;
    for (int k = 0; k < 4; ++k) sum += (e[k] = std::exp(row[k] - m));
    for (int k = 0; k < 4; ++k) c[4 * i + k] = e[k] / sum + eps;
  }
  auto column_pass = [&] {
    for (int k = 0; k < 4; ++k) {
      const double sum = c[k] + c[4 + k] + c[8 + k] + c[12 + k] + eps;
      for (int i = 0; i < 4; ++i) c[4 * i + k] /= sum;
    }
  };
  column_pass();
  for (int it = 1; it < iters; ++it) {
    for (int i = 0; i < 4; ++i) {
      const double sum = c[4 * i] + c[4 * i + 1] + c[4 * i + 2] + c[4 * i + 3] + eps;
      for (int k = 0; k < 4; ++k) c[4 * i + k] /= sum;
    }
    column_pass();
  }
  std::copy(c, c + 16, out);
}

void coefficients_f32(const float mix[24], float ssq, const MhcBoundaryProblem& p, float pre[4],
                      float post[4], float comb[16]) {
  const float rstd = rsqrt_f32(ssq / static_cast<float>(4 * p.hidden) + p.rms_eps);
  float a[kMixes];
  for (int n = 0; n < kMixes; ++n) {
    const int g = n < 4 ? 0 : (n < 8 ? 1 : 2);
    a[n] = std::fma(mix[n] * rstd, p.scale[g], p.base[n]);
  }
  for (int j = 0; j < 4; ++j) {
    pre[j] = sigmoid_f32(a[j]) + p.hc_pre_eps;
    post[j] = sigmoid_f32(a[4 + j]) * p.post_mult;
  }
  sinkhorn_f32(a + 8, p.sinkhorn_iters, p.sinkhorn_eps, comb);
}

void coefficients_f64(const double mix[24], double ssq, const MhcBoundaryProblem& p,
                      double pre[4], double post[4], double comb[16]) {
  const double rstd = 1.0 / std::sqrt(ssq / double(4 * p.hidden) + double(p.rms_eps));
  double a[kMixes];
  for (int n = 0; n < kMixes; ++n) {
    const int g = n < 4 ? 0 : (n < 8 ? 1 : 2);
    a[n] = mix[n] * rstd * double(p.scale[g]) + double(p.base[n]);
  }
  for (int j = 0; j < 4; ++j) {
    pre[j] = sigmoid_f64(a[j]) + double(p.hc_pre_eps);
    post[j] = sigmoid_f64(a[4 + j]) * double(p.post_mult);
  }
  sinkhorn_f64(a + 8, p.sinkhorn_iters, double(p.sinkhorn_eps), comb);
}

MhcBoundaryResult mhc_boundary(const MhcBoundaryProblem& p, Precision precision) {
  validate(p, precision);
  const int64_t T = p.tokens, H = p.hidden, K = kStreams * H;
  MhcBoundaryResult out;
  out.residual_out.resize(size_t(T * K));
  out.layer_input.resize(size_t(T * H));
  out.li.resize(size_t(T * H));
  out.pre.resize(size_t(T * 4));
  out.post.resize(size_t(T * 4));
  out.comb.resize(size_t(T * 16));
  out.mix.resize(size_t(T * kMixes));
  out.ssq.resize(size_t(T));
  out.ssq_li.resize(size_t(T));
  if (T == 0) return out;

  if (precision == Precision::kFloat32) {
    const std::vector<float> parts = weight_parts_f32(p);
    std::vector<std::vector<int64_t>> k_order(mhc::kCluster);
    for (int r = 0; r < mhc::kCluster; ++r) k_order[r] = slice_k_order(H, r);
    for (int64_t t = 0; t < T; ++t) token_f32(p, t, parts, k_order, out);
  } else {
    // The rounding rule is part of the selected semantics: the truth multiplies by
    // the rounded weight (exactly, in double).
    std::vector<double> weight(size_t(kMixes) * K);
    for (size_t i = 0; i < weight.size(); ++i) {
      weight[i] = fusedstep::bits::round_weight(p.fn[i], p.rounding);
    }
    for (int64_t t = 0; t < T; ++t) token_f64(p, t, weight, out);
  }
  return out;
}

}  // namespace fusedstep::reference
