// SPDX-License-Identifier: Apache-2.0
// fusedstep-bench: the CPU reference self-check. A tiny problem per operation runs
// through the reference's float32 mode (the GPU's rounding points) and its float64
// mode (the mathematical truth); they must agree within loose, norm-wise bounds.
// This runs everywhere, with or without a GPU.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <random>
#include <string>
#include <vector>

#include "bench.h"
#include "float_bits.h"
#include "fusedstep_reference/kda_decode.h"
#include "fusedstep_reference/mhc_boundary.h"

namespace fusedstep::bench {
namespace {

namespace ref = fusedstep::reference;

struct Random {
  explicit Random(uint64_t seed) : engine(seed) {}
  float uniform(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(engine); }
  std::vector<float> floats(size_t n, float lo, float hi) {
    std::vector<float> v(n);
    for (auto& x : v) x = uniform(lo, hi);
    return v;
  }
  std::vector<uint16_t> bf16(size_t n, float lo, float hi) {
    std::vector<uint16_t> v(n);
    for (auto& x : v) x = bits::bf16_rne(uniform(lo, hi));
    return v;
  }
  std::mt19937_64 engine;
};

// Largest |a - b| relative to the largest |b| (norm-wise: BF16 outputs near zero
// carry absolute, not relative, rounding). -1 when the sizes differ or either is
// empty (an unbuilt reference returns nothing).
double normwise_error(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.empty() || a.size() != b.size()) return -1.0;
  double diff = 0.0, scale = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) {
      if (!(std::isnan(a[i]) && std::isnan(b[i]))) return INFINITY;  // NaN = untouched, in both
      continue;
    }
    diff = std::max(diff, std::fabs(a[i] - b[i]));
    scale = std::max(scale, std::fabs(b[i]));
  }
  return diff / std::max(scale, 1e-30);
}

struct Compared {
  const char* name;
  const std::vector<double>* f32;
  const std::vector<double>* f64;
  double bound;
};

// Prints "<op>: pass|FAIL|not built yet (...)"; returns false only on a failure.
bool report(const char* op, const std::vector<Compared>& outputs) {
  std::string detail;
  bool built = true, pass = true;
  for (const Compared& c : outputs) {
    const double err = normwise_error(*c.f32, *c.f64);
    if (err < 0.0) {
      built = false;
      break;
    }
    char buf[96];
    std::snprintf(buf, sizeof buf, "%s%s %.2e (bound %.0e)", detail.empty() ? "" : ", ", c.name,
                  err, c.bound);
    detail += buf;
    if (!(err <= c.bound)) pass = false;
  }
  if (!built) {
    std::printf("  %-13s not built yet: the reference returned no outputs\n", op);
    return true;
  }
  std::printf("  %-13s %s  float32 vs float64: %s\n", op, pass ? "pass" : "FAIL", detail.c_str());
  return pass;
}

bool check_mhc(uint64_t seed) {
  constexpr int64_t kTokens = 3, kHidden = 512;
  Random rng(seed);
  auto x = rng.bf16(kTokens * kHidden, -2.0f, 2.0f);
  auto residual = rng.bf16(kTokens * 4 * kHidden, -4.0f, 4.0f);
  auto post = rng.floats(kTokens * 4, 0.0f, 2.0f);
  auto comb = rng.floats(kTokens * 16, 0.0f, 0.5f);
  auto pre_lag = rng.floats(kTokens * 4, 0.0f, 1.0f);
  auto fn = rng.floats(24 * 4 * kHidden, -0.05f, 0.05f);
  auto scale = rng.floats(3, 0.1f, 0.5f);
  auto base = rng.floats(24, -1.0f, 1.0f);
  auto norm_weight = rng.bf16(kHidden, 0.5f, 1.5f);

  ref::MhcBoundaryProblem p;
  p.tokens = kTokens;
  p.hidden = kHidden;
  p.x = x.data();
  p.residual = residual.data();
  p.post = post.data();
  p.comb = comb.data();
  p.pre_lag = pre_lag.data();
  p.fn = fn.data();
  p.scale = scale.data();
  p.base = base.data();
  p.norm_weight = norm_weight.data();
  const ref::MhcBoundaryResult r32 = ref::mhc_boundary(p, ref::Precision::kFloat32);
  const ref::MhcBoundaryResult r64 = ref::mhc_boundary(p, ref::Precision::kFloat64);
  // BF16 outputs differ by rounding (2^-8 relative) plus TF32 weights in the
  // projection; the coefficients pass through 20 Sinkhorn iterations.
  return report("mhc_boundary", {{"residual_out", &r32.residual_out, &r64.residual_out, 1e-2},
                                 {"layer_input", &r32.layer_input, &r64.layer_input, 2e-2},
                                 {"pre", &r32.pre, &r64.pre, 2e-2},
                                 {"post", &r32.post, &r64.post, 2e-2},
                                 {"comb", &r32.comb, &r64.comb, 5e-2}});
}

bool check_kda(uint64_t seed, int tokens) {
  constexpr int kBatch = 2, kHeads = 2;
  constexpr int64_t kDim = kHeads * 128;
  const int rows = kBatch * tokens;
  const int64_t taps = tokens + 2;
  const int64_t slots = kBatch * tokens + 1;
  Random rng(seed);
  auto x = rng.bf16(rows * 3 * kDim, -2.0f, 2.0f);
  auto f_a = rng.bf16(rows * 128, -1.0f, 1.0f);
  auto raw_beta = rng.bf16(rows * kHeads, -3.0f, 3.0f);
  auto output_gate = rng.bf16(rows * kDim, -3.0f, 3.0f);
  auto conv_weight = rng.floats(3 * kDim * 4, -0.5f, 0.5f);
  auto f_b = rng.bf16(kDim * 128, -0.1f, 0.1f);
  auto a_log = rng.floats(kHeads, 0.0f, 2.5f);
  auto dt_bias = rng.floats(kDim, -1.0f, 1.0f);
  auto norm_weight = rng.floats(128, 0.5f, 1.5f);
  auto conv_state = rng.bf16(slots * taps * 3 * kDim, -2.0f, 2.0f);
  auto state = rng.floats(slots * kHeads * 128 * 128, -0.3f, 0.3f);
  // Request b owns slots 1 + b * tokens ... (slot 0 stays padding).
  std::vector<int32_t> slot_table(kBatch * tokens), accepted(kBatch);
  for (int b = 0; b < kBatch; ++b) {
    for (int t = 0; t < tokens; ++t) slot_table[b * tokens + t] = 1 + b * tokens + t;
    accepted[b] = 1 + static_cast<int>(rng.engine() % tokens);
  }

  ref::KdaProblem p;
  p.batch = kBatch;
  p.heads = kHeads;
  p.tokens = tokens;
  p.x = x.data();
  p.x_stride = 3 * kDim;
  p.f_a = f_a.data();
  p.f_a_stride = 128;
  p.raw_beta = raw_beta.data();
  p.raw_beta_stride = kHeads;
  p.output_gate = output_gate.data();
  p.output_gate_stride = kDim;
  p.conv_weight = conv_weight.data();
  p.conv_weight_bf16 = false;
  p.conv_weight_channel_stride = 4;  // [3 dim, 4]
  p.conv_weight_tap_stride = 1;
  p.f_b_weight = f_b.data();
  p.a_log = a_log.data();
  p.dt_bias = dt_bias.data();
  p.norm_weight = norm_weight.data();
  p.conv_state = conv_state.data();
  p.conv_state_bf16 = true;
  p.conv_state_slot_stride = taps * 3 * kDim;  // [slot, tap, channel]
  p.conv_state_channel_stride = 1;
  p.conv_state_tap_stride = 3 * kDim;
  p.conv_state_slots = slots;
  p.state = state.data();
  p.state_slot_stride = kHeads * 128 * 128;
  p.state_slots = slots;
  p.slots = slot_table.data();
  p.slots_stride = tokens;
  p.accepted = tokens > 1 ? accepted.data() : nullptr;
  const ref::KdaResult r32 = ref::kda_decode(p, ref::Precision::kFloat32);
  const ref::KdaResult r64 = ref::kda_decode(p, ref::Precision::kFloat64);
  // Approximate ex2/rcp/sqrt are replaced by exact ones in float32 mode, and BF16
  // roundings of q/k/v, o and the output feed forward.
  char name[32];
  std::snprintf(name, sizeof name, "kda_decode q=%d", tokens);
  return report(name, {{"output", &r32.output, &r64.output, 5e-2},
                       {"state", &r32.state, &r64.state, 2e-2},
                       {"conv_state", &r32.conv_state, &r64.conv_state, 1e-2}});
}

}  // namespace

bool run_reference_self_check(uint64_t seed) {
  std::printf("CPU reference self-check (float32 vs float64 modes, tiny problems):\n");
  bool ok = true;
  try {
    ok = check_mhc(seed) && ok;
    ok = check_kda(seed + 1, 1) && ok;
    ok = check_kda(seed + 2, 3) && ok;
  } catch (const std::exception& e) {
    std::printf("  FAIL: the reference threw: %s\n", e.what());
    ok = false;
  }
  return ok;
}

}  // namespace fusedstep::bench
